"""Every public mutating entry point of the KV manager and the scheduler refuses bad input
with a typed error and changes nothing (chain snapshot, epoch, stats, requests)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvchain.alloc import Demand
from kvchain.errors import (
    AdmissionDivergenceError,
    CapacityError,
    ForgedQuoteError,
    InvalidDemandError,
    InvalidRequestError,
)
from kvchain.requests.batch import DecodeBatch
from kvchain.sched.request import (
    DecodeSeq,
    PrefillChunk,
    Request,
    RequestStatus,
    StepBatch,
    StepOutcome,
)
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

from ..cases.helpers import full_class, make_scheduler, window_class


def scheduler() -> Scheduler:
    # 16-token pages of 1,000 B per token class: 16,000 B pages, 100 pages of bytes.
    return make_scheduler([window_class(1_000, 64), full_class(1_000)], 1_600_000, 16)


def state_of(sched: Scheduler) -> tuple:
    kv = sched.kv
    held = {rid: (kv.tokens(rid), kv.held(rid)) for rid in sched.requests if rid in kv}
    return (sched.chain.snapshot(), sched.chain.epoch, sched.chain.stats, held,
            {rid: (r.status, r.computed, r.output_done) for rid, r in sched.requests.items()},
            [r.rid for r in sched.waiting], list(sched.running), sched.counters)


def test_kv_manager_refuses_demands_that_do_not_match_the_batch() -> None:
    sched = scheduler()
    kv = sched.kv
    before = state_of(sched)
    good = kv.demand(1, 20)
    for demands in ([good, good], [], [Demand((1,))], ["x"]):
        with pytest.raises(InvalidDemandError):
            kv.allocate([(1, 20)], demands)  # type: ignore[list-item]
        assert state_of(sched) == before
    with pytest.raises(InvalidDemandError):
        kv.allocate([(1, -1)], [good])
    assert state_of(sched) == before and 1 not in kv


def test_kv_manager_refuses_a_quote_for_another_demand() -> None:
    sched = scheduler()
    kv = sched.kv
    other = sched.chain.price(Demand((1, 1)))
    before = state_of(sched)
    with pytest.raises(ForgedQuoteError):
        kv.allocate([(1, 20)], None, other)  # 20 tokens need (2, 2) pages
    assert state_of(sched) == before and 1 not in kv


def test_scheduler_refuses_a_step_naming_unknown_or_repeated_requests() -> None:
    sched = scheduler()
    sched.add(Request(1, 40, 4, 0.0), 0.0)
    step = sched.schedule(0.0)
    assert [p.rid for p in step.prefills] == [1]
    before = state_of(sched)
    bad_steps = [
        replace(step, prefills=[PrefillChunk(9, 0, 16)]),  # unknown request
        replace(step, prefills=[*step.prefills, *step.prefills],
                prefill_demands=[*step.prefill_demands, *step.prefill_demands]),
        # request 1 is waiting (its decode batch is refused by the manager itself:
        # tests/test_hostile_inputs.py; here the step's own check)
        replace(step, decodes=[DecodeSeq(1, 0)], decode_demands=sched.kv.decode_demands([])),
        # demands that do not match, on a step that is not the one schedule() planned
        # (its basis dropped: it is checked, then planned again)
        replace(step, basis=None, prefill_demands=[]),
    ]
    for bad in bad_steps:
        with pytest.raises(InvalidRequestError):
            sched.allocate(bad, 0.0)
        assert state_of(sched) == before
    sched.allocate(step, 0.0)
    assert 1 in sched.running


def test_scheduler_refuses_completing_a_batch_twice() -> None:
    sched = scheduler()
    sched.add(Request(1, 40, 4, 0.0), 0.0)
    sched.add(Request(2, 20, 4, 0.0), 0.0)
    batch = sched.step(0.0)
    sched.complete(batch, StepOutcome(0.01), 0.01)
    before = state_of(sched)
    for bad in (batch, StepBatch((), (DecodeSeq(7, 3),)),
                StepBatch((), (DecodeSeq(1, 40), DecodeSeq(1, 40)))):
        with pytest.raises(InvalidRequestError):
            sched.complete(bad, StepOutcome(0.01), 0.02)
        assert state_of(sched) == before



@pytest.mark.parametrize("strict", [False, True])
def test_unallocatable_running_request_is_retracted_and_the_rest_allocated(
        monkeypatch: pytest.MonkeyPatch, strict: bool) -> None:
    """Planted defect: the allocator refuses the first take of a step (admission had
    fitted it). Non-strict: the event is recorded with the victim's demand, the latest
    arrival (request 2) is retracted, request 1's decode is taken. Strict: it raises."""
    sched = make_scheduler([window_class(1_000, 64), full_class(1_000)], 1_600_000, 16,
                           config=SchedulerConfig(strict=strict))
    sched.add(Request(1, 32, 8, 0.0), 0.0)
    sched.add(Request(2, 32, 8, 0.5), 0.5)
    batch = sched.step(0.5)
    sched.complete(batch, StepOutcome(0.01), 0.51)  # both prefilled: pages 0-1 per band
    real_apply = sched.kv.apply
    calls = [0]
    handed: list[object] = []

    def refuses_once(*args: object, **kwargs: object) -> Demand:
        calls[0] += 1
        handed.append(args[0])
        if calls[0] == 1:
            raise CapacityError("planted", shortfall_bytes=16_000, demand=Demand((2, 2)),
                                reason="bytes")
        return real_apply(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sched.kv, "apply", refuses_once)
    if strict:
        with pytest.raises(AdmissionDivergenceError):
            sched.step(0.52)
        assert sched.counters.divergences == 1 and not sched.unallocatable
        return
    batch = sched.step(0.52)
    assert [d.rid for d in batch.decodes] == [1] and not batch.prefills
    (event,) = sched.unallocatable
    assert (event.rid, event.shortfall_bytes, event.time_s) == (2, 16_000, 0.52)
    # Request 2's decode of token 32 starts page 2 in both bands (16-token pages; the
    # 64-token window still keeps pages 0-1): one window page (band 0) + one full page.
    assert event.demand == Demand((1, 1))
    assert sched.requests[2].status is RequestStatus.WAITING
    assert (sched.counters.divergences, sched.counters.retractions) == (1, 1)
    # the retake got a new step plan without request 2 (not the first one changed in
    # place): request 1's own decode of token 32, (1, 1) as request 2's above
    first, again = handed
    assert isinstance(first, DecodeBatch) and isinstance(again, DecodeBatch)
    assert first.rids == (1, 2) and first.total == Demand((2, 2))
    assert again.rids == (1,) and again.total == Demand((1, 1))
    sched.audit()
