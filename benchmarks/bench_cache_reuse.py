"""Prefix-cache reuse benchmark (docs/benchmarks.md, "Prefix cache reuse (round 4)").

Run from the worktree root (about a minute on 2 CPU cores)::

    .venv/bin/python benchmarks/bench_cache_reuse.py

Two parts, H200 cost model, page 16 tokens, default scheduler unless said:

1. **Shared system prompt** (junction checkpoints): 8 requests of 6,000 shared + 2,000 own
   tokens (one content id per 16 tokens), 40 GiB, arrivals 100 s apart (each alone) or
   all at 0 s; default cache settings. Limit: 7 x 6,000 of 64,000 prompt tokens = 65.63 %.
2. **Warm/cold interleaved trace** (``kvchain.sim.prefix.warm_cold_trace``: even requests
   one of 8 shared 8,192-token documents + a 256-token query, odd ones a cold 8,192-token
   prompt; Poisson arrivals at 16/s; 400 requests): FCFS against ``cache-aware``; prefill
   tokens computed = prompt tokens - hit tokens + tokens recomputed after retractions, and
   the cold requests' TTFT p99.
"""

from __future__ import annotations

import numpy as np

from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sched.queue import QueuePolicy
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, SimResult, simulate
from kvchain.sim.prefix import warm_cold_trace
from kvchain.sim.traces import Trace, TraceRequest

BLOCK = 16


def shared_prompt_trace(gap_s: float) -> Trace:
    """8 x (6,000 shared + 2,000 own) tokens, one content id per 16 tokens."""
    reqs = []
    for i in range(8):
        ids = tuple(range(1, 6000 // BLOCK + 1)) + tuple(
            10_000 * (i + 1) + k for k in range(2000 // BLOCK))
        reqs.append(TraceRequest(i, i * gap_s, 8000, 4, prefix_block_ids=ids))
    return Trace("shared-prompt", tuple(reqs), "generated", "-", block_tokens=BLOCK)


def exact(result: SimResult) -> str:
    s = result.summary
    return (f"unallocatable {s.admitted_but_unallocatable}, leaked {s.leaked_pages}, "
            f"finished {s.requests_finished}/{s.requests_total}")


def part1() -> None:
    print("## shared system prompt: 8 x (6,000 shared + 2,000 own), 40 GiB")
    for model in ("qwen3-next-80b-a3b", "jet-nemotron-2b", "gpt-oss-120b"):
        for gap in (100.0, 0.0):
            r = simulate(SimConfig(load_model(model), get_gpu("h200"), shared_prompt_trace(gap),
                                   buffer_bytes=40 << 30))
            e = r.summary.extra
            print(f"{model:20} gap {gap:5.0f} s: hit {e['prefix_hit_rate_pct']:6.2f} % "
                  f"({e['prefix_hit_tokens']:,} tokens); {exact(r)}")


def part2(model: str, gib: float) -> None:
    print(f"## warm/cold, {model}, {gib} GiB, 400 requests at 16/s")
    trace = warm_cold_trace(400, rate_per_s=16.0)
    for policy in (QueuePolicy.FCFS, QueuePolicy.CACHE_AWARE):
        r = simulate(SimConfig(load_model(model), get_gpu("h200"), trace,
                               buffer_bytes=int(gib * (1 << 30)),
                               scheduler=SchedulerConfig(policy=policy, strict=False)))
        pc = r.prefix_cache
        assert pc is not None
        computed = pc.prompt_tokens - pc.hit_tokens + int(r.summary.extra["recomputed_tokens"])
        cold = [x.first_token_s - x.arrival_s for x in r.recorder.records
                if x.request_id % 2 and x.first_token_s is not None]
        print(f"{policy.value:12}: computed {computed:,}, hit {100 * pc.hit_rate:.2f} %, "
              f"cold TTFT p99 {np.percentile(cold, 99):.2f} s, all TTFT p99 "
              f"{r.summary.ttft.p99_s:.2f} s, steps {r.summary.steps:,}; {exact(r)}")


if __name__ == "__main__":
    part1()
    part2("qwen3-next-80b-a3b", 5)
    part2("gpt-oss-120b", 7)
    part2("gpt-oss-120b", 9)
