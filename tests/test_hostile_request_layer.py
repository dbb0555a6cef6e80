"""Round-10 breaker findings in the request layer and the scheduler: each bad input gets a
typed error (:mod:`kvchain.errors`) and changes nothing (the state before == after), and
each refusal has a sibling where the good input of the same call does change the state
(so the "nothing changed" check could fail)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import InvalidDemandError, InvalidRequestError, UnknownRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, RequestStatus, StepOutcome
from kvchain.sched.scheduler import Scheduler

P = 4  # tokens per page


def manager(cached: bool = False) -> KVManager:
    """A window|full chain (W = 8 tokens, 32 B per token per class, P = 4): 128 B pages in
    a 64 KiB buffer, room for far more than these tests take."""
    layout = plan_layout([declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
                         64 * 1024, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=8) if cached else None
    return KVManager(Chain(layout), cache)


def state(kv: KVManager, rids=range(4)) -> tuple:
    """Everything a refused call may not change: the chain's snapshot and epoch, the
    requests held, and each one's tokens, counts and page tables."""
    rows = {rid: (kv.tokens(rid), kv.held(rid),
                  [kv.page_table(rid, b).tolist() for b in range(kv.geom.num_bands)])
            for rid in rids if rid in kv}
    return kv.chain.snapshot(), kv.chain.epoch, kv.num_requests, rows


def prefilled(tokens: int = 5) -> KVManager:
    """Request 0 with ``tokens`` committed: 5 tokens hold ceil(5 / 4) = 2 full pages (room
    for 8), so a decode commit of 1 or 2 tokens is covered by its pages."""
    kv = manager()
    kv.allocate([(0, tokens)])
    kv.commit(0, tokens)
    return kv


# --- KVManager.commit_decodes([0, 0]) -------------------------------------------------------


def test_commit_decodes_refuses_a_request_named_twice() -> None:
    """Was: 2 tokens committed to request 0 (documented), while allocate refuses a
    duplicate; now refused the same way, before any change."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match="request 0 appears twice in one decode"):
        kv.commit_decodes([0, 0])  # 5 + 2 = 7 tokens would be covered: refused for the id
    assert state(kv) == before
    kv.commit_decodes([0])  # the sibling: one token each, committed
    assert kv.tokens(0) == 6 and state(kv) != before


def test_a_decode_batch_refuses_a_request_named_twice() -> None:
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match="request 0 appears twice in one decode"):
        kv.decode_demands([0, 0])
    assert state(kv) == before


# --- KVManager.decode_demands([99]) ---------------------------------------------------------


@pytest.mark.parametrize("rids", [[99], [0, 99], (99, 0)])
def test_decode_demands_refuses_an_unknown_id(rids) -> None:
    """Was: a plan of request 99's first token that ``apply`` turned into a new request."""
    kv = prefilled()
    before = state(kv, [0, 99])
    with pytest.raises(UnknownRequestError, match="request 99 holds no pages"):
        kv.decode_demands(rids)
    assert state(kv, [0, 99]) == before and 99 not in kv


def test_a_decode_batch_of_known_requests_is_applied() -> None:
    """The sibling: request 0 at 8 tokens fills its 2 full pages; its decode needs a third
    full page (token 8 starts page 2), which ``apply`` takes."""
    kv = prefilled(8)
    before = state(kv)
    plan = kv.decode_demands([0])
    assert kv.apply(plan).pages[kv.geom.full] == 1
    assert kv.held(0).span(kv.geom.full) == (0, 3) and state(kv) != before
    assert kv.num_requests == 1


# --- KVManager.allocate(None) and the other batch arguments ----------------------------------


@pytest.mark.parametrize("batch", [None, 5, 1.5, "ab", b"ab"])
def test_allocate_of_a_non_sequence_names_the_argument(batch) -> None:
    """Was: a bare TypeError (``None`` is not iterable)."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match="batch must be a sequence of"):
        kv.allocate(batch)
    with pytest.raises(InvalidDemandError, match="batch must be a sequence of"):
        kv.plan(batch)
    assert state(kv) == before


@pytest.mark.parametrize("tokens", [2**62 + 1, 10**30])
def test_allocate_refuses_a_token_count_past_the_tables_int64(tokens) -> None:
    """Was: numpy's bare OverflowError (``Python int too large to convert to C long``);
    2**62 itself is a count (priced, then refused by the chain as too large)."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match=r"tokens \(an int in \[0, 2\*\*62\]\)"):
        kv.allocate([(0, tokens)])
    assert state(kv) == before


@pytest.mark.parametrize("resumes", [5, 1.5, True])
def test_allocate_refuses_resumes_that_are_not_a_sequence(resumes) -> None:
    """Was: a bare TypeError (``'int' object is not iterable``)."""
    kv = prefilled()
    before = state(kv, [0, 1])
    with pytest.raises(InvalidDemandError, match="resumes must be a sequence"):
        kv.allocate([(1, 1)], resumes=resumes)
    assert state(kv, [0, 1]) == before and 1 not in kv


@pytest.mark.parametrize("rids", [None, 3, "01", [0.0], [None], [True], [0, "1"]])
def test_the_batch_calls_refuse_ids_that_are_not_a_sequence_of_ints(rids) -> None:
    """Siblings of ``allocate(None)``: every call that takes a list of request ids. A
    float 0.0 would read request 0's row (``0.0 == 0`` as a dict key), as a bool would."""
    kv = prefilled()
    before = state(kv)
    for call in (kv.decode_demands, kv.commit_decodes, kv.reclaim_window_pages,
                 lambda r: kv.decode_run(r, 2), lambda r: kv.skip_decodes(r, 1)):
        with pytest.raises(InvalidDemandError):
            call(rids)
    assert state(kv) == before


def test_apply_of_none_is_a_typed_error() -> None:
    """Was: an AttributeError (``None`` looked up as an issued plan matched the registry's
    ``dict.get`` default); now the plan check's own StalePlanError, nothing changed."""
    from kvchain.errors import StalePlanError

    kv = prefilled()
    before = state(kv)
    with pytest.raises(StalePlanError):
        kv.apply(None)  # type: ignore[arg-type]
    assert state(kv) == before
    kv.apply(kv.plan([(1, 4)]))  # the sibling: an issued plan (a new request's 4 tokens:
    assert 1 in kv and state(kv) != before  # one page per band) is applied


def test_a_batch_of_numpy_ids_is_read_as_ints() -> None:
    """The sibling: numpy integers are ids (a decode loop over an index array)."""
    import numpy as np

    kv = prefilled()
    kv.commit_decodes(np.array([0]))
    assert kv.tokens(0) == 6


@pytest.mark.parametrize("rid", [True, 0.0, None, "0"])
def test_one_request_calls_refuse_an_id_that_is_not_an_int(rid) -> None:
    """``commit(True, 1)`` committed to request 1, ``free(True)`` freed it (``True == 1``
    as a dict key); a float or string id is refused the same way."""
    kv = manager()
    kv.allocate([(0, 5), (1, 5)])
    kv.commit(0, 5)
    kv.commit(1, 5)
    before = state(kv)
    for call in (lambda: kv.commit(rid, 1), lambda: kv.free(rid),
                 lambda: kv.release_window_tail(rid)):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            call()
    assert state(kv) == before
    assert kv.commit(1, 1) == 0 and kv.tokens(1) == 6  # the sibling: an int id commits



@pytest.mark.parametrize("rid", [True, 1.0, None, "1"])
def test_one_request_queries_refuse_an_id_that_is_not_an_int(rid) -> None:
    """The read-only queries answered ``tokens(True) == tokens(1)`` (``True == 1`` as a
    dict key, and so did ``1.0``) and ``tokens(None) == 0`` as if ``None`` named a
    request that holds nothing; now each is the typed error of the write calls."""
    kv = manager(cached=True)
    kv.allocate([(0, 5), (1, 5)])
    kv.commit(0, 5)
    kv.commit(1, 5)
    before = state(kv)
    for query in (kv.tokens, kv.held, kv.pages, kv.chunk_cut, kv.recompute_tokens,
                  kv.partial_tokens, kv.hit_holds, kv.hit_tokens, kv.shared_by_others,
                  kv.suspend_bytes, kv.touch, kv.__contains__,
                  lambda r: kv.page_table(r, 0)):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            query(rid)
    assert state(kv) == before
    # the sibling: an int id (a numpy one too) is answered, one that holds nothing with 0
    assert kv.tokens(1) == 5 and kv.tokens(np.int64(1)) == 5 and kv.tokens(7) == 0
    assert 1 in kv and 7 not in kv


def test_attach_refuses_a_request_that_already_holds_pages() -> None:
    """A second attach of request 0 would bind it a second row; refused, nothing moves."""
    kv = manager(cached=True)
    assert kv.attach(0, (1, 2), 10) == 0
    kv.allocate([(0, 10)])
    before = state(kv, [0, 1])
    with pytest.raises(InvalidRequestError, match="request 0 already holds pages"):
        kv.attach(0, (1, 2), 10)
    assert state(kv, [0, 1]) == before
    assert kv.attach(1, (1, 2), 10) == 0 and 1 in kv  # the sibling: a new id attaches


# --- page keys of the wrong length ------------------------------------------------------------


def test_a_request_with_more_page_keys_than_prompt_tokens_is_refused() -> None:
    """A key covers a whole page of >= 1 token: never more keys than prompt tokens."""
    with pytest.raises(InvalidRequestError, match="6 page keys for a prompt of 5 tokens"):
        Request(0, 5, 1, page_keys=tuple(range(6)))
    assert Request(0, 5, 1, page_keys=tuple(range(5))).page_keys == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("n", [0, 1, 3, 13])
def test_attach_refuses_keys_other_than_one_per_whole_page(n) -> None:
    """A 10-token prompt has floor(10 / 4) = 2 whole pages: exactly 2 keys. Fewer used to
    pass (the insert then dropped its last pages from the cache), more too, up to 10."""
    kv = manager(cached=True)
    before = state(kv, [0])
    with pytest.raises(InvalidRequestError, match=f"{n} page keys for a prompt of 10 tokens"):
        kv.attach(0, tuple(range(1, n + 1)), 10)
    assert state(kv, [0]) == before and 0 not in kv
    assert kv.attach(0, (1, 2), 10) == 0 and 0 in kv  # the sibling: 2 keys, a cold miss


@pytest.mark.parametrize(("keys", "prompt"), [("ab", 8), ([1.0, 2.0], 8), ([True, 2], 8),
                                              (None, 8), ((1, 2), 0), ((1, 2), 8.0)])
def test_attach_refuses_keys_and_prompts_of_the_wrong_type(keys, prompt) -> None:
    kv = manager(cached=True)
    before = state(kv, [0])
    with pytest.raises(InvalidRequestError):
        kv.attach(0, keys, prompt)
    assert state(kv, [0]) == before and 0 not in kv


def scheduler(cached: bool = False) -> Scheduler:
    return Scheduler(manager(cached))


def sched_state(sched: Scheduler) -> tuple:
    return (state(sched.kv), dict(sched.requests), [r.rid for r in sched.waiting],
            list(sched.running), sched.counters, len(sched._events))


@pytest.mark.parametrize("n", [1, 3])
def test_scheduler_add_refuses_page_keys_of_the_wrong_length(n) -> None:
    """The scheduler knows P: a 10-token prompt takes floor(10 / 4) = 2 keys, checked at
    ``add`` (with or without a cache: keys for other pages are wrong either way)."""
    for cached in (False, True):
        sched = scheduler(cached)
        before = sched_state(sched)
        with pytest.raises(InvalidRequestError, match=f"{n} page keys .* expected"):
            sched.add(Request(0, 10, 2, page_keys=tuple(range(1, n + 1))), 0.0)
        assert sched_state(sched) == before and not sched.requests
        assert sched.add(Request(0, 10, 2, page_keys=(1, 2)), 0.0)  # the sibling


# --- StepOutcome and Scheduler.complete --------------------------------------------------------


@pytest.mark.parametrize("duration", [math.nan, -1.0, math.inf, -math.inf, True, "1", None])
def test_step_outcome_refuses_a_duration_that_is_not_a_finite_time(duration) -> None:
    with pytest.raises(InvalidRequestError, match="duration_s must be a finite number"):
        StepOutcome(duration)


@pytest.mark.parametrize("kwargs", [
    {"stopped": [1]}, {"stopped": {1.0}}, {"stopped": {True}}, {"stopped": "1"},
    {"accepted": {0: -1}}, {"accepted": {0: 1.5}}, {"accepted": {True: 1}},
    {"accepted": {0: True}}, {"accepted": [(0, 1)]}, {"accepted": {"0": 1}},
])
def test_step_outcome_refuses_ids_and_counts_of_the_wrong_type(kwargs) -> None:
    with pytest.raises(InvalidRequestError, match="a step outcome's"):
        StepOutcome(0.01, **kwargs)


def test_step_outcome_of_good_values() -> None:
    out = StepOutcome(0, frozenset({1}), {1: 0})  # an int duration is a time too
    assert (out.duration_s, out.stopped, dict(out.accepted)) == (0, {1}, {1: 0})


def decoding() -> tuple[Scheduler, object]:
    """A scheduler with request 0 (8-token prompt, 4 outputs) prefilled: its next step
    is one decode of request 0."""
    sched = scheduler()
    assert sched.add(Request(0, 8, 4), 0.0)
    sched.complete(sched.step(0.0), StepOutcome(0.01), 0.01)
    batch = sched.step(0.01)
    assert [d.rid for d in batch.decodes] == [0] and not batch.prefills
    return sched, batch


@pytest.mark.parametrize("outcome", [StepOutcome(0.01, frozenset({7})),
                                     StepOutcome(0.01, accepted={7: 1}),
                                     StepOutcome(0.01, frozenset({0, 7}))])
def test_complete_refuses_an_outcome_naming_a_request_outside_the_batch(outcome) -> None:
    """Was: an unknown id in ``stopped`` / ``accepted`` dropped silently."""
    sched, batch = decoding()
    before = sched_state(sched)
    with pytest.raises(InvalidRequestError, match="not"):
        sched.complete(batch, outcome, 0.02)
    assert sched_state(sched) == before


@pytest.mark.parametrize("now", [math.nan, -1.0, math.inf, True, "0.02"])
def test_complete_refuses_a_clock_reading_that_is_not_a_time(now) -> None:
    """``add`` and ``schedule`` checked ``now``; ``complete`` did not."""
    sched, batch = decoding()
    before = sched_state(sched)
    with pytest.raises(InvalidRequestError, match="time must be a finite number"):
        sched.complete(batch, StepOutcome(0.01), now)
    with pytest.raises(InvalidRequestError, match="expected a StepOutcome"):
        sched.complete(batch, 0.01, 0.02)  # type: ignore[arg-type]
    assert sched_state(sched) == before


def test_complete_stops_a_request_of_the_batch() -> None:
    """The sibling: the batch's own request in ``stopped`` finishes it (1 of 4 outputs
    after the prefill, 2 after this decode)."""
    sched, batch = decoding()
    sched.complete(batch, StepOutcome(0.01, frozenset({0})), 0.02)
    assert sched.requests[0].status is RequestStatus.FINISHED
    assert sched.requests[0].output_done == 2 and sched.kv.num_requests == 0


# --- Request: the hostile-input walk ----------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"computed": -1}, {"computed": 1.0}, {"prefill_target": True}, {"output_done": None},
    {"retractions": -2}, {"hit_tokens": 2.5}, {"status": "waiting"}, {"arrival_s": True},
    {"max_tokens": True}, {"page_keys": [1]}, {"page_keys": (1.0,)},
])
def test_request_refuses_progress_fields_of_the_wrong_type(kwargs) -> None:
    with pytest.raises(InvalidRequestError):
        Request(0, 8, 2, **kwargs)


def test_scheduler_add_refuses_what_is_not_a_request() -> None:
    sched = scheduler()
    before = sched_state(sched)
    with pytest.raises(InvalidRequestError, match="expected a Request"):
        sched.add((0, 8, 2), 0.0)  # type: ignore[arg-type]
    assert sched_state(sched) == before
