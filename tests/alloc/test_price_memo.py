"""The price memo: repeats return the same quote; the key is the snapshot's value and the
demand (every field, not the epoch), and a memo hit never skips demand validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvchain.alloc import pricing
from kvchain.alloc.pricing import _price_uncached, price
from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot, Demand
from kvchain.errors import InvalidDemandError
from kvchain.layout import Anchor


def _two_ends(movable: bool = True, epoch: int = 7) -> ChainSnapshot:
    # window LOW: 60 live + 40 holes of 32 B; full HIGH: 20 live + 80 holes; B = 6,400 B
    # -> no gap at all: (50, 50) needs compaction moves (10 + 0 extra pages each way)
    window = BandSnapshot("window", Anchor.LOW, 32, 0, 3_200, 60, 40, 1 << 20, movable)
    full = BandSnapshot("full", Anchor.HIGH, 32, 3_200, 6_400, 20, 80, 1 << 20, movable)
    return ChainSnapshot(6_400, (window, full), epoch)


def test_repeat_is_the_same_quote_and_equals_the_planner():
    snap = _two_ends()
    d = Demand((30, 30))
    first = price(snap, d)
    assert price(snap, d) is first
    assert price(snap, Demand((30, 30))) is first  # an equal demand object
    assert first == _price_uncached(snap, d)


def test_key_is_the_snapshot_value_not_the_epoch():
    moving, frozen = _two_ends(movable=True), _two_ends(movable=False)
    assert moving.epoch == frozen.epoch  # an epoch-only key would confuse these two
    d = Demand((50, 50))  # 40 holes per band cannot hold 50: moves, or a refusal
    assert price(moving, d).fits and price(moving, d).needs_moves
    assert not price(frozen, d).fits
    assert price(moving, d).fits  # and back again


def test_equal_snapshot_of_another_epoch_gets_its_own_before():
    d = Demand((30, 30))
    a, b = _two_ends(epoch=1), _two_ends(epoch=2)
    qa, qb = price(a, d), price(b, d)
    assert qb.before is b and qb.before.epoch == 2
    assert qa.steps == qb.steps and qa.fits == qb.fits


def test_hit_never_skips_validation():
    snap = _two_ends()
    price(snap, Demand((1, 0)))
    with pytest.raises(InvalidDemandError):
        price(snap, Demand((True, 0)))  # == (1, 0), but a bool is refused
    with pytest.raises(InvalidDemandError):
        price(replace(snap), Demand((True, 0)))  # the dict path too


def test_memo_is_bounded():
    snap = _two_ends()
    for n in range(pricing._PRICE_MEMO_SIZE + 10):
        price(replace(snap, buffer_bytes=6_400 + 32 * n), Demand((1, 1)))
    assert len(pricing._PRICE_MEMO) <= pricing._PRICE_MEMO_SIZE
