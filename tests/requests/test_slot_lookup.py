"""The request-id -> slot memo of a decode step (``SlotIndex.lookup``): an equal batch of
ids is answered by one tuple comparison plus a look at the positions of ids 0 and 1 (the
only places an equal tuple can hold a bool), and still refuses a bool there."""

from __future__ import annotations

import pytest

from kvchain.alloc import Chain
from kvchain.errors import InvalidDemandError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests import lookup as lookup_module
from kvchain.requests.manager import KVManager


def _running(n: int) -> KVManager:
    """``n`` requests (ids 0 .. n - 1) of 5 tokens each on a window (W = 8) | full chain
    of 4-token pages."""
    kv = KVManager(Chain(plan_layout([declared_class(LC.WINDOW, 64, 8),
                                      declared_class(LC.FULL, 64)], 200_000_000, 4)))
    kv.allocate([(rid, 5) for rid in range(n)])
    for rid in range(n):
        kv.commit(rid, 5)
    return kv


def test_a_bool_in_an_equal_batch_is_refused_at_the_position_of_request_1() -> None:
    kv = _running(40)
    ids = [7, 1, 9, 0, *range(10, 40)]
    kv.decode_demands(ids)  # warms the memo with these ids (1 at position 1, 0 at 3)
    for bad in ([7, True, 9, 0, *range(10, 40)], [7, 1, 9, False, *range(10, 40)]):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            kv.decode_demands(bad)
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            kv.commit_decodes(bad)
    # nothing moved: every request still at its 5 prompt tokens
    assert {kv.tokens(rid) for rid in range(40)} == {5}
    assert len(kv.decode_demands(ids)) == 34  # the good batch is still served


def test_a_batch_naming_request_0_twice_is_scanned_whole() -> None:
    index = _running(4)._rows.index  # the memo itself: the reads refuse a bool before it
    index.known_slots((0, 2, 0, 3))  # memo with 0 named twice: no positions, a whole scan
    with pytest.raises(InvalidDemandError, match="request ids are ints"):
        index.known_slots((0, 2, False, 3))


def test_the_public_reads_refuse_a_bool_before_the_memo() -> None:
    kv = _running(4)
    full = kv.geom.full
    kv.reads.block_table([3, 1, 2], full)
    for call in (lambda: kv.reads.block_table([3, True, 2], full),
                 lambda: kv.reads.held_per_band([3, True]),
                 lambda: kv.reads.owned_per_band([True]),
                 lambda: kv.audit_settled([True]),
                 lambda: kv.page_table(True, full), lambda: kv.tokens(True),
                 lambda: kv.held(True), lambda: kv.pages(True), lambda: True in kv):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            call()
    for call in (lambda: kv.reads.block_table(None, full),  # type: ignore[arg-type]
                 lambda: kv.audit_settled(None)):  # type: ignore[arg-type]
        with pytest.raises(InvalidDemandError, match="sequence of request ids"):
            call()


def test_the_sibling_positions_that_miss_request_1_alias_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted defect: the memo records no position to check. Then True, equal to 1 as a
    # dict key and in the tuple comparison, is served request 1's slot, what the check
    # above refuses. (The manager's public calls refuse a bool up front too, through
    # kvchain.requests.batch.request_ids and check_rid; the memo is the last line.)
    monkeypatch.setattr(lookup_module, "positions_of_zero_one", lambda ids: ())
    index = _running(4)._rows.index
    good = index.known_slots((3, 1, 2)).tolist()
    assert index.known_slots((3, True, 2)).tolist() == good
