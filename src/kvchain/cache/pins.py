"""What running requests read of the prefix cache: the reference counts (pins) of the
window pages inside their windows and of the checkpoints their hits resume from, which
keep those pages out of every ``TAILS`` unit until dropped.

Owns pinning and unpinning by page index or by id (:meth:`PinsMixin.pin_window`,
:meth:`PinsMixin.unpin_window`, :meth:`PinsMixin.unpin_pages`), the per-node pinned counts
(``Node.pins``) and their effect on the eviction order (:meth:`PinsMixin._unread`), and
the id look-ups of a locked path (:meth:`PinsMixin._tail_ids`,
:meth:`PinsMixin.checkpoint_at`). The counts themselves are
:class:`~kvchain.cache.page_refs.PageRefs`, one per window band and the state band's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np

from kvchain.cache.nodes import Node
from kvchain.cache.order import OrderMixin
from kvchain.errors import AuditError


class PinsMixin(OrderMixin):
    """Pins (reference counts of read pages) over the cache's state and order."""

    def _window_of(self, band: int) -> int:
        """The index of window band ``band`` in ``geom.windows`` (``Node.win``'s order).

        Raises:
            AuditError: ``band`` is not a window or chunked-local band of the chain.
        """
        try:
            return self._wbands.index(band)
        except ValueError:
            raise AuditError(f"band {band} is not a window band of the cache "
                             f"(window bands {list(self._wbands)})") from None

    def _tail_of(self, band: int) -> int:
        """The index of band ``band``'s reference counts (``self._refs``, ``Node.pins``):
        a window band's in ``geom.windows``, the state band's last.

        Raises:
            AuditError: ``band`` is neither a window or chunked-local band nor the state
                band of the chain.
        """
        if band in self._wbands:
            return self._wbands.index(band)
        if self.geom.state is not None and band == self.geom.state:
            return len(self._wbands)
        raise AuditError(f"band {band} is not a window band nor the state band of the cache "
                         f"(window bands {list(self._wbands)}, state band {self.geom.state})")

    def _ref(self, k: int, vids: Sequence[int], nodes: Sequence[Node]) -> None:
        """One more reader of each cached id ``vids`` of reference counts ``k``, held by
        ``nodes`` (aligned): a node's pinned count rises by its ids that had no reader,
        and each node's share of the eviction order is recounted once."""
        if not vids:
            return
        refs = self._refs[k]
        fresh = refs.add(vids, nodes)
        if fresh:  # each node's pinned count rises by its ids that had no reader (C-level)
            for node, c in Counter(refs.node[fresh].tolist()).items():
                node.pins[k] += c
        for node in dict.fromkeys(nodes):
            self._refresh(node)

    def _tail_ids(self, handle: Node, k: int, pages: Iterable[int],
                  ) -> tuple[list[int], list[Node]]:
        """The ids of window band ``k``'s pages at page indices ``pages`` of ``handle``'s
        path and the nodes holding them.

        A contiguous ascending run of pages on the path (the window a request reads, the
        usual case) is taken node by node, one list slice each; any other set of pages
        page by page.

        Raises:
            AuditError: a page not on the path, or absent (a tombstone).
        """
        seq: Sequence[int] = pages if isinstance(pages, range) else list(pages)
        if seq and seq[0] >= 0 and seq[-1] < handle.end and (
                len(seq) == seq[-1] - seq[0] + 1 and (
                    isinstance(seq, range) or seq == list(range(seq[0], seq[-1] + 1)))):
            return self._run_ids(handle, k, seq[0], seq[-1] + 1)
        vids: list[int] = []
        nodes: list[Node] = []
        for i in seq:
            node = self._node_of(handle, i)
            v = node.win[k][i - node.start] if node.win[k] else -1
            if v < 0:
                raise AuditError(f"pin of window page {i}: absent from node {node.nid}")
            vids.append(v)
            nodes.append(node)
        return vids, nodes

    @staticmethod
    def _run_ids(handle: Node, k: int, lo: int, hi: int) -> tuple[list[int], list[Node]]:
        """:meth:`_tail_ids` of the page indices ``[lo, hi)`` (``0 <= lo < hi <=
        handle.end``: on the path): one slice of window band ``k``'s ids per node of the
        path that overlaps them.

        Raises:
            AuditError: a page absent (a tombstone, or a node without band ``k``'s pages).
        """
        runs: list[tuple[int, list[int], Node]] = []
        n: Node | None = handle
        while n is not None and n.nid and n.end > lo:
            a, b = max(lo, n.start), min(hi, n.end)
            if a < b:
                win = n.win[k]
                runs.append((a, win[a - n.start:b - n.start] if win else [-1], n))
            n = n.parent
        vids: list[int] = []
        nodes: list[Node] = []
        for a, ids, node in reversed(runs):  # ascending page order
            if min(ids) < 0:
                i = a + ids.index(min(ids))
                raise AuditError(f"pin of window page {i}: absent from node {node.nid}")
            vids += ids
            nodes += [node] * len(ids)
        return vids, nodes

    def pin_window(self, handle: Node, band: int, pages: Iterable[int]) -> None:
        """Reference the cached pages of window band ``band`` at page indices ``pages`` of
        ``handle``'s locked path: a running request reads them (its window in that band
        covers them), so no ``TAILS`` unit frees them until the references are dropped
        (:meth:`unpin_pages`, :meth:`unpin_window`).

        Raises:
            AuditError: ``band`` not a window band, or a page not on the path or not
                present (a tombstone); every page is checked before any is pinned
                (nothing changes).
        """
        k = self._window_of(band)
        self._ref(k, *self._tail_ids(handle, k, pages))

    def unpin_window(self, handle: Node, band: int, pages: Iterable[int]) -> None:
        """Undo :meth:`pin_window` for page indices ``pages`` of window band ``band`` (the
        request's window moved past them, or it ended): once no request pins a page it is
        evictable.

        Raises:
            AuditError: ``band`` not a window band, or a page that is not pinned (or named
                more times than it is pinned); every page is checked before any is
                unpinned (nothing changes).
        """
        k = self._window_of(band)
        refs = self._refs[k]
        vids: list[int] = []
        asked: dict[int, int] = {}
        for i in pages:
            node = self._node_of(handle, i)
            v = node.win[k][i - node.start] if node.win[k] else -1
            asked[v] = asked.get(v, 0) + 1
            if v < 0 or refs.of(v) < asked[v]:
                raise AuditError(f"unpin of window page {i} of node {node.nid}: not pinned")
            vids.append(v)
        self._unread(k, refs.drop(vids))

    def unpin_pages(self, band: int, vids: np.ndarray | Sequence[int]) -> None:
        """Drop one reference of each cached page id ``vids`` of band ``band`` (int64
        ``[n]``; an id named twice drops two): a window band's pages a request stopped
        reading (a decode batch's window fronts, as the request layer reads them from its
        rows), or the state band's checkpoint a hit resumed from (copied into the
        request's own slot, or given up). One vectorised decrement of the band's
        reference counts, then one recount of the eviction order per node that lost its
        last reader on some page (not per request).

        Raises:
            AuditError: ``band`` neither a window band nor the state band, or an id read
                by fewer running requests than it is named (nothing changes).
        """
        k = self._tail_of(band)
        self._unread(k, self._refs[k].drop(vids))

    def _unread(self, k: int, nodes: list[object]) -> None:
        """Pages of reference counts ``k`` (a window band in ``geom.windows``' order, or
        the state band, last) lost their last reader, one entry of ``nodes`` (the node
        holding it) per page: their nodes' pinned counts fall, and each such node's share
        of the eviction order is recounted once, in the order the nodes first appear:
        where its keys cannot move, by moving the totals (a node locked by a hit has no
        share either way; a prompt-locked node's ``TAILS`` unit keeps its key and only
        grows in pages in this band, nothing else changed since its share was counted:
        the total and the share move by as many), else by :meth:`_refresh`.

        A decode step's cost of the cache (its rows' window fronts, about one node per
        row that left a page): the band is resolved once, not per node, and the version
        is bumped once by the number of shares moved (the same final version as a bump
        each: nothing reads it in between); ``benchmarks/bench_unread.py``."""
        if not nodes:
            return
        lost: dict[Node, int] = {}
        for node in cast("list[Node]", nodes):
            lost[node] = lost.get(node, 0) + 1
        refresh, total = self._refresh, self._total
        state = k == len(self._wbands)
        band = self.geom.state if state else self._wbands[k]
        assert band is not None
        one = len(self._wbands) == 1  # the window counts of a share: a 1-tuple
        grown = 0
        for node, c in lost.items():
            pins = node.pins
            pins[k] -= c
            if node.lock:
                sig = node.sig
                if node.tlock:
                    if sig is None:
                        continue  # a hit lock keeps the path's tails: no unit either way
                elif sig is not None and node.parent is not None:  # a prompt lock's TAILS
                    if state:
                        now = len(node.ckpts) - pins[k]
                        total[band] += now - sig[6]
                        node.sig = (*sig[:6], now)
                    else:
                        tw = sig[5]
                        now = node.win_live[k] - pins[k]
                        total[band] += now - tw[k]
                        node.sig = (sig[0], sig[1], sig[2], sig[3], sig[4],
                                    (now,) if one else (*tw[:k], now, *tw[k + 1:]), sig[6])
                    grown += 1
                    continue
            refresh(node)  # an unlocked node holds no pin; tails that were all pinned
        self.version += grown

    def checkpoint_at(self, handle: Node, point: int) -> int:
        """The state slot of the checkpoint after ``point`` pages on ``handle``'s locked
        path, or -1 when there is none (the audit of what a request resumes from).

        Raises:
            AuditError: page ``point - 1`` is not on the path.
        """
        return self._node_of(handle, point - 1).ckpts.get(point, -1)

    def pinned(self) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
        """Copies of the reference counts: ``(window band, page id)`` -> readers,
        checkpoint slot id -> readers."""
        return ({(band, v): c for band, refs in zip(self._wbands, self._refs, strict=False)
                 for v, c in refs.items().items()}, self._refs[-1].items())

