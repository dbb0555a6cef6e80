"""Round-12 breaker findings in the request layer: counts, flags, batches and caller
demands of the wrong type or range each get the typed error of the call and change
nothing; each refusal has a sibling where the good input of the same call moves the state.

Chain (as tests/test_hostile_request_layer.py): window (W = 8 tokens) | full, P = 4 tokens
per page, 128 B pages in 64 KiB; request 0 holds 5 tokens: ceil(5 / 4) = 2 pages per band.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.test_hostile_request_layer import manager, prefilled, state

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.batch import MAX_RUN_STEPS
from kvchain.requests.manager import KVManager


def speculative(spec_tokens: int = 2) -> KVManager:
    """The chain above with ``spec_tokens`` drafts; requests 0 and 1 hold 5 tokens and
    pages for 5 + 1 + 2 = 8 (a speculative step's take)."""
    layout = plan_layout([declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
                         64 * 1024, 4)
    kv = KVManager(Chain(layout), None, spec_tokens)
    kv.allocate([(0, 5), (1, 5)])
    kv.commit(0, 5)
    kv.commit(1, 5)
    kv.allocate([(0, 3), (1, 3)])
    return kv


@pytest.mark.parametrize(("tokens", "error"), [
    (np.int8(125), "125 tokens not covered"),  # 5 + 125 = 130 tokens: read as a Python int
    (np.uint64(2**64 - 1), "tokens must be an int in"), (np.int64(2**63 - 1), "must be an int"),
    (2**62 + 1, "must be an int in"), (True, "must be an int in"), (1.0, "must be an int in")])
def test_commit_refuses_a_count_a_numpy_sum_would_wrap(tokens, error) -> None:
    """5 + np.int8(125) was int8 -126 (numpy's wrap-around): request 0 went to -126 tokens;
    np.uint64(2**64 - 1) wrapped to 4. Now a count is a Python int in [0, 2**62], so 125
    is 125 tokens, more than its 2 pages per band hold."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match=error):
        kv.commit(0, tokens)
    assert state(kv) == before and kv.tokens(0) == 5
    kv.commit(0, np.int8(3))  # the sibling: a small numpy count is read as 3
    assert kv.tokens(0) == 8


def test_a_generator_batch_is_read_once_not_as_empty() -> None:
    """``allocate`` of a generator used to return Demand((0, 0)): the type scan used it up
    and request 1 got nothing. Now read once: 8 tokens are 2 pages in each band."""
    kv = manager()
    assert kv.allocate((rid, 8) for rid in (1,)).pages == (2, 2)
    assert 1 in kv and kv.held(1).spans == ((0, 2), (0, 2))
    assert kv.plan((rid, 3) for rid in (2,)).total.pages == (1, 1)


@pytest.mark.parametrize("demand", [Demand((0.5, 0)), Demand((1.5, 1)), Demand(("1", 1)),
                                    Demand((True, 1)), Demand((-1, 1)), Demand((2**70, 1)),
                                    Demand((1,))])
def test_caller_demands_must_be_int_pages_per_band(demand) -> None:
    """A caller's Demand((0.5, 0)) was read as (0, 0) (request 1 registered with no page),
    (1.5, 1) as (1, 1), ("1", 1) coerced, 2**70 a bare OverflowError."""
    kv = prefilled()
    before = state(kv, [0, 1])
    with pytest.raises(InvalidDemandError, match="request 1: 1 tokens, demand"):
        kv.allocate([(1, 1)], [demand])
    assert state(kv, [0, 1]) == before and 1 not in kv
    assert kv.allocate([(1, 1)], [Demand((1, 1))]).pages == (1, 1)  # the sibling


@pytest.mark.parametrize("demands", [(d for d in [Demand((1, 1))]), Demand((1, 1)), 3, None,
                                     [Demand((1, 1)), Demand((1, 1))]])
def test_caller_demands_must_be_a_sequence_of_one_per_row(demands) -> None:
    kv = prefilled()
    before = state(kv, [0, 1])
    if demands is None:  # None: computed here (the sibling)
        assert kv.allocate([(1, 1)], demands).pages == (1, 1)
        return
    with pytest.raises(InvalidDemandError, match="demands"):
        kv.allocate([(1, 1)], demands)
    assert state(kv, [0, 1]) == before


@pytest.mark.parametrize("rids", [np.array(0), np.array([[0]])])
def test_an_id_array_that_is_not_one_dimensional_is_refused(rids) -> None:
    """A 0-d array is registered Iterable but iterating it raised a bare TypeError."""
    kv = prefilled()
    before = state(kv)
    for call in (lambda: kv.decode_demands(rids), lambda: kv.commit_decodes(rids),
                 lambda: kv.skip_decodes(rids, 1), lambda: kv.decode_run(rids, 1),
                 lambda: kv.reads.block_table(rids, 1), lambda: kv.reads.held_per_band(rids),
                 lambda: kv.audit_settled(rids)):
        with pytest.raises(InvalidDemandError, match="sequence of request ids"):
            call()
    assert state(kv) == before
    kv.commit_decodes(np.array([0]))  # the sibling: a 1-D id array is a batch
    assert kv.tokens(0) == 6


def test_step_counts_out_of_range_are_typed() -> None:
    """skip_decodes(2**64) was OverflowError, decode_run(2**40) a MemoryError (8 TiB of
    arrays), decode_run(2**70) numpy's ValueError."""
    kv = prefilled()
    before = state(kv)
    for call in (lambda: kv.skip_decodes([0], 2**64), lambda: kv.decode_run([0], 2**40),
                 lambda: kv.decode_run([0], 2**70), lambda: kv.decode_run([0], 0),
                 lambda: kv.decode_run([0], MAX_RUN_STEPS + 1),
                 lambda: kv.decode_demands([0], drafts=2**63)):
        with pytest.raises(InvalidDemandError, match="must be an int in"):
            call()
    assert state(kv) == before
    # the siblings: 3 quiet steps (5 -> 8 tokens, still 2 pages) and a run of 2 steps
    kv.skip_decodes([0], np.int64(3))
    assert kv.tokens(0) == 8
    demand, _released = kv.decode_run([0], 2)
    assert demand.shape == (2, 1, 2) and demand[0, 0].tolist() == [1, 1]


def test_drafts_past_the_managers_spec_tokens_are_refused() -> None:
    """On a manager without speculation (k = 0) verify(drafts=2) committed 2 tokens and
    decode_demands(drafts=3) priced them: its window slack and checkpoints are sized for
    k drafts. Now drafts is an int in [0, k]."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match=r"drafts must be an int in \[0, 0\]"):
        kv.verify([0], [1], 2)
    with pytest.raises(InvalidDemandError, match=r"drafts must be an int in \[0, 0\]"):
        kv.decode_demands([0], drafts=3)
    assert state(kv) == before
    spec = speculative(2)  # the sibling: k = 2 drafts, 1 accepted: 5 + 1 + 1 = 7 tokens
    spec.verify([0, 1], [1, 2], 2)
    assert spec.tokens(0) == 7 and spec.tokens(1) == 8


@pytest.mark.parametrize("accepted", [None, 5, "1"])
def test_verify_refuses_accepted_that_is_not_a_sequence(accepted) -> None:
    kv = speculative(2)
    before = state(kv, [0, 1])
    with pytest.raises(InvalidDemandError, match="accepted drafts must be"):
        kv.verify([0, 1], accepted, 2)
    assert state(kv, [0, 1]) == before


def test_flags_must_be_bools() -> None:
    """block_table(physical="no") returned physical ids and free(insert=1) freed."""
    kv = prefilled()
    before = state(kv)
    with pytest.raises(InvalidDemandError, match="physical must be a bool"):
        kv.reads.block_table([0], 1, physical="no")  # type: ignore[arg-type]
    with pytest.raises(InvalidDemandError, match="insert must be a bool"):
        kv.free(0, insert=1)  # type: ignore[arg-type]
    assert state(kv) == before
    assert kv.reads.block_table([0], 1, physical=False).tolist() == [kv.page_table(0, 1)
                                                                     .tolist()]
    kv.free(0, insert=False)  # the sibling: freed
    assert 0 not in kv


@pytest.mark.parametrize("rid", [True, 1.0, None, "1"])
def test_demands_refuse_an_id_that_is_not_an_int(rid) -> None:
    """demand(False, 3) was request 0's demand (False == 0), demand(None, 3) priced a new
    request."""
    kv = prefilled()
    kv.allocate([(1, 5)])
    kv.commit(1, 5)
    for call in (lambda: kv.demand(rid, 3), lambda: kv.demand_pair(rid, 3),
                 lambda: kv.resume_demand(rid), lambda: kv.suspensions.is_suspended(rid)):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            call()
    # the siblings: request 1 at 5 tokens in 2 pages per band (room for 8): 3 more tokens
    # need no new page; a new request of 3 tokens needs ceil(3 / 4) = 1 page per band
    assert kv.demand(1, 3).pages == (0, 0) and kv.demand(7, 3).pages == (1, 1)
