"""Prefix-cache speed: ``take`` that evicts, per evicted page, against ``release`` per page
(both measured in this run on the same chain shape), and the eviction-order rebuild.

Run: ``python benchmarks/bench_prefix_cache.py``. A window|full chain (sliding window
128 tokens, pages of 16 tokens) is filled with cached prompts (a radix tree of
``PROMPTS`` prompts sharing system prompts, every 512 tokens a resume point) until no
byte is free; then

* ``take`` of a demand that fits only after evicting: microseconds per evicted page
  (the planner's binary search, the cache's ``evict``, the chain's release and the
  snapshot check included);
* ``release``: the same number of pages released the way a finished request does (one
  call per band per request of 64 pages): microseconds per page;
* ``eviction_order``: milliseconds to rebuild the published order after a version change.

Target (issue 12): take-with-eviction per evicted page at least as fast as release per
page.
"""

from __future__ import annotations

import random
import time

from rich.console import Console
from rich.table import Table

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache, resume_points, tail_pages
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass

PAGE = 16
PROMPTS = 400
ROUNDS = 5


def filled(seed: int = 0) -> tuple[Chain, PrefixCache]:
    """A chain whose buffer is all cached pages (no free byte)."""
    classes = [declared_class(LifetimeClass.WINDOW, 1_000, 128),
               declared_class(LifetimeClass.FULL, 1_000)]
    layout = plan_layout(classes, 400_000_000, PAGE)
    chain = Chain(layout)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=512)
    chain.set_evictor(cache)
    g = cache.geom
    rng = random.Random(seed)
    systems = [[rng.randrange(1 << 30) for _ in range(1024)] for _ in range(8)]
    for _ in range(PROMPTS):
        tokens = rng.choice(systems) + [rng.randrange(1 << 30) for _ in range(rng.randint(
            16, 3000))]
        keys = page_keys_from_tokens(tokens, PAGE)
        n = len(keys)
        tails = sorted({i for q in resume_points(g, n, cache.interval_pages, cache.policy,
                                                    len(tokens))
                        for i in tail_pages(g, q)[g.window]})  # type: ignore[index]
        demand = [0, 0]
        demand[g.full] = n  # type: ignore[index]
        demand[g.window] = len(tails)  # type: ignore[index]
        try:
            grant = chain.take(Demand(tuple(demand)))
        except Exception:
            break
        full = list(grant.pages[g.full])  # type: ignore[index]
        win = dict(zip(tails, grant.pages[g.window], strict=True))  # type: ignore[index]
        dups = cache.insert(keys, 0, full, {g.window: win}, {})  # type: ignore[dict-item]
        for band, ids in enumerate(dups):
            if ids:
                chain.release(band, ids)
    return chain, cache


def main() -> None:
    table = Table(title="prefix cache: take with eviction vs release (best of 5)")
    for col in ("operation", "pages", "us per page", "ratio to release"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    best_take = best_release = best_order = float("inf")
    pages = 0
    units = 0
    for r in range(ROUNDS):
        chain, cache = filled(r)
        snap = chain.snapshot()
        units = snap.evictable.units
        g = cache.geom
        demand = [0, 0]
        # Enough full pages to need a few hundred units' worth of eviction.
        want = snap.evictable.freed(snap.evictable.units)[g.full] // 4  # type: ignore[index]
        demand[g.full] = want  # type: ignore[index]
        t0 = time.perf_counter()
        chain.take(Demand(tuple(demand)))
        dt = time.perf_counter() - t0
        evicted = chain.stats.pages_evicted
        best_take = min(best_take, dt / evicted)
        pages = evicted
        # Release as many pages the way finished requests do: 64 pages per call.
        chain2, cache2 = filled(r)
        held = [v for nd in cache2.nodes() for v in nd.full[0]][:evicted]
        chain2.set_evictor(None)
        t0 = time.perf_counter()
        for i in range(0, len(held), 64):
            chain2.release(g.full, held[i:i + 64])  # type: ignore[arg-type]
        best_release = min(best_release, (time.perf_counter() - t0) / max(1, len(held)))
        cache._bump()
        t0 = time.perf_counter()
        cache.eviction_order()
        best_order = min(best_order, time.perf_counter() - t0)
    table.add_row("take with eviction", f"{pages:,}", f"{best_take * 1e6:.2f}",
                  f"{best_take / best_release:.2f}x")
    table.add_row("release (64 pages a call)", f"{pages:,}", f"{best_release * 1e6:.2f}",
                  "1.00x")
    Console().print(table)
    Console().print(f"eviction order rebuild: {best_order * 1e3:.2f} ms for {units:,} units")


if __name__ == "__main__":
    main()
