"""A prompt inserted chunk by chunk keeps its window tails as one unit of recency with its
full pages, as the same prompt inserted whole did (regression: the README's default run
copied 53x the pages after incremental insertion, docs/benchmarks-history.md "Page copies of
incremental insertion (round 8)").

The tiny model of tests/cache/test_incremental_insert.py: window | full, P = 16 tokens,
W = 32 tokens, resume points every 64 tokens (4 pages). The 150-token prompt runs in three
chunks (96, 32, 22 tokens), so its path is three nodes: A = pages [0, 6) (inserted by
chunk 1), B = [6, 8) (chunk 2), C = [8, 9) (chunk 3). Window pages the cache keeps (that
file's derivation): A 2, 3 (point 4's tail) and 4, 5 (read by chunk 2, unpinned as the
window moved on), B 6, 7 (point 8's tail, 7 also point 9's), C 8 (point 9's): 4 + 2 + 1 = 7;
full pages 6 + 2 + 1 = 9.

Once the request finishes (unlocked), the LRU walk by hand: the finish touches the prompt's
path (every node's time := t_f). With one tail time for the prompt's tails (each chunk's
insert gives the path past the hit its time, the finish's touch refreshes the run of nodes
sharing the last node's tail time), every unit is keyed LIVE + t_f; ties go leaf first, so
LEAF(C) frees (1 window, 1 full), then B, a leaf now, LEAF(B) frees (2, 2), then LEAF(A)
(4, 6): cumulative (1, 1), (3, 3), (7, 9). Each eviction frees both bands in proportion.
Without it, A's tails keep the time of chunk 1 (older than t_f; B's are refreshed by the
finish's touch either way, as B holds page 7 of the request's last window, which starts at
page (149 - 31) // 16 = 7): TAILS(A) goes first and frees window pages only (4, 0), then
LEAF(C) (1, 1), LEAF(B) (2, 2), and LEAF(A) full pages only (0, 6): cumulative (4, 0),
(5, 1), (7, 3), (7, 9).
"""

from __future__ import annotations

from typing import Any

from tests.cache.test_incremental_insert import TOKENS, chunk, manager

from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import Node, PrefixCache

# cumulative pages freed per band after 0, 1, 2, ... units (the order's first row is 0)
ONE_RECENCY = ((0, 0), (1, 1), (3, 3), (7, 9))
SPLIT_RECENCY = ((0, 0), (4, 0), (5, 1), (7, 3), (7, 9))


def finished_prompt() -> PrefixCache:
    """The cache after request 0's 150-token prompt ran in chunks of 96, 32, 22 and the
    request finished (nothing locked or pinned)."""
    kv = manager()
    cache = kv.cache
    assert cache is not None
    kv.attach(0, page_keys_from_tokens(TOKENS, 16), 150)
    for tokens in (96, 32, 22):
        chunk(kv, tokens)
    kv.free(0)
    kv.audit()
    assert cache.pinned() == ({}, {})
    return cache


def path_nodes(cache: PrefixCache) -> list[Node]:
    out, node = [], cache.root
    while node.children:
        (node,) = node.children.values()
        out.append(node)
    return out


def test_a_chunked_prompt_is_evicted_leaf_first_both_bands_together() -> None:
    cache = finished_prompt()
    assert [(n.start, n.end) for n in path_nodes(cache)] == [(0, 6), (6, 8), (8, 9)]
    # One tail time on the path: the finish's touch.
    assert len({n.tail_time for n in path_nodes(cache)}) == 1
    assert cache.eviction_order().cumulative == ONE_RECENCY


_ADOPT = PrefixCache.adopt


def adopt_keeping_chunk_times(self: PrefixCache, *args: Any, **kw: Any) -> Any:
    """Planted defect: an insert gives only the nodes it creates its time (the earlier
    chunks' nodes keep theirs), as before the fix."""
    kw.pop("own_from", None)
    return _ADOPT(self, *args, **kw)


def touch_last_node_only(self: PrefixCache, handle: Node | None, window_first: int) -> None:
    """Planted defect: the touch of round 7 (tail times only on the hit's last node and
    the nodes holding window pages at or after ``window_first``)."""
    if handle is None:
        return
    now = self._tick()
    handle.tail_time = now
    n: Node | None = handle
    while n is not None and n.nid:
        n.time = now
        if n.end > window_first:
            n.tail_time = now
        self._refresh(n)
        n = n.parent


def test_planted_chunk_times_split_the_bands(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(PrefixCache, "adopt", adopt_keeping_chunk_times)
    assert finished_prompt().eviction_order().cumulative == SPLIT_RECENCY


def test_planted_last_node_touch_splits_the_bands(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(PrefixCache, "touch", touch_last_node_only)
    assert finished_prompt().eviction_order().cumulative == SPLIT_RECENCY
