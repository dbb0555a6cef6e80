"""Partial prefix-cache hits against ordinary ones (docs/benchmarks.md, "Partial hits
(round 7)"): the same run with and without ``--partial-hits`` on qwen3-next-80b-a3b (H200
cost model), counting the pages (state slots for the state band) the chain binds per band
over the run (every take; a partial hit's gap pages are the cache's, so they are never
taken) beside the run's own figures.

Two workloads:

* ``shared``: 8 requests of 6,000 shared + 2,000 own tokens, 10 s apart (each runs
  alone), 1,000-token content blocks (so the shared part is 6 whole blocks and the
  resume-point interval is 1,008 tokens, 63 pages), 16 GiB;
* ``mooncake``: the first ``N`` Mooncake conversation requests (default 600), 16 GiB.

Run from the worktree root (``shared`` about 2 s, ``mooncake`` about 10-15 s per run on 2
CPU cores)::

    .venv/bin/python benchmarks/bench_partial_hits.py shared
    .venv/bin/python benchmarks/bench_partial_hits.py mooncake [N] [BUFFER_BYTES] [lru]

``lru`` runs the cache's eviction without its dead-leaves-first rule (the plain LRU order,
as the planted ``LruOnlyCache`` of ``tests/cache/test_seeded_cache_runs.py``): whether that
rule is what limits partial hits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import CopyPages, Demand, Quote
from kvchain.cache.radix import PrefixCache
from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest, load_trace


class CountingChain(Chain):
    """A chain that counts the pages it binds per band (observes; decides nothing)."""

    def __init__(self, layout: Any) -> None:
        self.taken = [0] * len(layout.bands)
        super().__init__(layout)
        self.taken = [0] * len(layout.bands)  # not the null pages reserved at start

    def take(self, demand: Demand, quote: Quote | None = None,
             copies: Sequence[CopyPages] = ()) -> Any:
        grant = super().take(demand, quote, copies)
        for b, n in enumerate(demand.pages):
            self.taken[b] += n
        return grant


def shared_trace() -> Trace:
    """8 x (6 shared + 2 own blocks of 1,000 tokens), 10 s apart, 2 output tokens."""
    reqs = tuple(TraceRequest(i, 10.0 * i, 8000, 2, (*range(6), 100 + 2 * i, 101 + 2 * i))
                 for i in range(8))
    return Trace("shared-system-prompt", reqs, "hand-made", "n/a", block_tokens=1000)


def run(trace: Trace, buffer: int, partial: bool) -> dict[str, Any]:
    config = SimConfig(load_model("qwen3-next-80b-a3b"), get_gpu("h200"), trace,
                       buffer_bytes=buffer,
                       scheduler=replace(SchedulerConfig(strict=False),
                                         partial_hits=partial))
    chain = CountingChain(config.layout())
    result = simulate(config, allocator=chain)
    s, pc = result.summary, result.prefix_cache
    assert pc is not None
    return {"hit rate %": round(100 * pc.hit_rate, 2), "hit tokens": pc.hit_tokens,
            "partial hits": pc.partial_hits, "partial tokens": pc.partial_tokens,
            "pages taken": dict(zip((b.label for b in chain.layout.bands), chain.taken,
                                    strict=True)),
            "evicted": dict(pc.evicted_pages), "steps": s.steps,
            "ttft p50 s": round(s.ttft.p50_s, 4) if s.ttft else None,
            "ttft p90 s": round(s.ttft.p90_s, 4) if s.ttft else None,
            **({"ttft per request ms": [round(1000 * r.ttft_s, 1)
                                        for r in result.recorder.records
                                        if r.ttft_s is not None]}
               if len(trace.requests) <= 8 else {}),
            "unallocatable": s.admitted_but_unallocatable, "leaked": s.leaked_pages}


def main(which: str = "shared", n: int = 600, buffer: int = 17_179_869_184,
         order: str = "dead-first") -> None:
    trace = shared_trace() if which == "shared" else load_trace("mooncake", first=n)
    if order == "lru":  # the cache's eviction order without dead leaves first (a probe)
        PrefixCache._dead = lambda self, node, tails_gone: False  # type: ignore[method-assign]
        PrefixCache._dies = lambda self, node, joined: False  # type: ignore[method-assign]
    for partial in (False, True):
        print(f"{which} partial_hits={partial}: {run(trace, buffer, partial)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(args[:1]), *(int(a) for a in args[1:3]), *(args[3:4]))  # type: ignore[arg-type]
