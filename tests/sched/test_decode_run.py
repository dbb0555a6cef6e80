"""A run of decode steps priced in closed form (``KVManager.decode_run``) equals the
per-step demands and releases, quiet steps (``skip_decodes``) refuse steps that are not
quiet, and the scheduler plans and runs a decode run only where the per-step loop would
decide nothing else (values by hand)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.errors import ConfigError, InvalidDemandError, InvalidRequestError, UnknownRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import EventKind, Request, RequestStatus, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

SHAPES = {
    "full": [declared_class(LC.FULL, 1_024)],
    "window|full": [declared_class(LC.WINDOW, 1_024, 40), declared_class(LC.FULL, 1_024)],
    "local|full": [declared_class(LC.LOCAL, 1_024, 32), declared_class(LC.FULL, 1_024)],
    "state|window|full": [declared_class(LC.STATE, 50_000), declared_class(LC.WINDOW, 512, 24),
                          declared_class(LC.FULL, 1_024)],
    "window4|window12|full": [declared_class(LC.WINDOW, 512, 12),
                              declared_class(LC.WINDOW, 512, 4),
                              declared_class(LC.FULL, 1_024)],
}


def gpt_oss_like() -> KVManager:
    """W = 128, P = 16 (gpt-oss's window and page), window band 0, full band 1."""
    layout = plan_layout([declared_class(LC.WINDOW, 1_000, 128), declared_class(LC.FULL, 1_000)],
                         10_000_000, 16)
    assert layout.shape_name == "window|full"
    return KVManager(Chain(layout))


def test_run_by_hand_gpt_oss_geometry():
    kv = gpt_oss_like()
    kv.allocate([(0, 140)])
    kv.commit(0, 140)
    # After the 140-token prefill: full pages ceil(140 / 16) = 9; window pages 0..8 (the
    # next token 140 reads from max(0, 140 - 127) = 13, page 0: nothing released).
    demand, released = kv.decode_run([0], 6)
    # Steps decode positions 140..145. A position t needs page t // 16: 144 is the first on
    # page 9, so step 4 takes one page in each band.
    assert demand[:, 0, :].tolist() == [[0, 0], [0, 0], [0, 0], [0, 0], [1, 1], [0, 0]]
    # After step j the next token is 141 + j; its window starts at 141 + j - 127, on page
    # 1 first for 143 (step 2): that commit releases window page 0.
    assert released.tolist() == [False, False, True, False, False, False]


def test_skip_decodes_refuses_steps_that_are_not_quiet_and_changes_nothing():
    kv = gpt_oss_like()
    kv.allocate([(0, 140)])
    kv.commit(0, 140)
    with pytest.raises(InvalidDemandError, match="not quiet"):
        kv.skip_decodes([0], 3)  # the third step's commit releases page 0 (above)
    assert kv.tokens(0) == 140
    kv.skip_decodes([0], 2)  # positions 140, 141: pages held, nothing leaves the window
    assert kv.tokens(0) == 142
    with pytest.raises(InvalidDemandError):
        kv.skip_decodes([0], 1)
    assert kv.tokens(0) == 142
    with pytest.raises(UnknownRequestError):
        kv.skip_decodes([0, 7], 1)
    with pytest.raises(InvalidDemandError):
        kv.skip_decodes([0, 0], 1)
    with pytest.raises(InvalidDemandError):
        kv.skip_decodes([0], -1)
    with pytest.raises(InvalidDemandError):
        kv.decode_run([0], 0)
    assert kv.tokens(0) == 142


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("seed", range(4))
def test_run_columns_equal_the_per_step_decode_path(shape, seed):
    """Closed form vs the per-step path (``decode_demands``, ``allocate``,
    ``commit_decodes``) over 60 steps of a batch of random lengths."""
    rng = random.Random(seed)
    layout = plan_layout(SHAPES[shape], 40_000_000, 4)
    kv = KVManager(Chain(layout))
    prompts = [rng.randint(1, 90) for _ in range(rng.randint(1, 10))]
    batch = list(enumerate(prompts))
    kv.allocate(batch)
    for rid, n in batch:
        kv.commit(rid, n)
    rids = list(range(len(prompts)))
    rng.shuffle(rids)
    found = kv.decode_run(rids, 60)
    assert found is not None
    demand, released = found
    for j in range(60):
        got = kv.decode_demands(rids)
        assert [d.pages for d in got] == [tuple(row) for row in demand[j].tolist()]
        kv.allocate([(rid, 1) for rid in rids], got)
        before = [[f for f, _ in kv.held(rid).spans] for rid in rids]
        kv.commit_decodes(rids)
        after = [[f for f, _ in kv.held(rid).spans] for rid in rids]
        assert bool(released[j]) == (before != after)
    kv.audit()


def small_scheduler() -> Scheduler:
    layout = plan_layout([declared_class(LC.WINDOW, 1_000, 128), declared_class(LC.FULL, 1_000)],
                         10_000_000, 16)
    return Scheduler(KVManager(Chain(layout)), SchedulerConfig(max_prefill_tokens=1_024))


def test_plan_decode_run_bounds_and_refusals():
    sched = small_scheduler()
    with pytest.raises(ConfigError):
        sched.plan_decode_run(0)
    assert sched.plan_decode_run(10) is None  # nothing runs
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    sched.add(Request(2, 50, 9, 0.0), 0.0)
    assert sched.plan_decode_run(10) is None  # requests wait
    batch = sched.step(0.0)
    assert len(batch.prefills) == 2
    sched.complete(batch, StepOutcome(0.01), 0.01)
    # Both decode now, 1 of 30 and 1 of 9 output tokens done: request 2 generates its
    # last token in the 8th step, where the run ends (it finishes in it).
    run = sched.plan_decode_run(100)
    assert run is not None and run.steps == 8 and run.starts == (100, 50)
    assert run.shortest == 8
    assert sched.plan_decode_run(3).steps == 3
    sched.drain_events()
    times = [0.01 + 0.01 * (j + 1) for j in range(8)]
    assert sched.run_decodes(run, 8, times) == 8
    r1, r2 = sched.requests[1], sched.requests[2]
    assert (r1.computed, r1.output_done, r2.output_done) == (108, 9, 9)
    assert r2.status is RequestStatus.FINISHED and list(sched.running) == [1]
    assert [(e.kind, e.rid, e.time_s) for e in sched.drain_events()] == [
        (EventKind.FINISHED, 2, times[7])]
    assert sched.counters.steps == 9 and sched.counters.finished == 1
    assert 2 not in sched.kv
    sched.audit()
    with pytest.raises(InvalidRequestError):
        sched.run_decodes(run, 1, times)  # planned before those steps: stale
    assert r1.computed == 108  # nothing changed
    assert sched.plan_decode_run(100).steps == 30 - 9  # request 1 alone, to its end


def _decoding_one():
    """A scheduler whose request 1 (100 prompt, 30 output tokens) has prefilled at 0.01 s,
    and the plan of its next 5 decode steps."""
    sched = small_scheduler()
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    sched.complete(sched.step(0.0), StepOutcome(0.01), 0.01)
    run = sched.plan_decode_run(5)
    assert run is not None
    return sched, run


def test_run_decodes_checks_its_arguments():
    sched, run = _decoding_one()
    for bad in (0, 6):
        with pytest.raises(InvalidRequestError):
            sched.run_decodes(run, bad, [1.0] * 6)
    with pytest.raises(InvalidRequestError):
        sched.run_decodes(run, 5, [1.0] * 4)  # a time for each step
    seen: list[tuple[int, bool]] = []
    assert sched.run_decodes(run, 5, [1.0] * 5,
                             lambda j, changed: seen.append((j, changed))) == 5
    # Positions 100..104: page 6 (tokens 96..111) is held, so no step takes a page; the
    # window releases page 0 once the next token's window starts at 16 (token 143): none.
    assert seen == [(j, False) for j in range(5)]
    assert np.array_equal(run.released, np.zeros(5, dtype=bool))


def _reference_times(times, last):
    """The one-by-one check ``_check_run_times`` must agree with: each a finite time >= 0
    (s), each at or after the one before, the first at or after ``last``."""
    for t in times:
        if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                or t < 0 or t < last):
            return False
        last = t
    return True


@pytest.mark.parametrize("times, last", [
    ([1.0, 1.0, 2.5], 0.5), ([1.0, 2.0], 1.0), ([0.0], 0.0),  # good
    ([np.float64(1.0), np.float64(2.0)], 0.0), ([1, 2], 0.0),  # not floats: one by one
    ([1.0, 0.5], 0.0), ([0.5], 1.0),  # back: within the run, before the clock
    ([1.0, float("nan")], 0.0), ([float("nan")], 0.0), ([1.0, float("inf")], 0.0),
    ([True], 0.0), ([1.0, "2"], 0.0), ([-1.0], -2.0),
])
def test_run_times_fast_scan_agrees_with_the_one_by_one_check(times, last):
    from kvchain.sched.scheduler import _check_run_times

    if _reference_times(times, last):
        _check_run_times(times, last)
    else:
        with pytest.raises(InvalidRequestError):
            _check_run_times(times, last)


def test_run_decodes_refuses_a_nan_or_backward_time_and_changes_nothing():
    sched, run = _decoding_one()
    for times in ([1.0, float("nan"), 2.0], [1.0, 0.9, 2.0], [0.001, 1.0, 2.0]):
        with pytest.raises(InvalidRequestError):
            sched.run_decodes(run, 3, times)  # 0.001 s: before the step clock (0.01 s)
    assert sched.request(1).computed == 100 and sched.counters.steps == 1
    assert sched.run_decodes(run, 3, [1.0, 1.0, 2.0]) == 3
