"""The pin of a contiguous run of window pages (:meth:`PrefixCache.pin_window` taking
``PrefixCache._run_ids``: one list slice per node of the path) against the page-by-page
reading of the tree, on a seeded stream of prompts that share prefixes (so runs cross
node boundaries), and a planted-defect sibling that skips the run's first node.

Geometry as ``test_page_refs.py``: page P = 4 tokens, band 0 window (W = 5 tokens),
band 1 full. Every prompt offers a window page at every index, id ``1000 * prompt +
index``; a page already cached keeps the cache's id.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.cache.radix import CacheGeometry, Node, PrefixCache
from kvchain.errors import AuditError

WF = CacheGeometry(4, (WindowPolicy(0, 4, 5), FullPolicy(1, 4)))


def by_page(handle: Node, lo: int, hi: int) -> tuple[list[int], list[Node]]:
    """The reference: page by page, the node of the path holding it and its id."""
    vids, nodes = [], []
    for i in range(lo, hi):
        n: Node | None = handle
        while n is not None and not n.start <= i < n.end:
            n = n.parent
        assert n is not None
        vids.append(n.win[0][i - n.start])
        nodes.append(n)
    return vids, nodes


def skips_first_node(handle: Node, k: int, lo: int, hi: int) -> tuple[list[int], list[Node]]:
    """Planted defect: the run as ``_run_ids`` takes it, less the node holding ``lo``."""
    vids, nodes = PrefixCache._run_ids(handle, k, lo, hi)
    keep = [j for j, n in enumerate(nodes) if n is not nodes[0]]
    return [vids[j] for j in keep], [nodes[j] for j in keep]


def mismatches(runs: Callable[[Node, int, int, int], tuple[list[int], list[Node]]],
               seed: int = 7, prompts: int = 40) -> int:
    """Runs (of a seeded stream) where ``runs`` differs from :func:`by_page`."""
    rng = random.Random(seed)
    cache = PrefixCache(WF, interval_tokens=8)
    bad = 0
    for p in range(prompts):
        n = rng.randint(2, 12)
        keys = [rng.randint(1, 3) for _ in range(n)]  # few symbols: shared prefixes
        cache.insert(keys, 0, [10_000 * (p + 1) + i for i in range(n)],
                     {0: {i: 1000 * (p + 1) + i for i in range(n)}}, {})
        path, m = cache._path(keys)
        assert m == n
        handle = path[-1][0]
        if handle.end != n:
            continue
        lo = rng.randrange(n)
        hi = rng.randint(lo + 1, n)
        if runs(handle, 0, lo, hi) != by_page(handle, lo, hi):
            bad += 1
    return bad


def test_the_run_of_a_path_equals_the_page_by_page_reading() -> None:
    assert mismatches(PrefixCache._run_ids) == 0


def test_a_run_that_skips_its_first_node_is_caught() -> None:
    assert mismatches(skips_first_node) > 0


def test_pin_window_of_a_range_pins_what_page_by_page_pins_would() -> None:
    # prompt [1, 2, 3] then [1, 2, 4]: the path of the second splits after page 2, so
    # pages [1, 3) of its handle lie in two nodes (ids 1001 of the first prompt, 2002)
    cache, ref = PrefixCache(WF, interval_tokens=8), PrefixCache(WF, interval_tokens=8)
    for c in (cache, ref):
        c.insert([1, 2, 3], 0, [11, 12, 13], {0: {0: 1000, 1: 1001, 2: 1002}}, {})
        c.insert([1, 2, 4], 0, [21, 22, 23], {0: {0: 2000, 1: 2001, 2: 2002}}, {})
    handles = [c.lock(c.match([1, 2, 4, 9], 16), tails=False) for c in (cache, ref)]
    assert all(h is not None and h.end == 3 for h in handles)
    cache.pin_window(handles[0], 0, range(1, 3))
    for i in (2, 1):  # not ascending: page by page
        ref.pin_window(handles[1], 0, iter([i]))
    assert cache.pinned() == ref.pinned() == ({(0, 1001): 1, (0, 2002): 1}, {})
    cache.check_order()


def test_a_run_with_an_absent_page_pins_nothing() -> None:
    cache = PrefixCache(WF, interval_tokens=8)
    cache.insert([1, 2, 3], 0, [11, 12, 13], {0: {1: 101, 2: 102}}, {})  # page 0 absent
    handle = cache.lock(cache.match([1, 2, 3, 9], 16), tails=False)
    assert handle is not None
    with pytest.raises(AuditError, match="pin of window page 0"):
        cache.pin_window(handle, 0, range(0, 3))
    assert cache.pinned() == ({}, {})
