"""The exhaustive oracle against the planner with a prefix cache's evictable supply."""

from __future__ import annotations

import pytest

from kvchain.alloc.pricing import least_eviction
from kvchain.testing.corners import BASE_CORNERS, build_corner
from kvchain.testing.eviction_agreement import check_eviction_agreement, give_to_cache
from kvchain.testing.geometry import tiny_geometries

GEOMETRIES = tiny_geometries()


def _seed(base: str, variant: str) -> int:
    """A fixed seed per corner (str hashes vary between processes)."""
    return sorted(BASE_CORNERS).index(base) * 2 + (variant == "gate_closed")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g.shape}-P{g.page_size}-"
                         f"{g.buffer_bytes}")
def test_least_eviction_agrees_with_the_oracle(geometry) -> None:
    decisions = 0
    for base in BASE_CORNERS:
        for variant in ("open", "gate_closed"):
            corner = build_corner(geometry, base, variant)
            evictor = give_to_cache(corner.chain, corner.recorder.held,
                                    seed=_seed(base, variant))
            made, found = check_eviction_agreement(corner.chain, evictor)
            decisions += made
            assert found == [], (corner.name, found)
    assert decisions >= len(BASE_CORNERS) * 2


def test_the_sweep_exercises_eviction() -> None:
    """Over all tiny geometries the sweep decides thousands of demands of each kind: ones
    that need eviction (a least prefix > 0), fit as is, and never fit."""
    from kvchain.alloc.pricing import max_units
    from kvchain.testing.agreement import unit_directions

    counts = {"0": 0, ">0": 0, "none": 0}
    for g in GEOMETRIES:
        for base in BASE_CORNERS:
            for variant in ("open", "gate_closed"):
                corner = build_corner(g, base, variant)
                give_to_cache(corner.chain, corner.recorder.held,
                              seed=_seed(base, variant))
                snap = corner.chain.snapshot()
                for unit in unit_directions(len(snap.bands)):
                    n = max_units(snap, unit)
                    for k in sorted({1, max(n // 2, 1), n, n + 1}):
                        r = least_eviction(snap, unit.scaled(k))
                        counts["none" if r is None else "0" if r == 0 else ">0"] += 1
    assert counts[">0"] > 1_000 and counts["0"] > 1_000 and counts["none"] > 1_000


def test_a_planner_that_evicts_too_much_is_caught() -> None:
    """Planted defect: evict every unit whenever the demand does not fit as is."""

    def greedy(snap, demand):
        k = least_eviction(snap, demand)
        return snap.evictable.units if k else k

    g = next(g for g in GEOMETRIES if g.shape == "state|window|full" and g.page_size == 1)
    corner = build_corner(g, "full", "open")
    evictor = give_to_cache(corner.chain, corner.recorder.held, seed=3)
    assert corner.chain.snapshot().evictable.units >= 2
    _, found = check_eviction_agreement(corner.chain, evictor, least=greedy)
    assert found


def test_a_cache_publishing_a_wrong_order_is_caught() -> None:
    """Planted defect: the published order swaps its first two units; the oracle evicts
    the true pages, so some least prefix (or fit) differs, and a take diverges."""
    g = next(g for g in GEOMETRIES if g.shape == "window|full" and g.page_size == 1
             and g.classes[0].nbytes != g.classes[1].nbytes)
    corner = build_corner(g, "full", "open")
    held = corner.recorder.held
    evictor = give_to_cache(corner.chain, held, seed=0, share=0.0, defect="order")
    w, f = held[0], held[1]
    evictor.insert([[w[0]], []])
    evictor.insert([[], [f[0], f[1], f[2]]])
    snap = corner.chain.snapshot()
    assert snap.evictable.cumulative[1] == (0, 3)  # the lie: the full unit first
    _, found = check_eviction_agreement(corner.chain, evictor)
    assert found
