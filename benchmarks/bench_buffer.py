"""Benchmark of the buffer backends' page copies: GB/s and planning time.

Run: ``.venv/bin/python benchmarks/bench_buffer.py [--repeats N] [--cuda]``. Prints one row
per (case, backend). Fixed seeds; not a test (no timed assertions).

Cases (all on one band of 64 KiB pages, a 1 GiB buffer = 16,384 pages):

- slide: a float band relocated up by 3 pages: 8,192 live pages with every 8th page a gap
  (sources and destinations overlap; acyclic, no spill).
- compact: 4,096 pages from near the frontier into holes nearer the anchor (disjoint).
- rotate: a 4,096-page cycle (worst case: one spill page per cycle).
- naive: the slide done by literal gather-then-scatter (``pages[dst] = pages[src]``: one
  temporary copy of all sources), for comparison.

Bytes per second count page bytes copied once (read + write traffic is twice that).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from kvchain.buffer import NumpyBuffer, TorchBuffer, plan_copy
from kvchain.layout import Anchor, BandLayout
from kvchain.model.layers import CacheClass, CacheDtype, LayerCache, LifetimeClass, TensorDecl

PAGE_BYTES = 64 * 2**10
BUFFER_BYTES = 2**30
NUM_PAGES = BUFFER_BYTES // PAGE_BYTES


def band() -> BandLayout:
    layer = LayerCache(0, LifetimeClass.WINDOW, "gqa",
                       (TensorDecl("k", (1,), CacheDtype.FP8),), window=128)
    return BandLayout(CacheClass.of((layer,)), Anchor.FLOAT, PAGE_BYTES, PAGE_BYTES, 0,
                      NUM_PAGES, 0)


def cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    live = np.arange(8_192 + 1_200)
    live = live[live % 8 != 7][:8_192]
    rng = np.random.default_rng(0)
    holes = np.sort(rng.choice(8_192, 4_096, replace=False))
    movers = np.arange(NUM_PAGES - 4_096, NUM_PAGES)
    ring = np.arange(4_096)
    return {
        "slide": (live, live + 3),
        "compact": (movers, holes),
        "rotate": (ring, np.roll(ring, 1)),
    }


def best_of(repeats: int, fn: Callable[[], None], sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def _no_sync() -> None:
    pass


def _cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="also run TorchBuffer on CUDA")
    args = parser.parse_args()
    b = band()
    backends: dict[str, Callable[[], object]] = {
        "numpy": lambda: NumpyBuffer(BUFFER_BYTES),
        "torch-cpu": lambda: TorchBuffer(BUFFER_BYTES, "cpu"),
    }
    if args.cuda:
        backends["torch-cuda"] = lambda: TorchBuffer(BUFFER_BYTES, "cuda")
    print(f"{'case':<8} {'backend':<11} {'pages':>6} {'spill':>5} {'plan ms':>8} "
          f"{'copy ms':>8} {'GB/s':>6}")
    for name, (src, dst) in cases().items():
        t0 = time.perf_counter()
        plan = plan_copy(src, dst, 1_024)
        plan_ms = (time.perf_counter() - t0) * 1e3
        for backend, make in backends.items():
            buf = make()
            sync = _cuda_sync if backend == "torch-cuda" else _no_sync
            secs = best_of(args.repeats,
                           lambda buf=buf, s=src, d=dst: buf.copy_pages(b, s, d), sync)
            print(f"{name:<8} {backend:<11} {src.size:>6} {plan.spill_pages.size:>5} "
                  f"{plan_ms:>8.2f} {secs * 1e3:>8.1f} {src.size * PAGE_BYTES / secs / 1e9:>6.2f}")
    src, dst = cases()["slide"]
    buf = NumpyBuffer(BUFFER_BYTES)
    pages = buf.array.reshape(NUM_PAGES, PAGE_BYTES)

    def naive() -> None:
        pages[dst] = pages[src]

    secs = best_of(args.repeats, naive, lambda: None)
    print(f"{'naive':<8} {'numpy':<11} {src.size:>6} {'-':>5} {'-':>8} {secs * 1e3:>8.1f} "
          f"{src.size * PAGE_BYTES / secs / 1e9:>6.2f}")


if __name__ == "__main__":
    main()
