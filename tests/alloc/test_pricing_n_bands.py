"""Pricing on chains of several floats: worked examples derived by hand, the N-band solver
against the three-band one, and a planted defect the oracle catches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvchain.alloc import pricing
from kvchain.alloc.pricing import fits, max_units, price
from kvchain.alloc.snapshot import (
    BandSnapshot,
    ChainSnapshot,
    Demand,
    Extend,
    RefusalReason,
    Relocate,
    Side,
    UseHoles,
)
from kvchain.layout import Anchor
from kvchain.testing.agreement import check_agreement
from kvchain.testing.corners import corner_states
from kvchain.testing.geometry import shape_geometry, tiny_geometries


def four_bands() -> ChainSnapshot:
    """B = 200 B: state END [0, 40) 4 slots of 10 B; window float [40, 60) 3 live + 2 holes
    of 4 B; local float [120, 132) 2 pages of 6 B; full END [160, 200) 4 pages of 10 B.
    Live bytes 40 + 12 + 12 + 40 = 104."""
    return ChainSnapshot(200, (
        BandSnapshot("state", Anchor.LOW, 10, 0, 40, 4, 0, 20),
        BandSnapshot("window", Anchor.FLOAT, 4, 40, 60, 3, 2, 50),
        BandSnapshot("local", Anchor.FLOAT, 6, 120, 132, 2, 0, 33),
        BandSnapshot("full", Anchor.HIGH, 10, 160, 200, 4, 0, 20)))


def test_four_bands_in_place_uses_holes() -> None:
    q = price(four_bands(), Demand((0, 2, 0, 0)))  # the window's own 2 holes
    assert q.fits and q.copied_bytes == 0
    assert q.steps.actions == (UseHoles(1, 2),)


def test_four_bands_state_growth_relocates_the_window_float() -> None:
    # 3 slots: the state END ends at 70 > the window's lo 40, whose 2 holes cannot clear
    # 30 B by compaction (2 x 4 = 8 B); packed at the first 4-byte grid byte >= 70 (72):
    # [72, 84), below the local float at 120. Copies its 3 live pages: 12 B. Packing it
    # high (just below 120) copies the same 12 B: the tie goes to the low-side sweep.
    q = price(four_bands(), Demand((3, 0, 0, 0)))
    assert q.fits and q.copied_bytes == 12
    assert q.steps.actions == (Relocate(1, 72), Extend(0, Side.HIGH, 3))
    w = q.after.bands[1]
    assert (w.lo, w.hi, w.live, w.holes) == (72, 84, 3, 0)


def test_four_bands_full_growth_relocates_the_local_float() -> None:
    # 6 full pages: the full END's lo goes to 100 < the local float's hi 132. The local
    # float packs at the first 6-byte grid byte >= the window's hi 60: [60, 72), 12 B.
    q = price(four_bands(), Demand((0, 0, 0, 6)))
    assert q.fits and q.copied_bytes == 12
    assert q.steps.actions == (Relocate(2, 60), Extend(3, Side.LOW, 6))


def test_four_bands_capacity_and_grid_refusal() -> None:
    snap = four_bands()
    # Free bytes 200 - 104 = 96: 9 full pages (90 B) or 9 slots, by the byte bound.
    assert max_units(snap, Demand((0, 0, 0, 1))) == 9
    assert max_units(snap, Demand((1, 0, 0, 0))) == 9
    # (7, 0, 1, 2): exactly 200 B, but the maximal candidate ends the state END at 110,
    # packs the window from its first 4-byte grid byte >= 110: [112, 124), the local
    # float's 3 pages from its first 6-byte grid byte >= 124 (126) to 144, while the full
    # END's lo is 200 - 60 = 140: short by 4 B.
    q = price(snap, Demand((7, 0, 1, 2)))
    assert not q.fits and q.reason is RefusalReason.GRID and q.shortfall_bytes == 4
    assert fits(snap, Demand((7, 0, 0, 2)))  # window [112, 124), local [126, 138) <= 140


def test_four_bands_closed_gate_blocks_the_relocation() -> None:
    snap = four_bands()
    closed = ChainSnapshot(200, tuple(replace(b, movable=False) for b in snap.bands))
    q = price(closed, Demand((3, 0, 0, 0)))
    # In place the state END would end at 70, 30 B past the window's lo 40.
    assert not q.fits and q.reason is RefusalReason.MOVES_BLOCKED and q.shortfall_bytes == 30


def test_five_bands_relocations_run_in_a_realizable_order() -> None:
    # B = 300: state [0, 40) 10 B slots; floats [40, 52) 4 B x 3, [54, 66) 6 B x 2,
    # [100, 110) 5 B x 2; full [260, 300). 3 slots end the state at 70: the first float
    # packs at 72 ([72, 84)), the second at the first 6-byte grid byte >= 84 ([84, 96)),
    # the third stays. The second must move before the first (its current lo 54 is inside
    # the first's target): relocations upward run from the highest float down.
    snap = ChainSnapshot(300, (
        BandSnapshot("state", Anchor.LOW, 10, 0, 40, 4, 0, 30),
        BandSnapshot("window8", Anchor.FLOAT, 4, 40, 52, 3, 0, 75),
        BandSnapshot("window64", Anchor.FLOAT, 6, 54, 66, 2, 0, 50),
        BandSnapshot("local", Anchor.FLOAT, 5, 100, 110, 2, 0, 60),
        BandSnapshot("full", Anchor.HIGH, 10, 260, 300, 4, 0, 30)))
    q = price(snap, Demand((3, 0, 0, 0, 0)))
    assert q.fits and q.copied_bytes == 12 + 12
    assert q.steps.actions == (Relocate(2, 84), Relocate(1, 72), Extend(0, Side.HIGH, 3))
    assert [(b.lo, b.hi) for b in q.after.bands] == [(0, 70), (72, 84), (84, 96), (100, 110),
                                                    (260, 300)]


def test_n_band_solver_decides_three_band_chains_like_the_three_band_solver() -> None:
    # The general solver on one float must fit exactly where the three-band solver does
    # (both are exact), on every corner state of the three-band tiny chains.
    checked = 0
    for g in tiny_geometries():
        if g.shape != "state|window|full":
            continue
        for corner in corner_states(g):
            snap = corner.chain.snapshot()
            for d in ((0, 1, 0), (0, 0, 1), (1, 0, 0), (0, 2, 2), (1, 1, 1), (0, 4, 0),
                      (0, 0, 4), (2, 0, 3)):
                general = pricing._solve_chain(snap, d)
                three = pricing._solve_three_bands(snap, d)
                byte_ok = sum((b.live + x) * b.page_bytes
                              for b, x in zip(snap.bands, d, strict=True)) <= snap.buffer_bytes
                if not byte_ok:
                    continue
                assert isinstance(general, pricing._Plan) == isinstance(three, pricing._Plan), (
                    corner.name, d, snap)
                checked += 1
    assert checked > 500


def test_planted_defect_dropping_float_packing_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Without packing, a float the state END runs into cannot get out of the way: the
    # planner refuses demands the oracle holds (the 3-slot demand of the worked example).
    real = pricing._float_options

    def never_packs(c, j, x, limit):  # type: ignore[no-untyped-def]
        return [o for o in real(c, j, x, limit) if o[1].relocate_lo is None]

    monkeypatch.setattr(pricing, "_float_options", never_packs)
    assert not fits(four_bands(), Demand((3, 0, 0, 0)))
    found = []
    for corner in corner_states(shape_geometry("state|window|local|full", 1, pages=20,
                                               null_pages=False), ("open",)):
        found += check_agreement(corner.chain).disagreements
    assert any(d.oracle_fits and not d.planner_fits for d in found)


def test_planted_defect_overcounting_the_high_end_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One page too many at the top of the chain: the planner fits demands the oracle
    # cannot hold.
    real = pricing._thresholds

    def one_page_more(c, z_lo_max, moves):  # type: ignore[no-untyped-def]
        return real(c, z_lo_max + c.page[-1], moves)

    monkeypatch.setattr(pricing, "_thresholds", one_page_more)
    found = []
    for corner in corner_states(shape_geometry("state|window|wide|full", 1, pages=20,
                                               null_pages=False), ("open",)):
        found += check_agreement(corner.chain).disagreements
    assert any(d.planner_fits and not d.oracle_fits for d in found)
