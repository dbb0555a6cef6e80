"""Block-aligned prompts and their resend point: what the prefix cache's figures do on
memory-bound slices (docs/benchmarks-history.md, "Block-aligned prompts and their resend point
(round 10)").

Setup: ``benchmarks/bench_capacity.py``'s (first ``--requests`` requests, arrivals x
``--rate-scale``, the buffer ``buffer_for`` sizes so memory binds, H200 cost model, default
scheduler), kvchain only, prefix cache on (the Mooncake trace carries content keys).
Prints one line per model/trace: prompts that are block-aligned (``L mod 16 = 0``), hit
rate, hit tokens, TTFT p50, steps, pages copied, state checkpoints saved. With
``--resend-after S`` every request is sent again, identical, ``S`` seconds after its
arrival (a retry or a regenerate): the case a block-aligned prompt's resend point serves;
``--aligned-only`` keeps only the slice's block-aligned prompts (their resends then hit
as deep as the cache allows, nothing else competing).
Run it on two trees to compare them, e.g.::

    PYTHONPATH=/path/to/old/src python benchmarks/bench_aligned_resend.py
    python benchmarks/bench_aligned_resend.py
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from bench_capacity import buffer_for

import kvchain
from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, load_trace

PAIRS = ("gpt-oss-120b:mooncake", "qwen3-next-80b-a3b:mooncake", "jamba-v0.1:mooncake",
         "jet-nemotron-2b:mooncake", "gemma-3-27b:mooncake")


def with_resends(trace: Trace, after_s: float) -> Trace:
    """``trace`` with every request sent again, identical (same prompt, block ids and
    output), ``after_s`` seconds after its arrival; the copies get ids past the last."""
    n = max(r.request_id for r in trace.requests) + 1
    both = [*trace.requests, *(replace(r, request_id=r.request_id + n,
                                       arrival_s=r.arrival_s + after_s)
                               for r in trace.requests)]
    both.sort(key=lambda r: r.arrival_s)
    return Trace(f"{trace.name}+resends", tuple(both), trace.source, trace.license,
                 block_tokens=trace.block_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--rate-scale", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--pairs", default=",".join(PAIRS), help="model:trace,...")
    parser.add_argument("--resend-after", type=float, default=None,
                        help="send every request again this many seconds later")
    parser.add_argument("--aligned-only", action="store_true",
                        help="keep only the block-aligned prompts of the slice")
    args = parser.parse_args()
    print(f"# kvchain from {kvchain.__file__}", file=sys.stderr)
    print("| model / trace | aligned prompts | hit rate (%) | hit tokens | TTFT p50 (ms) | "
          "steps | pages copied | checkpoints saved |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for pair in args.pairs.split(","):
        name, trace_name = pair.split(":")
        model = load_model(name)
        trace = load_trace(trace_name, first=args.requests, rate_scale=args.rate_scale)
        if args.aligned_only:
            trace = Trace(f"{trace.name}-aligned", tuple(
                r for r in trace.requests if r.prompt_tokens % 16 == 0), trace.source,
                trace.license, block_tokens=trace.block_tokens)
        if args.resend_after is not None:
            trace = with_resends(trace, args.resend_after)
        aligned = sum(1 for r in trace.requests if r.prompt_tokens % 16 == 0)
        cfg = SimConfig(model, get_gpu("h200"), trace,
                        buffer_bytes=buffer_for(model, trace, args.concurrency))
        r = simulate(cfg)
        s, pc = r.summary, r.prefix_cache
        assert pc is not None
        rate = 100 * pc.hit_tokens / pc.prompt_tokens if pc.prompt_tokens else 0.0
        ttft = 1000 * s.ttft.p50_s if s.ttft else float("nan")
        print(f"| {name} / {trace_name} | {aligned} / {len(trace.requests)} | {rate:.2f} | "
              f"{pc.hit_tokens:,} | {ttft:,.1f} | {s.steps:,} | "
              f"{r.chain_stats.pages_copied:,} | {pc.checkpoints_saved:,} |", flush=True)


if __name__ == "__main__":
    main()
