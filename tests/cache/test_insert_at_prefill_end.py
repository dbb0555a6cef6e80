"""A request's prompt enters the prefix cache as its prefill computes it (at the end of
every chunk that completes whole pages: tests/cache/test_incremental_insert.py), not when
it ends:
its resume points' window tails and checkpoints are evictable cache units at once, the
window pages it still reads are pinned (its tail lock) and become evictable, never released,
as its window moves past them; a concurrent request sharing the prompt hits meanwhile.

The tiny model: state | window | full, page P = 16 tokens, window W = 32 tokens, resume
points every 64 tokens (4 pages). Values derived by hand in the comments."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.commits import Commits
from kvchain.requests.manager import KVManager

P = 16
STATE, WINDOW, FULL = 0, 1, 2  # band order of the chain: state END | window | full END


def manager(kv_cls: type[KVManager] = KVManager) -> KVManager:
    layout = plan_layout([declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 32),
                          declared_class(LC.FULL, 1_000)], 3_000_000, P)
    assert [b.lifetime for b in layout.bands] == [LC.STATE, LC.WINDOW, LC.FULL]
    chain = Chain(layout, debug_audit=True)
    return kv_cls(chain, PrefixCache(CacheGeometry.of(layout), interval_tokens=64))


A_TOKENS = list(range(1000, 1150))  # 150 tokens: 9 whole pages (144 tokens) + 6


def prefill_a(kv: KVManager) -> None:
    """Request 0 = A: its whole 150-token prompt in one chunk, then one commit."""
    assert kv.attach(0, page_keys_from_tokens(A_TOKENS, P), len(A_TOKENS)) == 0  # cold
    kv.allocate([(0, 150)])
    kv.commit(0, 150)
    kv.audit()


def test_prefill_end_hands_tails_and_checkpoints_to_the_cache():
    kv = manager()
    cache = kv.cache
    assert cache is not None
    assert kv.attach(0, page_keys_from_tokens(A_TOKENS, P), len(A_TOKENS)) == 0
    # Resume points of 9 whole pages, every 4 pages and the last: 4, 8, 9. Their window
    # tails [window_start(16q) // 16, q) with window_start(x) = x - 31: q=4 -> [2, 4),
    # q=8 -> [6, 8), q=9 -> [7, 9): pages 2, 3, 6, 7, 8.
    assert kv.pages(0).points == (4, 8, 9)
    kv.allocate([(0, 150)])
    # One chunk: 10 full pages, 10 window pages, 1 working slot + 3 checkpoint slots.
    req = kv.pages(0)
    assert [len(req.band(FULL)), len(req.band(WINDOW)), len(req.band(STATE)),
            len(req.ckpts)] == [10, 10, 1, 3]
    kv.commit(0, 150)
    kv.audit()
    req = kv.pages(0)
    # The next token (150) reads the window from 150 - 31 = 119: pages 7, 8, 9. Pages 0, 1,
    # 4, 5 were released (no tail); 2, 3, 6 (tails) and 7, 8 (read) went to the cache;
    # page 9 (tokens 144-149, partial) stays the request's own.
    assert (req.shared, req.first(WINDOW), len(req.band(WINDOW))) == (9, 7, 3)
    assert kv.chain.bound_pages(WINDOW) - kv.chain.layout.bands[WINDOW].reserved_pages == 6
    assert sorted(len(b) for b in cache.held_pages()) == [3, 5, 9]  # ckpts, window, full
    # Evictable at once: one TAILS unit of the locked prompt node with the 3 checkpoints
    # and the 3 unpinned tail pages (2, 3, 6); pages 7, 8 are pinned (A reads them); the
    # 9 full pages are locked.
    assert cache.eviction_order().cumulative == ((0, 0, 0), (3, 3, 0))
    assert kv.glue.prompts_inserted == 1 and not req.ckpts and not req.kept
    assert kv.hit_tokens(0) == 0  # the insert is not a hit
    # Ten decodes (positions 150-159, all on page 9) to 160 tokens: the window then starts
    # at 160 - 31 = 129 (page 8): page 7 is unpinned (evictable, not released): 4 window
    # pages offered, the chain's window band unchanged (5 cached + page 9).
    for _ in range(10):
        kv.allocate([(0, 1)])
        kv.commit(0, 1)
        kv.audit()
    assert kv.pages(0).first(WINDOW) == 8
    assert cache.eviction_order().cumulative == ((0, 0, 0), (3, 4, 0))
    assert kv.chain.bound_pages(WINDOW) - kv.chain.layout.bands[WINDOW].reserved_pages == 6
    # The request ends: it inserts nothing new, releases its own pages (full and window
    # page 9, tokens 144-159, and its working slot), unpins page 8 and
    # unlocks: the prompt node is one LEAF unit with everything the cache holds.
    kv.free(0)
    kv.audit()
    assert kv.glue.prompts_inserted == 1
    assert cache.eviction_order().cumulative == ((0, 0, 0), (3, 5, 9))


def test_a_concurrent_request_hits_the_prompt_while_it_decodes():
    kv = manager()
    prefill_a(kv)
    # B shares A's first 8 pages (128 tokens), then differs: 140 tokens, at most
    # (140 - 1) // 16 = 8 pages may hit. Checkpoints at 4 and 8; the tail of 8 is pages 6
    # (cache, evictable) and 7 (cache, pinned by A): both present, so the hit is 8 pages.
    b = A_TOKENS[:128] + list(range(5000, 5012))
    assert kv.attach(1, page_keys_from_tokens(b, P), len(b)) == 128
    assert kv.hit_tokens(1) == 128
    kv.audit()  # page 7 is pinned twice (A and B), page 6 and checkpoint 8 once (B)
    cache = kv.cache
    assert cache is not None
    wpins, cpins = cache.pinned()
    assert sorted(wpins.values()) == [1, 1, 2] and list(cpins.values()) == [1]
    # B's first chunk copies checkpoint 8 into its own slot and drops that pin.
    kv.allocate([(1, 12)])
    assert kv.glue.cow_state_copies == 1 and cache.pinned()[1] == {}
    kv.commit(1, 12)
    kv.audit()
    # B's prompt has 8 whole pages (140 // 16), all hit: nothing to insert.
    assert kv.glue.prompts_inserted == 1
    kv.free(1)
    kv.free(0)
    kv.audit()


def test_a_same_prompt_inserted_twice_switches_to_the_cache_copy():
    kv = manager()
    cache = kv.cache
    assert cache is not None
    keys = page_keys_from_tokens(A_TOKENS, P)
    # Two cold requests with the same prompt prefill side by side (neither hits the other).
    assert kv.attach(0, keys, 150) == 0 and kv.attach(1, keys, 150) == 0
    kv.allocate([(0, 150), (1, 150)])
    kv.commit(0, 150)
    own = kv.pages(1).band(FULL)[:9]
    kv.commit(1, 150)
    kv.audit()
    # The second insert finds all 9 pages cached: request 1 now reads the cache's full
    # pages and window pages 7, 8, and its own copies (9 full, window 2, 3, 6, 7, 8, 3
    # checkpoints) were released: the full band holds 9 cached + 1 + 1 own pages.
    assert kv.pages(1).band(FULL)[:9] == kv.pages(0).band(FULL)[:9] != own
    assert kv.pages(1).band(WINDOW)[:2] == kv.pages(0).band(WINDOW)[:2]
    assert kv.chain.bound_pages(FULL) == 11
    assert sorted(len(b) for b in cache.held_pages()) == [3, 5, 9]
    kv.free(0)
    kv.free(1)
    kv.audit()


def test_retraction_before_and_after_the_prefill_end_leaks_nothing():
    kv = manager()
    cache = kv.cache
    assert cache is not None
    keys = page_keys_from_tokens(A_TOKENS, P)
    # Retracted after a 64-token chunk: 4 pages computed of 9, inserted at the chunk's
    # commit (incremental insertion): the 4 full pages, window pages 2, 3 (the tail of
    # point 4, [(64 - 31) // 16, 4) = [2, 3], also the next token's window) and checkpoint
    # 4; pages 0, 1 were released. The retraction unlocks and unpins them: one LEAF unit
    # (state 1, window 2, full 4); the request's own working slot goes back to the chain.
    kv.attach(0, keys, 150)
    kv.allocate([(0, 64)])
    kv.commit(0, 64)
    kv.free(0, insert=False)
    kv.audit()
    assert [len(b) for b in cache.held_pages()] == [1, 2, 4]
    assert cache.eviction_order().cumulative == ((0, 0, 0), (1, 2, 4))
    assert cache.pinned() == ({}, {})
    assert all(kv.chain.bound_pages(b) - kv.chain.layout.bands[b].reserved_pages
               == len(cache.held_pages()[b]) for b in range(3))
    # Retracted after its prefill: the prompt stays cached (inserted at the prefill end),
    # unlocked and unpinned; the request's own pages are released.
    kv = manager()
    cache = kv.cache
    assert cache is not None
    prefill_a(kv)
    kv.free(0, insert=False)
    kv.audit()
    assert cache.eviction_order().cumulative == ((0, 0, 0), (3, 5, 9))
    assert cache.pinned() == ({}, {})


def test_detach_unpins_the_hit():
    kv = manager()
    prefill_a(kv)
    kv.free(0)
    b = A_TOKENS[:128] + list(range(5000, 5012))
    assert kv.attach(1, page_keys_from_tokens(b, P), len(b)) == 128
    cache = kv.cache
    assert cache is not None and cache.pinned() != ({}, {})
    kv.detach(1)
    kv.audit()
    assert cache.pinned() == ({}, {})


def test_a_tail_released_by_request_and_cache_is_caught_by_the_audit(monkeypatch):
    kv = manager()
    real = Commits.release_window_tail

    def double_release(self: Commits, rid: int) -> int:
        """Planted defect: the window-tail release gives the chain back the cache's pages
        too (a tail released by both the request and the cache)."""
        req = kv.pages(rid)
        keep_from = kv.geom.windows[0].first_page(req.tokens)
        drop = [v for i, v in enumerate(req.band(WINDOW), req.first(WINDOW))
                if i < min(keep_from, req.shared)]
        released = real(self, rid)
        if drop:
            kv.chain.release(WINDOW, drop)
        return released

    monkeypatch.setattr(Commits, "release_window_tail", double_release)
    prefill_a(kv)  # nothing of the cache's is out of the window yet
    with pytest.raises(AuditError):
        for _ in range(10):  # token 160 moves the window past page 7 (the cache's)
            kv.allocate([(0, 1)])
            kv.commit(0, 1)
            kv.audit()
