"""The batch unpin's recount of a prompt-locked node (:meth:`PrefixCache._unread`, the
decode step's path) on a chain of two window bands: its ``TAILS`` share grows in the
unpinned band only (the second window band's entry of the share, not the first's), the
version rises by one per node whose share moved (not per page), and the kept order equals
the tree walk's after every step; a planted cache that moves the totals but not the
node's share is caught by the rebuild-and-compare.

Geometry: page P = 4 tokens; band 0 window W = 5 tokens (a resume after q pages reads
pages ``[(4q - W + 1) // 4, q)``: [3, 4) for q = 4), band 1 window W = 12 tokens ([5 // 4,
4) = [1, 4)), band 2 full. A cached prompt of 4 pages
keeps band 0 pages 2, 3 (ids 102, 103) and band 1 pages 1-3 (ids 201-203); a prompt lock
(full pages only) on it reads band 1's three pages, so its ``TAILS`` unit frees band 0's
two pages only: cumulative rows ((0, 0, 0), (2, 0, 0)).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.cache.radix import CacheGeometry, Node, PrefixCache
from kvchain.errors import AuditError

WW = CacheGeometry(4, (WindowPolicy(0, 4, 5), WindowPolicy(1, 4, 12), FullPolicy(2, 4)))


def reading(cache: PrefixCache, first: int) -> Node:
    """Insert the 4-page prompt keyed ``first..first + 3`` (ids offset by ``(first - 1) *
    10``: full 11-14, band 0 pages 2, 3 -> 102, 103, band 1 pages 1-3 -> 201-203),
    prompt-lock it and pin band 1's pages 1-3; returns the lock's node."""
    off = (first - 1) * 10
    keys = [first, first + 1, first + 2, first + 3]
    cache.insert(keys, 0, [off + 11, off + 12, off + 13, off + 14],
                 {0: {2: off + 102, 3: off + 103}, 1: {i: off + 200 + i for i in (1, 2, 3)}},
                 {})
    hit = cache.match([*keys, 99], 20)
    assert hit.pages == 4  # every band holds its tail at 4 pages: band 0 [3, 4), band 1 [1, 4)
    handle = cache.lock(hit, tails=False)
    assert handle is not None
    cache.pin_window(handle, 1, [1, 2, 3])
    return handle


def test_a_second_window_bands_unpin_grows_only_its_entry_of_the_share() -> None:
    cache = PrefixCache(WW, interval_tokens=8)
    node = reading(cache, 1)
    assert cache.eviction_order().materialize().cumulative == ((0, 0, 0), (2, 0, 0))
    assert node.sig is not None and node.sig[5] == (2, 0)
    for vids, band1 in (([201], 1), ([202, 203], 3)):  # 1 page unread, then 2 more
        version = cache.version
        cache.unpin_pages(1, np.array(vids))
        assert cache.version == version + 1  # one node's share moved
        assert node.sig is not None and node.sig[5] == (2, band1)
        assert cache.eviction_order().materialize().cumulative == ((0, 0, 0), (2, band1, 0))
        cache.check_order()


def test_one_version_bump_per_node_whose_share_moved() -> None:
    # Two prompt-locked nodes (prompts 1-4 and 11-14); one batch unpins two pages of the
    # first and one of the second: the version rises by 2 (one per node), the totals by 3
    # band 1 pages (each TAILS unit: 2 band 0 pages + what it no longer pins).
    cache = PrefixCache(WW, interval_tokens=8)
    reading(cache, 1)
    reading(cache, 11)
    version = cache.version
    cache.unpin_pages(1, np.array([201, 202, 301]))
    assert cache.version == version + 2
    order = cache.eviction_order()
    assert order.units == 2 and order.freed(2) == (4, 3, 0)
    cache.check_order()


class ShareForgotten(PrefixCache):
    """Planted defect: the batch unpin moves the totals by the unread pages but leaves the
    node's share as it was counted, so the next recount starts from a stale share."""

    def _unread(self, k: int, nodes: list[object]) -> None:
        for node in nodes:
            assert isinstance(node, Node)
            node.pins[k] -= 1
            self._total[self._wbands[k]] += 1
        self.version += 1


def test_a_share_left_stale_is_caught_by_the_rebuild_and_compare() -> None:
    # Sibling of the first test: the defect's totals are right after both unpins (band 1:
    # 1, then 3), but the share still says 0 band 1 pages; the recount at the unlock (the
    # node becomes a LEAF freeing 2, 3, 4) subtracts 0 and adds 3: kept 6 against the
    # walk's 3.
    cache = ShareForgotten(WW, interval_tokens=8)
    node = reading(cache, 1)
    cache.unpin_pages(1, np.array([201]))
    cache.unpin_pages(1, np.array([202, 203]))
    cache.unlock(node, tails=False)
    with pytest.raises(AuditError, match="eviction counters"):
        cache.check_order()
