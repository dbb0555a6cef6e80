"""Band: slots on the band's grid, virtual ids, holes nearest the anchor, move plans."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc.band import HOLE_BLOCK, Band
from kvchain.alloc.snapshot import Side
from kvchain.errors import LayoutError, PlanMismatchError
from kvchain.layout import Anchor, BandLayout
from kvchain.model.layers import CacheClass, LifetimeClass

FULL = CacheClass(LifetimeClass.FULL, 32, 0, None, ())


def band_layout(anchor: Anchor, page_bytes: int = 32, buffer_bytes: int = 1000) -> BandLayout:
    grid_base = buffer_bytes % page_bytes if anchor is Anchor.HIGH else 0
    cap = (buffer_bytes - grid_base) // page_bytes
    return BandLayout(FULL, anchor, 1, page_bytes, grid_base, cap, 0)


def check_holes(b: Band) -> None:
    """Hole map and summary agree with p2v over the span."""
    expected = np.zeros(b.n_phys, dtype=bool)
    expected[b.lo_idx:b.hi_idx] = b.p2v[b.lo_idx:b.hi_idx] < 0
    assert np.array_equal(b.is_hole, expected)
    assert b.holes == int(expected.sum()) == int(b.block_holes.sum())
    assert b.span == b.live + b.holes


def test_low_end_slots_are_physical_and_ids_lowest_first() -> None:
    b = Band(band_layout(Anchor.LOW), 0)
    assert b.n_phys == 31
    vids = b.extend(Side.HIGH, 5)
    assert vids.tolist() == [0, 1, 2, 3, 4]
    assert b.v2p[:5].tolist() == [0, 1, 2, 3, 4]
    assert (b.lo, b.hi, b.live, b.holes) == (0, 160, 5, 0)
    b.release(np.array([1, 3]))
    assert (b.live, b.holes, b.hi) == (3, 2, 160)  # the span never shrinks on release
    check_holes(b)
    again = b.use_holes(1)
    assert again.tolist() == [1]  # released ids are reused in the order released
    assert b.v2p[1] == 1  # the lowest hole: nearest the anchor
    check_holes(b)


def test_high_end_slot_zero_touches_b() -> None:
    # B = 1,000, P = 32: grid_base = 1000 mod 32 = 8, 31 pages, page 30 at [968, 1000).
    b = Band(band_layout(Anchor.HIGH), 31)
    assert (b.grid_base, b.n_phys, b.lo, b.hi) == (8, 31, 1000, 1000)
    vids = b.extend(Side.LOW, 3)
    assert vids.tolist() == [0, 1, 2]
    assert b.v2p[:3].tolist() == [30, 29, 28]  # slot s = physical n_phys - 1 - s
    assert (b.lo, b.hi) == (1000 - 96, 1000)
    b.release(np.array([0, 2]))
    got = b.use_holes(1)
    assert b.v2p[got[0]] == 30  # the hole nearest B goes first
    check_holes(b)
    with pytest.raises(PlanMismatchError):
        b.extend(Side.HIGH, 1)
    with pytest.raises(PlanMismatchError):
        b.compact_moves(Side.HIGH, 1)


def test_extend_past_grid_is_refused_and_changes_nothing() -> None:
    b = Band(band_layout(Anchor.LOW), 0)
    b.extend(Side.HIGH, 30)
    with pytest.raises(PlanMismatchError):
        b.extend(Side.HIGH, 2)
    assert (b.span, b.live) == (30, 30)
    with pytest.raises(PlanMismatchError):
        b.use_holes(1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lowest_and_highest_holes_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lay = band_layout(Anchor.FLOAT, 8, 8 * 5 * HOLE_BLOCK)
    b = Band(lay, HOLE_BLOCK // 2)
    vids = np.concatenate([b.extend(Side.HIGH, 3 * HOLE_BLOCK), b.extend(Side.LOW, 37)])
    gone = rng.choice(vids, size=400, replace=False)
    b.release(gone)
    check_holes(b)
    holes = np.flatnonzero(b.is_hole)
    assert holes.size == 400
    for k in (0, 1, 17, 255, 256, 257, 400):
        assert b.lowest_holes(k).tolist() == holes[:k].tolist()
        assert b.highest_holes(k).tolist() == holes[::-1][:k].tolist()


def test_compact_low_end_moves_top_pages_into_lowest_holes() -> None:
    b = Band(band_layout(Anchor.LOW), 0)
    b.extend(Side.HIGH, 10)  # vids 0..9 at physical 0..9
    b.release(np.array([2, 5, 8]))  # holes at 2, 5, 8
    moves = b.compact_moves(Side.HIGH, 3)  # vacate slots 7, 8, 9: live 7 and 9 move
    assert moves.src.tolist() == [7, 9]
    assert moves.dst.tolist() == [2, 5]
    assert (moves.lo_idx, moves.hi_idx) == (0, 7)
    assert b.hi_idx == 10  # nothing changed yet
    b.apply_moves(moves)
    assert (b.hi_idx, b.live, b.holes) == (7, 7, 0)
    assert b.v2p[7] == 2 and b.v2p[9] == 5
    assert b.p2v[:7].tolist() == [0, 1, 7, 3, 4, 9, 6]
    check_holes(b)


def test_compact_float_low_moves_bottom_pages_into_highest_holes() -> None:
    b = Band(band_layout(Anchor.FLOAT), 10)
    b.extend(Side.HIGH, 8)  # vids 0..7 at physical 10..17
    b.release(np.array([1, 4, 6]))  # holes at 11, 14, 16
    moves = b.compact_moves(Side.LOW, 2)  # vacate 10, 11: only 10 is live
    assert moves.src.tolist() == [10]
    assert moves.dst.tolist() == [16]
    b.apply_moves(moves)
    assert (b.lo_idx, b.hi_idx, b.live, b.holes) == (12, 18, 5, 1)
    assert b.v2p[0] == 16
    check_holes(b)
    with pytest.raises(PlanMismatchError):
        b.compact_moves(Side.HIGH, 2)


def test_relocate_packs_in_physical_order_and_skips_pages_in_place() -> None:
    b = Band(band_layout(Anchor.FLOAT), 10)
    b.extend(Side.HIGH, 6)  # physical 10..15
    b.release(np.array([1, 3]))  # holes 11, 13
    moves = b.relocate_moves(10)  # ranks: 10->10 (in place), 12->11, 14->12, 15->13
    assert moves.src.tolist() == [12, 14, 15]
    assert moves.dst.tolist() == [11, 12, 13]
    b.apply_moves(moves)
    assert (b.lo_idx, b.hi_idx, b.holes) == (10, 14, 0)
    assert b.p2v[10:14].tolist() == [0, 2, 4, 5]
    check_holes(b)
    moves = b.relocate_moves(12)  # overlapping shift up by 2
    assert moves.src.tolist() == [10, 11, 12, 13]
    assert moves.dst.tolist() == [12, 13, 14, 15]
    b.apply_moves(moves)
    assert b.p2v[12:16].tolist() == [0, 2, 4, 5]
    assert b.v2p[[0, 2, 4, 5]].tolist() == [12, 13, 14, 15]
    check_holes(b)
    with pytest.raises(PlanMismatchError):
        b.relocate_moves(28)  # 4 pages from 28 leave the 31-page grid


def test_relocate_only_for_float() -> None:
    b = Band(band_layout(Anchor.LOW), 0)
    with pytest.raises(PlanMismatchError):
        b.relocate_moves(0)


def test_snapshot_counts_and_frontiers() -> None:
    b = Band(band_layout(Anchor.HIGH), 31)
    b.extend(Side.LOW, 4)
    b.release(np.array([1]))
    s = b.snapshot(movable=False, fence_pending=True)
    assert (s.lo, s.hi, s.live, s.holes, s.cap, s.span) == (1000 - 128, 1000, 3, 1, 31, 4)
    assert (s.movable, s.fence_pending, s.anchor, s.label) == (False, True, Anchor.HIGH,
                                                               "full")


def test_start_page_must_match_the_anchor() -> None:
    with pytest.raises(LayoutError):
        Band(band_layout(Anchor.LOW), 3)
    with pytest.raises(LayoutError):
        Band(band_layout(Anchor.HIGH), 0)
    with pytest.raises(LayoutError):
        Band(band_layout(Anchor.FLOAT), 32)
