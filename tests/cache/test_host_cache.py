"""The host tier's prefix cache (kvchain.cache.host_cache): write-through, host LRU
eviction with the device's cascade, the audit of host slots, its planted defects, and a
hypothesis machine over write / take / give / evict / match.

Geometry (tests/cache/host_layout.py): P = 4 tokens; band 0 state (S = 48 B), band 1
window (W = 8 tokens, 8 B pages: a resume point q keeps the tail [q - 2, q)), band 2 full
(16 B pages). Resume interval K = 16 tokens (I = 4 pages): 1 slot + 2 window pages + 4
full pages = 128 B. ``H = 640`` B holds m = 2 intervals (state [0, 96), window at 256:
[256, 288), full at 512: [512, 640); m = 3 would end at 512 + 12 x 16 = 704): pools of
2 state slots, 4 window pages, 8 full pages.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.cache.host_layout import LAYOUT

from kvchain.cache.host_cache import HostTier
from kvchain.errors import AuditError, ConfigError

STATE, WIN, FULL = 0, 1, 2


def tier(host_bytes: int = 640) -> HostTier:
    return HostTier(LAYOUT, host_bytes, 16, audit=True)


def test_pools_are_the_plan_split() -> None:
    t = tier()
    assert [p.slots for p in t.pools] == [2, 4, 8]  # module docstring: m = 2
    assert t.capacity_bytes == 2 * 48 + 4 * 8 + 8 * 16  # 256 B of slots
    with pytest.raises(ConfigError):
        HostTier(LAYOUT, 0, 16)
    with pytest.raises(ConfigError):
        HostTier(LAYOUT, 640, 6)  # not a multiple of the page size


def test_write_through_takes_what_the_host_lacks_and_a_hit_resumes_there() -> None:
    t = tier()
    # Prompt X: 4 pages, its resume point 4 keeps window pages 2, 3 and a checkpoint.
    assert t.write([1, 2, 3, 4], {WIN: {2: 70, 3: 71}}, {4: 90}) == 48 + 2 * 8 + 4 * 16
    assert t.held_slots() == (1, 2, 4)
    # The same prompt again: nothing new, nothing taken, nothing evicted.
    assert t.write([1, 2, 3, 4], {WIN: {2: 72, 3: 73}}, {4: 91}) == 0
    assert t.held_slots() == (1, 2, 4)
    # A 20-token prompt over X resumes after 4 pages ((20 - 1) // 4 = 4 is the cap).
    hit = t.match([1, 2, 3, 4, 9], 20)
    assert hit.pages == 4 and hit.checkpoint >= 0 and len(hit.window[WIN]) == 2
    t.audit()
    assert t.stats.bytes_written == 128 and t.stats.writes == 1


def test_state_chain_writes_only_up_to_the_deepest_checkpoint() -> None:
    t = tier()
    # 6 pages offered with a checkpoint at 4 only: pages 4, 5 could never be resumed.
    t.write([1, 2, 3, 4, 5, 6], {WIN: {2: 1, 3: 2, 4: 3, 5: 4}}, {4: 9})
    assert t.held_slots() == (1, 2, 4)
    assert t.write([7, 8], {WIN: {0: 1, 1: 2}}, {}) == 0  # no checkpoint: nothing
    assert t.stranded_full_pages() == 0
    t.audit()


def test_a_full_host_evicts_lru_and_the_evicted_prefix_misses() -> None:
    t = tier()
    t.write([1, 2, 3, 4], {WIN: {2: 0, 3: 0}}, {4: 0})  # X at time 1
    t.write([5, 6, 7, 8], {WIN: {2: 0, 3: 0}}, {4: 0})  # Y at time 2: pools full
    assert t.held_slots() == (2, 4, 8)
    t.write([10, 11, 12, 13], {WIN: {2: 0, 3: 0}}, {4: 0})  # evicts X, the LRU leaf
    assert t.match([1, 2, 3, 4, 9], 20).pages == 0
    assert t.match([5, 6, 7, 8, 9], 20).pages == 4
    assert t.match([10, 11, 12, 13, 9], 20).pages == 4
    assert t.stats.evicted == [1, 2, 4]
    t.audit()


def two_level(t: HostTier) -> None:
    """X = pages 0..3 (checkpoint 4), then Z = X + pages 4, 5 (checkpoint 6): X becomes
    interior, its tail time stays that of its own write while its time moves on."""
    t.write([1, 2, 3, 4], {WIN: {2: 0, 3: 0}}, {4: 0})
    t.write([1, 2, 3, 4, 5, 6], {WIN: {4: 0, 5: 0}}, {6: 0})
    assert t.held_slots() == (2, 4, 6)


def test_a_partial_walk_never_leaves_a_dead_host_leaf() -> None:
    t = tier()
    two_level(t)
    # Two free state slots: the walk's first units are TAILS(X) (X's checkpoint and
    # window pages: its tail time is older) and LEAF(Z) (Z's slot, 2 window and 2 full
    # pages): 2 slots after 2 units. X is then a leaf without a checkpoint: dead, its 4
    # full pages can never be resumed, so it goes too.
    assert t.evict_for([2, 0, 0])
    assert t.held_slots() == (0, 0, 0)
    assert t.stranded_full_pages() == 0
    t.audit()


class KeepsDeadLeaves(HostTier):
    """Planted defect: a host eviction that drops a checkpoint but keeps its KV."""

    def _drop_dead(self) -> None:
        return


def test_planted_dead_leaf_is_stranded_kv_and_the_audit_says_so() -> None:
    t = KeepsDeadLeaves(LAYOUT, 640, 16, audit=True)
    two_level(t)
    assert t.evict_for([2, 0, 0])
    assert t.held_slots() == (0, 0, 4)  # X's 4 full pages, no checkpoint left
    assert t.stranded_full_pages() == 4
    with pytest.raises(AuditError, match="4 host full pages without a checkpoint"):
        t.audit()


class ForgetsFreedSlots(HostTier):
    """Planted defect: host eviction drops nodes but does not return their slots."""

    def _evict(self, units: int) -> None:
        self.cache.evict(units)


def test_planted_slot_leak_is_caught_by_the_audit() -> None:
    t = ForgetsFreedSlots(LAYOUT, 640, 16, audit=True)
    t.write([1, 2, 3, 4], {WIN: {2: 0, 3: 0}}, {4: 0})
    t.write([5, 6, 7, 8], {WIN: {2: 0, 3: 0}}, {4: 0})
    assert t.evict_for([1, 0, 0])
    with pytest.raises(AuditError, match="leaked host slots"):
        t.audit()


def test_slots_taken_by_another_user_come_from_the_same_pools() -> None:
    t = tier()
    t.write([1, 2, 3, 4], {WIN: {2: 0, 3: 0}}, {4: 0})
    t.write([5, 6, 7, 8], {WIN: {2: 0, 3: 0}}, {4: 0})
    got = t.take_slots(FULL, 3)  # evicts X (LRU): 4 full pages free, 3 taken
    assert len(got) == 3 and t.held_slots() == (1, 2, 7)
    t.audit()
    t.give_slots(FULL, got)
    assert t.held_slots() == (1, 2, 4)
    t.audit()


@pytest.mark.parametrize("seed", range(6))
def test_seeded_stream_of_writes_matches_and_evictions_keeps_every_invariant(
        seed: int) -> None:
    """Random prompts over a small key alphabet (shared prefixes), each written with a
    checkpoint and window tail at every 2-page point and its last page, matched, and the
    audit after every operation; a large host (10,000 B) and a tight one (640 B)."""
    rng = random.Random(seed)
    for host_bytes in (640, 10_000):
        t = tier(host_bytes)
        taken: list[tuple[int, np.ndarray]] = []
        for _ in range(60):
            n = rng.randint(1, 10)
            keys = [rng.randint(1, 3) * 100 + rng.randint(0, 1) for _ in range(n)]
            keys = [sum(keys[:i + 1]) for i in range(n)]  # prefix-dependent keys
            points = sorted({*range(2, n + 1, 2), n})
            window = {WIN: {i: 0 for q in points for i in range(max(0, q - 2), q)}}
            if rng.random() < 0.1:  # another user of the pools (retraction by host copy)
                band = rng.randrange(3)
                taken.append((band, t.take_slots(band, 1)))
            if taken and rng.random() < 0.1:
                t.give_slots(*taken.pop())
            t.write(keys, window, {q: 0 for q in points})
            t.audit()
            hit = t.match(keys, n * 4 + 1)
            if hit.pages:  # at a point of this prompt or of an earlier one on its path
                assert hit.pages <= n and hit.checkpoint >= 0
        held = t.held_slots()
        assert all(0 <= h <= p.slots for h, p in zip(held, t.pools, strict=True))
        assert t.stats.peak_held_bytes <= t.capacity_bytes
        assert np.all(np.asarray(t.stats.pages_written) >= 0)


class HostTierMachine(RuleBasedStateMachine):
    """Writes of prompts over a small alphabet (shared prefixes), slots taken and given
    back by another user, evictions for random needs and matches, on the 640-byte tier
    (2 state slots, 4 window pages, 8 full pages: eviction binds at once); the host
    tier's audit after every step (slots held once or free, no stranded full page)."""

    def __init__(self) -> None:
        super().__init__()
        self.tier = tier(640)
        self.taken: list[tuple[int, np.ndarray]] = []

    @rule(raw=st.lists(st.integers(1, 3), min_size=1, max_size=8),
          every=st.sampled_from([1, 2, 4]))
    def write(self, raw: list[int], every: int) -> None:
        keys = [sum(raw[:i + 1]) * 10 + i for i in range(len(raw))]
        n = len(keys)
        points = sorted({*range(every, n + 1, every), n})
        window = {WIN: {i: 0 for q in points for i in range(max(0, q - 2), q)}}
        self.tier.write(keys, window, {q: 0 for q in points})

    @rule(band=st.integers(0, 2), n=st.integers(1, 2))
    def take(self, band: int, n: int) -> None:
        pool = self.tier.pools[band]
        order = self.tier.cache.eviction_order()
        evictable = order.freed(order.units)[band] if order.units else 0
        if pool.free_count + evictable >= n:
            self.taken.append((band, self.tier.take_slots(band, n)))

    @rule()
    def give(self) -> None:
        if self.taken:
            self.tier.give_slots(*self.taken.pop())

    @rule(need=st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 8)))
    def evict(self, need: tuple[int, int, int]) -> None:
        before = self.tier.held_slots()
        if not self.tier.evict_for(list(need)):
            assert self.tier.held_slots() == before  # refused: nothing evicted

    @rule(raw=st.lists(st.integers(1, 3), min_size=1, max_size=8))
    def match(self, raw: list[int]) -> None:
        keys = [sum(raw[:i + 1]) * 10 + i for i in range(len(raw))]
        hit = self.tier.match(keys, 4 * len(keys) + 1)
        if hit.pages:
            assert hit.checkpoint >= 0 and len(hit.window[WIN]) == min(2, hit.pages)

    @invariant()
    def audited(self) -> None:
        self.tier.audit()


TestHostTierMachine = HostTierMachine.TestCase
TestHostTierMachine.settings = settings(max_examples=40, stateful_step_count=30,
                                        deadline=None)
