"""Order a page copy so it can run in place, in bounded chunks.

``copy_pages(src, dst)`` means: every source page is read before any destination page is
written (gather, then scatter). Done literally that needs a temporary copy of every page.
This module instead orders the copies so that each chunk of at most ``chunk_pages`` pages
can be gathered into a small staging area and scattered back, with the same result.

The dependency graph. Within one band, two pages either coincide or are disjoint (one
grid), and each destination page is written by exactly one copy. Copy ``i`` reads page
``src[i]``; if some copy ``j`` writes that page (``dst[j] == src[i]``), ``i`` must read
before ``j`` writes: an edge ``i -> j``. Every copy has at most one such edge, so the graph
is a forest of chains, possibly ending in cycles::

    slide up by 2 pages, source pages 0 1 3 4 (gap at 2):
        copy a: 0 -> 2     copy b: 1 -> 3     copy c: 3 -> 5     copy d: 4 -> 6
        edge b -> c (b reads page 3, which c writes); a, c, d read pages nobody writes.
        depth: b = 1, a = c = d = 0.  Order by depth, deepest first: b, a, c, d.

Ordering copies by decreasing chain depth (``depth(i) = depth(next(i)) + 1``) puts every
reader before the writer of its page; a reader and its writer in the same chunk are safe
because a chunk gathers all its sources before it scatters. A cycle (pages that swap or
rotate) has no such order: one page per cycle is saved to a **spill** area before any
write, and its reader reads the spill instead, which breaks the cycle.

Temporary memory: one staging chunk (``chunk_pages`` pages) plus one page per cycle of the
copy graph (none for slides and compactions, which are acyclic). Depths come from pointer
jumping: ``O(n log n)`` numpy work for ``n`` copies, no Python loop over pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class CopyChunk:
    """One gather-then-scatter step.

    Attributes:
        src: pages to read (int64), one per copy.
        dst: pages to write (int64, distinct), one per copy.
        spill_slot: per copy, the spill row to read instead of ``src`` (``-1``: read
            ``src``); ``None`` when no copy of the chunk reads the spill.
    """

    src: np.ndarray
    dst: np.ndarray
    spill_slot: np.ndarray | None


@dataclass(frozen=True, slots=True, eq=False)
class CopyPlan:
    """An in-place execution order of one ``copy_pages`` call.

    Run it as: save ``spill_pages`` (in order: spill row ``k`` = page ``spill_pages[k]``),
    then for each chunk gather its sources (spill rows where ``spill_slot >= 0``) and
    scatter them to its destinations.

    Attributes:
        spill_pages: pages to save before any write (one per cycle of the copy graph).
        chunks: the chunks, in execution order; each holds at most ``chunk_pages`` copies.
    """

    spill_pages: np.ndarray
    chunks: tuple[CopyChunk, ...]


def _chunks(src: np.ndarray, dst: np.ndarray, slot: np.ndarray | None,
            chunk_pages: int) -> tuple[CopyChunk, ...]:
    out = []
    for lo in range(0, src.size, chunk_pages):
        hi = lo + chunk_pages
        part = None
        if slot is not None:
            part = slot[lo:hi]
            if not (part >= 0).any():
                part = None
        out.append(CopyChunk(src[lo:hi], dst[lo:hi], part))
    return tuple(out)


def _rank(nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pointer jumping over ``i -> nxt[i]`` (``-1`` ends a chain).

    Returns ``(depth, jump, min_label)`` after ``r`` rounds with ``2**r > n``: ``depth[i]``
    counts edges to the chain's end (meaningless on nodes that reach a cycle), ``jump[i]``
    is ``-1`` unless ``i`` reaches a cycle (then it is the node ``2**r`` steps ahead, which
    lies on the cycle), and ``min_label[i]`` is the smallest node among the first ``2**r``
    nodes of the path from ``i`` (for a node on a cycle: the cycle's smallest node).
    """
    n = nxt.size
    depth = (nxt >= 0).astype(np.int64)
    jump = nxt.copy()
    min_label = np.arange(n, dtype=np.int64)
    for _ in range(max(1, n.bit_length())):
        live = jump >= 0
        if not live.any():
            break
        ahead = jump[live]
        depth[live] += depth[ahead]
        min_label[live] = np.minimum(min_label[live], min_label[ahead])
        new_jump = np.full(n, -1, dtype=np.int64)
        new_jump[live] = jump[ahead]
        jump = new_jump
    return depth, jump, min_label


def plan_copy(src: np.ndarray, dst: np.ndarray, chunk_pages: int) -> CopyPlan:
    """Order the copies ``src[i] -> dst[i]`` for in-place execution in chunks.

    Args:
        src: source pages (int64; duplicates allowed).
        dst: destination pages (int64, distinct; validated by the caller).
        chunk_pages: most copies per chunk (>= 1).

    Returns:
        The plan. Copies of a page onto itself are dropped (they change nothing: the only
        writer of that page writes the value every reader must see).
    """
    keep = src != dst
    src, dst = src[keep], dst[keep]
    n = src.size
    empty = np.zeros(0, dtype=np.int64)
    if n == 0:
        return CopyPlan(empty, ())
    by_dst = np.argsort(dst, kind="stable")
    sorted_dst = dst[by_dst]
    pos = np.minimum(np.searchsorted(sorted_dst, src), n - 1)
    written = sorted_dst[pos] == src
    if not written.any():  # no source is overwritten: any order is safe
        return CopyPlan(empty, _chunks(src, dst, None, chunk_pages))
    nxt = np.where(written, by_dst[pos], -1)

    depth, jump, min_label = _rank(nxt)
    spill = empty
    slot = None
    cyclic = jump >= 0
    if cyclic.any():
        on_cycle = np.unique(jump[cyclic])
        reps = on_cycle[min_label[on_cycle] == on_cycle]  # one copy per cycle
        spill = src[reps]
        slot = np.full(n, -1, dtype=np.int64)
        slot[reps] = np.arange(reps.size, dtype=np.int64)
        nxt = nxt.copy()
        nxt[reps] = -1  # the representative reads the spill: its edge is gone
        depth, _, _ = _rank(nxt)

    order = np.argsort(-depth, kind="stable")
    return CopyPlan(spill, _chunks(src[order], dst[order],
                                   None if slot is None else slot[order], chunk_pages))
