"""Eviction priced by the planner: the least eviction prefix, the ``Evict`` step, and the
chain realizing it through an evictor (the prefix cache's side of the contract).

Numbers are derived by hand on the two-END chain of ``docs/pricing.md``: pages of 32 B,
``B = 6,400 B`` (200 pages), both ENDs full with 100 live pages each, and an eviction
order of three units freeing ``(0, 5)``, ``(10, 0)`` and ``(0, 20)`` pages (A, Z).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc import Chain, Demand, Evict, EvictionOrder
from kvchain.alloc.pricing import apply_action, fits, least_eviction, max_units, price
from kvchain.alloc.snapshot import (
    BandSnapshot,
    ChainSnapshot,
    Compact,
    Extend,
    RefusalReason,
    Side,
    UseHoles,
)
from kvchain.errors import AuditError, CapacityError, InvalidDemandError, PlanMismatchError
from kvchain.layout import Anchor, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass

ORDER = EvictionOrder.from_units([(0, 5), (10, 0), (0, 20)], 2)


def full_chain(movable: bool = True, order: EvictionOrder = ORDER) -> ChainSnapshot:
    a = BandSnapshot("window", Anchor.LOW, 32, 0, 3_200, 100, 0, 10_000, movable)
    z = BandSnapshot("full", Anchor.HIGH, 32, 3_200, 6_400, 100, 0, 10_000, movable)
    return ChainSnapshot(6_400, (a, z), 0, order)


# --- the value object -----------------------------------------------------------------


def test_order_cumulative_rows_and_suffix():
    assert ORDER.cumulative == ((0, 0), (0, 5), (10, 5), (10, 25))
    assert ORDER.units == 3
    assert ORDER.after(1).cumulative == ((0, 0), (10, 0), (10, 20))
    assert ORDER.after(3) == EvictionOrder()
    assert EvictionOrder.from_units([], 2) == EvictionOrder()


@pytest.mark.parametrize("rows", [((1, 0),), ((0, 0), (1,)), ((0, 0), (2, 0), (1, 0)),
                                  ((0,), (True,)), ()])
def test_malformed_orders_are_refused(rows):
    with pytest.raises(InvalidDemandError):
        EvictionOrder(rows)


# --- pricing ----------------------------------------------------------------------------


def test_no_eviction_when_the_demand_fits_as_is():
    order = EvictionOrder.from_units([(0, 5)], 2)
    snap = full_chain(order=order)
    a = snap.bands[0]
    snap = snap.with_band(0, BandSnapshot("window", Anchor.LOW, 32, 0, 3_200, 97, 3, 10_000))
    assert a.live == 100
    quote = price(snap, Demand((3, 0)))
    assert quote.fits and quote.evicted_units == 0
    assert [s.action for s in quote.steps] == [UseHoles(0, 3)]


def test_least_prefix_frees_exactly_what_is_needed():
    snap = full_chain()
    # Without the cache (0, 3) is refused by the byte bound: 100*32 + 103*32 - 6,400 = 96 B.
    bare = price(ChainSnapshot(6_400, snap.bands), Demand((0, 3)))
    assert not bare.fits and bare.shortfall_bytes == 96
    # The first unit frees 5 pages of Z: 3 of them are used in place.
    quote = price(snap, Demand((0, 3)))
    assert [s.action for s in quote.steps] == [Evict(1), UseHoles(1, 3)]
    z = quote.after.bands[1]
    assert (z.live, z.holes, z.lo) == (98, 2, 3_200)
    assert quote.after.evictable.cumulative == ((0, 0), (10, 0), (10, 20))
    # A's 8 pages need the second unit (the first frees only Z pages: Z cannot compact 8
    # pages with 5 spare holes, and the byte bound 108*32 + 95*32 = 6,496 > 6,400).
    assert least_eviction(snap, Demand((8, 0))) == 2
    assert [s.action for s in price(snap, Demand((8, 0))).steps] == [Evict(2), UseHoles(0, 8)]
    # (10, 15) needs all three: after two, 100*32 + 110*32 = 6,720 > 6,400.
    assert least_eviction(snap, Demand((10, 15))) == 3


def test_eviction_then_moves():
    # (11, 15) after all three units: A 90 live + 10 holes, Z 75 live + 25 holes; A needs
    # one page beyond its holes and the gap is 0, so Z compacts one spare page (32 B).
    quote = price(full_chain(), Demand((11, 15)))
    assert [s.action for s in quote.steps] == [
        Evict(3), Compact(1, Side.LOW, 1), UseHoles(0, 10), UseHoles(1, 15),
        Extend(0, Side.HIGH, 1)]
    assert quote.copied_bytes == 32
    # With the gate closed the compaction is impossible: refused after evicting everything.
    closed = price(full_chain(movable=False), Demand((11, 15)))
    assert not closed.fits and closed.reason is RefusalReason.MOVES_BLOCKED


def test_refusal_after_evicting_everything_gives_the_smallest_shortfall():
    # All units evicted: (90 + 50) * 32 + (75 + 50) * 32 - 6,400 = 2,080 B.
    quote = price(full_chain(), Demand((50, 50)))
    assert not quote.fits and quote.reason is RefusalReason.BYTES
    assert quote.shortfall_bytes == 2_080
    assert least_eviction(full_chain(), Demand((50, 50))) is None
    assert not fits(full_chain(), Demand((50, 50)))


def test_max_units_counts_evictable_supply():
    # No free byte, 10 + 25 evictable pages of 32 B: after evicting all three units each
    # END's spare holes compact away and open the gap to the other END, so either band
    # fits 35 pages; 36 would break the byte bound (200 - 165 live = 35 pages).
    assert max_units(full_chain(), Demand((0, 1))) == 35
    assert max_units(full_chain(), Demand((1, 0))) == 35
    assert max_units(ChainSnapshot(6_400, full_chain().bands), Demand((0, 1))) == 0


def test_evict_past_the_order_is_a_mismatch():
    with pytest.raises(PlanMismatchError):
        apply_action(full_chain(), Evict(4))
    with pytest.raises(PlanMismatchError):
        apply_action(ChainSnapshot(6_400, full_chain().bands), Evict(1))


@settings(max_examples=200, deadline=None)
@given(units=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=6),
       da=st.integers(0, 40), dz=st.integers(0, 40), movable=st.booleans())
def test_least_prefix_is_the_first_that_fits(units, da, dz, movable):
    """The binary search agrees with a linear scan over every prefix (monotone)."""
    order = EvictionOrder.from_units(units, 2)
    total = order.freed(order.units) if order.units else (0, 0)
    a = BandSnapshot("window", Anchor.LOW, 32, 0, 3_200, 100, 0, 10_000, movable)
    z = BandSnapshot("full", Anchor.HIGH, 32, 3_200, 6_400, 100, 0, 10_000, movable)
    assert total[0] <= 100 and total[1] <= 100
    snap = ChainSnapshot(6_400, (a, z), 0, order)
    demand = Demand((da, dz))
    scan = None
    for k in range(order.units + 1):
        s = snap if k == 0 else apply_action(snap, Evict(k))
        if fits(ChainSnapshot(6_400, s.bands), demand):
            scan = k
            break
    assert least_eviction(snap, demand) == scan
    quote = price(snap, demand)
    assert quote.fits == (scan is not None)
    if scan:
        assert quote.evicted_units == scan


# --- the executor with an evictor ---------------------------------------------------------


class ListEvictor:
    """A minimal prefix cache: units of held virtual ids per band, evicted in list order."""

    def __init__(self, units: list[tuple[list[int], ...]], lie: bool = False) -> None:
        self.units = units
        self.version = 0
        self.lie = lie

    def eviction_order(self) -> EvictionOrder:
        return EvictionOrder.from_units([tuple(len(v) for v in u) for u in self.units], 2)

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        gone, self.units = self.units[:units], self.units[units:]
        self.version += 1
        out = tuple(np.asarray([v for u in gone for v in u[i]], dtype=np.int64)
                    for i in range(2))
        if self.lie:  # a planted defect: the cache hands back one page too few
            out = (out[0], out[1][:-1])
        return out


def two_end_chain() -> Chain:
    window = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    return Chain(plan_layout([window, full], 6_400, 1, null_pages=False), debug_audit=True)


def filled_chain(lie: bool = False) -> tuple[Chain, ListEvictor]:
    chain = two_end_chain()
    grant = chain.take(Demand((100, 100)))
    a, z = grant.pages
    evictor = ListEvictor([([], list(z[:5])), (list(a[:10]), []), ([], list(z[5:25]))], lie)
    chain.set_evictor(evictor)
    return chain, evictor


def test_take_evicts_exactly_the_priced_prefix():
    chain, evictor = filled_chain()
    epoch = chain.epoch
    quote = chain.price(Demand((11, 15)))
    assert quote.evicted_units == 3
    grant = chain.take(Demand((11, 15)), quote)
    assert chain.snapshot() == quote.after
    assert [len(p) for p in grant.pages] == [11, 15]
    assert chain.stats.pages_evicted == 35 and chain.stats.pages_copied <= 1
    assert evictor.units == [] and chain.epoch > epoch
    chain.audit()


def test_a_lying_evictor_is_a_divergence_not_a_silent_leak():
    chain, _ = filled_chain(lie=True)
    with pytest.raises(PlanMismatchError):
        chain.take(Demand((0, 3)))


def test_capacity_error_changes_nothing_with_an_evictor():
    chain, evictor = filled_chain()
    before, epoch = chain.snapshot(), chain.epoch
    with pytest.raises(CapacityError):
        chain.take(Demand((50, 50)))
    assert chain.snapshot() == before and chain.epoch == epoch and len(evictor.units) == 3


def test_a_version_bump_is_a_new_epoch_and_a_new_snapshot():
    chain, evictor = filled_chain()
    snap, epoch = chain.snapshot(), chain.epoch
    evictor.units = evictor.units[:1]
    evictor.version += 1
    assert chain.epoch == epoch  # read lazily, on the next snapshot
    fresh = chain.snapshot()
    assert chain.epoch == epoch + 1 and fresh != snap
    assert fresh.evictable.cumulative == ((0, 0), (0, 5))


def test_set_evictor_refuses_a_non_evictor():
    chain = two_end_chain()
    with pytest.raises(InvalidDemandError):
        chain.set_evictor(object())  # type: ignore[arg-type]


def test_an_audit_between_a_version_bump_and_the_next_snapshot_keeps_it_fresh():
    """Regression: building a snapshot for the audit must not mark a stale cached snapshot
    as current (the chain would then price on the old evictable supply)."""
    chain, evictor = filled_chain()
    chain.snapshot()
    evictor.units = evictor.units[:1]
    evictor.version += 1
    chain.audit()
    assert chain.snapshot().evictable.cumulative == ((0, 0), (0, 5))


def test_an_order_changed_without_a_version_bump_is_refused_before_anything_changes():
    """A broken Evictor drops its first unit but keeps its version: the quote (3 units,
    35 pages) no longer matches what ``evict(3)`` would free (the live order has 2 units).
    The take refuses in phase 1 (typed), nothing is evicted and the chain is unchanged."""
    chain, evictor = filled_chain()
    quote = chain.price(Demand((11, 15)))
    snap, epoch = chain.snapshot(), chain.epoch
    evictor.units = evictor.units[1:]  # no version bump: the planted contract break
    with pytest.raises(PlanMismatchError, match="without a version bump"):
        chain.take(Demand((11, 15)), quote)
    assert chain.snapshot() == snap and chain.epoch == epoch and len(evictor.units) == 2
    with pytest.raises(AuditError):  # the audit names the stale order too
        chain.audit()


def test_the_sibling_with_a_version_bump_takes_on_the_new_order():
    """Sibling of the test above: with the bump the old quote is stale and a fresh price
    evicts from the new order (both remaining units: 10 + 20 pages)."""
    chain, evictor = filled_chain()
    chain.price(Demand((11, 15)))
    evictor.units = evictor.units[1:]
    evictor.version += 1
    grant = chain.take(Demand((11, 15)))
    assert grant.quote.evicted_units == 2 and chain.stats.pages_evicted == 30


@pytest.mark.parametrize("order", [EvictionOrder.from_units([(1, 1, 1)], 3), ((0, 0),)])
def test_an_order_of_the_wrong_width_or_type_is_a_typed_error(order):
    """An evictor whose order has 3 bands on a 2-band chain (or is not an EvictionOrder)
    gets PlanMismatchError from price and take, never a bare ValueError."""
    chain, evictor = filled_chain()

    class Wrong(ListEvictor):
        def eviction_order(self):  # type: ignore[override]
            return order

    wrong = Wrong(list(evictor.units), False)
    chain.set_evictor(wrong)
    with pytest.raises(PlanMismatchError):
        chain.price(Demand((0, 3)))
    with pytest.raises(PlanMismatchError):
        chain.take(Demand((0, 3)))
    assert len(wrong.units) == 3
