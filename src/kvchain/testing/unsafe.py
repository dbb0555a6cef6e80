"""Test-only entry to the chain's take path with hand-written plans.

``Chain.take`` realizes only quotes its own ``price`` issued (quotes are tokens; see
docs/architecture.md). Tests that need a specific plan - a relocation the planner would
not choose, a deliberately wrong prediction - go through :func:`unsafe_take_plan`, which is
not part of the chain's public surface. The plan still passes the executor's phase-1
checks (every action checked, every predicted snapshot recomputed) before anything is
applied, so a bad hand-written plan raises and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvchain.alloc.chain import Chain, Grant
from kvchain.alloc.pricing import apply_action
from kvchain.alloc.snapshot import Action, Demand, Extend, PlanStep, Quote, UseHoles


def hand_plan(chain: Chain, actions: Sequence[Action]) -> tuple[Demand, Quote]:
    """A quote for ``actions`` on the chain's current snapshot, each step's prediction
    computed by the pure planner's ``apply_action``; the demand is the pages the plan's
    ``UseHoles`` and ``Extend`` bind per band.

    Raises:
        PlanMismatchError: an action impossible on the predicted snapshot.
    """
    before = chain.snapshot()
    pages = [0] * chain.num_bands
    snap = before
    steps = []
    for action in actions:
        snap = apply_action(snap, action)
        steps.append(PlanStep(action, snap))
        if isinstance(action, UseHoles | Extend):
            pages[action.band] += action.pages
    demand = Demand(tuple(pages))
    return demand, Quote(demand, before, tuple(steps), True)


def unsafe_take_plan(chain: Chain, demand: Demand, quote: Quote | Sequence[Action]) -> Grant:
    """Realize a hand-written plan on ``chain`` (tests only).

    Args:
        chain: the chain.
        demand: the pages the plan must bind per band.
        quote: a hand-built :class:`Quote` (its ``before`` must equal the chain's snapshot),
            or the plan's actions (predictions computed as in :func:`hand_plan`).

    Returns:
        The grant, as :meth:`Chain.take` returns it.

    Raises:
        PlanMismatchError: a prediction differs from what the action gives, the plan binds
            other pages than ``demand``, or an action is impossible; nothing changed.
        MovesBlockedError: a copy with the move gate closed; nothing changed.
        CapacityError: a quote that says it does not fit; nothing changed.
    """
    if not isinstance(quote, Quote):
        _, quote = hand_plan(chain, quote)
        quote = Quote(demand, quote.before, quote.steps, True)
    chain._check_demand(demand)
    return chain._realize(demand, quote, verify_predictions=True)
