"""The baselines' pool allocators with a prefix cache: evictable supply priced by the planner
under each capacity rule (a freed page returns to its own pool / freed bytes are shared),
``Evict`` steps executed exactly, and planted evictor defects caught with typed errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvchain.alloc.allocator import EvictingAllocator
from kvchain.alloc.pricing import fits, least_eviction
from kvchain.alloc.snapshot import Demand, Evict, EvictionOrder
from kvchain.baselines import CapacityRule, ManagerKind, PoolAllocator, build_manager
from kvchain.errors import CapacityError, InvalidDemandError, PlanMismatchError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass
from kvchain.testing.evictor import ReferenceEvictor

WIN = declared_class(LifetimeClass.WINDOW, 1_000, 32)
FULL = declared_class(LifetimeClass.FULL, 1_000)
STATE = declared_class(LifetimeClass.STATE, 1_000)
SMALL_FULL = declared_class(LifetimeClass.FULL, 10)
BIG_STATE = declared_class(LifetimeClass.STATE, 20_000)  # a slot a bit over a full page


def _fixed() -> tuple[PoolAllocator, ReferenceEvictor, tuple[int, ...]]:
    """SGLang-ratio pools of 1.8 MB at 16,000 B pages: window 50 pages (1 null page), full
    62 (test_baselines derives them); the window pool is filled and 10 of its pages go to
    the cache as units of 3, 5 and 2 pages (oldest first)."""
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    assert isinstance(alloc, PoolAllocator) and alloc.pool_pages == (50, 62)
    ids = alloc.take(Demand((49, 0))).pages[0]
    cache = ReferenceEvictor(2)
    alloc.set_evictor(cache)
    for lo, hi in ((0, 3), (3, 8), (8, 10)):
        cache.insert([ids[lo:hi], []])
    return alloc, cache, ids


def test_fixed_pool_evicts_exactly_the_least_units_that_fit():
    alloc, cache, ids = _fixed()
    snap = alloc.snapshot()
    # The window pool is full (49 + the null page = 50): 6 window pages need 6 freed; the
    # first unit frees 3 (short), the first two 3 + 5 = 8 -> the least prefix is 2 units.
    assert snap.evictable.freed(3) == (10, 0)
    assert least_eviction(snap, Demand((6, 0))) == 2
    quote = alloc.price(Demand((6, 0)))
    assert quote.fits and quote.steps[0].action == Evict(2)
    grant = alloc.take(Demand((6, 0)), quote)
    # The 8 freed ids (ids[0:8]) return to the window pool and 6 of them are reused.
    assert set(grant.pages[0]) <= set(ids[:8])
    assert alloc.bound_pages(0) == 50 - 8 + 6
    assert alloc.evicted_pages == (8, 0) and alloc.stats.pages_evicted == 8
    assert len(cache.units) == 1 and cache.eviction_order().freed(1) == (2, 0)
    alloc.audit()


def test_fixed_pool_never_lends_freed_or_free_pages_across_pools():
    alloc, cache, _ = _fixed()
    before = alloc.snapshot()
    # 11 window pages: evicting all 3 units frees 10 window pages, one short; the full
    # pool's 62 free pages never count for the window (fixed pools): refused, shortfall
    # one 16,000-byte window page, nothing evicted.
    assert least_eviction(before, Demand((11, 0))) is None
    with pytest.raises(CapacityError) as err:
        alloc.take(Demand((11, 0)))
    assert err.value.shortfall_bytes == 16_000
    assert alloc.snapshot() == before and len(cache.units) == 3
    # A full-pool demand fits as is: nothing is evicted.
    quote = alloc.price(Demand((0, 62 - alloc.bound_pages(1))))
    assert quote.fits and quote.evicted_units == 0


def _shared() -> tuple[PoolAllocator, ReferenceEvictor]:
    """The equal-page pool of test_baselines: 10 blocks of 1,120 B shared by state slots
    and full pages (no null pages), filled with 4 slots and 6 full pages; cache units:
    2 full pages, then a slot + a full page, then 1 full page."""
    alloc = build_manager(ManagerKind.EQUAL_PAGE, [STATE, SMALL_FULL], 11_200, 16).allocator
    assert isinstance(alloc, PoolAllocator)
    slots, full = alloc.take(Demand((4, 6))).pages
    cache = ReferenceEvictor(2)
    alloc.set_evictor(cache)
    cache.insert([[], full[0:2]])
    cache.insert([slots[0:1], full[2:3]])
    cache.insert([[], full[3:4]])
    return alloc, cache


def test_shared_pool_freed_bytes_serve_any_class():
    alloc, _ = _shared()
    # 1 slot + 2 full pages = 3 blocks on a full pool: unit 1 frees 2 blocks (short),
    # units 1-2 free 4 -> 2 units; the freed full pages' bytes hold the new state slot.
    assert least_eviction(alloc.snapshot(), Demand((1, 2))) == 2
    alloc.take(Demand((1, 2)))
    assert (alloc.bound_pages(0), alloc.bound_pages(1)) == (4 - 1 + 1, 6 - 3 + 2)
    assert alloc.evicted_pages == (1, 3)
    alloc.audit()


def test_shared_pool_refuses_when_evicting_everything_is_short():
    alloc, cache = _shared()
    before = alloc.snapshot()
    # Evicting all 3 units frees 5 blocks: 5 full pages fit after exactly 3 units, 6 are
    # one block (1,120 B) short.
    assert least_eviction(before, Demand((0, 5))) == 3
    with pytest.raises(CapacityError) as err:
        alloc.take(Demand((0, 6)))
    assert err.value.shortfall_bytes == 1_120
    assert alloc.snapshot() == before and len(cache.units) == 3


def _reference_least(alloc: PoolAllocator, live: list[int], order: EvictionOrder,
                     demand: Demand) -> int | None:
    """The rule applied to the counts left after each eviction prefix: FIXED per pool
    (``live_i - freed_i + d_i <= pool_i``); SHARED: the pool's own snapshot of those counts
    (packed, no holes; with two bands that is ``sum (live - freed + d) x P_i <= B``)."""
    for k in range(order.units + 1):
        freed = order.freed(k) if k else (0,) * len(live)  # the empty order is 0 wide
        left = [n - f for n, f in zip(live, freed, strict=True)]
        if alloc.rule is CapacityRule.FIXED:
            ok = all(n + d <= cap for n, d, cap in
                     zip(left, demand.pages, alloc.pool_pages, strict=True))
        else:
            ok = fits(alloc._snapshot_of(left), demand)
            if len(left) == 2:
                assert ok == (sum((n + d) * b.page_bytes for n, d, b in zip(
                    left, demand.pages, alloc.layout.bands, strict=True))
                    <= alloc.layout.buffer_bytes)
        if ok:
            return k
    return None


@pytest.mark.parametrize("rule", list(CapacityRule))
@pytest.mark.parametrize("classes", [[WIN, FULL], [BIG_STATE, WIN, FULL], [BIG_STATE, FULL]])
def test_planner_least_eviction_equals_the_rule_on_seeded_pools(rule, classes):
    rng = random.Random(f"{rule}-{len(classes)}-{classes[0].lifetime}")
    layout = plan_layout(classes, 1_200_000, 16)
    n = len(layout.bands)
    pools = None
    if rule is CapacityRule.FIXED:
        share = layout.buffer_bytes // n
        pools = [share // b.page_bytes for b in layout.bands]
    seen: set[str] = set()
    for _ in range(40):
        alloc = PoolAllocator(layout, rule, pools)
        cache = ReferenceEvictor(n)
        alloc.set_evictor(cache)
        for _ in range(rng.randint(1, 6)):
            want = Demand(tuple(rng.randint(0, 12) for _ in range(n)))
            if not fits(alloc.snapshot(), want) or want.is_empty:
                continue
            pages = alloc.take(want).pages
            cut = [rng.randint(0, len(p)) for p in pages]
            if any(cut):
                cache.insert([p[:c] for p, c in zip(pages, cut, strict=True)])
        for _ in range(5):
            demand = Demand(tuple(rng.randint(0, 40) for _ in range(n)))
            snap = alloc.snapshot()
            live = [alloc.bound_pages(i) for i in range(n)]
            least = least_eviction(snap, demand)
            assert least == _reference_least(alloc, live, snap.evictable, demand)
            seen.add("refused" if least is None else "evicts" if least else "as is")
    assert seen == {"refused", "evicts", "as is"}  # every kind of decision was checked


def test_pool_allocator_is_an_evicting_allocator_and_refuses_a_non_evictor():
    alloc = build_manager(ManagerKind.IDEAL, [WIN, FULL], 1_800_000, 16).allocator
    assert isinstance(alloc, EvictingAllocator)
    with pytest.raises(InvalidDemandError):
        alloc.set_evictor(object())  # type: ignore[arg-type]


# --- planted defects: a broken evictor is caught, typed, before the pool changes ---------


def test_short_handback_is_a_plan_mismatch_and_the_pool_keeps_its_pages():
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    ids = alloc.take(Demand((49, 0))).pages[0]
    cache = ReferenceEvictor(2, defect="short")
    alloc.set_evictor(cache)
    cache.insert([ids[0:3], []])
    cache.insert([ids[3:8], []])
    bound = alloc.bound_pages(0)
    with pytest.raises(PlanMismatchError, match="freed"):
        alloc.take(Demand((6, 0)))
    # Nothing released here: the pages the cache forgot stay bound (a leak the simulator
    # counts), none reused.
    assert alloc.bound_pages(0) == bound and alloc.evicted_pages == (0, 0)


def test_swapped_order_is_a_plan_mismatch():
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    ids = alloc.take(Demand((49, 0))).pages[0]
    cache = ReferenceEvictor(2, defect="order")  # publishes units 2, 1; evicts 1, 2
    alloc.set_evictor(cache)
    cache.insert([ids[0:3], []])
    cache.insert([ids[3:8], []])
    # The published first unit has 5 pages (enough for 4); the real first has 3.
    with pytest.raises(PlanMismatchError, match="band 0 freed 3 pages, the order said 5"):
        alloc.take(Demand((4, 0)))
    assert alloc.bound_pages(0) == 50


class _WrongIds(ReferenceEvictor):
    """Hands back as many ids as the order said, but ids the pool never bound."""

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        freed = super().evict(units)
        return tuple(np.asarray(v, dtype=np.int64) + 1_000 for v in freed)


class _Silent(ReferenceEvictor):
    """Changes its order (a new unit) without bumping its version."""

    @property
    def version(self) -> int:
        return 0


def test_wrong_ids_and_silent_order_changes_are_refused_before_release():
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    ids = alloc.take(Demand((49, 0))).pages[0]
    wrong = _WrongIds(2)
    alloc.set_evictor(wrong)
    wrong.insert([ids[0:3], []])
    with pytest.raises(PlanMismatchError, match="not held pages"):
        alloc.take(Demand((2, 0)))
    assert alloc.bound_pages(0) == 50
    silent = _Silent(2)
    alloc.set_evictor(silent)
    silent.insert([ids[10:14], []])
    alloc.snapshot()  # sees the unit
    silent.insert([ids[14:16], []])  # a change the version does not show
    with pytest.raises(PlanMismatchError, match="without a version bump"):
        alloc.take(Demand((2, 0)))
    assert len(silent.units) == 2 and alloc.bound_pages(0) == 50


class _BadHandBack(ReferenceEvictor):
    """Hands back the right number of ids per band, but the window band's second id is
    ``bad(ids)`` instead: the null page, or the first id again."""

    def __init__(self, width: int, bad) -> None:
        super().__init__(width)
        self.bad = bad

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        freed = [np.array(v, dtype=np.int64) for v in super().evict(units)]
        freed[0][1] = self.bad(freed[0])
        return tuple(freed)


@pytest.mark.parametrize("kind", ["null page", "repeated id", "honest"])
def test_a_null_page_or_a_repeated_id_handed_back_is_refused_before_release(kind):
    """The pool's held-pages check of an eviction (``PoolAllocator._holds``, asked by the
    evictor side it shares with the chain): ids distinct, bound, none a null page. The
    honest row is the sibling: the same hand-back with its real second id is released."""
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    assert isinstance(alloc, PoolAllocator)
    ids = alloc.take(Demand((49, 0))).pages[0]  # the window pool full: 49 + its null page
    bad = {"null page": lambda v: alloc.null_page(0), "repeated id": lambda v: v[0],
           "honest": lambda v: v[1]}[kind]
    cache = _BadHandBack(2, bad)
    alloc.set_evictor(cache)
    cache.insert([ids[0:3], []])
    if kind == "honest":
        alloc.take(Demand((2, 0)))  # evicts the unit of 3 (the pool is full), takes 2
        assert alloc.evicted_pages == (3, 0) and alloc.bound_pages(0) == 50 - 3 + 2
        return
    with pytest.raises(PlanMismatchError, match=r"Evict\(1\): band 0 freed ids that are "
                                                "not held pages"):
        alloc.take(Demand((2, 0)))
    assert alloc.bound_pages(0) == 50 and alloc.evicted_pages == (0, 0)
