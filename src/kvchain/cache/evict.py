"""Eviction in the prefix cache: :meth:`EvictMixin.evict` frees the first units of the
published eviction order (:mod:`kvchain.cache.order`), each ``LEAF`` unit's full pages
with its node and each unit's unpinned window pages and checkpoints
(:meth:`EvictMixin._free_tails`), and recounts the changed nodes' shares of the order.
With the audit flag it first rebuilds and compares the order
(:meth:`~kvchain.cache.audit.AuditMixin.check_order`).
"""

from __future__ import annotations

import numpy as np

from kvchain.cache.audit import AuditMixin
from kvchain.cache.nodes import Node
from kvchain.cache.order import LEAF
from kvchain.errors import PlanMismatchError


class EvictMixin(AuditMixin):
    """``evict`` (the chain's Evictor) over the cache's order, pins and audit."""

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        """Evict the first ``units`` units of the walk; return the freed ids per band.

        With the audit flag, the order is first rebuilt by a whole-tree walk and compared
        (:meth:`check_order`).

        Raises:
            PlanMismatchError: ``units`` outside ``[1, eviction_order().units]``.
            AuditError: (audit flag) the kept order differs from the rebuilt one.
        """
        order = self.eviction_order()
        if not 0 < units <= order.units:
            raise PlanMismatchError(f"evict({units}) with {order.units} eviction units")
        if self.audit_walks:
            self.check_order()
        order.walk_to(units)
        published = self._published
        assert published is not None and published[1] is order
        g = self.geom
        freed: list[list[int]] = [[] for _ in range(g.num_bands)]
        changed: list[Node] = []
        for kind, node in published[2][:units]:
            self._free_tails(node, freed)
            changed.append(node)
            if kind == LEAF:
                for band, ids in zip(self._fbands, node.full, strict=True):
                    freed[band].extend(ids)
                parent = node.parent
                assert parent is not None
                del parent.children[node.keys[0]]
                node.parent = None
                changed.append(parent)
        for node in changed:
            self._refresh(node)
        for b, ids in enumerate(freed):
            self.evicted_pages[b] += len(ids)
            self._held[b] -= len(ids)
        self.evictions += units
        self._bump()
        return tuple(np.asarray(ids, dtype=np.int64) for ids in freed)

    def _free_tails(self, node: Node, freed: list[list[int]]) -> None:
        """Free ``node``'s unpinned window pages and checkpoints into ``freed``."""
        g = self.geom
        for k, band in enumerate(self._wbands):
            if node.win_live[k] <= node.pins[k]:
                continue
            out, refs, win = freed[band], self._refs[k], node.win[k]
            for i, v in enumerate(win):
                if v >= 0 and not refs.of(v):
                    out.append(v)
                    win[i] = -1
            node.win_live[k] = node.pins[k]
        if len(node.ckpts) > node.pins[-1] and g.state is not None:
            if node.pins[-1]:
                crefs = self._refs[-1]
                keep = {p: v for p, v in node.ckpts.items() if crefs.of(v)}
                freed[g.state].extend(v for v in node.ckpts.values() if not crefs.of(v))
                node.ckpts = keep
            else:
                freed[g.state].extend(node.ckpts.values())
                node.ckpts = {}

