"""Reservation policies side by side: the retraction-storm case and the capacity slices.

Run (a few minutes on 2 CPU cores)::

    python benchmarks/bench_reserve.py            # prints the markdown table
    python benchmarks/bench_reserve.py --storm-requests 100   # a quicker storm

Cases:

* storm: gemma-3-27b on one H200, a 20 GB KV buffer, N requests of (500 prompt, 2,000
  output) tokens all arriving at t = 0 (outputs run to their limit, as in RL rollouts and
  fixed-length benchmarks).
* slices: the kvchain rows of ``docs/benchmarks.md``'s capacity table for azure-conv and
  mooncake (first 150 requests, arrivals x8, buffer = 12 x the mean ideal request bytes;
  :func:`bench_capacity.buffer_for`).

Every case runs under ``sglang``, ``adaptive`` and ``full``; columns: retractions,
recomputed tokens, steps, output throughput, TTFT p50/p99, and steps / throughput as a
ratio to ``sglang`` in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sched.admission import ReserveConfig, ReservePolicy
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest, load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capacity import MODELS, buffer_for

POLICIES = (ReservePolicy.SGLANG, ReservePolicy.ADAPTIVE, ReservePolicy.FULL)
SLICE_TRACES = ("azure-conv", "mooncake")


def storm_trace(requests: int, prompt: int = 500, output: int = 2_000) -> Trace:
    """``requests`` identical (prompt, output) requests arriving at t = 0."""
    return Trace("storm", tuple(TraceRequest(i, 0.0, prompt, output) for i in range(requests)),
                 "synthetic: identical requests at t = 0", "none (generated)")


def run(cfg: SimConfig, policy: ReservePolicy) -> dict[str, float]:
    """One simulation under ``policy``: the table's numbers."""
    cfg = SimConfig(cfg.model, cfg.gpu, cfg.trace, buffer_bytes=cfg.buffer_bytes,
                    scheduler=SchedulerConfig(reserve=ReserveConfig(policy)))
    s = simulate(cfg).summary
    assert s.ttft is not None
    return {"retractions": s.retractions,
            "recomputed": float(s.extra.get("recomputed_tokens", 0)),
            "steps": s.steps, "tput": s.output_tokens_per_s or 0.0,
            "ttft50": 1e3 * s.ttft.p50_s, "ttft99": 1e3 * s.ttft.p99_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storm-requests", type=int, default=400)
    parser.add_argument("--slice-requests", type=int, default=150)
    parser.add_argument("--rate-scale", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=12)
    args = parser.parse_args()
    h200 = get_gpu("h200")
    cases = [(f"gemma-3-27b / storm x{args.storm_requests}",
              SimConfig(load_model("gemma-3-27b"), h200, storm_trace(args.storm_requests),
                        buffer_bytes=20_000_000_000))]
    for name in MODELS:
        model = load_model(name)
        for trace_name in SLICE_TRACES:
            trace = load_trace(trace_name, first=args.slice_requests,
                               rate_scale=args.rate_scale)
            cases.append((f"{name} / {trace_name}",
                          SimConfig(model, h200, trace,
                                    buffer_bytes=buffer_for(model, trace, args.concurrency))))
    print("| case | policy | retractions | recomputed tokens | steps | steps x sglang | "
          "out tok/s | tok/s x sglang | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, cfg in cases:
        rows = {p: run(cfg, p) for p in POLICIES}
        base = rows[ReservePolicy.SGLANG]
        for p, r in rows.items():
            print(f"| {label} | {p.value} | {r['retractions']:,.0f} | {r['recomputed']:,.0f} | "
                  f"{r['steps']:,.0f} | {r['steps'] / base['steps']:.4f} | {r['tput']:,.1f} | "
                  f"{r['tput'] / base['tput']:.4f} | {r['ttft50']:,.1f} | "
                  f"{r['ttft99']:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
