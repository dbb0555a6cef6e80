"""The prefix cache's integrity checks and counts: the eviction order rebuilt by a
whole-tree walk and compared with the kept one (:meth:`AuditMixin.check_order`), the
tree's invariants, locks and pins against what running requests hold
(:meth:`AuditMixin.audit`), and the held and dead page counts read from the tree
(:meth:`AuditMixin.held_pages`, :meth:`AuditMixin.dead_full_pages`).

Reads the tree, the order (:mod:`kvchain.cache.order`) and the reference counts
(:mod:`kvchain.cache.pins`); changes nothing but the count of whole-tree walks.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.cache.nodes import Node
from kvchain.cache.order import IN_USE, LEAF, TAILS
from kvchain.cache.pins import PinsMixin
from kvchain.errors import AuditError, PlanMismatchError

_K = TypeVar("_K", int, tuple[int, int])


def _check_pins(name: str, want: Iterable[_K], have: Mapping[_K, int]) -> None:
    """Raise :class:`AuditError` unless the pin counts ``have`` equal the readers ``want``
    (one entry per reader) counted."""
    count: dict[_K, int] = {}
    for v in want:
        count[v] = count.get(v, 0) + 1
    if count != have:
        raise AuditError(f"{name} pins {sorted(have.items(), key=str)[:8]} differ from what "
                         f"running requests read {sorted(count.items(), key=str)[:8]}")



def _path_counts(handles: Sequence[Node]) -> dict[int, int]:
    """Node id -> how many of the paths root..handle of ``handles`` pass through it."""
    count: dict[int, int] = {}
    for h in handles:
        n: Node | None = h
        while n is not None and n.nid:
            count[n.nid] = count.get(n.nid, 0) + 1
            n = n.parent
    return count


class AuditMixin(PinsMixin):
    """The audit and the tree's counts over the cache's state, order and pins."""

    def _walk_from_scratch(self) -> tuple[EvictionOrder, list[tuple[int, Node]]]:
        """The eviction order rebuilt by a whole-tree walk (the audit's reference: what
        the cache computed on every version change before the order was kept
        incrementally). O(nodes log nodes); counted in :attr:`full_walks`."""
        self.full_walks += 1
        heap: list[tuple[int, int, int, Node]] = []
        left: dict[int, int] = {}
        for node in self.nodes():
            if node.lock:  # its full pages stay
                if not node.tlock and node.has_tails():  # tails of a prompt lock: evictable
                    heap.append((IN_USE + node.tail_time, TAILS, node.nid, node))
                continue
            if node.children:
                left[node.nid] = len(node.children)
            else:
                heap.append((self._leaf_key(node, False), LEAF, node.nid, node))
            if node.has_tails():
                heap.append((self._tails_key(node, not node.children), TAILS, node.nid, node))
        heapq.heapify(heap)
        dropped: set[int] = set()
        gone: set[int] = set()
        leaves: set[int] = set()  # unlocked nodes that became leaves during the walk
        walk: list[tuple[int, Node]] = []
        rows: list[list[int]] = []
        while heap:
            _, kind, nid, node = heapq.heappop(heap)
            if nid in gone:  # a LEAF entry superseded by its dead one, or tails after it
                continue
            if kind == TAILS:
                if nid in dropped:
                    continue
                dropped.add(nid)
                walk.append((TAILS, node))
                rows.append(self._unit_pages(node, TAILS, False))
                if self._dies(node, nid in leaves):  # its pages can no longer hit
                    heapq.heappush(heap, (node.time, LEAF, nid, node))
                continue
            walk.append((LEAF, node))
            rows.append(self._unit_pages(node, LEAF, nid in dropped))
            gone.add(nid)
            parent = node.parent
            if parent is not None and parent.nid in left:
                n = left[parent.nid] - 1
                left[parent.nid] = n
                if n == 0:
                    leaves.add(parent.nid)
                    tails_gone = parent.nid in dropped
                    heapq.heappush(heap, (self._leaf_key(parent, tails_gone), LEAF,
                                          parent.nid, parent))
                    if not tails_gone and parent.has_tails():  # its tails' key as a leaf
                        heapq.heappush(heap, (self._tails_key(parent, True), TAILS,
                                              parent.nid, parent))
        if rows:
            cum = np.cumsum(np.asarray(rows, dtype=np.int64), axis=0)
            order = EvictionOrder(((0,) * self.geom.num_bands, *tuple(map(tuple, cum.tolist()))))
        else:
            order = EvictionOrder()
        return order, walk

    def check_order(self) -> None:
        """Rebuild the eviction order by a whole-tree walk and compare it with the kept one
        (unit count, pages freed in all, every row, and the units' nodes in order).

        Raises:
            AuditError: naming what differs.
        """
        ref, ref_walk = self._walk_from_scratch()
        order = self.eviction_order()
        if (order.units, order.freed(order.units)) != (ref.units, ref.freed(ref.units)):
            raise AuditError(f"eviction counters: {order.units} units freeing "
                             f"{order.freed(order.units)}, the tree walk gives {ref.units} "
                             f"freeing {ref.freed(ref.units)}")
        try:
            rows = order.cumulative
        except PlanMismatchError as exc:
            raise AuditError(f"the kept eviction order cannot be walked: {exc}") from exc
        if rows != ref.cumulative:
            first = next(j for j, (a, b) in enumerate(zip(rows, ref.cumulative, strict=True))
                         if a != b)
            raise AuditError(f"eviction order row {first}: kept {rows[first]}, the tree walk "
                             f"gives {ref.cumulative[first]}")
        published = self._published
        assert published is not None
        kept = [(kind, node.nid) for kind, node in published[2]]
        if kept != [(kind, node.nid) for kind, node in ref_walk]:
            raise AuditError("the kept eviction order walks other units than the tree walk")

    @property
    def held_counts(self) -> tuple[int, ...]:
        """Pages (state slots for a state band) the cache holds per band, locked or not:
        counters kept by :meth:`insert` and :meth:`evict`, so O(bands) to read (the
        per-step band samples read them); :meth:`audit` checks them against
        :meth:`held_pages`."""
        return tuple(self._held)

    def held_pages(self) -> list[list[int]]:
        """Every virtual id the cache holds, per band."""
        g = self.geom
        out: list[list[int]] = [[] for _ in range(g.num_bands)]
        for node in self.nodes():
            for band, ids in zip(self._fbands, node.full, strict=True):
                out[band].extend(ids)
            for band, win in zip(self._wbands, node.win, strict=True):
                out[band].extend(v for v in win if v >= 0)
            if g.state is not None:
                out[g.state].extend(node.ckpts.values())
        return out

    def dead_full_pages(self, unlocked_only: bool = False) -> tuple[int, int]:
        """``(dead, cached)`` full-band pages: of the ``cached`` full pages the cache holds,
        the ``dead`` ones no hit can use on a state chain (:meth:`dead_full_page_ids`).
        With ``unlocked_only`` both count only nodes no running request locks (the pages
        eviction may take; locked ones are in use). O(nodes); a measurement
        (``benchmarks/bench_dead_pages.py``), not used by the cache itself."""
        dead, cached = self._dead_full(unlocked_only)
        return len(dead), cached

    def dead_full_page_ids(self, unlocked_only: bool = False) -> list[int]:
        """Lowest full band's ids (every full band keeps the same pages) of the cached
        pages no hit can use: on a state chain, page ``j``
        of a node is live iff a checkpoint after ``p > j`` pages exists in that node or in
        its subtree (a hit resumes only at a checkpoint, and uses pages ``[0, p)``); the
        others are dead. Empty without a state band (every page boundary, or every window
        tail, resumes there) or without a full band; ``unlocked_only`` as
        :meth:`dead_full_pages`."""
        return self._dead_full(unlocked_only)[0]

    def _dead_full(self, unlocked_only: bool) -> tuple[list[int], int]:
        g = self.geom
        dead: list[int] = []
        cached = 0
        if g.full is None:
            return dead, 0
        below: dict[int, bool] = {}  # nid -> a checkpoint in its subtree (itself included)
        order = list(self.nodes())  # depth first: every child after its parent
        for node in reversed(order):
            deeper = any(below[c.nid] for c in node.children.values())
            below[node.nid] = deeper or bool(node.ckpts)
            if unlocked_only and node.lock:
                continue
            cached += len(node.full[0])
            if g.state is not None and not deeper:
                last = max(node.ckpts, default=node.start)
                dead.extend(node.full[0][last - node.start:])
        return dead, cached

    def audit(self, handles: Sequence[Node],
              pins: tuple[Sequence[tuple[int, int]], Sequence[int]] | None = None,
              prompt_handles: Sequence[Node] = ()) -> None:
        """Tree invariants, lock counts equal to the paths of ``handles`` (the hit locks
        of running requests) and ``prompt_handles`` (their prompt locks), and pin counts
        equal to ``pins`` (the ``(window band, page id)`` pairs and the checkpoint ids
        running requests read; not checked when ``None``), and the kept eviction order
        equal to the one a whole-tree walk rebuilds (:meth:`check_order`).

        Raises:
            AuditError: naming the first thing found wrong.
        """
        held = [len(ids) for ids in self.held_pages()]
        if list(self.held_counts) != held:
            raise AuditError(f"held page counters {list(self.held_counts)} per band, the tree "
                             f"holds {held}")
        if pins is not None:
            _check_pins("window page", pins[0], self.pinned()[0])
            _check_pins("checkpoint", pins[1], self._refs[-1].items())
        expected = _path_counts([*handles, *prompt_handles])
        texpected = _path_counts(handles)
        wpins = cpins = 0
        for node in self.nodes():
            wp, cp = self._check_node(node, expected.get(node.nid, 0),
                                      texpected.get(node.nid, 0))
            wpins += wp
            cpins += cp
        npins = sum(len(refs) for refs in self._refs[:-1])
        if (wpins, cpins) != (npins, len(self._refs[-1])):
            raise AuditError(f"{npins} window pages and {len(self._refs[-1])} checkpoints "
                             f"pinned, {wpins} and {cpins} found in the tree")
        self.check_order()

    def _check_node(self, node: Node, locks: int, tlocks: int) -> tuple[int, int]:
        """One node's invariants for :meth:`audit`: linked to its parent, contiguous with
        it, not empty, one full id per key per full band, its present window pages
        counted, its checkpoints inside its pages, ``locks`` running requests (``tlocks`` of
        them hit locks) passing through it, no younger than its children, its tail time
        no later than its time, and its pins equal to the read pages it holds; returns
        its pinned ``(window pages, checkpoints)``.

        Raises:
            AuditError: naming what is wrong.
        """
        parent = node.parent
        if parent is None or parent.children.get(node.keys[0]) is not node:
            raise AuditError(f"node {node.nid}: not its parent's child")
        if node.start != parent.end and parent.nid:
            raise AuditError(f"node {node.nid}: starts at {node.start}, parent ends at "
                             f"{parent.end}")
        if not node.keys:
            raise AuditError(f"node {node.nid}: empty")
        if len(node.full) != len(self._fbands) or any(
                len(ids) != len(node.keys) for ids in node.full):
            raise AuditError(f"node {node.nid}: full pages per band "
                             f"{[len(ids) for ids in node.full]} for {len(node.keys)} "
                             f"keys and {len(self._fbands)} full bands")
        if len(node.win) != len(self._wbands) or any(
                len(win) != len(node.keys) or live != sum(1 for v in win if v >= 0)
                for win, live in zip(node.win, node.win_live, strict=False)):
            raise AuditError(f"node {node.nid}: window pages miscounted")
        if any(not node.start < p <= node.end for p in node.ckpts):
            raise AuditError(f"node {node.nid}: a checkpoint outside its pages")
        if node.lock != locks or node.tlock != tlocks:
            raise AuditError(f"node {node.nid}: lock {node.lock} (hits {node.tlock}), "
                             f"{locks} running requests pass through it "
                             f"({tlocks} hits)")
        if node.time < max((c.time for c in node.children.values()), default=0):
            raise AuditError(f"node {node.nid}: older than a child")
        if node.tail_time > node.time:
            raise AuditError(f"node {node.nid}: tail time {node.tail_time} after its time "
                             f"{node.time}")
        wp = [sum(1 for v in win if v >= 0 and refs.of(v))
              for win, refs in zip(node.win, self._refs, strict=False)]
        for win, refs in zip([*node.win, list(node.ckpts.values())], self._refs,
                             strict=True):
            if any(refs.of(v) and refs.node[v] is not node for v in win if v >= 0):
                raise AuditError(f"node {node.nid}: a read window page is recorded at "
                                 f"another node")
        cp = sum(1 for v in node.ckpts.values() if self._refs[-1].of(v))
        if [*wp, cp] != node.pins:
            raise AuditError(f"node {node.nid}: pins counted {node.pins}, "
                             f"held ({wp}, {cp})")
        if (any(wp) or cp) and not node.lock:
            raise AuditError(f"node {node.nid}: pinned pages on an unlocked node")
        return sum(wp), cp
