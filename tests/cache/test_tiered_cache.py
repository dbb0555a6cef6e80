"""The device cache over a host tier (kvchain.cache.tiered): write-through at insert and
load-back plans derived by hand.

Geometry (tests/cache/host_layout.py): P = 4; band 0 state, band 1 window (W = 8
tokens: a point q keeps the tail [q - 2, q)), band 2 full. Interval 16 tokens (4 pages).
The device cache here is the tree alone (no chain): its ids are made-up integers.
"""

from __future__ import annotations

import pytest
from tests.cache.host_layout import LAYOUT

from kvchain.cache.host_cache import HostTier
from kvchain.cache.radix import CacheGeometry
from kvchain.cache.tiered import TieredPrefixCache
from kvchain.errors import PlanMismatchError

STATE, WIN, FULL = 0, 1, 2
X = [1, 2, 3, 4]  # a 4-page prompt
PROMPT = [1, 2, 3, 4, 9]  # a later turn over X: 20 tokens, a hit caps at 4 pages


def device() -> TieredPrefixCache:
    geom = CacheGeometry.of(LAYOUT)
    return TieredPrefixCache(geom, HostTier(LAYOUT, 10_000, 16, geom, audit=True),
                             interval_tokens=16, audit=True)


def test_insert_writes_through_and_a_device_eviction_leaves_the_host_copy() -> None:
    c = device()
    c.insert(X, 0, [10, 11, 12, 13], {WIN: {2: 20, 3: 21}}, {4: 30})
    assert c.host.held_slots() == (1, 2, 4)
    assert c.host.stats.bytes_written == 48 + 2 * 8 + 4 * 16  # 128 B
    c.evict(c.eviction_order().units)  # the device forgets X
    assert c.match(PROMPT, 20).pages == 0
    assert c.host.match(PROMPT, 20).pages == 4


def test_a_cold_device_loads_every_class_of_the_hit() -> None:
    c = device()
    c.insert(X, 0, [10, 11, 12, 13], {WIN: {2: 20, 3: 21}}, {4: 30})
    c.evict(c.eviction_order().units)
    plan = c.plan_load(PROMPT, 20)
    assert plan is not None
    # d = 0 on the device; h = 4 on the host; the device holds no page: full [0, 4),
    # the window tail [2, 4) and the checkpoint after 4 pages come back.
    assert (plan.device_pages, plan.host_pages, plan.full_from) == (0, 4, 0)
    assert plan.window == {WIN: (2, 3)} and plan.checkpoint
    assert plan.demand.pages == (1, 2, 4)
    handle = c.lock_prefix(PROMPT, plan.full_from)
    assert handle is None  # nothing on the device to keep
    dups = c.realize_load(PROMPT, plan, [[40], [41, 42], [43, 44, 45, 46]])
    assert dups == [[], [], []]
    hit = c.match(PROMPT, 20)
    assert hit.pages == 4 and hit.full == {FULL: (43, 44, 45, 46)} and hit.checkpoint == 40
    assert hit.window[WIN] == (41, 42)
    assert c.host.stats.bytes_loaded == 128 and c.host.stats.tokens_loaded == 16
    # Not written through again: the host held it.
    assert c.host.stats.bytes_written == 128
    c.audit([])


def test_a_device_that_kept_the_full_pages_loads_only_the_tail_and_the_checkpoint() -> None:
    c = device()
    # X (point 4), then Z = X + 2 pages (point 6): X's node keeps its own tails with an
    # older tail time, so the device's first unit is TAILS(X) - its window pages 2, 3
    # and checkpoint 4 go while its full pages stay (Z's path needs them).
    c.insert(X, 0, [10, 11, 12, 13], {WIN: {2: 20, 3: 21}}, {4: 30})
    c.insert([1, 2, 3, 4, 5, 6], 4, [10, 11, 12, 13, 14, 15], {WIN: {4: 22, 5: 23}}, {6: 31})
    c.evict(1)
    prompt = [1, 2, 3, 4, 7, 8]  # leaves the cached path after page 4
    assert c.match(prompt, 24).pages == 0
    plan = c.plan_load(prompt, 24)
    assert plan is not None and (plan.device_pages, plan.host_pages, plan.full_from) == (0, 4, 4)
    assert plan.demand.pages == (1, 2, 0)  # checkpoint + tail [2, 4); no full page
    handle = c.lock_prefix(prompt, 4)
    c.realize_load(prompt, plan, [[50], [51, 52], []])
    c.unlock(handle)
    assert c.match(prompt, 24).pages == 4
    # No shorter host point below 4: nothing to shorten to.
    assert c.plan_load(prompt, 24, below=4) is None
    c.audit([])


def test_no_plan_when_the_host_resumes_no_deeper() -> None:
    c = device()
    c.insert(X, 0, [10, 11, 12, 13], {WIN: {2: 20, 3: 21}}, {4: 30})
    assert c.match(PROMPT, 20).pages == 4
    assert c.plan_load(PROMPT, 20) is None  # the device already resumes at 4
    assert c.plan_load([5, 6, 7], 12) is None  # nothing on either tier


def test_a_grant_that_does_not_match_the_plan_is_refused() -> None:
    c = device()
    c.insert(X, 0, [10, 11, 12, 13], {WIN: {2: 20, 3: 21}}, {4: 30})
    c.evict(c.eviction_order().units)
    plan = c.plan_load(PROMPT, 20)
    assert plan is not None
    with pytest.raises(PlanMismatchError):
        c.realize_load(PROMPT, plan, [[40], [41], [43, 44, 45, 46]])
    assert c.match(PROMPT, 20).pages == 0  # nothing changed


def test_host_interval_follows_the_spacing_of_the_resume_points() -> None:
    # P = 4, interval 16 tokens (4 pages). A 56-token prompt (14 pages) keeps points
    # 4, 8, 12, 14 under blocks (14 / 4 = 3.5 pages = 0.875 intervals: rounded to 1, 16
    # tokens) and 12, 14 under ends (the last interval boundary and the last page: 14 / 2
    # = 7 pages = 1.75 intervals, rounded to 2: 32 tokens). A prompt without content keys
    # is left out; with none at all, the plain interval.
    from kvchain.cache.radix import ResumePolicy
    from kvchain.sim.prefix import host_interval_tokens
    from kvchain.sim.traces import Trace, TraceRequest

    reqs = (TraceRequest(0, 0.0, 56, 1, (1, 2, 3, 4)), TraceRequest(1, 1.0, 400, 1, None))
    trace = Trace("t", reqs, "test", "test", block_tokens=16)
    geom = CacheGeometry.of(LAYOUT)
    assert host_interval_tokens(trace, geom, 16, ResumePolicy.BLOCKS) == 16
    assert host_interval_tokens(trace, geom, 16, ResumePolicy.ENDS) == 32
    none = Trace("t", reqs[1:], "test", "test", block_tokens=16)
    assert host_interval_tokens(none, geom, 16, ResumePolicy.ENDS) == 16
