"""Dead cached pages on a state hybrid (docs/benchmarks-history.md, "Spaced checkpoints and
eviction that keeps what can hit (round 4)").

A cached full-attention page is *dead* when no checkpoint lies at or below it on its path:
no hit can resume past it, so it can never be reused while it stays
(:meth:`kvchain.cache.radix.PrefixCache.dead_full_pages`). This runs the first ``N``
Mooncake requests on qwen3-next-80b-a3b (H200 cost model, default settings) in a buffer
of ``B`` bytes and samples the dead fraction of the cached full pages (all, and those no
running request locks) each time a request finishes; it prints the samples' min /
median / mean / max, and around every eviction (from the first finish on) counts the
live unlocked full pages evicted while dead ones stayed cached; and the hit rate. Run from the
worktree root (about a minute on 2 CPU cores)::

    .venv/bin/python benchmarks/bench_dead_pages.py [N] [B] [cache-points]

Defaults: 300 requests, 6,000,000,000 B, ``auto``. On a tree whose cache has no
``dead_full_pages`` (the baseline), the measurement is taken from this tree's
``src/kvchain/cache/radix.py`` (it reads only the tree's nodes).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from kvchain.alloc.chain import Chain
from kvchain.cache.radix import PrefixCache, ResumePolicy
from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace


def measure() -> None:
    """Give the loaded ``PrefixCache`` this tree's measurement where it lacks it."""
    if hasattr(PrefixCache, "dead_full_page_ids"):
        return
    path = Path(__file__).resolve().parents[1] / "src" / "kvchain" / "cache" / "radix.py"
    spec = importlib.util.spec_from_file_location("radix_measure", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["radix_measure"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    for name in ("_dead_full", "dead_full_pages", "dead_full_page_ids"):
        setattr(PrefixCache, name, getattr(module.PrefixCache, name))


def main(n: int = 300, buffer_bytes: int = 6_000_000_000, points: str = "auto") -> None:
    measure()
    config = SimConfig(load_model("qwen3-next-80b-a3b"), get_gpu("h200"),
                       load_trace("mooncake", first=n), buffer_bytes=buffer_bytes,
                       cache_points=ResumePolicy(points))
    chain = Chain(config.layout())
    samples: dict[bool, list[float]] = {False: [], True: []}
    live_lost = [0, 0]  # live unlocked full pages evicted while dead ones stayed; evicted

    def wrap(cache: PrefixCache) -> None:  # measure around every eviction of the run
        evict = cache.evict

        def measured(units: int):  # type: ignore[no-untyped-def]
            dead = set(cache.dead_full_page_ids(True))
            freed = evict(units)
            assert cache.geom.full is not None
            gone = set(freed[cache.geom.full].tolist())
            live_lost[0] += min(len(gone - dead), len(dead - gone))
            live_lost[1] += len(gone)
            return freed

        cache.evict = measured  # type: ignore[method-assign]

    def sample(done: int, total: int) -> None:
        cache = chain.evictor
        if not isinstance(cache, PrefixCache):
            return
        if "evict" not in vars(cache):
            wrap(cache)
        for unlocked in (False, True):
            dead, cached = cache.dead_full_pages(unlocked)
            if cached:
                samples[unlocked].append(dead / cached)

    result = simulate(config, allocator=chain, progress=sample)
    s, e = result.summary, result.summary.extra
    print(f"qwen3-next-80b-a3b, mooncake {n}, {buffer_bytes:,} B, cache points {points}:")
    for unlocked, name in ((False, "all cached"), (True, "unlocked (evictable)")):
        fr = np.asarray(samples[unlocked]) * 100
        print(f"  dead fraction of {name} full pages at each finish: min {fr.min():.1f} %, "
              f"median {np.median(fr):.1f} %, mean {fr.mean():.1f} %, max {fr.max():.1f} % "
              f"({len(fr)} samples)")
    print(f"  full pages evicted (after the first finish): {live_lost[1]:,}; of them live "
          f"while dead ones stayed cached: {live_lost[0]:,}")
    print(f"  hit "
          f"{e['prefix_hit_rate_pct']:.2f} %, steps {s.steps:,}, TTFT p50 "
          f"{s.ttft.p50_s:.2f} s; unallocatable {s.admitted_but_unallocatable}, leaked "
          f"{s.leaked_pages}, finished {s.requests_finished}/{s.requests_total}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 300, int(args[1]) if len(args) > 1 else 6_000_000_000,
         args[2] if len(args) > 2 else "auto")
