"""--clock steps: instant compute, one scheduler step = one tick of trace time."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.sim.cost import ClockKind, StepClock, StepWork
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

MODEL = declare_model("tiny", full=1_000)  # full attention only, no weights
TRACE = Trace("three", (
    TraceRequest(0, 0.00, 10, 3),  # A
    TraceRequest(1, 0.00, 20, 1),  # B
    TraceRequest(2, 0.10, 5, 2),   # C
), source="hand", license="-")


def run(step_ms: float = 30.0):
    config = SimConfig(MODEL, get_gpu("h200"), TRACE, page_size=16,
                       buffer_bytes=10_000_000, clock=ClockKind.STEPS, step_ms=step_ms)
    return simulate(config, audit_every_step=True)


def test_three_requests_count_steps_exactly():
    """By hand, 30 ms ticks, memory and token budget ample:

    step 1 at 0.00: prefill A (10) and B (20) -> 0.03: A's first token, B done (1 output)
    step 2 at 0.03: decode A                 -> 0.06: A's 2nd token
    step 3 at 0.06: decode A                 -> 0.09: A done (3 outputs)
    idle: the clock jumps to C's arrival, 0.10
    step 4 at 0.10: prefill C (5)            -> 0.13: C's first token
    step 5 at 0.13: decode C                 -> 0.16: C done (2 outputs)
    So 5 steps, serving ends at 0.16 s, every TTFT is one tick (30 ms), TPOT of A and C
    one tick.
    """
    result = run()
    s = result.summary
    assert s.steps == 5
    assert s.requests_finished == 3
    assert s.duration_s == pytest.approx(0.16)
    assert s.ttft is not None and s.ttft.p50_s == pytest.approx(0.03)
    assert s.ttft.p99_s == pytest.approx(0.03)
    finish = {r.request_id: r.finished_s for r in result.recorder.records}
    assert finish == pytest.approx({0: 0.09, 1: 0.03, 2: 0.16})


def test_tick_scales_time_not_steps():
    s = run(step_ms=5.0).summary
    assert s.steps == 5
    # 3 ticks, a jump to 0.10, 2 ticks
    assert s.duration_s == pytest.approx(0.10 + 2 * 0.005)


def test_step_clock_ticks_only_steps_with_tokens():
    clock = StepClock(0.03)
    assert clock.step_time(StepWork(tokens=0)) == 0.0
    assert clock.step_time(StepWork(tokens=7)) == 0.03
    with pytest.raises(ConfigError, match="tick"):
        StepClock(0.0)


def test_step_clock_prices_a_decode_run_one_tick_a_step():
    from kvchain.sim.cost import StepWorkBuilder
    clock = StepClock(0.03)
    run = StepWorkBuilder().decode_run(np.asarray([5, 70]), 3)
    assert clock.run_times(run).tolist() == [0.03] * 3 == [clock.step_time(run.step(j))
                                                           for j in range(3)]
    empty = StepWorkBuilder().decode_run(np.asarray([], dtype=np.int64), 2)
    assert clock.run_times(empty).tolist() == [0.0, 0.0]
