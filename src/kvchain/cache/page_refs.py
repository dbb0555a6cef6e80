"""Reference counts of the prefix cache's window pages that running requests read.

A running request whose window (in one window or chunked-local band) covers pages the
prefix cache holds reads them by reference: one reference per request and page, taken
when its hit is attached or its prompt inserted, dropped page by page as its window moves
past them (or all at once when it ends). A page with a reference is never freed by a
``TAILS`` unit. The counts live in one int64 array per band indexed by the band's virtual
page id (ids are ``0 .. cap - 1``, :mod:`kvchain.alloc.band`), so a decode batch's dropped
front pages are one vectorised decrement, whatever the number of requests (as vLLM's
``ref_cnt`` on its KV blocks, vllm ``KVCacheBlock``). Beside each count the array keeps
the radix node that holds the page (meaningful while the count is above 0), so the cache
can recount the share of the eviction order of each node that lost its last reference,
once per node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvchain.errors import AuditError


class PageRefs:
    """Running readers per page id of one window band, and the node holding each read
    page.

    Args:
        size: initial number of page ids covered (grown by doubling on demand).

    Attributes:
        count: int64 ``[size]``: readers of page id ``v`` (0: none).
        node: object ``[size]``: the radix node holding page ``v`` while ``count[v] > 0``
            (``None`` otherwise).
    """

    def __init__(self, size: int = 64) -> None:
        self.count = np.zeros(size, dtype=np.int64)
        self.node = np.full(size, None, dtype=object)

    def _fit(self, top: int) -> None:
        """Cover page ids up to ``top`` (inclusive)."""
        old = self.count.size
        if top < old:
            return
        new = max(top + 1, 2 * old)
        count = np.zeros(new, dtype=np.int64)
        count[:old] = self.count
        node = np.full(new, None, dtype=object)
        node[:old] = self.node
        self.count, self.node = count, node

    def of(self, vid: int) -> int:
        """Readers of page id ``vid`` (0 for an id never read, or negative: a tombstone)."""
        return int(self.count[vid]) if 0 <= vid < self.count.size else 0

    def held(self, vids: np.ndarray) -> np.ndarray:
        """Readers of each id of ``vids`` (int64 ``[n]``; 0 for negative or unknown ids)."""
        ok = (vids >= 0) & (vids < self.count.size)
        out = np.zeros(vids.size, dtype=np.int64)
        out[ok] = self.count[vids[ok]]
        return out

    def add(self, vids: Sequence[int], nodes: Sequence[object]) -> list[int]:
        """One more reader of each id of ``vids`` (ids >= 0; an id named twice gets two),
        held by ``nodes`` (aligned). Returns the distinct ids that had no reader before."""
        if not len(vids):
            return []
        v = np.asarray(vids, dtype=np.int64)
        self._fit(int(v.max()))
        fresh = v[self.count[v] == 0].tolist()
        if len(fresh) > 1:  # ascending, an id named twice once (cheaper than np.unique)
            fresh = sorted(set(fresh))
        np.add.at(self.count, v, 1)
        if nodes.count(nodes[0]) == len(nodes):  # one holder (a run of one node's pages)
            self.node[v] = nodes[0]
        else:
            held_by = np.empty(v.size, dtype=object)
            held_by[:] = list(nodes)
            self.node[v] = held_by
        return fresh

    def drop(self, vids: np.ndarray | Sequence[int]) -> list[object]:
        """One reader less of each id of ``vids`` (an id named twice loses two): one
        vectorised decrement. Returns the node of each distinct id whose last reader went
        (its count is 0 now), one entry per such id.

        Raises:
            AuditError: an id with fewer readers than it is named (nothing changes).
        """
        v = np.asarray(vids, dtype=np.int64)
        if not v.size:
            return []
        if int(v.min()) < 0 or int(v.max()) >= self.count.size:
            bad = v[(v < 0) | (v >= self.count.size)][0]
            raise AuditError(f"unpin of window page id {int(bad)}: not pinned")
        count = self.count
        np.subtract.at(count, v, 1)
        after = count[v]
        if (after < 0).any():
            bad = v[after < 0][0]
            np.add.at(count, v, 1)  # as before
            raise AuditError(f"unpin of window page id {int(bad)}: not pinned (named more "
                             f"times than it is read)")
        gone = v[after == 0]
        if not gone.size:
            return []
        if gone.size > 1:  # an id named twice appears twice: once each (C-level dedupe)
            gone = np.fromiter(dict.fromkeys(gone.tolist()), dtype=np.int64)
        nodes: list[object] = self.node[gone].tolist()
        self.node[gone] = None
        return nodes

    def items(self) -> dict[int, int]:
        """Page id -> readers of every id read now (a copy)."""
        at = np.flatnonzero(self.count)
        return dict(zip(at.tolist(), self.count[at].tolist(), strict=True))

    def __len__(self) -> int:
        """Distinct page ids read now."""
        return int(np.count_nonzero(self.count))
