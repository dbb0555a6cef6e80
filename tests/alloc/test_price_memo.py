"""The price memo belongs to one allocator and dies with its epoch: a repeat on an unchanged
chain returns the quote already issued; another chain (another planner) or another epoch
never sees it; it is bounded; a memo hit never skips demand validation nor the check of an
altered quote. The pure planner (``pricing.price``) keeps nothing between calls."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvchain.alloc import Chain, Demand, Extend, Side, UseHoles, pricing
from kvchain.alloc.pricing import GENERAL_PLANNER, Planner, _price_uncached, price
from kvchain.alloc.quotes import MAX_ISSUED_PER_EPOCH, plan_actions
from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot, EvictionOrder, RefusalReason
from kvchain.baselines import CapacityRule, PoolAllocator
from kvchain.errors import ConfigError, ForgedQuoteError, InvalidDemandError, StaleQuoteError
from kvchain.layout import Anchor, ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass


def _layout() -> ChainLayout:
    # window LOW END | full HIGH END, 32 B pages, B = 6,400 B: 200 pages of bytes in all
    win = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    return plan_layout([win, full], 6_400, 1, null_pages=False)


def _refuses_everything(snapshot: ChainSnapshot, demand: Demand) -> object:
    """A planted solver: every demand is refused, short by one page (32 B)."""
    return pricing._Refusal(RefusalReason.BYTES, 32)


def test_repeat_is_the_same_quote_and_equals_the_planner() -> None:
    chain = Chain(_layout())
    d = Demand((30, 30))
    first = chain.price(d)
    assert chain.price(d) is first
    assert chain.price(Demand((30, 30))) is first  # an equal demand object
    assert first == _price_uncached(chain.snapshot(), d)
    assert chain.take(d).quote is first  # a take without a quote realizes the issued one


def test_the_memo_dies_with_the_epoch() -> None:
    chain = Chain(_layout())
    d = Demand((10, 10))
    before = chain.price(d)
    grant = chain.take(Demand((1, 0)))  # one window page: a new epoch
    after = chain.price(d)
    assert after is not before and after.before is chain.snapshot()
    # 1 window page live now: 10 more window pages extend the LOW END to 11 x 32 = 352 B.
    assert after.after.bands[0].hi == 352 and before.after.bands[0].hi == 320
    with pytest.raises(StaleQuoteError):
        chain.take(d, before)
    chain.release(0, grant.pages[0])  # another epoch: the released page is a hole now
    again = chain.price(d)
    # The LOW END's span [0, 32 B) holds 1 hole: it takes it, then extends 9 pages.
    assert again is not before and again.before is chain.snapshot()
    assert plan_actions(again) == (UseHoles(0, 1), Extend(0, Side.HIGH, 9),
                                   Extend(1, Side.LOW, 10))


def test_the_pure_planner_keeps_nothing() -> None:
    snap = Chain(_layout()).snapshot()
    d = Demand((30, 30))
    assert price(snap, d) is not price(snap, d)
    assert price(snap, d) == price(snap, d)


def test_each_chain_has_its_own_memo_and_planner() -> None:
    # Regression: with one memo for the process, a chain whose planner refuses everything
    # was served the quote the general planner had priced on an equal snapshot (which is
    # why every test had to start by emptying it).
    d = Demand((10, 10))  # 20 of 200 pages on an empty chain: fits in place
    assert Chain(_layout()).price(d).fits
    refusing = Chain(_layout(), planner=Planner(_refuses_everything))
    quote = refusing.price(d)
    assert not quote.fits and quote.shortfall_bytes == 32
    other = Chain(_layout())
    with pytest.raises(ForgedQuoteError):  # a quote of one chain is no token of another
        other.take(d, Chain(_layout()).price(d))


def test_a_planner_with_another_solver_answers_every_demand_itself() -> None:
    snap = Chain(_layout()).snapshot()
    d = Demand((1, 1))  # fits in place: the general planner's shortcut would answer it
    assert GENERAL_PLANNER.shortcut and GENERAL_PLANNER.fits(snap, d)
    planted = Planner(_refuses_everything)
    assert not planted.shortcut
    assert not planted.fits(snap, d) and planted.least_eviction(snap, d) is None
    assert not planted.price(snap, d).fits
    assert planted.max_units(snap, Demand((0, 1))) == 0
    assert GENERAL_PLANNER.max_units(snap, Demand((0, 1))) == 200  # 6,400 B / 32 B


def test_a_chain_refuses_a_planner_that_is_not_one() -> None:
    with pytest.raises(ConfigError):
        Chain(_layout(), planner=_refuses_everything)  # type: ignore[arg-type]


def test_hit_never_skips_validation() -> None:
    chain = Chain(_layout())
    chain.price(Demand((1, 0)))
    with pytest.raises(InvalidDemandError):
        chain.price(Demand((True, 0)))  # == (1, 0) and hashes alike, but a bool is refused
    with pytest.raises(InvalidDemandError):
        chain.take(Demand((True, 0)))


def test_an_altered_quote_is_not_realized_from_the_memo() -> None:
    chain = Chain(_layout())
    d = Demand((3, 0))
    quote = chain.price(d)
    object.__setattr__(quote, "fits", False)  # tampered with after pricing
    with pytest.raises(ForgedQuoteError):
        chain.take(d)  # the memo hit goes through the registry's check
    assert chain.bound_pages(0) == 0


def test_memo_is_bounded_and_an_evicted_demand_is_priced_again() -> None:
    chain = Chain(_layout())
    first = chain.price(Demand((0, 1)))
    for n in range(2, MAX_ISSUED_PER_EPOCH + 12):
        chain.price(Demand((0, n)))
    registry = chain._quotes
    assert len(registry._issued) == MAX_ISSUED_PER_EPOCH
    assert len(registry._by_pages) == MAX_ISSUED_PER_EPOCH
    again = chain.price(Demand((0, 1)))  # dropped as the oldest: priced afresh, a token
    assert again is not first and again == first
    assert chain.take(Demand((0, 1)), again).pages == ((), (0,))  # ids start at 0 per band


def test_pool_allocators_memo_their_quotes_per_epoch() -> None:
    pools = PoolAllocator(_layout(), CapacityRule.SHARED)
    d = Demand((2, 2))
    first = pools.price(d)
    assert pools.price(d) is first
    pools.take(Demand((1, 0)))
    assert pools.price(d) is not first


def test_a_snapshot_built_by_hand_is_priced_by_value() -> None:
    # The pure planner on two equal snapshots of different epochs: equal decisions.
    window = BandSnapshot("window", Anchor.LOW, 32, 0, 3_200, 60, 40, 1 << 20)
    full = BandSnapshot("full", Anchor.HIGH, 32, 3_200, 6_400, 20, 80, 1 << 20)
    a = ChainSnapshot(6_400, (window, full), 1)
    b = replace(a, epoch=2)
    qa, qb = price(a, Demand((50, 50))), price(b, Demand((50, 50)))
    assert qa.fits and qa.needs_moves and qb.before is b and qa.steps == qb.steps


# --- the O(1) repeat (round 6) --------------------------------------------------------------


def _counting_chain() -> tuple[Chain, list[int]]:
    """A chain whose planner counts its solver runs (the general solver, no shortcut, so
    every planner run is one count)."""
    runs = [0]

    def counted(snapshot: ChainSnapshot, demand: Demand) -> object:
        runs[0] += 1
        return pricing._solve(snapshot, demand)

    return Chain(_layout(), planner=Planner(counted)), runs  # type: ignore[arg-type]


def test_a_repeat_runs_no_planner_until_the_epoch_moves() -> None:
    chain, runs = _counting_chain()
    d = Demand((4, 4))
    first = chain.price(d)
    assert runs == [1]
    assert chain.price(d) is first  # the same object: the last-answer entry
    assert chain.price(Demand(d.pages)) is first  # a new Demand on the same tuple
    assert chain.price(Demand(tuple([4, 4]))) is first  # a new, equal tuple: the lookup
    other = chain.price(Demand((1, 0)))
    assert chain.price(d) is first and chain.price(Demand((1, 0))) is other
    assert runs == [2]  # two distinct demands priced once each
    chain.take(Demand((1, 0)), other)  # a new epoch: both answers die with it
    again = chain.price(d)
    assert again is not first and again.before is chain.snapshot() and runs == [3]


@pytest.mark.parametrize("pages", [(True, 0), (1.0, 0), (np.int64(1), 0), ([1], 0), [1, 0],
                                   (1, 0, 0), (1,)])
def test_a_lookalike_of_a_priced_demand_is_refused_typed(pages: object) -> None:
    # (True, 0), (1.0, 0) and (np.int64(1), 0) equal the priced (1, 0) and hash alike: the
    # repeat must not serve them; ([1], 0) cannot hash; a list is not a tuple; the wrong
    # number of bands. Each reaches the full validation and is refused, nothing changes.
    chain = Chain(_layout())
    quote = chain.price(Demand((1, 0)))
    epoch = chain.epoch
    with pytest.raises(InvalidDemandError):
        chain.price(Demand(pages))  # type: ignore[arg-type]
    assert chain.epoch == epoch and chain.price(Demand((1, 0))) is quote


def test_the_sibling_a_repeat_without_the_type_scan_serves_a_bool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted defect: the registry's repeat trusts equality alone. Then (True, 0) is served
    # the quote of (1, 0): the type scan is what makes the test above fail-able.
    from kvchain.alloc import quotes

    def trusting(self: quotes.QuoteRegistry, snapshot: ChainSnapshot,
                 pages: object) -> object:
        hit = self._by_pages.get(pages)  # type: ignore[call-overload]
        return None if hit is None or hit[1].before is not snapshot else hit[1]

    monkeypatch.setattr(quotes.QuoteRegistry, "repeat", trusting)
    chain = Chain(_layout())
    quote = chain.price(Demand((1, 0)))
    assert chain.price(Demand((True, 0))) is quote  # type: ignore[arg-type]


def test_a_pending_fence_is_polled_before_a_repeat_is_served() -> None:
    from kvchain.buffer import ManualFence

    chain = Chain(_layout())
    fence = ManualFence()
    chain.begin_forward(fence)
    d = Demand((2, 2))
    pending = chain.price(d)
    assert pending.before.bands[0].fence_pending
    assert chain.price(d) is pending  # the fence still pending: the same epoch
    fence.complete()
    # The completed fence is one epoch bump (_FenceDone) seen by the next query: a new
    # snapshot whose bands no longer say a fence is pending, and a new quote on it.
    done = chain.price(d)
    assert done is not pending and not done.before.bands[0].fence_pending


def test_an_evictor_version_bump_is_seen_by_a_repeat() -> None:
    class Empty:
        """An evictor holding nothing; only its version moves."""

        version = 0

        def eviction_order(self) -> EvictionOrder:
            return EvictionOrder.from_units([], 2)

        def evict(self, units: int) -> tuple[np.ndarray, ...]:
            raise AssertionError("nothing to evict")

    chain = Chain(_layout())
    evictor = Empty()
    chain.set_evictor(evictor)  # type: ignore[arg-type]
    d = Demand((2, 2))
    first = chain.price(d)
    assert chain.price(d) is first
    epoch = chain.epoch
    evictor.version += 1  # the cache changed: the chain's capacity epoch must move
    again = chain.price(d)
    assert again is not first and chain.epoch == epoch + 1 and again.before.epoch == epoch + 1
