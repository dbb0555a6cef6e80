"""The prefix cache's eviction order kept incrementally: the planner's least prefix walks
only that prefix, a stale order refuses rows it never walked, and changes that leave every
node's share of the order as it was bump no version (so the chain's epoch and its quotes
stay valid).

Geometries as ``test_radix.py``: page P = 4 tokens; ``FULL`` one full band; ``WF`` band 0
window (W = 5 tokens), band 1 full.
"""

from __future__ import annotations

import pytest

from kvchain.alloc import Chain, Demand
from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import PlanMismatchError, StaleQuoteError
from kvchain.layout import plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass

FULL = CacheGeometry(4, (FullPolicy(0, 4),))
WF = CacheGeometry(4, (WindowPolicy(0, 4, 5), FullPolicy(1, 4)))


def fifty_prompts(audit: bool = False) -> PrefixCache:
    """50 one-page prompts with distinct keys, inserted at t = 1..50: 50 LEAF units of one
    full page each, oldest first."""
    c = PrefixCache(FULL, interval_tokens=8, audit=audit)
    for i in range(50):
        c.insert([1000 + i], 0, [i], {}, {})
    return c


def test_the_least_prefix_walks_only_that_prefix() -> None:
    c = fifty_prompts()
    order = c.eviction_order()
    assert order.units == 50 and order.freed(50) == (50,)  # the counters: no walk
    assert c._published is not None and c._published[2] == []
    # 64 B of 32-byte pages: 2 units; the walk went as far as the answer and no further.
    assert order.least_units_freeing((32,), 64) == 2
    assert len(c._published[2]) == 2
    # More than everything frees: all units, still no further walk (the total is known).
    assert order.least_units_freeing((32,), 10_000) == 50 and len(c._published[2]) == 2
    assert [n.keys[0] for _, n in c._published[2]] == [1000, 1001]  # LRU: oldest first
    assert c.full_walks == 0


def test_a_stale_order_refuses_rows_it_never_walked() -> None:
    c = fifty_prompts()
    order = c.eviction_order()
    order.freed(3)
    c.evict(1)  # the cache moves on
    assert order.freed(3) == (3,)  # walked before: still known
    with pytest.raises(PlanMismatchError, match="version"):
        order.freed(10)
    # Unequal when undecidable (never a wrong memo hit); the suffix rows it knows agree.
    fresh = c.eviction_order()
    assert fresh.units == 49 and order.after(1) != fresh
    materialized = fifty_prompts().eviction_order().materialize()
    assert materialized.cumulative[-1] == (50,)


def test_the_audit_flag_walks_the_tree_before_each_eviction() -> None:
    quiet, audited = fifty_prompts(audit=False), fifty_prompts(audit=True)
    for c in (quiet, audited):
        c.evict(2)
        c.evict(3)
    assert (quiet.full_walks, audited.full_walks) == (0, 2)
    quiet.audit([])  # the explicit audit always rebuilds and compares
    assert quiet.full_walks == 1


def window_chain() -> tuple[Chain, PrefixCache]:
    window = CacheClass(LifetimeClass.WINDOW, 32, 0, 5, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    chain = Chain(plan_layout([window, full], 6_400, 4, null_pages=False))
    cache = PrefixCache(WF, interval_tokens=8)
    chain.set_evictor(cache)
    # One prompt of 3 pages, window pages kept at 1 and 2 (ids 101, 102), full 11-13.
    cache.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    return chain, cache


def test_unpinning_a_page_of_a_hit_locked_path_changes_no_epoch() -> None:
    """A running hit locks the whole path (tails too): its nodes offer no unit at all, so
    the request's window moving past page 1 (unpin) changes no share of the order: no
    version bump, the chain's epoch stays, and the quote priced before is realized."""
    chain, cache = window_chain()
    handle = cache.lock(cache.match([1, 2, 3, 9], 16))
    cache.pin_window(handle, 0, [1, 2])
    assert chain.snapshot().evictable.units == 0
    quote = chain.price(Demand((2, 2)))
    version, epoch = cache.version, chain.epoch
    cache.unpin_window(handle, 0, [1])
    assert (cache.version, chain.snapshot().epoch) == (version, epoch)
    chain.take(Demand((2, 2)), quote)  # still this epoch's quote
    assert chain.snapshot() == quote.after
    cache.check_order()


def test_unpinning_a_page_of_a_prompt_locked_path_is_a_new_epoch() -> None:
    """Sibling: under a prompt lock only (full pages kept), the unpinned window page becomes
    a TAILS unit (window 1, full 0): the order changed, so the version and the chain's
    epoch move and the old quote is stale."""
    chain, cache = window_chain()
    handle = cache.lock(cache.match([1, 2, 3, 9], 16), tails=False)
    cache.pin_window(handle, 0, [1, 2])
    assert chain.snapshot().evictable.units == 0
    quote = chain.price(Demand((2, 2)))
    version = cache.version
    cache.unpin_window(handle, 0, [1])
    assert cache.version != version
    assert chain.snapshot().evictable.cumulative == ((0, 0), (1, 0))
    with pytest.raises(StaleQuoteError):
        chain.take(Demand((2, 2)), quote)


def test_touching_a_hit_locked_path_bumps_nothing_until_it_is_unlocked() -> None:
    _, cache = window_chain()
    handle = cache.lock(cache.match([1, 2, 3, 9], 16))
    version = cache.version
    cache.touch(handle, 0)  # new LRU times on nodes that offer no unit
    assert cache.version == version
    cache.unlock(handle)  # now the path is a LEAF again (window 101, 102 and full 11-13)
    assert cache.version != version
    assert cache.eviction_order().cumulative == ((0, 0), (2, 3))
    cache.check_order()


def test_a_refused_unlock_changes_nothing() -> None:
    """Regression: unlock checked each node while it decremented, so an unlock refused at
    an ancestor had already unlocked the nodes below it (their share of the order moved
    with no version bump). Now every node is checked first."""
    from kvchain.errors import AuditError

    c = PrefixCache(WF, interval_tokens=8)
    c.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    upper = c.lock(c.match([1, 2, 9], 12))  # splits at page 2: [0, 2) locked
    lower = c.lock(c.match([1, 2, 3, 9], 16))  # [0, 2) twice, [2, 3) once
    assert upper is not None and lower is not None and lower.parent is upper
    c.unlock(upper)
    c.unlock(upper)  # one unlock too many: [0, 2) is no longer locked by lower's path
    version = c.version
    with pytest.raises(AuditError, match="not locked"):
        c.unlock(lower)
    assert (lower.lock, lower.tlock, upper.lock) == (1, 1, 0) and c.version == version
