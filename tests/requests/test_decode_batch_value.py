"""The decode batch is an immutable value (``DecodeBatch``): priced once by
``KVManager.decode_demands``, trusted by ``allocate`` of the same manager for the same
requests, validated once otherwise; a batch without one request is a new value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvchain.alloc import Demand
from kvchain.errors import InvalidDemandError, UnknownRequestError
from kvchain.requests.batch import DecodeBatch

from .window_full import manager, prefilled, state


def test_the_value_by_hand_and_without_a_row() -> None:
    # P = 4, W = 40 (nothing leaves the window yet). Request 0: 4 tokens on 1 page, its
    # token 4 starts page 1 in both bands: (1, 1). Request 1: 5 tokens on 2 pages,
    # token 5 is on page 1: (0, 0). Request 2: 8 tokens on 2 pages, token 8 starts
    # page 2: (1, 1). Total (2, 2).
    kv = prefilled([4, 5, 8])
    got = kv.decode_demands([0, 1, 2])
    assert isinstance(got, DecodeBatch)
    assert got.rids == (0, 1, 2) and got.drafts == 0
    assert list(got) == [Demand((1, 1)), Demand((0, 0)), Demand((1, 1))]
    assert got.matrix.tolist() == [[1, 1], [0, 0], [1, 1]]
    assert got.nonzero == (0, 2) and got.total == Demand((2, 2))
    assert got.needs.tolist() == [[1, 1], [1, 1]]  # the matrix's non-empty rows
    # without request 0: rows 1, 2 remain (now 0, 1); total (1, 1), request 2 at row 1
    less = got.without(0)
    assert less.rids == (1, 2) and less.nonzero == (1,) and less.total == Demand((1, 1))
    assert less.matrix.tolist() == [[0, 0], [1, 1]] and less.needs.tolist() == [[1, 1]]
    # without the empty request 1: total unchanged, request 2 moves to row 1
    assert got.without(1).total == Demand((2, 2)) and got.without(1).nonzero == (0, 1)
    assert got.without(1).without(0).without(0).total == Demand((0, 0))
    # the original value is untouched by either
    assert got.total == Demand((2, 2)) and got.rids == (0, 1, 2)
    with pytest.raises(IndexError):
        got.without(3)


def test_the_value_cannot_be_changed_in_place() -> None:
    kv = prefilled([4, 5, 8])
    got = kv.decode_demands([0, 1, 2])
    with pytest.raises(ValueError):
        got.matrix[0, 0] = 0  # read-only array
    with pytest.raises(ValueError):
        got.needs[0, 0] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.total = Demand((0, 0))  # type: ignore[misc]
    assert not hasattr(got, "append") and not hasattr(got, "__setitem__")
    assert not hasattr(got, "__delitem__")
    assert got.without(0).needs.flags.writeable is False
    assert got.without(1).needs.flags.writeable is False


def test_allocate_takes_its_own_value_as_priced() -> None:
    kv = prefilled([4, 5, 8])
    got = kv.decode_demands([0, 1, 2])
    assert kv.allocate([(0, 1), (1, 1), (2, 1)], got) == Demand((2, 2))
    assert [kv.held(rid).span(kv.geom.full)[1] for rid in (0, 1, 2)] == [2, 2, 3]


def test_a_value_from_another_manager_is_validated_once() -> None:
    a, b = prefilled([4, 5, 8]), prefilled([4, 5, 8])
    rids = (0, 1, 2)
    # b's value for the same state: validated by a, then taken as its demands say
    assert a.allocate([(rid, 1) for rid in rids], b.decode_demands(rids)) == Demand((2, 2))
    # planted: a value of b whose demands have 3 bands on this 2-band chain is refused
    # by a (validated), and nothing changes; the same forged value is refused as a list
    a2, b2 = prefilled([4, 5, 8]), prefilled([4, 5, 8])
    good = b2.decode_demands(rids)
    bad = (Demand((1, 1, 1)), good[1], good[2])
    forged = DecodeBatch(b2, good.rids, 0, bad, good.nonzero, good.needs, good.total)
    before = state(a2, (0, 1, 2))
    for demands in (forged, list(bad)):
        with pytest.raises(InvalidDemandError):
            a2.allocate([(rid, 1) for rid in rids], demands)
        assert state(a2, (0, 1, 2)) == before
    # the same forged value naming a2 as its owner is refused too: a value a2 did not
    # issue (built by hand, or a copy of one of its own with other demands) is validated
    # like any list, never trusted
    own = dataclasses.replace(forged, owner=a2)
    copied = dataclasses.replace(a2.decode_demands(rids), demands=bad)
    for demands in (own, copied):
        with pytest.raises(InvalidDemandError):
            a2.allocate([(rid, 1) for rid in rids], demands)
        assert state(a2, (0, 1, 2)) == before
    # its own issued value is trusted: (1, 1) + (0, 0) + (1, 1) = (2, 2)
    assert a2.allocate([(rid, 1) for rid in rids], a2.decode_demands(rids)) == Demand((2, 2))


def test_a_value_for_other_requests_or_tokens_is_validated() -> None:
    kv = prefilled([4, 5, 8])
    got = kv.decode_demands([0, 1, 2])
    before = state(kv, (0, 1, 2))
    with pytest.raises(InvalidDemandError):  # 3 demands for 2 entries: not its batch
        kv.allocate([(0, 1), (2, 1)], got)
    assert state(kv, (0, 1, 2)) == before
    # its rows, but priced for 1 token and the batch asks 2: validated as a list (the
    # demands are well formed, so the take is theirs: (2, 2))
    assert kv.allocate([(0, 2), (1, 2), (2, 2)], got) == Demand((2, 2))


def test_building_from_misaligned_demands_is_refused() -> None:
    kv = manager()
    with pytest.raises(InvalidDemandError):
        DecodeBatch.of(kv, (0, 1), 0, [Demand((0, 0))], 2)
    with pytest.raises(InvalidDemandError):
        DecodeBatch.of(kv, (0,), 0, [Demand((1, 1))], 2, nonzero=(0,))  # needs missing
    with pytest.raises(InvalidDemandError):  # needs of 1 band on a 2-band chain
        DecodeBatch.of(kv, (0,), 0, [Demand((1, 1))], 2, (0,), np.ones((1, 1), np.int64))
    empty = DecodeBatch.of(kv, (), 0, [], 2)
    assert empty.total == Demand((0, 0)) and empty.matrix.shape == (0, 2)
    assert np.array_equal(DecodeBatch.of(kv, (5,), 0, [Demand((1, 0))], 2).matrix, [[1, 0]])


def test_the_slot_lookup_memo_follows_the_slot_version() -> None:
    # Requests 0 (4 tokens: its next token starts page 1: (1, 1)) and 1 (5 tokens: (0, 0)).
    kv = prefilled([4, 5])
    ids = (0, 1)
    assert list(kv.decode_demands(ids)) == [Demand((1, 1)), Demand((0, 0))]
    # Request 1 leaves; request 7 takes its freed slot with 5 tokens. The same ids now
    # read request 1 as holding nothing: a decode of it is refused. A memo that kept the
    # slots past the version would read request 7's row: (0, 0), and no error.
    kv.free(1)
    kv.allocate([(7, 5)])
    kv.commit(7, 5)
    with pytest.raises(UnknownRequestError, match="request 1 holds no pages"):
        kv.decode_demands(ids)
    assert list(kv.decode_demands((0,))) == [Demand((1, 1))]
    assert list(kv.decode_demands((7,))) == [Demand((0, 0))]
