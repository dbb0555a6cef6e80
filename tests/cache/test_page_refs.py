"""Reference counts of the cache's window pages read by running requests
(:mod:`kvchain.cache.page_refs`) and the batch unpin by page id
(:meth:`PrefixCache.unpin_pages`, the decode step's path): it equals the per-index
:meth:`PrefixCache.unpin_window`, keeps the eviction order exact (the kept order == the
tree walk), and refuses what is not read without changing anything.

Geometry as ``test_incremental_order.py``: page P = 4 tokens, band 0 window (W = 5
tokens), band 1 full; one cached prompt of 3 pages whose window pages 1 and 2 are kept
(ids 101, 102) and full pages 11-13.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc import Chain
from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.cache.page_refs import PageRefs
from kvchain.cache.radix import CacheGeometry, Node, PrefixCache
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass

WF = CacheGeometry(4, (WindowPolicy(0, 4, 5), FullPolicy(1, 4)))


def cached(cls: type[PrefixCache] = PrefixCache) -> tuple[Chain, PrefixCache]:
    window = CacheClass(LifetimeClass.WINDOW, 32, 0, 5, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    chain = Chain(plan_layout([window, full], 6_400, 4, null_pages=False))
    cache = cls(WF, interval_tokens=8)
    chain.set_evictor(cache)
    cache.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})
    return chain, cache


def prompt_locked(cache: PrefixCache) -> Node:
    """A prompt lock (full pages only) of the 3-page path, reading window pages 1 and 2."""
    handle = cache.lock(cache.match([1, 2, 3, 9], 16), tails=False)
    assert handle is not None
    cache.pin_window(handle, 0, [1, 2])
    return handle


def test_the_batch_unpin_by_id_equals_the_unpin_by_page_index() -> None:
    # Both pages read: the prompt-locked node offers nothing (tails 2 - 2 = 0). Page 1
    # (id 101) unread: a TAILS unit of 1 window page; then page 2 (id 102): 2 pages.
    _, by_index = cached()
    _, by_id = cached()
    h = prompt_locked(by_index)
    prompt_locked(by_id)
    for page, vid, freed in ((1, 101, 1), (2, 102, 2)):
        by_index.unpin_window(h, 0, [page])
        by_id.unpin_pages(0, np.array([vid]))
        for c in (by_index, by_id):
            assert c.eviction_order().materialize().cumulative == ((0, 0), (freed, 0))
            c.check_order()
        assert by_id.pinned() == by_index.pinned()
    assert by_id.pinned() == ({}, {})


def test_two_readers_of_one_page_drop_it_together_once() -> None:
    # Two prompt locks read page 1 (id 101), one of them page 2 as well: 101 has two
    # references. One batch naming 101 twice drops both; the node's pinned count falls by
    # one page (not two), so its TAILS unit frees exactly 1 window page (id 101).
    _, cache = cached()
    first = prompt_locked(cache)
    second = cache.lock(cache.match([1, 2, 3, 9], 16), tails=False)
    assert second is not None
    cache.pin_window(second, 0, [1])
    assert cache.pinned()[0] == {(0, 101): 2, (0, 102): 1}
    cache.unpin_pages(0, np.array([101, 101]))
    assert cache.pinned()[0] == {(0, 102): 1}
    assert first.pins == [1, 0]
    assert cache.eviction_order().materialize().cumulative == ((0, 0), (1, 0))
    cache.check_order()


def test_a_refused_batch_unpin_changes_nothing() -> None:
    _, cache = cached()
    prompt_locked(cache)
    before = (cache.pinned(), cache.version)
    for bad in ([101, 101],  # read once, named twice
                [999],  # never read
                [101, -1]):  # a tombstone's id
        with pytest.raises(AuditError, match="not pinned"):
            cache.unpin_pages(0, np.array(bad))
        assert (cache.pinned(), cache.version) == before
    with pytest.raises(AuditError, match="not a window band"):
        cache.unpin_pages(1, np.array([11]))
    assert (cache.pinned(), cache.version) == before
    cache.check_order()


def test_unpinning_on_a_hit_locked_path_bumps_no_version() -> None:
    # A hit lock keeps the path's tails: no unit before or after, so no version bump
    # (the chain's epoch, and the quotes priced on it, stay valid).
    _, cache = cached()
    handle = cache.lock(cache.match([1, 2, 3, 9], 16))
    assert handle is not None
    cache.pin_window(handle, 0, [1, 2])
    version = cache.version
    cache.unpin_pages(0, np.array([101, 102]))
    assert cache.version == version and cache.pinned() == ({}, {})
    cache.check_order()


class TotalsForgottenCache(PrefixCache):
    """Planted defect: the batch unpin drops the references and the nodes' pinned counts
    but leaves the eviction order's totals (and the nodes' shares) as they were."""

    def _unread(self, k: int, nodes: list[object]) -> None:  # type: ignore[override]
        for node in nodes:
            assert isinstance(node, Node)
            node.pins[k] -= 1
        self.version += 1


def test_a_batch_unpin_that_forgets_the_order_is_caught_by_check_order() -> None:
    # Sibling of the equality above: with the defect the kept order still says 0 units
    # while the tree walk finds the TAILS unit of the unread pages.
    _, cache = cached(TotalsForgottenCache)
    prompt_locked(cache)
    cache.unpin_pages(0, np.array([101, 102]))
    with pytest.raises(AuditError, match="eviction counters"):
        cache.check_order()


def test_page_refs_grow_and_report_each_page_once() -> None:
    refs = PageRefs(size=2)
    a, b = object(), object()
    assert refs.add([5, 5, 1], [a, a, b]) == [1, 5]  # ids past the size: grown
    assert refs.items() == {1: 1, 5: 2} and len(refs) == 2
    assert refs.drop(np.array([5])) == []  # one reader left
    assert refs.drop([5, 1]) == [a, b]
    assert len(refs) == 0 and refs.of(5) == 0 and refs.of(-1) == 0
    with pytest.raises(AuditError):
        refs.drop([1])
    assert refs.items() == {}
