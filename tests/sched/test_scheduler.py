"""The scheduler's policies, with exact values: new-token ratio, retraction victim (latest
arrival first), FCFS vs SPF, rejection without blocking, determinism of the event log.

Runs go through the field-case harness (``tests/cases/helpers.py``), which checks the
invariants of docs/field-cases.md after every step.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.errors import ConfigError, InvalidRequestError, UnknownRequestError
from kvchain.sched.admission import NewTokenRatio, ReserveConfig, ReservePolicy
from kvchain.sched.driver import FixedStepDriver
from kvchain.sched.request import EventKind, Request, RequestStatus, StepBatch
from kvchain.sched.scheduler import QueuePolicy, Scheduler, SchedulerConfig

from ..cases.helpers import (
    full_class,
    make_scheduler,
    run_to_completion,
    state_class,
    window_class,
)

PAGE_BYTES = 16_000  # 16 tokens x 1,000 B

# --- new_token_ratio ---------------------------------------------------------------------


def test_new_token_ratio_defaults_decay_and_reset() -> None:
    ratio = NewTokenRatio()
    assert (ratio.init, ratio.value) == (0.7, 0.7)
    assert ratio.floor == 0.7 * 0.14
    assert ratio.decay == (0.7 - 0.7 * 0.14) / 600
    ratio.step()
    assert ratio.value == 0.7 - (0.7 - 0.7 * 0.14) / 600
    for _ in range(598):
        ratio.step()
    assert ratio.value > ratio.floor  # 599 steps
    ratio.step()
    assert ratio.value == ratio.floor  # 600 steps reach the floor
    ratio.step()
    assert ratio.value == ratio.floor
    assert ratio.tokens(999) == 98  # ceil(999 x 0.098)
    assert (ratio.tokens(0), ratio.tokens(1)) == (0, 1)  # the next decode always covered
    ratio.reset()
    assert ratio.value == 0.7
    assert (ratio.tokens(10), ratio.tokens(15)) == (7, 11)


@pytest.mark.parametrize(("init", "floor", "decay"), [(1.5, 0.1, 0.0), (0.5, 0.6, 0.0),
                                                      (0.5, -0.1, 0.0), (0.5, 0.1, -1.0)])
def test_new_token_ratio_rejects_bad_values(init: float, floor: float, decay: float) -> None:
    with pytest.raises(ConfigError):
        NewTokenRatio(init, floor, decay)


def test_scheduler_decays_the_ratio_each_step() -> None:
    sched = make_scheduler([full_class(1_000)], 100 * PAGE_BYTES, 16,
                           config=SchedulerConfig(reserve=ReserveConfig(ReservePolicy.SGLANG)))
    run_to_completion(sched, [Request(0, 16, 5)])
    expected = NewTokenRatio()
    for _ in range(5):  # one prefill step + 4 decode steps
        expected.step()
    assert sched.ratio.value == expected.value


# --- retraction ----------------------------------------------------------------------------


def _retraction_scheduler() -> Scheduler:
    """Full-only chain of 6 pages; a ratio of 0.01 reserves one token of future output, so
    two (16, 60) requests are admitted together and collide at 48 tokens (8 pages > 6)."""
    return make_scheduler([full_class(1_000)], 6 * PAGE_BYTES, 16,
                          config=SchedulerConfig(max_running=2),
                          ratio=NewTokenRatio(init=0.01, floor=0.0, decay=0.01))


@pytest.mark.parametrize(("arrivals", "victim"), [((0.0, 1.0), 1), ((1.0, 0.0), 0),
                                                  ((0.0, 0.0), 1)])
def test_retraction_takes_the_latest_arrival(arrivals: tuple[float, float],
                                             victim: int) -> None:
    sched = _retraction_scheduler()
    seen: dict[str, object] = {}

    def after(step: int, s: Scheduler, batch: StepBatch) -> None:
        if s.counters.retractions == 1 and "waiting" not in seen:
            seen["step"] = step
            seen["waiting"] = [r.rid for r in s.waiting]
            seen["ratio"] = s.ratio.value

    def before(step: int, s: Scheduler) -> None:
        if step == 33:  # the decode at 48 tokens: the ratio is reset within this step
            seen["ratio_before"] = s.ratio.value

    requests = [Request(0, 16, 60, arrivals[0]), Request(1, 16, 60, arrivals[1]),
                Request(2, 16, 10, 2.0)]
    result = run_to_completion(sched, requests, before_step=before, after_step=after)
    assert result.kinds(EventKind.RETRACTED) == [victim]
    retracted = next(e for e in result.events if e.kind is EventKind.RETRACTED)
    assert retracted.time_s == 33.0  # step 33: both at 48 tokens need a 4th page
    assert seen["step"] == 33
    assert seen["waiting"] == [victim, 2]  # back to the front of the queue
    assert seen["ratio_before"] == 0.0
    assert seen["ratio"] == 0.0  # reset to 0.01 in the step, decayed again at its end
    r = sched.requests[victim]
    assert r.retractions == 1 and r.status is RequestStatus.FINISHED
    # Recomputed from its prompt plus the 33 tokens it had generated.
    assert r.prefill_target == 16 + 33
    assert sched.counters.retractions == 1
    assert len(result.kinds(EventKind.FINISHED)) == 3


def test_retraction_resets_the_ratio() -> None:
    sched = _retraction_scheduler()
    for r in (Request(0, 16, 60, 0.0), Request(1, 16, 60, 1.0)):
        sched.add(r, 0.0)
    driver = FixedStepDriver(1.0)
    for step in range(33):
        batch = sched.step(float(step))
        sched.complete(batch, driver.run(batch), step + 1.0)
    assert sched.ratio.value == 0.0 and sched.counters.retractions == 0
    sched.step(33.0)
    assert sched.counters.retractions == 1
    assert sched.ratio.value == 0.01  # reset to init by the retraction


# --- queue order --------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "order"), [(QueuePolicy.FCFS, [0, 1, 2]),
                                               (QueuePolicy.SPF, [1, 2, 0])])
def test_fcfs_and_spf_order(policy: QueuePolicy, order: list[int]) -> None:
    sched = make_scheduler([full_class(1_000)], 200 * PAGE_BYTES, 16,
                           config=SchedulerConfig(max_running=1, policy=policy))
    requests = [Request(0, 300, 2, 0.0), Request(1, 20, 2, 1.0), Request(2, 100, 2, 2.0)]
    result = run_to_completion(sched, requests)
    assert result.kinds(EventKind.ADMITTED) == order
    assert result.kinds(EventKind.FINISHED) == order


def test_fcfs_does_not_overtake_a_request_that_waits_for_room() -> None:
    # 20 pages; request 0 holds 13 (+1 reserved); request 1 (200 tokens = 13 pages) waits,
    # and the small request 2 behind it waits too (no overtaking, so 1 cannot starve).
    sched = make_scheduler([full_class(1_000)], 20 * PAGE_BYTES, 16)
    requests = [Request(0, 200, 3, 0.0), Request(1, 200, 3, 1.0), Request(2, 16, 3, 2.0)]
    result = run_to_completion(sched, requests)
    assert result.admitted_at == {0: 0, 1: 3, 2: 3}
    assert result.kinds(EventKind.FINISHED) == [0, 1, 2]


# --- rejection ------------------------------------------------------------------------------


def test_never_fitting_request_rejected_without_blocking_the_queue() -> None:
    sched = make_scheduler([full_class(1_000)], 10 * PAGE_BYTES, 16)
    assert not sched.add(Request(0, 200, 2), 0.0)  # ceil(201 / 16) = 13 pages > 10
    assert sched.add(Request(1, 16, 2), 0.0)
    result = run_to_completion(sched)
    assert sched.requests[0].status is RequestStatus.REJECTED
    assert sched.counters.rejected == 1
    assert result.kinds(EventKind.FINISHED) == [1]
    assert list(sched.waiting) == []


def test_rejection_event_names_the_bytes() -> None:
    sched = make_scheduler([full_class(1_000)], 10 * PAGE_BYTES, 16)
    sched.add(Request(0, 200, 2), 0.0)
    rejected = [e for e in sched.drain_events() if e.kind is EventKind.REJECTED]
    assert len(rejected) == 1
    assert "208,000 B" in rejected[0].detail  # 13 pages
    assert "160,000 B" in rejected[0].detail  # the empty chain


def test_bad_requests_and_configs_raise() -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig(max_running=0)
    with pytest.raises(ConfigError):
        SchedulerConfig(chunk_size=0)
    with pytest.raises(InvalidRequestError):
        Request(0, 0, 1)
    sched = make_scheduler([full_class(1_000)], 10 * PAGE_BYTES, 16)
    sched.add(Request(0, 16, 2), 0.0)
    with pytest.raises(InvalidRequestError):
        sched.add(Request(0, 16, 2), 0.0)
    with pytest.raises(UnknownRequestError):
        sched.request(5)
    assert sched.request(0).prompt_tokens == 16


# --- determinism ------------------------------------------------------------------------------


def _mixed_workload(policy: QueuePolicy) -> tuple[str, object]:
    rng = np.random.default_rng(7)
    sched = make_scheduler([full_class(1_000), window_class(1_000, 64),
                            state_class(100_000)], 100 * PAGE_BYTES + 500_000, 16,
                           config=SchedulerConfig(chunk_size=64, max_prefill_tokens=256,
                                                  policy=policy),
                           ratio=NewTokenRatio(init=0.2, floor=0.05))
    arrivals = [(int(rng.integers(0, 80)),
                 Request(i, int(rng.integers(1, 600)), int(rng.integers(1, 90)), float(i)))
                for i in range(40)]
    result = run_to_completion(sched, arrivals=arrivals)
    return result.digest(), sched.counters


def test_same_inputs_same_event_log() -> None:
    digest, counters = _mixed_workload(QueuePolicy.FCFS)
    again, counters_again = _mixed_workload(QueuePolicy.FCFS)
    assert digest == again
    assert counters == counters_again
    other, _ = _mixed_workload(QueuePolicy.SPF)
    assert other != digest  # the log does depend on the inputs
