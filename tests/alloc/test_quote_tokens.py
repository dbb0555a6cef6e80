"""Quotes are tokens: ``Chain.take`` realizes only a quote its own ``price`` issued for the
current snapshot and the demand taken; every forged, stale or altered quote is refused and
changes nothing (snapshot, epoch, page tables, buffer bytes, stats)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvchain.alloc import (
    Chain,
    Compact,
    Demand,
    Extend,
    PlanStep,
    Quote,
    Side,
    UseHoles,
)
from kvchain.alloc.pricing import apply_action
from kvchain.baselines import CapacityRule, PoolAllocator
from kvchain.buffer import NumpyBuffer
from kvchain.errors import (
    CapacityError,
    ForgedQuoteError,
    MovesBlockedError,
    PlanMismatchError,
    QuoteError,
    StaleQuoteError,
)
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.testing.unsafe import unsafe_take_plan


def layout_of(shape: str) -> ChainLayout:
    win = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    if shape == "two":  # window LOW END | full HIGH END, 32 B pages, 200 pages of bytes
        return plan_layout([win, full], 6_400, 1, null_pages=False)
    state = CacheClass(LifetimeClass.STATE, 0, 48, None, ())
    return plan_layout([state, win, full], 6_784, 1, null_pages=False)


def build(shape: str, seed: int) -> tuple[Chain, NumpyBuffer]:
    """A chain with pages taken, patterned bytes, and interior holes (seeded)."""
    layout = layout_of(shape)
    buf = NumpyBuffer(layout.buffer_bytes)
    chain = Chain(layout, buf)
    rng = np.random.default_rng(seed)
    n = chain.num_bands
    grant = chain.take(Demand(tuple(int(x) for x in rng.integers(10, 50, size=n))))
    for i, bl in enumerate(layout.bands):
        vids = np.asarray(grant.pages[i], dtype=np.int64)
        for vid, j in zip(vids.tolist(), chain.translate(i, vids).tolist(), strict=True):
            buf.write_page(bl, j, np.full(bl.page_bytes, (vid * 7 + i) % 251, np.uint8))
        drop = [v for v in grant.pages[i] if rng.random() < 0.4]
        if drop:
            chain.release(i, drop)
    return chain, buf


def state(chain: Chain, buf: NumpyBuffer) -> tuple:
    tables = tuple((b.v2p.tobytes(), b.p2v.tobytes(), b.is_hole.tobytes(), b.lo_idx,
                    b.hi_idx, b.live, b.holes, np.sort(b.free_vids()).tobytes())
                   for b in (chain.band(i) for i in range(chain.num_bands)))
    return (chain.snapshot(), chain.epoch, tables, buf.array.tobytes(), chain.gate,
            chain.stats)


def mutated(chain: Chain, quote: Quote, kind: str, rng: np.random.Generator) -> Quote:
    """A quote that differs from what the chain issued, by ``kind``."""
    steps = list(quote.steps)
    n = chain.num_bands
    if not steps and kind in ("step_removed", "step_changed"):
        kind = "step_added"  # nothing to remove or change in an empty plan
    if kind == "rebuilt":  # same content, a new object: no token
        return Quote(quote.demand, quote.before, tuple(steps), quote.fits, quote.shortfall_bytes,
                     quote.reason, quote.copied_bytes)
    if kind == "step_added":
        band = int(rng.integers(n))
        extra = UseHoles(band, 1)
        steps.append(PlanStep(extra, quote.after))
    elif kind == "step_removed" and steps:
        del steps[int(rng.integers(len(steps)))]
    elif kind == "step_changed" and steps:
        k = int(rng.integers(len(steps)))
        a = steps[k].action
        new_action = replace(a, pages=a.pages + 1) if hasattr(a, "pages") else UseHoles(0, 1)
        steps[k] = PlanStep(new_action, steps[k].after)
    elif kind == "before_other_epoch":
        before = replace(quote.before, epoch=quote.before.epoch + 1)
        out = Quote(quote.demand, before, quote.steps, quote.fits)
        return out
    elif kind == "fits_flipped":
        forged = Quote(quote.demand, quote.before, quote.steps, not quote.fits)
        object.__setattr__(quote, "fits", not quote.fits)  # and the issued object altered
        return forged if rng.random() < 0.5 else quote
    # Alter the issued object in place (frozen dataclasses can still be forced).
    object.__setattr__(quote, "steps", tuple(steps))
    return quote


KINDS = ["rebuilt", "step_added", "step_removed", "step_changed", "before_other_epoch",
         "fits_flipped", "demand_changed", "stale", "other_chain", "pool_quote"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(["two", "three"]), seed=st.integers(0, 2**16),
       kind=st.sampled_from(KINDS), pages=st.lists(st.integers(0, 60), min_size=3,
                                                     max_size=3))
def test_forged_stale_and_mutated_quotes_change_nothing(shape: str, seed: int, kind: str,
                                                        pages: list[int]) -> None:
    chain, buf = build(shape, seed)
    rng = np.random.default_rng(seed + 1)
    demand = Demand(tuple(pages[:chain.num_bands]))
    quote = chain.price(demand)
    take_demand = demand
    if kind == "demand_changed":
        take_demand = Demand(tuple(p + 1 for p in demand.pages))
    elif kind == "stale":
        chain.release(0, [int(np.flatnonzero(chain.band(0).v2p >= 0)[0])])
    elif kind == "other_chain":
        twin, _ = build(shape, seed)  # the very same snapshot, another chain
        quote = twin.price(demand)
    elif kind == "pool_quote":
        pool = PoolAllocator(chain.layout, CapacityRule.SHARED)
        quote = pool.price(Demand((0,) * chain.num_bands))
        take_demand = quote.demand
    else:
        quote = mutated(chain, quote, kind, rng)
    before = state(chain, buf)
    with pytest.raises(QuoteError) as err:
        chain.take(take_demand, quote)
    if kind == "stale":
        assert isinstance(err.value, StaleQuoteError)
    assert state(chain, buf) == before


def test_the_issued_quote_is_realized_and_then_spent() -> None:
    chain, buf = build("two", 3)
    demand = Demand((5, 5))
    quote = chain.price(demand)
    grant = chain.take(demand, quote)
    assert grant.quote is quote and chain.snapshot() == quote.after
    before = state(chain, buf)
    with pytest.raises(StaleQuoteError):  # the take moved the epoch: a quote is used once
        chain.take(demand, quote)
    assert state(chain, buf) == before


def test_pool_allocator_refuses_a_forged_fit() -> None:
    """The baselines take the same tokens: a hand-built "fits" quote for a demand beyond the
    fixed pool (20 window pages, the pool holds 10) is refused, and nothing changes."""
    layout = layout_of("two")
    pool = PoolAllocator(layout, CapacityRule.FIXED, (10, 100))
    demand = Demand((20, 0))
    real = pool.price(demand)
    assert not real.fits
    forged = Quote(demand, real.before, (), True)
    epoch = pool.epoch
    with pytest.raises(ForgedQuoteError):
        pool.take(demand, forged)
    with pytest.raises(CapacityError):
        pool.take(demand, real)
    assert pool.epoch == epoch and pool.bound_pages(0) == 0


def test_review_case_gate_closed_two_step_plan_binds_nothing() -> None:
    """The review's case: a hand-built plan that binds a page and then compacts, taken with
    the gate closed, used to raise after the epoch moved and one page was bound. Now every
    action is checked first: MovesBlockedError, and nothing changed."""
    chain, buf = build("two", 5)
    chain.set_move_gate(False, realize_moves=False)
    snap = chain.snapshot()
    band = 0 if snap.bands[0].holes >= 2 else 1
    side = Side.HIGH if band == 0 else Side.LOW
    pages = [0, 0]
    pages[band] = 1
    demand = Demand(tuple(pages))
    use = UseHoles(band, 1)
    after_use = apply_action(snap, use)
    b = after_use.bands[band]  # the compaction's prediction by hand: one hole, one page less
    p = b.page_bytes
    moved = (replace(b, hi=b.hi - p, holes=b.holes - 1) if side is Side.HIGH
             else replace(b, lo=b.lo + p, holes=b.holes - 1))
    compact = PlanStep(Compact(band, side, 1), after_use.with_band(band, moved))
    quote = Quote(demand, snap, (PlanStep(use, after_use), compact), True)
    before = state(chain, buf)
    with pytest.raises(MovesBlockedError):
        unsafe_take_plan(chain, demand, quote)
    assert state(chain, buf) == before


def test_hand_plan_with_a_wrong_page_count_binds_nothing() -> None:
    chain, buf = build("two", 6)
    snap = chain.snapshot()
    ext = Extend(0, Side.HIGH, 2)
    quote = Quote(Demand((3, 0)), snap, (PlanStep(ext, apply_action(snap, ext)),), True)
    before = state(chain, buf)
    with pytest.raises(PlanMismatchError):  # binds 2 pages for a demand of 3
        unsafe_take_plan(chain, Demand((3, 0)), quote)
    assert state(chain, buf) == before


def test_an_epoch_bump_outside_the_mutation_path_still_makes_quotes_stale() -> None:
    """A registered quote is checked against the epoch too, not only removed by the
    mutation path: bumping the epoch directly (as a path that forgets to empty the
    registry would) still refuses it."""
    chain, buf = build("two", 8)
    quote = chain.price(Demand((1, 1)))
    chain._epoch += 1  # planted: an epoch bump that bypasses _apply
    chain._snap = None
    before = state(chain, buf)
    with pytest.raises(StaleQuoteError):
        chain.take(Demand((1, 1)), quote)
    assert state(chain, buf) == before
