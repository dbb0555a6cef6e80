"""``Scheduler.add`` checks everything before it changes anything, and queues only fresh
requests; ``Scheduler.request`` refuses ids that are not ints.

Breaker findings: a :class:`Request` is a mutable dataclass, validated by its constructor
only, and ``add`` registered the request and emitted ``ARRIVED`` before a later check
raised (a re-add of the fixed request then said "duplicate id"); fields changed after
construction (``prompt_tokens = 2.5``, ``status = "running"``) passed; and requests with
progress (``RUNNING``, ``computed=5``, ``prefill_target=100``) were queued and wedged the
scheduler or diverged from the KV manager. Every refusal here has a sibling where the good
input of the same call changes the state, so the "nothing changed" check could fail.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.errors import InvalidDemandError, InvalidRequestError, UnknownRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import EventKind, PrefillChunk, Request, RequestStatus, StepOutcome
from kvchain.sched.scheduler import Scheduler

P = 4  # tokens per page


def scheduler() -> Scheduler:
    """A window|full chain (W = 8 tokens, 32 B per token per class, P = 4): 128 B pages in
    a 64 KiB buffer, room for far more than these tests take."""
    layout = plan_layout([declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
                         64 * 1024, P)
    return Scheduler(KVManager(Chain(layout)))


def state_of(sched: Scheduler) -> tuple:
    """What a refused ``add`` may not change: the chain, the KV manager's requests, the
    scheduler's requests, queues and counters."""
    kv = sched.kv
    return (sched.chain.snapshot(), sched.chain.epoch, kv.num_requests,
            dict(sched.requests), [r.rid for r in sched.waiting], list(sched.running),
            repr(sched.counters))


def run_to_the_end(sched: Scheduler, r: Request) -> list[tuple[int, int, int]]:
    """Step (from 0.1 s, 0.1 s apart) until ``r`` finishes: ``(step, computed, kv tokens)``
    after each step (-1: freed, finished)."""
    seen = []
    for i in range(1, 20):
        batch = sched.step(0.1 * i)
        assert not batch.is_empty
        sched.complete(batch, StepOutcome(0.01), 0.1 * i + 0.01)
        if r.status is RequestStatus.FINISHED:
            seen.append((i, r.computed, -1))
            return seen
        seen.append((i, r.computed, sched.kv.tokens(r.rid)))
    raise AssertionError(f"request {r.rid} never finished: {seen}")


def assert_the_fresh_request_runs(sched: Scheduler) -> None:
    """The sibling: a fresh Request(0, 8, 4) is queued (ARRIVED), prefilled in one chunk
    of 8 tokens from 0, then decodes to its end: 8 + 3 = 11 tokens in its cache at its
    last step (the 4th output token is sampled, never fed back)."""
    r = Request(0, 8, 4)
    assert sched.add(r, 0.0) is True
    assert list(sched.requests) == [0] and [w.rid for w in sched.waiting] == [0]
    assert [(e.kind, e.rid) for e in sched.drain_events()] == [(EventKind.ARRIVED, 0)]
    batch = sched.step(0.0)
    assert batch.prefills == (PrefillChunk(0, 0, 8),)
    sched.complete(batch, StepOutcome(0.01), 0.01)
    assert (r.computed, sched.kv.tokens(0), r.output_done) == (8, 8, 1)
    assert run_to_the_end(sched, r) == [(1, 9, 9), (2, 10, 10), (3, 11, -1)]
    assert r.output_done == 4 and 0 not in sched.kv


# --- fields changed after construction ------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "message"), [
    ("prompt_tokens", -3, "prompt_tokens and output_tokens must be >= 1, got -3 and 4"),
    ("prompt_tokens", 2.5, "prompt_tokens must be an int, got float 2.5"),
    ("output_tokens", 0, "prompt_tokens and output_tokens must be >= 1, got 8 and 0"),
    ("rid", "x", "rid must be an int, got str 'x'"),
    ("rid", True, "rid must be an int, got bool True"),
    ("status", "running", "status must be a RequestStatus, got 'running'"),
    ("arrival_s", math.nan, "arrival_s must be a finite number of seconds, got nan"),
    ("max_tokens", 2, r"max_tokens must be an int >= output_tokens \(4\), got 2"),
    ("page_keys", [1, 2], "page_keys must be a tuple of ints"),
    ("computed", -1, "computed must be an int >= 0, got -1"),
])
def test_a_field_changed_after_construction_is_refused_before_any_change(
        field: str, value: object, message: str) -> None:
    sched = scheduler()
    r = Request(0, 8, 4)
    setattr(r, field, value)
    before = state_of(sched)
    with pytest.raises(InvalidRequestError, match=message):
        sched.add(r, 0.0)
    assert state_of(sched) == before
    assert sched.requests == {} and sched.drain_events() == []
    # the same id, fixed, is not a duplicate: nothing of the refused add is left
    assert_the_fresh_request_runs(sched)


def test_the_constructor_and_add_apply_one_set_of_rules() -> None:
    """``Request.check`` is the constructor's check: the same message either way."""
    with pytest.raises(InvalidRequestError, match="prompt_tokens must be an int, got float"):
        Request(0, 2.5, 4)  # type: ignore[arg-type]
    r = Request(0, 8, 4)
    r.check()  # a valid request: nothing raised, nothing changed
    assert (r.prompt_tokens, r.prefill_target) == (8, 8)
    r.prompt_tokens = 2.5  # type: ignore[assignment]
    with pytest.raises(InvalidRequestError, match="prompt_tokens must be an int, got float"):
        r.check()


# --- requests that are not fresh ------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"status": RequestStatus.RUNNING}, "got status running"),
    ({"status": RequestStatus.FINISHED}, "got status finished"),
    ({"status": RequestStatus.REJECTED}, "got status rejected"),
    ({"computed": 5}, "no progress, got computed=5"),
    ({"computed": 100}, "no progress, got computed=100"),
    ({"output_done": 1}, "no progress, got output_done=1"),
    ({"retractions": 1}, "no progress, got retractions=1"),
    ({"hit_tokens": 4}, "no progress, got hit_tokens=4"),
    ({"prefill_target": 100}, r"prefill_target is its prompt \(8 tokens\), got 100"),
    ({"prefill_target": 3}, r"prefill_target is its prompt \(8 tokens\), got 3"),
])
def test_a_request_with_progress_is_refused(kwargs: dict, message: str) -> None:
    """Was: queued, then a permanent wedge (RUNNING, FINISHED), kv tokens 3 vs computed 8
    (computed=5), a wait forever (computed=100), 100 tokens prefilled for an 8-token
    prompt (prefill_target=100)."""
    sched = scheduler()
    before = state_of(sched)
    with pytest.raises(InvalidRequestError, match=message):
        sched.add(Request(0, 8, 4, **kwargs), 0.0)
    assert state_of(sched) == before
    assert sched.requests == {} and sched.drain_events() == []
    assert_the_fresh_request_runs(sched)


def test_progress_set_after_construction_is_refused_too() -> None:
    sched = scheduler()
    r = Request(0, 8, 4)
    r.status = RequestStatus.RUNNING
    with pytest.raises(InvalidRequestError, match="got status running"):
        sched.add(r, 0.0)
    r = Request(0, 8, 4)
    r.prompt_tokens = 16  # its prefill_target (8) is stale: it would prefill half
    with pytest.raises(InvalidRequestError, match=r"its prompt \(16 tokens\), got 8"):
        sched.add(r, 0.0)
    assert sched.requests == {} and sched.drain_events() == []
    assert_the_fresh_request_runs(sched)


def test_an_explicit_default_prefill_target_is_fresh() -> None:
    """``prefill_target`` equal to the prompt (what the constructor's default sets) is a
    fresh request: queued and run like one built without it."""
    sched = scheduler()
    r = Request(0, 8, 4, prefill_target=8)
    assert sched.add(r, 0.0) is True
    batch = sched.step(0.0)
    assert batch.prefills == (PrefillChunk(0, 0, 8),)
    sched.complete(batch, StepOutcome(0.01), 0.01)
    assert (r.computed, sched.kv.tokens(0)) == (8, 8)


def test_a_request_that_already_holds_pages_is_refused() -> None:
    """Was: queued, then prefilled on top of the 8 tokens the KV manager already held
    (kv tokens 16 vs computed 8)."""
    sched = scheduler()
    sched.kv.allocate([(0, 8)])
    sched.kv.commit(0, 8)
    before = state_of(sched)
    with pytest.raises(InvalidRequestError, match="already holds pages"):
        sched.add(Request(0, 8, 4), 0.0)
    assert state_of(sched) == before and sched.drain_events() == []
    assert sched.kv.tokens(0) == 8
    # sibling: another id is queued and prefilled from 0
    r = Request(1, 8, 4)
    assert sched.add(r, 0.0) is True
    batch = sched.step(0.0)
    assert batch.prefills == (PrefillChunk(1, 0, 8),)
    sched.complete(batch, StepOutcome(0.01), 0.01)
    assert (r.computed, sched.kv.tokens(1), sched.kv.tokens(0)) == (8, 8, 8)


def test_a_refused_add_leaves_the_other_requests_as_they_were() -> None:
    sched = scheduler()
    assert sched.add(Request(1, 12, 4), 0.0) is True
    sched.drain_events()
    before = state_of(sched)
    with pytest.raises(InvalidRequestError, match="got computed=5"):
        sched.add(Request(0, 8, 4, computed=5), 0.5)
    assert state_of(sched) == before and sched.drain_events() == []
    assert list(sched.requests) == [1] and [w.rid for w in sched.waiting] == [1]
    assert sched.add(Request(0, 8, 4), 0.5) is True
    assert [w.rid for w in sched.waiting] == [1, 0]


# --- Scheduler.request ids ------------------------------------------------------------------


@pytest.mark.parametrize("rid", [True, 1.0, "1", None])
def test_request_refuses_an_id_that_is_not_an_int(rid: object) -> None:
    """Was: ``request(True)`` and ``request(1.0)`` returned request 1 (dict key aliasing)."""
    sched = scheduler()
    sched.add(Request(0, 8, 4), 0.0)
    sched.add(Request(1, 12, 4), 0.0)
    before = state_of(sched)
    with pytest.raises(InvalidDemandError, match="request ids are ints"):
        sched.request(rid)  # type: ignore[arg-type]
    assert state_of(sched) == before
    assert sched.request(1).prompt_tokens == 12
    assert sched.request(np.int64(1)).prompt_tokens == 12  # type: ignore[arg-type]
    with pytest.raises(UnknownRequestError, match="no request 5"):
        sched.request(5)


def test_one_request_object_is_queued_by_one_scheduler() -> None:
    """Was: the same waiting Request queued by two schedulers, each then mutating its
    status, computed and output_done under the other. The second add is refused and
    changes nothing; a copy (dataclasses.replace) is fresh and runs there; the original
    stays queued by the first (still waiting, nothing computed)."""
    first, second = scheduler(), scheduler()
    r = Request(0, 8, 4)
    assert first.add(r, 0.0) is True
    before = state_of(second)
    with pytest.raises(InvalidRequestError, match="already queued by another scheduler"):
        second.add(r, 0.0)
    assert state_of(second) == before and second.drain_events() == []
    copy = dataclasses.replace(r)
    assert second.add(copy, 0.0) is True
    batch = second.step(0.0)
    assert batch.prefills == (PrefillChunk(0, 0, 8),)
    assert (r.status, r.computed, copy.computed) == (RequestStatus.WAITING, 0, 0)
    second.complete(batch, StepOutcome(0.01), 0.01)
    assert (copy.computed, r.computed) == (8, 0)
    with pytest.raises(InvalidRequestError, match="duplicate request id 0"):
        first.add(r, 0.0)  # its own scheduler: the duplicate id, as before
