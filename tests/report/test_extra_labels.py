"""Every counter a run adds to its summary's ``extra`` reads as words in the summary table:
a new counter without a display label showed its raw key (``spec_overhead_mean_pct``)."""

from __future__ import annotations

import pytest

from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.report.tables import EXTRA_LABELS
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

MODEL = declare_model("m", full=1_000, window=1_000, window_tokens=64, state=50_000)
# Six requests of 40 prompt tokens in 16-token content blocks (two shared first blocks), so
# the prefix cache is on and its counters appear too.
TRACE = Trace("t", tuple(TraceRequest(i, i * 0.01, 40, 8, (i % 2, 7, 10 + i))
                         for i in range(6)), "hand-made", "n/a", block_tokens=16)


@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_every_extra_counter_has_a_label(spec_tokens):
    result = simulate(SimConfig(model=MODEL, gpu=get_gpu("h200"), trace=TRACE,
                                clock=ClockKind.STEPS, buffer_bytes=20_000_000,
                                spec_tokens=spec_tokens))
    extra = result.summary.extra
    assert extra, "the run reports no extra counters: the check would be empty"
    assert set(extra) - set(EXTRA_LABELS) == set()
