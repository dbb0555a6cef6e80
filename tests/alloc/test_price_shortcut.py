"""The in-place shortcut of the planner gives exactly the general solver's quote.

``pricing._price_uncached`` answers a demand that fits without a copy (after the least
eviction prefix if bytes must be freed) from the counts alone; ``pricing._price_general``
runs every candidate. On random snapshots of 1-4 bands, with and without an eviction order,
both must give the same ``Quote``: fits, reason, shortfall, copied bytes, the actions and
every predicted snapshot (``Chain.take`` checks those). ``fits`` and ``least_eviction`` use
the shortcut too and must agree with the general quote. A planted defect (the shortcut one
page short) shows the comparison can fail.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc import pricing
from kvchain.alloc.pricing import _price_general, _price_uncached, fits, least_eviction
from kvchain.alloc.snapshot import (
    BandSnapshot,
    ChainSnapshot,
    Demand,
    Evict,
    EvictionOrder,
    Extend,
    Side,
    UseHoles,
)
from kvchain.errors import PlanMismatchError
from kvchain.layout import Anchor


def random_case(rng: random.Random, num_bands: int,
                evictable: bool) -> tuple[ChainSnapshot, Demand]:
    """A valid snapshot (LOW END, floats on their own grids, HIGH END; small page sizes so
    grids misalign), random caps, gates and fences, an optional eviction order that never
    frees more than a band holds live, and a demand of up to a few pages past each band's
    holes."""
    specs = []
    x = 0
    for i in range(num_bands):
        p = rng.choice((2, 3, 4, 5, 6))
        live, holes = rng.randint(0, 6), rng.randint(0, 4)
        span = live + holes
        if i == 0:
            lo = 0
        elif i < num_bands - 1 or num_bands == 1:
            lo = -(-(x + rng.randint(0, 12)) // p) * p  # a float on its own page grid
        else:
            lo = x + rng.randint(0, 12)  # the HIGH END: B is set from it
        anchor = (Anchor.LOW if i == 0 else
                  Anchor.HIGH if i == num_bands - 1 else Anchor.FLOAT)
        cap = span + rng.randint(0, 8)
        specs.append((anchor, p, lo, lo + span * p, live, holes, cap))
        x = lo + span * p
    buffer_bytes = x + (rng.randint(0, 12) if num_bands == 1 else 0)
    bands = tuple(
        BandSnapshot(f"b{i}", anchor, p, lo, hi, live, holes, cap,
                     rng.random() < 0.8, rng.random() < 0.3)
        for i, (anchor, p, lo, hi, live, holes, cap) in enumerate(specs))
    order = EvictionOrder()
    if evictable:
        left = [b.live for b in bands]
        units = []
        for _ in range(rng.randint(1, 5)):
            unit = [rng.randint(0, min(n, 3)) for n in left]
            left = [n - u for n, u in zip(left, unit, strict=True)]
            units.append(unit)
        order = EvictionOrder.from_units(units, num_bands)
    snap = ChainSnapshot(buffer_bytes, bands, 0, order)
    demand = Demand(tuple(rng.randint(0, b.holes + rng.choice((0, 2, 6))) for b in bands))
    return snap, demand


def disagreements(snap: ChainSnapshot, demand: Demand) -> list[str]:
    """Every way the shortcut-backed answers differ from the general solver's quote."""
    general = _price_general(snap, demand)
    fast = _price_uncached(snap, demand)
    out = []
    if fast != general:  # demand, before, fits, shortfall, reason, copied, steps
        out.append(f"quote {fast!r} != {general!r}")
    if fast.fits and general.fits and [s.after for s in fast.steps] != [
            s.after for s in general.steps]:
        out.append("predicted snapshots differ")
    if fits(snap, demand) != general.fits:
        out.append("fits")
    if least_eviction(snap, demand) != (general.evicted_units if general.fits else None):
        out.append("least_eviction")
    return out


def run_cases(seed: int, count: int) -> tuple[int, int, list[str]]:
    """``count`` random cases per band count (1-4) and eviction setting: how many the
    shortcut answered, how many it left to the general solver, and the disagreements."""
    rng = random.Random(seed)
    answered = passed = 0
    bad: list[str] = []
    for _ in range(count):
        for num_bands in (1, 2, 3, 4):
            for evictable in (False, True):
                snap, demand = random_case(rng, num_bands, evictable)
                if not any(demand.pages):
                    continue
                if pricing._in_place_shortcut(snap, demand.pages) is None:
                    passed += 1
                else:
                    answered += 1
                bad += [f"{snap} {demand}: {m}" for m in disagreements(snap, demand)]
    return answered, passed, bad


def test_shortcut_equals_the_general_solver_on_seeded_random_snapshots() -> None:
    answered, passed, bad = run_cases(seed=2026, count=400)
    assert bad == []
    # Both paths were exercised: the random demands fit in place often, not always.
    assert answered > 300 and passed > 300


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_shortcut_equals_the_general_solver_hypothesis(seed: int) -> None:
    assert run_cases(seed, count=3)[2] == []


def test_planted_defect_one_page_short_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pricing._walk_in_place

    def one_page_short(snap, pages, freed):  # type: ignore[no-untyped-def]
        actions = real(snap, pages, freed)
        if actions:
            a = actions[-1]
            if isinstance(a, UseHoles) and a.pages > 1:
                actions[-1] = UseHoles(a.band, a.pages - 1)
            elif isinstance(a, Extend) and a.pages > 1:
                actions[-1] = Extend(a.band, a.side, a.pages - 1)
        return actions

    monkeypatch.setattr(pricing, "_walk_in_place", one_page_short)
    answered, _, bad = run_cases(seed=2026, count=50)
    assert answered > 0 and len(bad) > 0


def test_worked_example_three_bands_in_place() -> None:
    # docs/pricing.md §2: state 41 slots x 48 B = 1,968 B; an empty window float at page
    # 200 of 32 B (bytes 6,400-6,432, 1 live page); an empty full END at B = 6,784.
    # (0, 10, 10): the window extends 10 pages down into the 4,432 B gap below it; the
    # full END extends 10 pages down to byte 6,784 - 320 = 6,464 >= 6,432. No copy.
    snap = ChainSnapshot(6_784, (
        BandSnapshot("state", Anchor.LOW, 48, 0, 1_968, 41, 0, 1 << 20),
        BandSnapshot("window", Anchor.FLOAT, 32, 6_400, 6_432, 1, 0, 1 << 20),
        BandSnapshot("full", Anchor.HIGH, 32, 6_784, 6_784, 0, 0, 1 << 20)))
    q = _price_uncached(snap, Demand((0, 10, 10)))
    assert q.steps.actions == (Extend(1, Side.LOW, 10), Extend(2, Side.LOW, 10))
    assert q.after.bands[1].lo == 6_400 - 320 and q.after.bands[2].lo == 6_464
    assert q == _price_general(snap, Demand((0, 10, 10)))


def test_worked_example_eviction_in_place() -> None:
    # A full buffer (100,000 pages of 32 B, no hole, no gap); each unit frees 2 window +
    # 8 full pages = 320 B. (10, 40) needs 50 pages = 1,600 B: 5 units, which free exactly
    # (10, 40) pages, then used in place as holes.
    snap = ChainSnapshot(3_200_000, (
        BandSnapshot("window", Anchor.LOW, 32, 0, 640_000, 20_000, 0, 1 << 20),
        BandSnapshot("full", Anchor.HIGH, 32, 640_000, 3_200_000, 80_000, 0, 1 << 20)),
        0, EvictionOrder.from_units([(2, 8)] * 2_000, 2))
    q = _price_uncached(snap, Demand((10, 40)))
    assert q.steps.actions == (Evict(5), UseHoles(0, 10), UseHoles(1, 40))
    assert q.after.evictable.units == 1_995
    assert q == _price_general(snap, Demand((10, 40)))


def test_an_order_freeing_more_than_live_raises_on_both_paths() -> None:
    # The order frees 3 pages of a band with 2 live: the general path's eviction check.
    snap = ChainSnapshot(40, (
        BandSnapshot("a", Anchor.LOW, 4, 0, 8, 2, 0, 100),
        BandSnapshot("z", Anchor.HIGH, 4, 8, 40, 8, 0, 100)),
        0, EvictionOrder.from_units([(3, 0)], 2))
    for planner in (_price_uncached, _price_general):
        with pytest.raises(PlanMismatchError):
            planner(snap, Demand((1, 0)))


def test_planted_defect_refusal_one_byte_short_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = pricing._in_place_shortcut

    def understates(snap, pages):  # type: ignore[no-untyped-def]
        found = real(snap, pages)
        if isinstance(found, pricing._Refusal):
            return pricing._Refusal(found.reason, found.shortfall_bytes - 1)
        return found

    monkeypatch.setattr(pricing, "_in_place_shortcut", understates)
    assert len(run_cases(seed=2026, count=50)[2]) > 0


def test_worked_example_refusal_after_evicting_everything() -> None:
    # Same full buffer as above with 2,000 units of (2, 8) pages: evicting everything
    # frees 4,000 + 16,000 pages; (20,000, 80,000) needs 100,000 pages more than the
    # 100,000 that fill B, so after eviction 80,000 pages x 32 B = 2,560,000 B are short.
    snap = ChainSnapshot(3_200_000, (
        BandSnapshot("window", Anchor.LOW, 32, 0, 640_000, 20_000, 0, 1 << 20),
        BandSnapshot("full", Anchor.HIGH, 32, 640_000, 3_200_000, 80_000, 0, 1 << 20)),
        0, EvictionOrder.from_units([(2, 8)] * 2_000, 2))
    q = _price_uncached(snap, Demand((20_000, 80_000)))
    assert not q.fits and q.shortfall_bytes == 2_560_000 and q.reason == "bytes"
    assert q == _price_general(snap, Demand((20_000, 80_000)))


def test_order_hash_is_consistent_with_equality() -> None:
    # A suffix view and a freshly built order of the same units are equal and hash equal;
    # two orders with the same unit count, total and middle row but a different first unit
    # ((1,0),(0,1),... vs (0,1),(1,0),...) hash alike and still compare unequal.
    units = [(1, 0), (0, 1), (2, 2), (1, 1)]
    whole = EvictionOrder.from_units([(5, 5), *units], 2)
    fresh = EvictionOrder.from_units(units, 2)
    assert whole.after(1) == fresh and hash(whole.after(1)) == hash(fresh)
    swapped = EvictionOrder.from_units([(0, 1), (1, 0), (2, 2), (1, 1)], 2)
    assert hash(swapped) == hash(fresh) and swapped != fresh
    assert hash(EvictionOrder()) == 0 == hash(whole.after(5))
