"""Regression tests for bugs an adversarial tester found: each bad input gets a typed error
and changes nothing; configurations that could stall are refused up front."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError, InvalidDemandError, InvalidRequestError, LayoutError
from kvchain.layout import MAX_PAGES_PER_BAND, plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.admission import WindowAdmission
from kvchain.sched.request import EventKind, Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

_load_commands()
runner = CliRunner()


def window_full(buffer_bytes=640, e=32, window=4, page_size=1, null_pages=True):
    return plan_layout([declared_class(LC.WINDOW, e, window), declared_class(LC.FULL, e)],
                       buffer_bytes, page_size, null_pages=null_pages)


def test_chunk_smaller_than_a_page_is_refused_up_front():
    """Was a livelock: a request accepted, then never admitted on an idle chain."""
    layout = window_full(page_size=4, buffer_bytes=64 * 128)
    for config in (SchedulerConfig(chunk_size=3), SchedulerConfig(max_prefill_tokens=2)):
        with pytest.raises(ConfigError, match="at least the page size"):
            Scheduler(KVManager(Chain(layout)), config)


def test_split_admission_rejects_what_split_can_never_admit():
    """Was a stall: never-fits judged jointly while admission was split."""
    split = Scheduler(KVManager(Chain(window_full())),
                      SchedulerConfig(window_admission=WindowAdmission.SPLIT))
    assert split.add(Request(0, 12, 1), 0.0) is False
    assert [e.kind for e in split.drain_events()] == [EventKind.ARRIVED, EventKind.REJECTED]
    joint = Scheduler(KVManager(Chain(window_full())))
    assert joint.add(Request(0, 12, 1), 0.0) is True
    now = 0.0
    while not joint.idle:
        batch = joint.step(now)
        now += 1.0
        joint.complete(batch, StepOutcome(1.0), now)
    assert joint.counters.finished == 1


def test_demand_pages_must_be_a_tuple_and_the_chain_stays_as_it_was():
    chain = Chain(window_full())
    before, epoch = chain.snapshot(), chain.epoch
    with pytest.raises(InvalidDemandError, match="tuple"):
        chain.take(Demand([1, 1]))  # type: ignore[arg-type]
    assert chain.snapshot() == before and chain.epoch == epoch
    assert chain.bound_pages(1) == 0


@pytest.mark.parametrize(("prompt", "output", "arrival"), [
    (np.int64(5), 2, 0.0), (5.0, 2, 0.0), (float("nan"), 2, 0.0), ("5", 2, 0.0),
    (5, float("inf"), 0.0), (True, 2, 0.0), (5, 2, float("nan")), (5, 2, "now"),
])
def test_request_fields_are_typed(prompt, output, arrival):
    with pytest.raises(InvalidRequestError):
        Request(0, prompt, output, arrival)


def test_too_many_pages_for_a_band_is_a_layout_error():
    with pytest.raises(LayoutError, match="page table"):
        plan_layout([declared_class(LC.FULL, 2)], 2 * MAX_PAGES_PER_BAND + 2, 1)


def test_page_table_without_null_pages_until_something_is_released():
    layout = window_full(null_pages=False, buffer_bytes=64 * 32)
    kv = KVManager(Chain(layout))
    kv.allocate([(0, 3)])
    assert tuple(kv.page_table(0, 0).tolist()) == kv.pages(0).band(0)


def run_cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def test_cli_refuses_bad_files_with_one_line_errors(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"full": 1.5}))
    assert "declared full must be an integer, got 1.5 (float)" in run_cli(
        "plan", "--spec", str(spec), "--buffer-bytes", "100000000")
    assert "slots-held must be >= 0" in run_cli("plan", "--slots-held", "-1")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "cannot write outputs" in run_cli("simulate", "--requests", "3", "--out", str(a_file))
    assert "cannot write stream" in run_cli("replay", "--generate", "full", "--ops", "5",
                                            "-o", str(a_file / "x.jsonl"))
    binary = tmp_path / "ops.jsonl"
    binary.write_bytes(bytes(range(128, 256)))
    assert "cannot read stream" in run_cli("replay", str(binary))
    stream = tmp_path / "bad.jsonl"
    runner.invoke(app, ["replay", "--generate", "full", "--ops", "3", "-o", str(stream)])
    lines = stream.read_text().splitlines()
    stream.write_text("\n".join([lines[0], '{"op": "take", "pages": [1.5]}']) + "\n")
    assert "expected an integer" in run_cli("replay", str(stream))
    stream.write_text("\n".join([lines[0], '{"op": "gate", "open": "yes"}']) + "\n")
    assert "expected true or false" in run_cli("replay", str(stream))


def test_a_retracted_request_can_always_be_readmitted_on_the_empty_chain():
    """Second adversarial round: after a retraction the recompute prompt (prompt + generated)
    spans several pages, and its later chunks used to reserve one window page more than
    the never-fits check had promised, so it could never come back."""
    from kvchain.sched.admission import ChainPrefillBudget

    # W = 32, P = 16: 4 full + 3 window pages + the null page fill the buffer exactly.
    layout = plan_layout([declared_class(LC.WINDOW, 3_000, 32), declared_class(LC.FULL, 100)],
                         4 * 1_600 + 4 * 48_000, 16)
    sched = Scheduler(KVManager(Chain(layout)))
    for done in range(40):
        r = Request(done, 16, 40, 0.0)
        assert sched.add(r, 0.0)
        r.output_done, r.prefill_target = done, 16 + done  # as a retraction leaves it
        budget = ChainPrefillBudget(sched.chain.empty_snapshot(), sched.rules)
        upper = min(8_192, r.remaining_prefill)
        assert budget.largest(lambda t, r=r: sched._admission_demand(r, t), upper, 16) > 0
