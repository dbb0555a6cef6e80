"""Planner vs oracle with a prefix cache's evictable supply on corner states.

For a chain state whose held pages are partly given to a
:class:`~kvchain.testing.evictor.ReferenceEvictor` (units of pages, some locked), and every
unit direction scaled from 1 to one past the capacity with everything evicted, the
planner's least eviction prefix (:func:`~kvchain.alloc.pricing.least_eviction`) must equal
the oracle's (:func:`~kvchain.testing.oracle.oracle_least_eviction`: a linear scan over
prefixes, each searched on the real page positions with the evicted pages released).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvchain.alloc import Chain, ChainSnapshot, Demand
from kvchain.alloc.pricing import least_eviction, max_units
from kvchain.testing.agreement import unit_directions
from kvchain.testing.evictor import ReferenceEvictor
from kvchain.testing.oracle import oracle_least_eviction


def give_to_cache(chain: Chain, held: list[list[int]], seed: int, *,
                  share: float = 0.6, defect: str | None = None) -> ReferenceEvictor:
    """Hand a seeded share of ``held`` pages to a new reference evictor attached to
    ``chain``, in units of 1-3 pages of one or several bands; about one unit in five is
    locked (a running request's match). ``held`` loses the pages given away."""
    rng = random.Random(seed)
    evictor = ReferenceEvictor(chain.num_bands, defect=defect)
    pool = [(i, v) for i, vids in enumerate(held) for v in vids if rng.random() < share]
    rng.shuffle(pool)
    while pool:
        take = pool[:rng.randint(1, 3)]
        pool = pool[len(take):]
        pages: list[list[int]] = [[] for _ in range(chain.num_bands)]
        for i, v in take:
            pages[i].append(v)
            held[i].remove(v)
        index = evictor.insert(pages)
        if rng.random() < 0.2:
            evictor.lock(index)
    chain.set_evictor(evictor)
    return evictor


def check_eviction_agreement(
        chain: Chain, evictor: ReferenceEvictor, *,
        least: Callable[[ChainSnapshot, Demand], int | None] = least_eviction,
) -> tuple[int, list[tuple[tuple[int, ...], int | None, int | None]]]:
    """Compare the least eviction prefix on every unit direction at and past capacity.

    Args:
        chain: a chain with ``evictor`` attached (read only).
        evictor: its reference evictor (the truth of which pages each unit frees).
        least: the planner's query (replaceable to plant defects).

    Returns:
        ``(decisions, disagreements)``; each disagreement is ``(demand, planner, oracle)``.
    """
    snap = chain.snapshot()
    units = snap.evictable.units
    found = []
    decisions = 0
    for unit in unit_directions(len(snap.bands)):
        n = max_units(snap, unit)
        for k in sorted({1, max(n // 2, 1), n, n + 1}):
            demand = unit.scaled(k)
            planner = least(snap, demand)
            oracle = oracle_least_eviction(chain, demand, evictor.unit_pages, units)
            decisions += 1
            if planner != oracle:
                found.append((demand.pages, planner, oracle))
    return decisions, found
