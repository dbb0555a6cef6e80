"""The scheduler's clock never goes back: a step is scheduled at or after the last step's
time, completed at or after its own start, and a decode run's step times are in order
from there. Before, ``complete`` at t=1.0 of a step scheduled at t=5.0 recorded a first
token before its admission. Each refusal changes nothing; each has a sibling that runs.

Chain as tests/sched/test_decode_run.py: window (W = 128) | full, P = 16 tokens.
"""

from __future__ import annotations

import pytest
from tests.sched.test_decode_run import small_scheduler

from kvchain.errors import InvalidRequestError
from kvchain.sched.request import EventKind, Request, StepOutcome


def progress(sched) -> tuple:
    """What a refused call may not change: each request's computed and output tokens, the
    KV manager's tokens, the step count and the pending events."""
    return (tuple((r.rid, r.computed, r.output_done, sched.kv.tokens(r.rid))
                  for r in sched.requests.values()),
            sched.counters.steps, len(sched._events))


def test_a_step_is_completed_at_or_after_its_start() -> None:
    sched = small_scheduler()
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    batch = sched.step(5.0)
    before = progress(sched)
    with pytest.raises(InvalidRequestError, match=r"time goes back: t=1\.0 s after a step at 5\.0"):
        sched.complete(batch, StepOutcome(0.01), 1.0)
    assert progress(sched) == before
    sched.complete(batch, StepOutcome(0.01), 5.0)  # the sibling: a forward of 0 s
    assert sched.requests[1].computed == 100  # the 100-token prompt in one chunk
    kinds = [(e.kind, e.time_s) for e in sched.drain_events()]
    assert (EventKind.ADMITTED, 5.0) in kinds and (EventKind.FIRST_TOKEN, 5.0) in kinds


def test_a_step_is_scheduled_at_or_after_the_last_completion() -> None:
    sched = small_scheduler()
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    sched.complete(sched.step(0.0), StepOutcome(0.5), 0.5)
    before = progress(sched)
    with pytest.raises(InvalidRequestError, match="time goes back"):
        sched.step(0.25)
    assert progress(sched) == before
    batch = sched.step(0.5)  # the sibling: the decode of the 101st token
    assert [d.rid for d in batch.decodes] == [1]


def test_a_decode_runs_times_must_not_go_back() -> None:
    sched = small_scheduler()
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    sched.complete(sched.step(0.0), StepOutcome(0.01), 2.0)
    run = sched.plan_decode_run(3)
    assert run is not None
    before = progress(sched)
    for times in ([1.0, 2.5, 3.0], [2.5, 2.4, 3.0]):  # before the last step; out of order
        with pytest.raises(InvalidRequestError, match="step times go back"):
            sched.run_decodes(run, 3, times)
        assert progress(sched) == before
    assert sched.run_decodes(run, 3, [2.0, 2.5, 2.5]) == 3  # the sibling: in order, ties
    assert sched.requests[1].computed == 103
    with pytest.raises(InvalidRequestError, match="time goes back"):
        sched.step(2.4)  # the run moved the clock to its last step's time
