"""Suspensions lent the host prefix cache's pools (requests/suspend.py ``LentPool``): one
host budget. Geometry as tests/cache/test_host_cache.py: pools of 2 state slots, 4 window
pages and 8 full pages (H = 640 B, K = 16 tokens); two 4-page prompts X (older) and Y
fill every pool."""

from __future__ import annotations

import pytest
from tests.cache.host_layout import LAYOUT

from kvchain.cache.host_cache import HostTier
from kvchain.errors import HostPoolFullError
from kvchain.requests.suspend import HostSide, LentPool

STATE, WIN, FULL = 0, 1, 2


def full_tier() -> HostTier:
    t = HostTier(LAYOUT, 640, 16, audit=True)
    t.write([1, 2, 3, 4], {WIN: {2: 0, 3: 0}}, {4: 0})  # X
    t.write([5, 6, 7, 8], {WIN: {2: 0, 3: 0}}, {4: 0})  # Y
    assert t.held_slots() == (2, 4, 8)
    return t


def test_a_lent_pool_counts_evictable_slots_and_its_own_apart() -> None:
    t = full_tier()
    side = HostSide.of_tier(t)
    full = side.pool(LAYOUT.bands[FULL].label)
    assert isinstance(full, LentPool)
    # nothing free, but both prompts are unlocked: all 8 full pages can be freed
    assert (full.free_count, full.held_count, full.slots) == (8, 0, 8)
    got = full.alloc(3)  # evicts X, the LRU prompt: 4 full pages free, 3 lent
    assert len(got) == 3 and full.held_count == 3
    assert t.held_slots() == (1, 2, 7)  # the pool's view: Y's 4 + the 3 lent
    assert t.match([1, 2, 3, 4, 9], 20).pages == 0  # X is gone from the host cache
    t.audit()  # the cache's audit leaves the lent slots out
    full.free(got)
    assert full.held_count == 0 and t.held_slots() == (1, 2, 4)
    t.audit()


def test_a_lent_pool_refuses_past_what_eviction_can_free_and_takes_nothing() -> None:
    t = full_tier()
    full = HostSide.of_tier(t).pool(LAYOUT.bands[FULL].label)
    with pytest.raises(HostPoolFullError):
        full.alloc(9)  # 8 slots in all
    assert t.held_slots() == (2, 4, 8) and full.held_count == 0
    t.audit()
