"""The eviction order of the prefix cache, kept incrementally (the chain's
:class:`~kvchain.alloc.evictor.Evictor` reads it as the evictable supply).

Owns the two kinds of unit (:data:`LEAF`, :data:`TAILS`) and their walk keys (dead leaves
first, then :data:`LIVE`, then :data:`IN_USE`: the rules in :mod:`kvchain.cache.radix`'s
overview), each node's share of the order (its signature, recounted by
:meth:`OrderMixin._refresh`, which moves the kept totals and the ready heap), and the
published lazy :class:`~kvchain.alloc.snapshot.EvictionOrder` (the simulated walk,
:meth:`OrderMixin.eviction_order`). Freeing its first units is
:mod:`kvchain.cache.evict`'s; the whole-tree rebuild that checks it,
:mod:`kvchain.cache.audit`'s.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.cache.core import CacheCore
from kvchain.cache.nodes import Node, Share
from kvchain.errors import PlanMismatchError

LEAF = 0
TAILS = 1
IN_USE = 1 << 62  # walk time offset of a locked node's tails: after every unlocked unit
LIVE = 1 << 61  # walk time offset of every unit that can still hit: after every dead leaf


#: An entry of the ready heap: (walk key, kind, node id, serial, node).
Entry = tuple[int, int, int, int, Node]


def _pop_scan(scan: list[tuple[Entry, int]], ready: list[Entry], size: int) -> Entry:
    """The least entry of the heap ``ready`` (its first ``size`` entries) read in order
    without changing it: ``scan`` is a heap of ``(entry, index)`` holding the frontier;
    the popped entry's heap children join it."""
    entry, i = heapq.heappop(scan)
    j = 2 * i + 1
    if j < size:
        heapq.heappush(scan, (ready[j], j))
        if j + 1 < size:
            heapq.heappush(scan, (ready[j + 1], j + 1))
    return entry


class OrderMixin(CacheCore):
    """The incremental eviction order over a :class:`CacheCore`."""

    # --- Evictor -------------------------------------------------------------------------

    def eviction_order(self) -> EvictionOrder:
        """The simulated LRU walk as cumulative pages per band: a lazy
        :class:`EvictionOrder` (cached by version) whose unit count and last row are the
        kept counters and whose rows are walked from the ready units only as far as they
        are asked for (O(k log nodes) for the first ``k``)."""
        published = self._published
        if published is not None and published[0] == self.version:
            return published[1]
        version = self.version
        walk: list[tuple[int, Node]] = []
        units = self._walk_iter()

        def grow(rows: list[tuple[int, ...]]) -> None:
            if self.version != version:
                raise PlanMismatchError(f"eviction order of cache version {version} asked for "
                                        f"row {len(rows)} at version {self.version}")
            step = next(units, None)
            if step is None:
                raise PlanMismatchError(f"the ready units ran out after {len(walk)} units, "
                                        f"the counters say {self._units}")
            kind, node, row = step
            walk.append((kind, node))
            rows.append(tuple([a + b for a, b in zip(rows[-1], row, strict=True)]))

        if self._units < 0 or any(v < 0 for v in self._total):
            raise PlanMismatchError(f"eviction counters below zero: {self._units} units, "
                                    f"{self._total}")
        order = EvictionOrder.lazy(self._units, tuple(self._total), grow)
        self._published = (version, order, walk)
        return order

    def _unit_pages(self, node: Node, kind: int, tails_gone: bool) -> list[int]:
        g = self.geom
        row = [0] * g.num_bands
        if not tails_gone:
            for k, band in enumerate(self._wbands):
                row[band] = node.win_live[k] - node.pins[k]
            if g.state is not None:
                row[g.state] = len(node.ckpts) - node.pins[-1]
        if kind == LEAF:
            for band, ids in zip(self._fbands, node.full, strict=True):
                row[band] = len(ids)
        return row

    # --- eviction order, kept incrementally ------------------------------------------------
    #
    # A unit is *ready* when the whole-tree walk would put it in its heap at the start: a
    # LEAF of an unlocked node without children, keyed by its time; a TAILS unit of a
    # node with tails to free that is either locked by prompt locks only (keyed
    # IN_USE + tail time) or unlocked with a tail time older than its time (an unlocked
    # node whose tail time equals its time never frees its tails before its LEAF: every
    # node of its subtree is no newer and its LEAF sorts first at equal times; and the
    # tail time is never newer than the time: every update of it sets both). The ready
    # units live in one heap with lazy deletion (an entry is live while its serial is the
    # node's); a node's share of the order (its signature: keys, time when unlocked,
    # units and pages) is recounted by _refresh whenever its locks, times, pages, pins or
    # children change, which moves the kept totals and bumps the version only when the
    # share changed. The published order walks the heap in sorted order without changing
    # it (a second heap over its indices) and merges the parents that become leaves on
    # the way (the cascade), exactly as the whole-tree walk pops them.

    def _dead(self, node: Node, tails_gone: bool) -> bool:
        """Whether an unlocked leaf is *dead*: on a state chain, no checkpoint left (none,
        or its tails already dropped in the walk, ``tails_gone``), so no hit can resume in
        it and its full pages (and window pages) can never be used."""
        return self.geom.state is not None and (tails_gone or not node.ckpts)

    def _leaf_key(self, node: Node, tails_gone: bool) -> int:
        """The walk key of an unlocked leaf's ``LEAF`` unit: a dead leaf (:meth:`_dead`)
        goes before every unit that can hit (key = its time); every other one at ``LIVE``
        + its time."""
        return node.time if self._dead(node, tails_gone) else LIVE + node.time

    def _tails_key(self, node: Node, leaf: bool) -> int:
        """The walk key of an unlocked node's ``TAILS`` unit: its tail time, after ``LIVE``
        unless the node is a dead ``leaf`` (its window pages, with no checkpoint, cannot be
        resumed from either: they go with the dead units, just before its ``LEAF``)."""
        return node.tail_time if leaf and self._dead(node, False) else LIVE + node.tail_time

    def _dies(self, node: Node, joined: bool) -> bool:
        """Whether ``node``'s ``LEAF`` turns dead when the walk drops its tails: an unlocked
        node on a state chain that is a leaf (at the start, or ``joined`` as one in the
        walk), so its full pages, no checkpoint left at or below them, follow their
        checkpoint at once (its dead ``LEAF`` is entered; the live one is skipped)."""
        return (self.geom.state is not None and not node.lock
                and (joined or not node.children))

    def _refresh(self, node: Node) -> bool:
        """Recount ``node``'s share of the eviction order; returns whether it changed (then
        the totals and ready entries move and the version is bumped)."""
        if not node.nid:
            return False
        sig: Share | None
        if node.parent is None:  # evicted
            sig = None
        else:
            tw = node.tail_windows()
            tc = len(node.ckpts) - node.pins[-1]
            tails = tc > 0 or any(tw)
            if not node.lock:
                tk = (self._tails_key(node, not node.children)
                      if tails and node.tail_time < node.time else -1)
                sig = (-1 if node.children else self._leaf_key(node, False), tk, node.time,
                       2 if tk >= 0 else 1, tuple(map(len, node.full)), tw, tc)
            elif not node.tlock and tails:
                sig = (-1, IN_USE + node.tail_time, -1, 1, (0,) * len(self._fbands), tw, tc)
            else:
                sig = None
        old = node.sig
        if sig == old:
            return False
        node.sig = sig
        g = self.geom
        total = self._total
        for share, sign in ((old, -1), (sig, 1)):
            if share is None:
                continue
            self._units += sign * share[3]
            for band, pages in zip(self._fbands, share[4], strict=True):
                total[band] += sign * pages
            for band, pages in zip(self._wbands, share[5], strict=True):
                total[band] += sign * pages
            if g.state is not None:
                total[g.state] += sign * share[6]
        old_leaf = old[0] if old is not None else -1
        old_tails = old[1] if old is not None else -1
        new_leaf = sig[0] if sig is not None else -1
        new_tails = sig[1] if sig is not None else -1
        if new_leaf != old_leaf:
            node.lser = self._push(new_leaf, LEAF, node, old_leaf >= 0)
        if new_tails != old_tails:
            node.tser = self._push(new_tails, TAILS, node, old_tails >= 0)
        self.version += 1
        return True

    def _push(self, key: int, kind: int, node: Node, replaces: bool) -> int:
        """Enter a ready unit (``key >= 0``) or none (``key < 0``) for ``node``, replacing
        its live entry of that kind if ``replaces``; returns the new serial (0: none).
        Compacts the heap when stale entries outnumber the live ones."""
        ready = self._ready
        if replaces:
            self._entries -= 1
        serial = 0
        if key >= 0:
            self._serial += 1
            serial = self._serial
            heapq.heappush(ready, (key, kind, node.nid, serial, node))
            self._entries += 1
        if len(ready) > 2 * self._entries + 64:
            if kind == LEAF:
                node.lser = serial  # the compaction below reads the new serial
            else:
                node.tser = serial
            live = [e for e in ready
                    if (e[4].lser if e[1] == LEAF else e[4].tser) == e[3]]
            heapq.heapify(live)
            ready[:] = live
        return serial

    def _walk_iter(self) -> Iterator[tuple[int, Node, list[int]]]:
        """The walk of the published order: ``(kind, node, pages per band)`` unit by unit,
        the ready heap read in sorted order (not changed) merged with the parents that
        become leaves as their last child goes (their LEAF joins with their own time)."""
        ready = self._ready
        size = len(ready)
        heappush, heappop = heapq.heappush, heapq.heappop
        scan: list[tuple[Entry, int]] = [(ready[0], 0)] if ready else []
        joined: list[Entry] = []
        left: dict[int, int] = {}
        dropped: set[int] = set()
        gone: set[int] = set()
        leaves: set[int] = set()  # unlocked nodes that became leaves during the walk

        while True:
            while scan:  # skip stale entries, reading their children in the heap
                e = scan[0][0]
                if (e[4].lser if e[1] == LEAF else e[4].tser) == e[3]:
                    break
                _pop_scan(scan, ready, size)
            if scan and (not joined or scan[0][0] < joined[0]):
                e = _pop_scan(scan, ready, size)
            elif joined:
                e = heappop(joined)
            else:
                return
            kind, nid, node = e[1], e[2], e[4]
            if nid in gone:  # a LEAF entry superseded by its dead one
                continue
            if kind == TAILS:
                if nid in dropped:  # an entry superseded by its key as a leaf
                    continue
                dropped.add(nid)
                yield TAILS, node, self._unit_pages(node, TAILS, False)
                if self._dies(node, nid in leaves):  # its pages can no longer hit
                    heappush(joined, (node.time, LEAF, nid, -1, node))
                continue
            yield LEAF, node, self._unit_pages(node, LEAF, nid in dropped)
            gone.add(nid)
            parent = node.parent
            if parent is not None and parent.nid and not parent.lock:
                n = left.get(parent.nid, len(parent.children)) - 1
                left[parent.nid] = n
                if n == 0:
                    leaves.add(parent.nid)
                    tails_gone = parent.nid in dropped
                    heappush(joined, (self._leaf_key(parent, tails_gone), LEAF, parent.nid, -1,
                                      parent))
                    if (not tails_gone and parent.has_tails()
                            and parent.tail_time < parent.time):  # its tails' key as a leaf
                        heappush(joined, (self._tails_key(parent, True), TAILS, parent.nid,
                                          -1, parent))

