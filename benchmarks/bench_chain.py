"""Benchmark of the chain allocator's executor: microseconds per operation.

Run: ``.venv/bin/python benchmarks/bench_chain.py [--repeats N]``. Prints one table row
per (operation, backend, chain shape). Fixed seeds; not a test (no timed assertions).

Operations:

- decode take: one Demand for a batch of 256 decoding requests (typical: 16 full + 16
  window new pages for the batch; worst case: 256 + 256, every request crossing a page
  boundary), on a half-full chain with holes; timed: ``Chain.take`` (price + plan + apply).
- prefill take: 8,192 tokens at 16 tokens/page: 512 full pages + 10 window pages
  (``ceil((128 - 1 + 8,192) / 16) + 1 = 521`` pages bound the window for W = 128, but the
  window band only keeps the last ``ceil(127 / 16) + 1 = 9`` pages plus the current one).
- release: 256 full pages.
- compaction: ``flush_idle`` moving 10,000 pages of a LOW END into 10,000 holes.

Target on the development machine: decode take for 256 requests <= 500 us.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from kvchain.alloc import Chain, Demand
from kvchain.buffer import NullBuffer, NumpyBuffer
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass

PAGE_TOKENS = 16
BYTES_PER_TOKEN = 64  # small pages: 1 KiB per page
BUFFER_BYTES = 128 * 2**20  # 131,072 pages of 1 KiB per band grid


def layout_for(shape: str) -> ChainLayout:
    full = CacheClass(LifetimeClass.FULL, BYTES_PER_TOKEN, 0, None, ())
    window = CacheClass(LifetimeClass.WINDOW, BYTES_PER_TOKEN, 0, 128, ())
    state = CacheClass(LifetimeClass.STATE, 0, 64 * 1024, None, ())
    classes = [window, full] if shape == "window|full" else [state, window, full]
    return plan_layout(classes, BUFFER_BYTES, PAGE_TOKENS)


def make_buffer(kind: str) -> NumpyBuffer | NullBuffer:
    return NumpyBuffer(BUFFER_BYTES) if kind == "numpy" else NullBuffer(BUFFER_BYTES)


def busy_chain(shape: str, kind: str, seed: int = 0) -> Chain:
    """A chain about half full, with a quarter of its token pages released as holes."""
    rng = np.random.default_rng(seed)
    chain = Chain(layout_for(shape), make_buffer(kind))
    bands = chain.layout.bands
    per_band = []
    for b in bands:
        if b.lifetime is LifetimeClass.STATE:
            per_band.append(64)
        elif b.lifetime is LifetimeClass.WINDOW:
            per_band.append(8_000)
        else:
            per_band.append(40_000)
    grant = chain.take(Demand(tuple(per_band)))
    for i, vids in enumerate(grant.pages):
        if bands[i].lifetime is not LifetimeClass.STATE:
            gone = rng.choice(np.array(vids), size=len(vids) // 4, replace=False)
            chain.release(i, gone)
    return chain


def demand_of(chain: Chain, full: int, window: int) -> Demand:
    pages = []
    for b in chain.layout.bands:
        pages.append({LifetimeClass.FULL: full, LifetimeClass.WINDOW: window}.get(
            b.lifetime, 0))
    return Demand(tuple(pages))


def time_take_release(chain: Chain, demand: Demand, repeats: int,
                      extend: bool = False) -> tuple[float, float]:
    """Mean microseconds of take and of releasing what it took (the chain returns to a
    state with the same counts each round). ``extend``: compact all holes before each
    take (untimed), so the take grows the frontiers instead of filling holes."""
    take_s = release_s = 0.0
    for _ in range(repeats):
        if extend:
            chain.flush_idle()
        t0 = time.perf_counter()
        grant = chain.take(demand)
        t1 = time.perf_counter()
        for i, vids in enumerate(grant.pages):
            if vids:
                chain.release(i, vids)
        t2 = time.perf_counter()
        take_s += t1 - t0
        release_s += t2 - t1
    return take_s / repeats * 1e6, release_s / repeats * 1e6


def time_release(chain: Chain, repeats: int) -> float:
    band = chain.layout.index_of(LifetimeClass.FULL)
    assert band is not None
    total = 0.0
    demand = demand_of(chain, 256, 0)
    for _ in range(repeats):
        vids = chain.take(demand).pages[band]
        t0 = time.perf_counter()
        chain.release(band, vids)
        total += time.perf_counter() - t0
    return total / repeats * 1e6


def time_compaction(kind: str, repeats: int) -> tuple[float, int]:
    """flush_idle on a LOW END whose 10,000 lowest pages are holes and whose top 10,000
    slots are live: exactly 10,000 pages copied."""
    layout = plan_layout([CacheClass(LifetimeClass.FULL, BYTES_PER_TOKEN, 0, None, ())],
                         BUFFER_BYTES, PAGE_TOKENS)
    total, copied = 0.0, 0
    for _ in range(repeats):
        chain = Chain(layout, make_buffer(kind))
        vids = chain.take(Demand((20_000,))).pages[0]
        chain.release(0, vids[:10_000])
        t0 = time.perf_counter()
        copied = chain.flush_idle()
        total += time.perf_counter() - t0
    return total / repeats * 1e6, copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rows: list[tuple[str, str, str, float]] = []

    def add(op: str, kind: str, shape: str, fn: Callable[[], float]) -> None:
        rows.append((op, kind, shape, fn()))

    for kind in ("numpy", "null"):
        for shape in ("window|full", "state|window|full"):
            chain = busy_chain(shape, kind)
            for label, full, window, extend in (
                    ("decode take 256 req (16+16 pages), holes", 16, 16, False),
                    ("decode take 256 req (256+256 pages), holes", 256, 256, False),
                    ("decode take 256 req (256+256 pages), extend", 256, 256, True),
                    ("prefill take 8,192 tokens (512+10), holes", 512, 10, False),
                    ("prefill take 8,192 tokens (512+10), extend", 512, 10, True)):
                take_us, _ = time_take_release(chain, demand_of(chain, full, window),
                                               args.repeats, extend)
                rows.append((label, kind, shape, take_us))
            chain = busy_chain(shape, kind)
            add("release 256 pages", kind, shape, lambda c=chain: time_release(c, args.repeats))
            chain.audit()
        us, copied = time_compaction(kind, max(3, args.repeats // 20))
        rows.append((f"compaction ({copied:,} pages copied)", kind, "full", us))

    width = max(len(r[0]) for r in rows)
    print(f"{'operation':<{width}}  {'buffer':<6}  {'chain':<17}  {'us/op':>10}")
    print("-" * (width + 40))
    for op, kind, shape, us in rows:
        print(f"{op:<{width}}  {kind:<6}  {shape:<17}  {us:>10.1f}")


if __name__ == "__main__":
    main()
