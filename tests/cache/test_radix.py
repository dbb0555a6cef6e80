"""The radix prefix cache on its own: hits per class, eviction units and the published
order, derived by hand on tiny prompts (page P = 4 tokens, window W = 5 tokens, resume
points every 2 pages)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.bands.policies import FullPolicy, LocalPolicy, StatePolicy, WindowPolicy
from kvchain.cache.radix import (
    IN_USE,
    TAILS,
    CacheGeometry,
    Hit,
    PrefixCache,
    ResumePolicy,
    resume_points,
)
from kvchain.errors import AuditError, InvalidRequestError, PlanMismatchError

# Band 0 window (W = 5 tokens), band 1 full; P = 4. The tail of point q (pages) is
# [window_start(4q) // 4, q) = [(4q - 4) // 4, q) = [q - 1, q): one page.
WF = CacheGeometry(4, (WindowPolicy(0, 4, 5), FullPolicy(1, 4)))
# Band 0 state, band 1 full.
SF = CacheGeometry(4, (StatePolicy(0, 4), FullPolicy(1, 4)))
FULL = CacheGeometry(4, (FullPolicy(0, 4),))
# Two windows (W = 5 and W = 12 tokens: tails of 1 and 3 pages) and a full band.
W2F = CacheGeometry(4, (WindowPolicy(0, 4, 5), WindowPolicy(1, 4, 12), FullPolicy(2, 4)))
# Chunked local (C = 8 tokens, 2 pages), a window, state and full.
LWSF = CacheGeometry(4, (LocalPolicy(0, 4, 8), WindowPolicy(1, 4, 5), StatePolicy(2, 4),
                         FullPolicy(3, 4)))


def cache(geom: CacheGeometry = WF) -> PrefixCache:
    return PrefixCache(geom, interval_tokens=8)


def test_resume_points_every_interval_and_the_prompt_end():
    assert resume_points(WF, 5, 2) == (2, 4, 5)
    assert resume_points(WF, 4, 2) == (2, 4)
    assert resume_points(FULL, 5, 2) == ()  # full only: every page boundary resumes


def test_auto_is_spaced_with_a_state_band():
    # 5 whole pages, interval 2: blocks -> 2, 4 and the end 5; ends -> the last interval
    # boundary 4 and the end 5. AUTO: spaced with a state band (SF), blocks without (WF);
    # SF knows no bytes, so spaced has no budget and keeps every boundary, as blocks.
    assert resume_points(SF, 5, 2, ResumePolicy.ENDS) == (4, 5)
    assert resume_points(SF, 5, 2, ResumePolicy.AUTO) == (2, 4, 5)
    assert resume_points(WF, 5, 2, ResumePolicy.AUTO) == (2, 4, 5)
    assert PrefixCache(SF, 8, ResumePolicy.AUTO).policy is ResumePolicy.SPACED
    assert PrefixCache(WF, 8, ResumePolicy.AUTO).policy is ResumePolicy.BLOCKS


def test_window_hit_ends_where_the_tail_is_present():
    c = cache()
    # Prompt of 20 tokens = pages 0..4; tails of points 2, 4, 5 are pages 1, 3, 4.
    dups = c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}},
                    {})
    assert dups == [[], []]
    hit = c.match([1, 2, 3, 4, 9], 20)  # 4 pages match; cap (20 - 1) // 4 = 4
    assert (hit.pages, hit.full, hit.window, hit.window_first) == (4, {1: (11, 12, 13, 14)},
                                                                   {0: (103,)}, {0: 3})
    hit = c.match([1, 2, 3, 9], 16)  # page 2 has no window page (tombstone): back to 2
    assert (hit.pages, hit.window, hit.window_first) == (2, {0: (101,)}, {0: 1})
    # The same prompt again: at least one token is computed, so 4 pages, not 5.
    assert c.match([1, 2, 3, 4, 5], 20).pages == 4
    assert c.match([9], 8).pages == 0


def test_full_only_hits_any_page_and_state_only_at_checkpoints():
    f = cache(FULL)
    f.insert([1, 2, 3], 0, [11, 12, 13], {}, {})
    assert f.match([1, 2, 7, 8], 16).pages == 2
    s = cache(SF)
    s.insert([1, 2, 3], 0, [11, 12, 13], {}, {2: 50})  # one checkpoint after page 2
    hit = s.match([1, 2, 3, 4], 16)
    assert (hit.pages, hit.checkpoint) == (2, 50)
    assert s.match([1, 9], 8).pages == 0  # no checkpoint after page 1


def test_insert_keeps_one_copy_and_returns_the_duplicates():
    c = cache()
    c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}}, {})
    # A second prompt shares pages 0-1, then differs; it offers its own tails 1 and 3.
    dups = c.insert([1, 2, 6, 7], 0, [21, 22, 23, 24], {0: {1: 201, 3: 203}}, {})
    assert dups == [[201], [21, 22]]  # page 1's window and pages 0-1's full are duplicates
    assert sorted(c.held_pages()[1]) == [11, 12, 13, 14, 15, 23, 24]


def test_eviction_order_is_the_lru_walk_with_cascade_and_tail_units():
    c = cache()
    c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}}, {})  # t=1
    c.insert([1, 2, 6, 7], 0, [21, 22, 23, 24], {0: {1: 201, 3: 203}}, {})  # t=2
    # Nodes: upper [0, 2) (time 2, tail time 1: no hit ended there since t=1), A's rest
    # [2, 5) (time 1), B's rest [2, 4) (time 2). Walk: LEAF(A rest) frees window 103, 104
    # and full 13-15 -> (2, 3); TAILS(upper) at t=1 frees window 101 -> (1, 0);
    # LEAF(B rest) frees 203 and 23-24 -> (1, 2); upper is now a leaf: its full 11-12
    # -> (0, 2).
    order = c.eviction_order()
    assert order.cumulative == ((0, 0), (2, 3), (3, 3), (4, 5), (4, 7))
    freed = c.evict(2)
    assert sorted(freed[0].tolist()) == [101, 103, 104] and sorted(freed[1].tolist()) == [
        13, 14, 15]
    assert c.eviction_order() == order.after(2)
    assert c.evicted_pages == [3, 3]


def test_locked_paths_are_not_evictable_and_unlock_restores_them():
    c = cache()
    c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}}, {})
    assert c.eviction_order().cumulative == ((0, 0), (3, 5))
    handle = c.lock(c.match([1, 2, 9], 12))  # hit of 2 pages: the node splits at 2
    assert handle is not None
    # A hit lock keeps the path whole: only the unlocked rest [2, 5) is offered, a LEAF:
    # window 103, 104, full 13-15 -> (2, 3).
    assert c.eviction_order().cumulative == ((0, 0), (2, 3))
    c.audit([handle])
    c.unlock(handle)
    # A prompt lock (the inserting request's own path) keeps only the full pages: the
    # upper [0, 2)'s window page 101 is a TAILS unit, used now (locked), so after every
    # unlocked unit -> (3, 3).
    handle = c.lock(c.match([1, 2, 9], 12), tails=False)
    assert handle is not None
    assert c.eviction_order().cumulative == ((0, 0), (2, 3), (3, 3))
    with pytest.raises(AuditError, match="lock"):
        c.audit([handle])  # counted as a hit lock: the tail counts differ
    # The request reads page 1 (its window tail): pinned, only the LEAF is left.
    c.pin_window(handle, 0, [1])
    assert c.eviction_order().cumulative == ((0, 0), (2, 3))
    c.audit([], ([(0, 101)], []), [handle])
    with pytest.raises(AuditError, match="pins"):
        c.audit([], ([], []), [handle])  # a pin no running request accounts for
    c.unpin_window(handle, 0, [1])
    with pytest.raises(AuditError, match="not pinned"):
        c.unpin_window(handle, 0, [1])
    c.audit([], ([], []), [handle])
    c.unlock(handle, tails=False)
    c.audit([])
    assert c.eviction_order().freed(c.eviction_order().units) == (3, 5)
    with pytest.raises(PlanMismatchError):
        c.evict(3)


def test_bad_interval_is_refused():
    with pytest.raises(InvalidRequestError):
        PrefixCache(WF, interval_tokens=6)


def suffix_property(ops, cache_cls: type = PrefixCache, audit: bool | None = None) -> None:
    """Random inserts, locks (pinning the hit's window tail and checkpoint), unlocks and
    evictions: evict(k) frees exactly freed(k) per band and leaves order.after(k); no id is
    held twice; pinned pages are never evicted (the audit's pin counts hold)."""
    for geom in (WF, SF, W2F, LWSF):
        c = cache_cls(geom, interval_tokens=8, audit=audit)
        next_id, handles, hits = 1000, [], []
        for kind, keys, k in ops:
            chain_keys = [hash((tuple(keys[:i + 1]),)) for i in range(len(keys))]
            if kind == 0:
                n = len(keys)
                full = list(range(next_id, next_id + n))
                # Every window band offers its own ids; a second band keeps only the pages
                # of one parity, so the bands' tails differ and each decides the hit.
                win = {pol.band: {i: next_id + 100 + 20 * k + i for i in range(n)
                                  if k == 0 or i % 2 == n % 2}
                       for k, pol in enumerate(geom.windows)}
                ck = {q: next_id + 200 + q for q in range(1, n + 1)} if geom.state is not None \
                    else {}
                next_id += 300
                c.insert(chain_keys, 0, full, win, ck)
            elif kind == 1:
                hit = c.match(chain_keys, 4 * len(keys) + 1)
                h = c.acquire(hit)  # locks it, references what a request reads (as attach)
                if h is not None:
                    handles.append(h)
                    hits.append(hit)
            elif kind == 2 and handles:
                h, hit = handles.pop(0), hits.pop(0)
                for band, first in hit.window_first.items():
                    c.unpin_window(h, band, range(first, hit.pages))
                if hit.checkpoint >= 0:
                    assert geom.state is not None
                    c.unpin_pages(geom.state, [hit.checkpoint])
                c.unlock(h)
            else:
                order = c.eviction_order()
                if order.units:
                    k = min(k, order.units)
                    order.materialize()  # comparable once the cache moves on
                    freed = c.evict(k)
                    assert tuple(len(f) for f in freed) == order.freed(k)
                    assert c.eviction_order() == order.after(k)
            held = c.held_pages()
            for ids in held:
                assert len(set(ids)) == len(ids)
            c.audit(handles, ([(b, v) for hit in hits for b, ids in hit.window.items()
                               for v in ids],
                              [hit.checkpoint for hit in hits if hit.checkpoint >= 0]))
        assert all(isinstance(f, np.ndarray) for f in c.evict(c.eviction_order().units)) \
            if c.eviction_order().units else True


OPS = st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(1, 3), min_size=1,
                                                     max_size=7), st.integers(1, 4)),
               max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_evict_leaves_exactly_the_suffix_order(ops):
    suffix_property(ops)


@settings(max_examples=30, deadline=None)
@given(ops=OPS)
def test_evict_leaves_exactly_the_suffix_order_without_the_audit(ops):
    """The same property on the cheap path alone (no whole-tree walk before an eviction;
    the per-operation ``audit`` call still compares with one)."""
    suffix_property(ops, audit=False)


# Three prompts, a hit lock on the first, two evictions of one unit each.
PLANTED_OPS = [(0, [1, 2, 3], 1), (0, [2, 3], 1), (0, [3, 1, 2], 1), (1, [1, 2, 3], 1),
               (3, [1], 1), (3, [1], 1)]


class EvictsTheNewest(PrefixCache):
    """Planted defect: publishes its LRU walk but evicts the units from the other end."""

    def evict(self, units):  # type: ignore[no-untyped-def]
        self.eviction_order().materialize()
        assert self._published is not None
        self._published[2].reverse()
        return super().evict(units)


class LocksForgetInUse(PrefixCache):
    """Planted defect in the kept order: a prompt-locked node's tails are keyed by their
    tail time alone (the IN_USE offset forgotten), so they sort among the unlocked units;
    evict follows the same wrong walk, so only the rebuild-and-compare can see it."""

    def _refresh(self, node):  # type: ignore[no-untyped-def]
        changed = super()._refresh(node)
        sig = node.sig
        if changed and sig is not None and sig[1] >= IN_USE:
            node.sig = (sig[0], sig[1] - IN_USE, *sig[2:])
            node.tser = self._push(sig[1] - IN_USE, TAILS, node, True)
        return changed


def test_the_suffix_property_passes_on_the_planted_ops():
    suffix_property(PLANTED_OPS)


def test_the_suffix_property_catches_a_cache_evicting_other_units():
    with pytest.raises(AssertionError):
        suffix_property(PLANTED_OPS, EvictsTheNewest, audit=False)


def test_the_order_audit_catches_a_wrongly_kept_order():
    c = LocksForgetInUse(WF, interval_tokens=8)
    # X (t=1) prompt-locked with an unpinned tail 101; Y (t=2) unlocked: the right walk
    # takes LEAF(Y) first (X is in use), the planted one TAILS(X) (t=1 < 2).
    c.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    handle = c.lock(c.match([1, 2, 3, 9], 16), tails=False)
    c.pin_window(handle, 0, [2])
    c.insert([5, 6], 0, [21, 22], {0: {1: 201}}, {})
    assert c.eviction_order().cumulative == ((0, 0), (1, 0), (2, 2))  # wrong, as planted
    with pytest.raises(AuditError, match="row 1"):
        c.check_order()
    right = PrefixCache(WF, interval_tokens=8)
    right.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    h = right.lock(right.match([1, 2, 3, 9], 16), tails=False)
    right.pin_window(h, 0, [2])
    right.insert([5, 6], 0, [21, 22], {0: {1: 201}}, {})
    right.check_order()
    assert right.eviction_order().cumulative == ((0, 0), (1, 2), (2, 2))


def test_held_counts_follow_insert_and_evict_by_hand():
    c = cache()
    assert c.held_counts == (0, 0)
    # First prompt: window tails 101, 103, 104 and full 11-15 -> (3, 5).
    c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}}, {})
    assert c.held_counts == (3, 5)
    # Second prompt shares pages 0-1: window 201 and full 21-22 are duplicates; it adds
    # window 203 and full 23-24 -> (4, 7).
    c.insert([1, 2, 6, 7], 0, [21, 22, 23, 24], {0: {1: 201, 3: 203}}, {})
    assert c.held_counts == (4, 7)
    # Unlocked: the whole order frees exactly what is held.
    assert c.eviction_order().freed(c.eviction_order().units) == c.held_counts
    c.evict(2)  # LEAF(A rest) frees (2, 3), TAILS(upper) (1, 0): (4 - 3, 7 - 3)
    assert c.held_counts == (1, 4)
    c.audit([])


def test_audit_catches_miscounted_held_pages():
    c = cache()
    c.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101}}, {})
    c._held[1] += 1  # planted: a counter that drifted from the tree
    with pytest.raises(AuditError, match="held page counters"):
        c.audit([])


def test_a_locked_nodes_tails_come_after_every_unlocked_unit():
    c = cache()
    # X (t=1): 3 pages, tails of points 2 and 3 are pages 1 and 2 (window 101, 102).
    c.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    # A prompt lock of X (as after its request's prefill): 3 pages.
    handle = c.lock(c.match([1, 2, 3, 9], 16), tails=False)
    assert handle is not None and handle.end == 3
    c.pin_window(handle, 0, [2])  # the running request reads page 2
    # Y (t=2, newer than X): 2 pages, tail of point 2 is page 1 (window 201).
    c.insert([5, 6], 0, [21, 22], {0: {1: 201}}, {})
    # Plain LRU would take X's tails (t=1) first; X is in use, so Y's leaf (window 201,
    # full 21-22 -> (1, 2)) goes first, then X's unpinned page 101 -> (2, 2).
    assert c.eviction_order().cumulative == ((0, 0), (1, 2), (2, 2))
    c.audit([], ([(0, 102)], []), [handle])


def test_window_pin_and_unpin_change_nothing_when_a_page_is_bad():
    # Pages 0-4 with window pages only at 1, 3, 4 (page 2 is a tombstone: no window id).
    # Before the checks ran first, pin_window(h, 0, [1, 2]) pinned page 1 and then raised on
    # page 2, and unpin_window(h, 0, [1, 1]) with one pin unpinned it and then raised.
    c = cache()
    c.insert([1, 2, 3, 4, 5], 0, [11, 12, 13, 14, 15], {0: {1: 101, 3: 103, 4: 104}}, {})
    handle = c.lock(c.match([1, 2, 3, 4, 5], 100), tails=False)  # the whole path
    assert handle is not None
    with pytest.raises(AuditError, match="absent"):
        c.pin_window(handle, 0, [1, 2])
    c.audit([], ([], []), [handle])  # no pin left behind by the refused call
    c.pin_window(handle, 0, [1])
    with pytest.raises(AuditError, match="not pinned"):
        c.unpin_window(handle, 0, [1, 1])  # one pin, two unpins asked
    c.audit([], ([(0, 101)], []), [handle])  # page 101 is still pinned once
    # the sibling: a page pinned twice unpins twice
    c.pin_window(handle, 0, [1])
    c.unpin_window(handle, 0, [1, 1])
    c.audit([], ([], []), [handle])
    c.unlock(handle, tails=False)
    c.audit([])


# --- eviction that keeps what can hit (state chains) ------------------------------------
#
# SF: band 0 state, band 1 full; rows of the order are cumulative (state, full). A full page
# with no checkpoint at or below it on its path can never hit: such a *dead* leaf goes
# before every unit that can hit, and a leaf's checkpoint, once dropped, is followed at
# once by the full pages only it made reusable.


def sf_cache_with_old_tails() -> PrefixCache:
    c = cache(SF)
    c.insert([1, 2], 0, [11, 12], {}, {2: 101})  # node A at time 1, checkpoint after 2 pages
    c.insert([3, 4], 0, [13, 14], {}, {2: 102})  # node B at time 2
    # A's prompt again: its pages and checkpoint are duplicates; A's time becomes 3 while
    # its tail time stays 1 (its checkpoint is older than the rest of it).
    dups = c.insert([1, 2], 0, [21, 22], {}, {2: 201})
    assert dups == [[201], [21, 22]]
    return c


def test_a_dropped_checkpoint_takes_its_pages_with_it():
    # Units: TAILS(A) key 1, LEAF(B) key 2, LEAF(A) key 3 (LRU). Old order: TAILS(A), LEAF(B),
    # LEAF(A): A's pages, dead once its checkpoint is gone, would outlive B. Now: TAILS(A)
    # (1 slot), then A's pages at once (2 full pages: dead), then LEAF(B) (2 full + 1 slot).
    c = sf_cache_with_old_tails()
    order = c.eviction_order()
    assert order.units == 3
    assert order.cumulative == ((0, 0), (1, 0), (1, 2), (2, 4))
    assert c.dead_full_pages() == (0, 4)
    freed = c.evict(2)
    assert [f.tolist() for f in freed] == [[101], [11, 12]]
    assert c.eviction_order().cumulative == ((0, 0), (1, 2))  # the suffix: LEAF(B)
    assert c.dead_full_pages() == (0, 2)


def test_a_dead_leaf_goes_first_however_new():
    # B (time 1, checkpoint) and then C (time 2, no checkpoint: its pages can never hit).
    # LRU would evict B first; C goes first, B's pages and checkpoint after.
    c = cache(SF)
    c.insert([3, 4], 0, [13, 14], {}, {2: 102})
    c.insert([5, 6], 0, [15, 16], {}, {})
    assert c.dead_full_pages() == (2, 4)
    assert c.eviction_order().cumulative == ((0, 0), (0, 2), (1, 4))
    assert [f.tolist() for f in c.evict(1)] == [[], [15, 16]]
    assert c.dead_full_pages() == (0, 2)


def test_a_parent_left_without_checkpoints_follows_its_last_child():
    # X = [1, 2] (no checkpoint) with children Y = [3] (checkpoint 3, time 1) and Z = [4]
    # (checkpoint 3, time 2); D = [9] (checkpoint 1, time 3). Walk: LEAF(Y) (1 slot + 1),
    # LEAF(Z) (1 + 1), then X joins as a leaf with no checkpoint: dead, before D although
    # D is no newer than X (X's time is 2): X (2 full), then D (1 slot + 1).
    c = cache(SF)
    c.insert([1, 2, 3], 0, [11, 12, 13], {}, {3: 103})
    c.insert([1, 2, 4], 0, [11, 12, 14], {}, {3: 104})
    c.insert([9], 0, [19], {}, {1: 109})
    assert c.dead_full_pages() == (0, 5)
    order = c.eviction_order()
    assert order.cumulative == ((0, 0), (1, 1), (2, 2), (2, 4), (3, 5))
    c.evict(2)
    assert c.dead_full_pages() == (2, 3)  # X's 2 pages: nothing below them any more
    assert c.eviction_order().cumulative == ((0, 0), (0, 2), (1, 3))


def test_dead_pages_count_only_unlocked_nodes_when_asked():
    # B = [3, 4] with a checkpoint, C = [5, 6] without (dead); a running request's prompt
    # lock on C: all cached 4 pages, 2 dead; unlocked only: B's 2 pages, none dead. A
    # locked dead node is no unit at all: the order holds B alone.
    c = cache(SF)
    c.insert([3, 4], 0, [13, 14], {}, {2: 102})
    c.insert([5, 6], 0, [15, 16], {}, {})
    handle = c.lock(Hit(2, c.root.children[5]), tails=False)
    assert c.dead_full_pages() == (2, 4)
    assert c.dead_full_pages(unlocked_only=True) == (0, 2)
    assert c.eviction_order().cumulative == ((0, 0), (1, 2))
    c.unlock(handle, tails=False)
    assert c.eviction_order().cumulative == ((0, 0), (0, 2), (1, 4))  # C first: dead
    assert cache(WF).dead_full_pages() == (0, 0)  # empty; no state band: never dead
