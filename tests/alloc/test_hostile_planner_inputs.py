"""Hostile inputs to the pricing strategy, the module-level planner functions and the
chain's release: every one is a typed error, raised before anything is priced or changed.

Defects found by adversarial testing, each fixed in one place every entry point shares:
``pricing.check_demand`` (a non-``Demand`` is refused before ``.pages`` is read, by the
module functions, a ``Planner``'s methods, the chain and the pool allocator),
``Planner.__post_init__`` (a bad solver or shortcut is refused when built) and
``alloc.chain.page_ids`` (``release`` takes one band's flat int ids, on the chain and the
pool allocator alike, and the evictor's answers too).
"""

from __future__ import annotations

import pytest

from kvchain.alloc import Chain, Demand, pricing
from kvchain.alloc.pricing import Planner
from kvchain.errors import ConfigError, InvalidDemandError, KVChainError, UnknownPageError
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass


def _layout() -> ChainLayout:
    # window LOW END | full HIGH END, 32 B pages, B = 6,400 B (as tests/alloc/test_price_memo.py)
    win = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    return plan_layout([win, full], 6_400, 1, null_pages=False)


@pytest.mark.parametrize("fn", [pricing.fits, pricing.price, pricing.least_eviction,
                                pricing.max_units, Planner().fits, Planner().price,
                                Planner().least_eviction])
@pytest.mark.parametrize("demand", [(1, 1), None, [1, 1]])
def test_module_functions_refuse_a_non_demand_typed(fn, demand) -> None:
    # Every entry point of the planner (module functions, a Planner's methods, max_units'
    # unit and base) runs the one check (pricing.check_demand) before reading .pages.
    snap = Chain(_layout()).snapshot()
    with pytest.raises(InvalidDemandError, match="expected a Demand"):
        fn(snap, demand)


@pytest.mark.parametrize("base", [(1, 1), [1, 1], (), 0])
def test_max_units_refuses_a_base_that_is_not_a_demand(base) -> None:
    # ``base=None`` means no base; anything else must be a Demand (an empty tuple or 0 was
    # read as "no base" by ``base or Demand.zeros(...)``).
    snap = Chain(_layout()).snapshot()
    with pytest.raises(InvalidDemandError, match="expected a Demand"):
        pricing.max_units(snap, Demand((1, 1)), base)


def test_chain_price_refuses_a_non_demand_typed() -> None:
    # The chain's own check (the sibling of the xfail above: this one passes today).
    chain = Chain(_layout())
    before = chain.snapshot()
    for demand in [(1, 1), None, [1, 1]]:
        with pytest.raises(InvalidDemandError, match="expected a Demand"):
            chain.price(demand)  # type: ignore[arg-type]
        with pytest.raises(InvalidDemandError, match="expected a Demand"):
            chain.take(demand)  # type: ignore[arg-type]
    assert chain.snapshot() is before and chain.epoch == before.epoch


@pytest.mark.parametrize("planner", [
    lambda: Planner(solve="x"),  # type: ignore[arg-type]
    lambda: Planner(solve=None),  # type: ignore[arg-type]
    lambda: Planner(shortcut="yes"),  # type: ignore[arg-type]
    lambda: Planner(shortcut=1),  # type: ignore[arg-type]
    # the shortcut stands for the general solver's answers only (Planner's docstring)
    lambda: Planner(lambda snap, demand: pricing._solve(snap, demand), shortcut=True),
])
def test_a_bad_planner_is_refused_when_built_or_handed_to_a_chain(planner) -> None:
    with pytest.raises(ConfigError):
        Chain(_layout(), planner=planner())


def test_a_planner_of_the_wrong_type_is_refused() -> None:
    # Sibling of the xfail above (passes today): not a Planner at all.
    for planner in (None, Planner, "general"):
        with pytest.raises(ConfigError, match="planner must be a Planner"):
            Chain(_layout(), planner=planner)  # type: ignore[arg-type]


def test_refusals_change_nothing_and_the_memo_hit_is_checked() -> None:
    # bools, floats, negatives, numpy-like ints, wrong length: refused by price, take, fits
    # with the chain unchanged (snapshot object, epoch).
    np = pytest.importorskip("numpy")
    chain = Chain(_layout())
    before = chain.snapshot()
    bad = [Demand((True, 1)), Demand((1.0, 1)), Demand((-1, 0)), Demand((1,)),
           Demand((np.int64(1), 1)), Demand([1, 1])]  # type: ignore[arg-type]
    for d in bad:
        for call in (chain.price, chain.take, lambda x: pricing.fits(chain.snapshot(), x)):
            with pytest.raises(InvalidDemandError):
                call(d)
    assert chain.snapshot() is before and chain.epoch == before.epoch


def test_release_refuses_ids_that_are_not_one_dimensional() -> None:
    chain = Chain(_layout())
    held = chain.take(Demand((0, 10)))  # full vids 0 .. 9: another request's pages
    grant = chain.take(Demand((3, 3)))  # window vids 0, 1, 2; full vids 10, 11, 12
    assert grant.pages == ((0, 1, 2), (10, 11, 12))
    before = chain.snapshot()
    with pytest.raises((InvalidDemandError, UnknownPageError)):  # a typed refusal
        chain.release(1, grant.pages)  # type: ignore[arg-type]
    assert chain.snapshot() is before and chain.bound_pages(1) == 13
    assert held.pages[1] == tuple(range(10))


def test_release_of_ragged_ids_is_a_typed_error() -> None:
    chain = Chain(_layout())
    grant = chain.take(Demand((0, 4)))
    assert grant.pages == ((), (0, 1, 2, 3))
    before = chain.snapshot()
    with pytest.raises(UnknownPageError, match="flat sequence of ints"):
        chain.release(1, grant.pages)  # type: ignore[arg-type]
    assert chain.snapshot() is before


@pytest.mark.parametrize("vids", [
    [[10]], [[10, 11], [12, 13]], 10, [10, 11.0], [True], ["10"], [10, None], [[]],
])
def test_release_takes_one_flat_sequence_of_int_ids_only(vids) -> None:
    # Every shape but (n,) is refused before anything changes: a nested list (band 1's own
    # ids 10..13 inside it, so a flattening release would have freed them), a scalar, and
    # ids that are not ints. np.int64 ids in a list and an empty list stay accepted.
    np = pytest.importorskip("numpy")
    chain = Chain(_layout())
    chain.take(Demand((0, 14)))  # full vids 0 .. 13
    before = chain.snapshot()
    with pytest.raises(UnknownPageError):
        chain.release(1, vids)
    assert chain.snapshot() is before and chain.bound_pages(1) == 14
    chain.release(1, [np.int64(10), 11])
    chain.release(1, [])
    chain.release(1, np.array([12, 13], dtype=np.int32))
    assert chain.bound_pages(1) == 10  # 14 - 4 released


@pytest.mark.parametrize("call", [
    lambda pool: pool.price((1, 1)),
    lambda pool: pool.take((1, 1)),
    lambda pool: pool.release(1, [[0]]),
    lambda pool: pool.release(1, [0.0]),  # int(0.0) read it as id 0
    lambda pool: pool.release(1, [True]),  # int(True) read it as id 1
    lambda pool: pool.release(1, ((0,), (0, 1))),  # ragged
])
def test_pool_allocator_refuses_bad_input_typed(call) -> None:
    from kvchain.baselines import CapacityRule, PoolAllocator

    pool = PoolAllocator(_layout(), CapacityRule.SHARED)
    pool.take(Demand((0, 2)))  # full ids 0, 1: what a truncating release would free
    before = pool.snapshot()
    with pytest.raises(KVChainError):
        call(pool)
    assert pool.snapshot() is before and pool.bound_pages(1) == 2
