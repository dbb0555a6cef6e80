"""Planner tests: the worked examples of docs/pricing.md, exact values, and properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.pricing import apply_action, fits, max_units, price
from kvchain.alloc.snapshot import (
    BandSnapshot,
    ChainSnapshot,
    Compact,
    Demand,
    Extend,
    RefusalReason,
    Relocate,
    Side,
    UseHoles,
    WaitFence,
)
from kvchain.layout import Anchor


def low_end(label, p, live, holes, cap=10_000, movable=True):
    return BandSnapshot(label, Anchor.LOW, p, 0, (live + holes) * p, live, holes, cap, movable)


def high_end(label, p, live, holes, buffer_bytes, cap=10_000, movable=True):
    return BandSnapshot(label, Anchor.HIGH, p, buffer_bytes - (live + holes) * p, buffer_bytes,
                        live, holes, cap, movable)


def float_band(label, p, lo_page, live, holes, cap=10_000, movable=True):
    return BandSnapshot(label, Anchor.FLOAT, p, lo_page * p, (lo_page + live + holes) * p,
                        live, holes, cap, movable)


def two_end_example(movable=True):
    """docs/pricing.md §1: 100 pages each, then 40 of A and 80 of Z released."""
    return ChainSnapshot(6_400, (low_end("window", 32, 60, 40, movable=movable),
                                 high_end("full", 32, 20, 80, 6_400, movable=movable)))


def test_two_ends_worked_example_plan():
    q = price(two_end_example(), Demand((50, 50)))
    assert q.fits
    assert [s.action for s in q.steps] == [
        Compact(1, Side.LOW, 10), UseHoles(0, 40), UseHoles(1, 50), Extend(0, Side.HIGH, 10)]
    a, z = q.after.bands
    assert (a.live, a.holes, a.hi) == (110, 0, 3_520)
    assert (z.live, z.holes, z.lo) == (70, 20, 3_520)
    assert q.after.gap_above(0) == 0
    assert q.copied_bytes == 320


def test_two_ends_capacity_with_and_without_moves():
    assert max_units(two_end_example(), Demand((1, 1))) == 60
    assert max_units(two_end_example(movable=False), Demand((1, 1))) == 40


def test_two_ends_refusal_shortfall():
    q = price(two_end_example(), Demand((61, 61)))
    assert not q.fits and q.reason is RefusalReason.BYTES and q.shortfall_bytes == 64
    assert q.steps == () and q.after == two_end_example()


def test_closed_gate_refuses_with_moves_blocked_and_plans_no_copies():
    q = price(two_end_example(movable=False), Demand((50, 50)))
    assert not q.fits and q.reason is RefusalReason.MOVES_BLOCKED and q.shortfall_bytes == 320
    q = price(two_end_example(movable=False), Demand((40, 40)))
    assert q.fits and not q.needs_moves and q.copied_bytes == 0


def three_band_example(float_page=106, float_live=0):
    """docs/pricing.md §2: 41 slots of 48 B held; window float, full END empty."""
    return ChainSnapshot(6_784, (
        low_end("state", 48, 41, 0),
        float_band("window", 32, float_page, float_live, 0),
        high_end("full", 32, 0, 0, 6_784),
    ))


def test_three_bands_worked_example_grid():
    snap = three_band_example()
    assert price(snap, Demand((0, 75, 75))).fits
    q = price(snap, Demand((0, 76, 76)))
    assert not q.fits and q.reason is RefusalReason.BYTES and q.shortfall_bytes == 48
    assert max_units(snap, Demand((0, 1, 1))) == 75


def test_three_bands_in_place_extends_float_low_side_first():
    q = price(three_band_example(), Demand((0, 75, 75)))
    # Float at page 106: 44 pages of room below (1,968 -> 3,392), 31 above.
    assert [s.action for s in q.steps] == [
        Extend(1, Side.LOW, 44), Extend(1, Side.HIGH, 31), Extend(2, Side.LOW, 75)]
    assert q.copied_bytes == 0


def test_three_bands_float_relocates_when_grid_room_is_split_badly():
    # Float with one live page far up: in place leaves too little on the high side.
    snap = three_band_example(float_page=200, float_live=1)
    q = price(snap, Demand((0, 70, 74)))
    assert q.fits and q.needs_moves
    reloc = [s.action for s in q.steps if isinstance(s.action, Relocate)]
    assert reloc == [Relocate(1, 62 * 32)]  # packed right above the state band (ceil 1968/32)
    w = q.after.bands[1]
    assert (w.lo, w.live, w.holes) == (62 * 32, 71, 0)
    assert q.copied_bytes == 32


def test_wait_fence_precedes_copies():
    snap = two_end_example()
    snap = ChainSnapshot(snap.buffer_bytes,
                         tuple(BandSnapshot(**{**_fields(b), "fence_pending": True})
                               for b in snap.bands))
    q = price(snap, Demand((50, 50)))
    assert isinstance(q.steps[0].action, WaitFence)
    assert not any(b.fence_pending for b in q.after.bands)


def _fields(b):
    return {k: getattr(b, k) for k in BandSnapshot.__slots__}


def test_single_band_pool():
    snap = ChainSnapshot(320, (low_end("window", 32, 3, 2),))
    assert max_units(snap, Demand((1,))) == 7  # 2 holes + 5 pages of gap
    q = price(snap, Demand((8,)))
    assert not q.fits and q.shortfall_bytes == 32


def test_index_cap_refusal():
    snap = ChainSnapshot(6_400, (low_end("window", 32, 10, 0, cap=12),
                                 high_end("full", 32, 0, 0, 6_400)))
    q = price(snap, Demand((3, 0)))
    assert not q.fits and q.reason is RefusalReason.INDEX_CAP and q.shortfall_bytes == 32


# --- properties ----------------------------------------------------------------------------


@st.composite
def snapshots(draw):
    """Random two- and three-band snapshots with consistent geometry."""
    three = draw(st.booleans())
    ps = draw(st.sampled_from([16, 32, 48, 64]))
    pw = draw(st.sampled_from([16, 32]))
    pf = draw(st.sampled_from([16, 32, 64]))
    s_live, s_holes = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    f_live, f_holes = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    movable = draw(st.booleans())
    if not three:
        b = (s_live + s_holes) * ps + (f_live + f_holes) * pf + draw(st.integers(0, 200))
        return ChainSnapshot(b, (low_end("window", ps, s_live, s_holes, movable=movable),
                                 high_end("full", pf, f_live, f_holes, b, movable=movable)))
    w_live, w_holes = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    s_hi = (s_live + s_holes) * ps
    gap_low = draw(st.integers(0, 200))
    w_lo_page = -(-(s_hi + gap_low) // pw)
    w_hi = (w_lo_page + w_live + w_holes) * pw
    b = w_hi + draw(st.integers(0, 200)) + (f_live + f_holes) * pf
    return ChainSnapshot(b, (
        low_end("state", ps, s_live, s_holes, movable=movable),
        float_band("window", pw, w_lo_page, w_live, w_holes, movable=movable),
        high_end("full", pf, f_live, f_holes, b, movable=movable),
    ))


@st.composite
def snapshot_and_demand(draw):
    snap = draw(snapshots())
    pages = tuple(draw(st.integers(0, 16)) for _ in snap.bands)
    return snap, Demand(pages)


@settings(max_examples=400, deadline=None)
@given(snapshot_and_demand())
def test_plan_steps_replay_to_after_and_respect_the_gate(case):
    snap, demand = case
    q = price(snap, demand)
    assert q == price(snap, demand)  # deterministic
    if not q.fits:
        assert q.shortfall_bytes > 0 and q.steps == ()
        return
    current = snap
    for step in q.steps:
        current = apply_action(current, step.action)
        assert current == step.after
    for before, after, d in zip(snap.bands, q.after.bands, demand.pages, strict=True):
        assert after.live == before.live + d
        assert after.span == after.live + after.holes
    if not all(b.movable for b in snap.bands):
        assert q.copied_bytes == 0


@settings(max_examples=400, deadline=None)
@given(snapshot_and_demand(), st.integers(0, 2))
def test_monotone(case, band):
    snap, demand = case
    band = band % len(snap.bands)
    more = list(demand.pages)
    more[band] += 1
    if fits(snap, Demand(tuple(more))):
        assert fits(snap, demand)
