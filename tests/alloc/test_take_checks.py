"""The take's checks after each action: O(bands) counters with the audit flag off, the
full rebuild-and-compare with it on; which planted defect each one catches.

Chain: the two-END chain of ``docs/pricing.md`` (pages of 32 B, ``B = 6,400 B``: 200 pages),
both ENDs full with 100 live pages; an evictor offers three units freeing ``(0, 5)``,
``(10, 0)`` and ``(0, 20)`` pages (window, full). A demand of 3 full pages fits only after
evicting the first unit: the plan is ``Evict(1)``, ``UseHoles(full, 3)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc import Chain, Demand, EvictionOrder
from kvchain.alloc.band import Band
from kvchain.alloc.snapshot import Evict, UseHoles
from kvchain.audit import AUDIT_ENV, resolve_audit
from kvchain.errors import ConfigError, PlanMismatchError
from kvchain.layout import plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass


class ListEvictor:
    """Units of held virtual ids per band, evicted in list order; ``permute`` plants a
    defect: after an eviction the two next units swap places (same totals, other rows)."""

    def __init__(self, units: list[tuple[list[int], ...]], permute: bool = False) -> None:
        self.units = units
        self.version = 0
        self.permute = permute

    def eviction_order(self) -> EvictionOrder:
        return EvictionOrder.from_units([tuple(len(v) for v in u) for u in self.units], 2)

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        gone, self.units = self.units[:units], self.units[units:]
        if self.permute and len(self.units) >= 2:
            self.units[0], self.units[1] = self.units[1], self.units[0]
        self.version += 1
        return tuple(np.asarray([v for u in gone for v in u[i]], dtype=np.int64)
                     for i in range(2))


def filled(audit: bool, permute: bool = False) -> tuple[Chain, ListEvictor]:
    window = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    chain = Chain(plan_layout([window, full], 6_400, 1, null_pages=False), audit=audit)
    a, z = chain.take(Demand((100, 100))).pages
    evictor = ListEvictor([([], list(z[:5])), (list(a[:10]), []), ([], list(z[5:25]))],
                          permute)
    chain.set_evictor(evictor)
    return chain, evictor


@pytest.mark.parametrize("audit", [False, True])
def test_take_realizes_the_plan_under_both_checks(audit: bool) -> None:
    chain, evictor = filled(audit)
    quote = chain.price(Demand((0, 3)))
    assert [s.action for s in quote.steps] == [Evict(1), UseHoles(1, 3)]
    chain.take(Demand((0, 3)), quote)
    # 5 full pages freed, 3 taken: 98 live and 2 holes; the order left: (10, 0), (0, 20).
    snap = chain.snapshot()
    assert (snap.bands[1].live, snap.bands[1].holes) == (98, 2)
    assert snap == quote.after and snap.evictable.cumulative == ((0, 0), (10, 0), (10, 20))
    assert len(evictor.units) == 2


@pytest.mark.parametrize("audit", [False, True])
def test_a_planted_executor_bug_is_caught_with_the_audit_on_and_off(
        audit: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted executor defect: UseHoles binds its pages and then drops the last one again
    (live 97 instead of 98): the counters differ from the prediction, so the cheap check
    names the band, and the rebuild-and-compare the whole snapshot."""
    real = Band.use_holes

    def drops_one(self: Band, k: int) -> np.ndarray:
        vids = real(self, k)
        self.release(vids[-1:])
        return vids

    monkeypatch.setattr(Band, "use_holes", drops_one)
    chain, _ = filled(audit)
    with pytest.raises(PlanMismatchError, match="!= predicted" if audit else "band 1 is"):
        chain.take(Demand((0, 3)))


def test_an_order_permuted_behind_equal_totals_is_caught_by_the_audit_only() -> None:
    """Planted evictor defect: after evicting it swaps its next two units. Units (2) and
    total ((10, 20)) still match the prediction, so the O(bands) check lets it pass - the
    rows ((0, 20) first instead of (10, 0)) are what only the audit compares."""
    chain, _ = filled(audit=False, permute=True)
    chain.take(Demand((0, 3)))  # the cheap check: units and total agree
    assert chain.snapshot().evictable.cumulative == ((0, 0), (0, 20), (10, 20))
    chain, _ = filled(audit=True, permute=True)
    with pytest.raises(PlanMismatchError, match="!= predicted"):
        chain.take(Demand((0, 3)))


def test_a_changed_total_is_caught_without_the_audit() -> None:
    """Sibling: a defect that changes the total (the evictor forgets its last unit while
    evicting the first) is caught by the cheap check: 1 unit offered, 2 predicted."""

    class Forgets(ListEvictor):
        def evict(self, units: int) -> tuple[np.ndarray, ...]:
            out = super().evict(units)
            self.units = self.units[:-1]
            return out

    chain, _ = filled(audit=False)
    chain.set_evictor(Forgets(chain.evictor.units))  # type: ignore[union-attr]
    with pytest.raises(PlanMismatchError, match="the evictor offers"):
        chain.take(Demand((0, 3)))


def test_an_evictor_answering_ids_in_a_nested_shape_is_caught_before_a_release() -> None:
    """Planted evictor defect: the first unit's 5 full ids come back as a (5, 1) column.
    A flattening check would release them; the one id check (``page_ids``) refuses any
    shape but ``(n,)``, and nothing is released (the take is refused)."""

    class Column(ListEvictor):
        def evict(self, units: int) -> tuple[np.ndarray, ...]:
            out = super().evict(units)
            return tuple(v.reshape(-1, 1) for v in out)

    chain, _ = filled(audit=False)
    chain.set_evictor(Column(chain.evictor.units))  # type: ignore[union-attr]
    with pytest.raises(PlanMismatchError, match="flat sequence"):
        chain.take(Demand((0, 3)))
    assert chain.bound_pages(1) == 100  # none of the 5 released


def test_the_audit_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUDIT_ENV, "0")
    assert resolve_audit(None) is False and resolve_audit(True) is True
    monkeypatch.setenv(AUDIT_ENV, "On")
    assert resolve_audit(None) is True and resolve_audit(False) is False
    monkeypatch.delenv(AUDIT_ENV)
    assert resolve_audit(None) is False
    monkeypatch.setenv(AUDIT_ENV, "maybe")
    with pytest.raises(ConfigError, match="KVCHAIN_AUDIT"):
        resolve_audit(None)
    with pytest.raises(ConfigError, match="audit must be"):
        resolve_audit(1)  # type: ignore[arg-type]


# --- the lazy order value object ------------------------------------------------------------


def lazy(rows: list[tuple[int, ...]], units: int, total: tuple[int, ...]) -> EvictionOrder:
    """A lazy order whose source hands out ``rows`` (cumulative, after row 0) one by one."""
    feed = iter(rows)

    def grow(known: list[tuple[int, ...]]) -> None:
        known.append(next(feed))

    return EvictionOrder.lazy(units, total, grow)


def test_a_lazy_order_equals_the_whole_one_and_grows_only_what_is_asked() -> None:
    whole = EvictionOrder.from_units([(0, 5), (10, 0), (0, 20)], 2)
    order = lazy([(0, 5), (10, 5), (10, 25)], 3, (10, 25))
    assert order.units == 3 and order.freed(3) == (10, 25)  # the counters, no row grown
    assert order._core.rows == [(0, 0)]
    # 32-byte pages; 200 B: (0, 5) frees 160 B, (10, 5) 480 B -> 2 units, 2 rows grown.
    assert order.least_units_freeing((32, 32), 200) == 2 and len(order._core.rows) == 3
    assert order == whole and hash(order) == hash(whole)
    assert order.after(1).cumulative == ((0, 0), (10, 0), (10, 20))


def test_a_lazy_order_refuses_bad_counters_and_bad_rows() -> None:
    from kvchain.errors import InvalidDemandError

    with pytest.raises(InvalidDemandError):
        EvictionOrder.lazy(-1, (0,), lambda rows: None)
    with pytest.raises(InvalidDemandError):
        EvictionOrder.lazy(0, (3,), lambda rows: None)  # no units cannot free pages
    assert EvictionOrder.lazy(0, (0, 0), lambda rows: None) == EvictionOrder()
    with pytest.raises(PlanMismatchError, match="bad row"):
        lazy([(0, 5), (0, 4)], 3, (10, 25)).freed(2)  # a decreasing row
    # Planted: a walk that frees other pages than its counters said (total (10, 25)).
    with pytest.raises(PlanMismatchError, match="counters said"):
        lazy([(0, 5), (10, 5), (10, 24)], 3, (10, 25)).materialize()
