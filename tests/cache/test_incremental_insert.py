"""Incremental prompt insertion: every prefill chunk that completes whole pages inserts the
prompt's pages so far into the prefix cache at its commit, so the window tails and
checkpoints of the resume points it reached are evictable cache units at once, and the
request's reservation for its later chunks holds none of them.

The tiny model: window | full, page P = 16 tokens, window W = 32 tokens (the token at ``s``
reads from page ``(s - 31) // 16``), resume points every 64 tokens (4 pages). A 150-token
prompt has 9 whole pages and resume points 4, 8, 9; the tail of point ``q`` is
``[(16 q - 31) // 16, q) = [q - 2, q)``: [2, 4), [6, 8), [7, 9). It runs in three chunks:
96, 32 and 22 tokens. Values derived by hand in the comments.
"""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.bands.policies import WindowPolicy
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.demand import tail_spans
from kvchain.requests.manager import KVManager

P = 16
WINDOW, FULL = 0, 1  # band order of the chain: window | full END
TOKENS = list(range(1000, 1150))  # 150 tokens: 9 whole pages + 6 tokens


def manager() -> KVManager:
    layout = plan_layout([declared_class(LC.WINDOW, 1_000, 32), declared_class(LC.FULL, 1_000)],
                         3_000_000, P)
    assert [b.lifetime for b in layout.bands] == [LC.WINDOW, LC.FULL]
    return KVManager(Chain(layout, debug_audit=True),
                     PrefixCache(CacheGeometry.of(layout), interval_tokens=64))


def chunk(kv: KVManager, tokens: int) -> None:
    kv.allocate([(0, tokens)])
    kv.commit(0, tokens)
    kv.audit()


def test_three_chunks_insert_as_they_go() -> None:
    kv = manager()
    cache = kv.cache
    assert cache is not None
    assert kv.attach(0, page_keys_from_tokens(TOKENS, P), 150) == 0  # cold
    assert kv.pages(0).points == (4, 8, 9)
    # Admission demand of chunk 1 (96 tokens) with the 54 later ones in one-page chunks:
    # full ceil(150 / 16) = 10; window: the chunk's span [0, 6) = 6 pages against a later
    # step's 1 + ceil(31 / 16) = 3, and no tail beside it: 6. (With the tails reserved
    # beside a later step until the prefill end, as before: max(6, 3 + 5 tail pages) = 8.)
    assert kv.demand(0, 96, 54, P).pages == (6, 10)
    chunk(kv, 96)
    # After chunk 1 (96 tokens, next token's window from page (96 - 31) // 16 = 4): pages
    # [0, 6) are the cache's (shared = 6); window pages 0, 1 released, 2, 3 (the tail of
    # point 4) handed over unpinned, 4, 5 handed over and pinned (the request reads them).
    req = kv.pages(0)
    assert (req.shared, req.first(WINDOW), len(req.band(WINDOW))) == (6, 4, 2)
    assert [len(b) for b in cache.held_pages()] == [4, 6]
    # Evictable at once: one TAILS unit of 2 window pages (2, 3); the full pages are
    # prompt-locked, pages 4, 5 pinned.
    assert cache.eviction_order().cumulative == ((0, 0), (2, 0))
    assert sorted(cache.pinned()[0]) == sorted((WINDOW, v) for v in req.band(WINDOW))
    assert not req.kept and req.points == (8, 9)
    assert (kv.glue.prompts_inserted, kv.hit_tokens(0)) == (0, 0)  # not whole yet, no hit
    # The reservation of the rest (chunk 2 of 32 tokens, 22 later in one-page chunks), by
    # hand: full ceil(150 / 16) - 6 = 4; window: the chunk's span [(96 - 31) // 16,
    # ceil(128 / 16)) = [4, 8) = 4 pages, 2 of them held; a later step's span
    # min(ceil(150 / 16) - (128 - 31) // 16, 1 + 2) = min(10 - 6, 3) = 3: max(4, 3) - 2 = 2.
    # Before (the tails [6, 9) of points 8, 9 reserved beside a later step):
    # max(4, 3 + 3) - 2 = 4.
    assert kv.demand(0, 32, 22, P).pages == (2, 4)
    win = kv.geom.windows[0]
    assert isinstance(win, WindowPolicy)
    assert tail_spans(kv.geom, (8, 9), 6)[WINDOW] == ((6, 9),)
    chunk(kv, 32)
    # After chunk 2 (128 tokens, window from page 6): pages 4, 5 unpinned (the cache's,
    # out of the window: evictable, not released); 6, 7 (the tail of point 8) handed over
    # and pinned. The prompt lock moved: the path to page 8 is locked once, so the first
    # node (pages [0, 6)) holds one lock, not two.
    req = kv.pages(0)
    assert (req.shared, req.first(WINDOW), len(req.band(WINDOW))) == (8, 6, 2)
    assert [len(b) for b in cache.held_pages()] == [6, 8]
    assert cache.eviction_order().cumulative == ((0, 0), (4, 0))
    first_node = next(iter(cache.root.children.values()))
    assert (first_node.start, first_node.end, first_node.lock) == (0, 6, 1)
    # Chunk 3 (22 tokens, to 150; window from page (150 - 31) // 16 = 7): page 6 unpinned,
    # page 8 (point 9's tail with 7) handed over and pinned; page 9 (tokens 144-149) is the
    # request's own. The whole prompt is inserted now.
    chunk(kv, 22)
    req = kv.pages(0)
    assert (req.shared, req.first(WINDOW), len(req.band(WINDOW))) == (9, 7, 3)
    assert [len(b) for b in cache.held_pages()] == [7, 9]
    assert cache.eviction_order().cumulative == ((0, 0), (4, 0), (5, 0))
    assert (kv.glue.prompts_inserted, kv.glue.chunk_inserts) == (1, 3)
    # The chain holds the cache's 7 + 9 pages and the request's own window/full page 9.
    assert [kv.chain.bound_pages(b) - kv.chain.layout.bands[b].reserved_pages
            for b in (WINDOW, FULL)] == [8, 10]
    kv.free(0)
    kv.audit()
    assert cache.pinned() == ({}, {})
    # Unlocked: the cache's units free all 7 + 9 pages.
    assert cache.eviction_order().cumulative[-1] == (7, 9)


def test_a_second_request_hits_a_prompt_still_in_its_prefill() -> None:
    kv = manager()
    keys = page_keys_from_tokens(TOKENS, P)
    kv.attach(0, keys, 150)
    chunk(kv, 96)
    # Pages [0, 6) are cached with window pages 2-5: a request with the same prompt hits
    # all 6 pages (96 tokens) while request 0 is still in its prefill: a hit after 6 pages
    # reads the window tail [(96 - 31) // 16, 6) = [4, 6), present (request 0 reads it
    # too; no state band, so no checkpoint is needed there).
    assert kv.attach(1, keys, 150) == 96
    kv.audit()
    kv.free(1, insert=False)
    kv.free(0, insert=False)
    kv.audit()


_MAYBE_INSERT = CacheGlue.maybe_insert


def insert_at_prefill_end_only(self, rid, facts, tokens):  # type: ignore[no-untyped-def]
    """Planted defect: the prompt is inserted only once its prefill ends (the old path),
    so a chunk's reached tails stay the request's though its reservation counts none."""
    if facts.keys and tokens >= len(facts.keys) * self.geom.page_size:
        _MAYBE_INSERT(self, rid, facts, tokens)


def test_a_tail_kept_but_not_inserted_is_caught_by_the_audit(monkeypatch) -> None:
    monkeypatch.setattr(CacheGlue, "maybe_insert", insert_at_prefill_end_only)
    kv = manager()
    kv.attach(0, page_keys_from_tokens(TOKENS, P), 150)
    kv.allocate([(0, 96)])
    kv.commit(0, 96)
    # Pages 2, 3 (point 4's tail) are kept by the request at 96 tokens, not cached.
    with pytest.raises(AuditError, match="2 kept window pages"):
        kv.audit()


def after_first_chunk():  # type: ignore[no-untyped-def]
    """The manager and its cache after request 0's first chunk of 96 tokens."""
    kv = manager()
    cache = kv.cache
    assert cache is not None
    kv.attach(0, page_keys_from_tokens(TOKENS, P), 150)
    chunk(kv, 96)
    return kv, cache


def test_an_inserted_tail_freed_while_read_is_caught_by_the_audit() -> None:
    kv, cache = after_first_chunk()
    # Planted: the cache drops the pin of page 5 (the request reads it: its window starts
    # at page 4), so a TAILS unit would free it under the running request.
    handle = kv.pages(0).handle
    assert handle is not None
    cache.unpin_window(handle, WINDOW, [5])
    assert cache.eviction_order().cumulative == ((0, 0), (3, 0))  # now evictable
    with pytest.raises(AuditError):
        kv.audit()


def test_a_prompt_lock_not_moved_is_caught_by_the_audit() -> None:
    kv, cache = after_first_chunk()
    # Planted: a second prompt lock of the path so far (the lock of chunk 1 left behind
    # when chunk 2 locks its longer path): no request holds it.
    handle = kv.pages(0).handle
    assert handle is not None
    first_node = next(iter(cache.root.children.values()))
    first_node.lock += 1
    with pytest.raises(AuditError):
        kv.audit()
