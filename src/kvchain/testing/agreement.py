"""Planner vs oracle on corner states: every demand at and just past capacity.

For a chain state and every unit direction (each non-empty 0/1 vector over the bands:
one band alone, pairs, all bands), the planner's capacity ``n = max_units(snapshot,
unit)`` must be exactly what the oracle (:mod:`kvchain.testing.oracle`) can hold:
``n x unit`` fits in the oracle, ``(n + 1) x unit`` does not. Also measured: the **grid
slack**, bytes free at capacity beyond one more unit (``free - n x unit_bytes -
unit_bytes``, when positive), which page-grid rounding of the float or ENDs leaves
unused; docs/design.md contract 3 allows at most one float page per edge.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from kvchain.alloc import Chain, ChainSnapshot, Demand
from kvchain.alloc.pricing import fits, largest_fitting, max_units
from kvchain.testing.oracle import OracleProblem, oracle_fits


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Planner and oracle differ on one demand.

    Attributes:
        demand: pages per band.
        planner_fits: the planner's decision.
        oracle_fits: the oracle's decision.
    """

    demand: tuple[int, ...]
    planner_fits: bool
    oracle_fits: bool


@dataclass(frozen=True, slots=True)
class AgreementResult:
    """Result of :func:`check_agreement` on one chain state.

    Attributes:
        decisions: demands decided by both.
        states: oracle states visited in all.
        disagreements: every demand they decided differently.
        max_slack_bytes: largest grid slack measured (0 if none).
        max_slack_float_pages: that slack in float pages (``ceil(bytes / P_float)``; 0
            without a float).
    """

    decisions: int
    states: int
    disagreements: tuple[Disagreement, ...]
    max_slack_bytes: int
    max_slack_float_pages: int


def unit_directions(num_bands: int) -> tuple[Demand, ...]:
    """Every non-empty 0/1 demand over ``num_bands`` bands."""
    return tuple(Demand(bits) for bits in itertools.product((0, 1), repeat=num_bands)
                 if any(bits))


def check_agreement(chain: Chain, *,
                    capacity: Callable[[ChainSnapshot, Demand], int] = max_units
                    ) -> AgreementResult:
    """Compare the planner's capacity with the oracle on every unit direction.

    Args:
        chain: the chain state (read only).
        capacity: the planner's capacity query (replaceable to plant defects).
    """
    snap = chain.snapshot()
    problem = OracleProblem.from_chain(chain)
    float_bytes = next((b.page_bytes for b in snap.bands if b.anchor.value == "float"), 0)
    decisions = states = 0
    found: list[Disagreement] = []
    max_slack = 0
    for unit in unit_directions(len(snap.bands)):
        n = capacity(snap, unit)
        for k, planner in ((n, True), (n + 1, False)):
            if k == 0:
                continue
            verdict = oracle_fits(problem, unit.scaled(k))
            decisions += 1
            states += verdict.states
            if verdict.fits != planner:
                found.append(Disagreement(unit.scaled(k).pages, planner, verdict.fits))
        unit_bytes = sum(d * b.page_bytes for d, b in zip(unit.pages, snap.bands, strict=True))
        if snap.bands[0].movable:
            max_slack = max(max_slack, snap.free_bytes - (n + 1) * unit_bytes)
    pages = -(-max_slack // float_bytes) if float_bytes and max_slack > 0 else 0
    return AgreementResult(decisions, states, tuple(found), max(max_slack, 0), pages)


def check_demand_sweep(chain: Chain, max_pages: int = 12) -> AgreementResult:
    """Every demand at and just past capacity, not only unit directions: for each
    ``head`` in ``[0, max_pages]^(bands - 1)`` the planner fits, the largest last-band
    demand ``n`` (:func:`~kvchain.alloc.pricing.largest_fitting`) must fit in the oracle and
    ``n + 1`` must not. Grid slack is not measured here (0 in the result).
    """
    snap = chain.snapshot()
    problem = OracleProblem.from_chain(chain)
    nb = len(snap.bands)
    upper = max(b.cap for b in snap.bands)
    decisions = states = 0
    found: list[Disagreement] = []
    for head in itertools.product(range(max_pages + 1), repeat=nb - 1):
        if not fits(snap, Demand((*head, 0))):
            continue
        def fits_last(k: int, head: tuple[int, ...] = head) -> bool:
            return fits(snap, Demand((*head, k)))

        n = largest_fitting(fits_last, upper)
        for k, planner in ((n, True), (n + 1, False)):
            demand = Demand((*head, k))
            verdict = oracle_fits(problem, demand)
            decisions += 1
            states += verdict.states
            if verdict.fits != planner:
                found.append(Disagreement(demand.pages, planner, verdict.fits))
    return AgreementResult(decisions, states, tuple(found), 0, 0)
