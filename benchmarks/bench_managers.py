"""Speed benchmark: one fixed-seed operation stream through every memory manager.

    .venv/bin/python benchmarks/bench_managers.py [--requests 300] [--seed 0]

The stream is a real trace slice (azure-conv, gpt-oss-120b, memory-bound buffer) served by
the same scheduler; wall time is split into microseconds per scheduler step and per
decode token, reported as ratios to kvchain in the same run (timings vary with the
machine; ratios are what to compare).
"""

from __future__ import annotations

import argparse
import time

from kvchain.baselines import ManagerKind
from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.compare import run_manager
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-oss-120b")
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rate-scale", type=float, default=8.0)
    parser.add_argument("--buffer-bytes", type=int, default=1_000_000_000)
    parser.add_argument("--seed", type=int, default=0, help="trace seed (Poisson traces)")
    args = parser.parse_args()
    cfg = SimConfig(load_model(args.model), get_gpu("h200"),
                    load_trace(args.trace, first=args.requests, rate_scale=args.rate_scale,
                               seed=args.seed),
                    buffer_bytes=args.buffer_bytes)
    rows = []
    for kind in ManagerKind:
        t0 = time.perf_counter()
        run = run_manager(cfg, kind)
        wall = time.perf_counter() - t0
        s = run.summary
        decode_tokens = round((s.output_tokens_per_s or 0.0) * s.duration_s)
        rows.append((kind, wall, s.steps, decode_tokens))
    base = rows[0]
    print(f"{args.model} on {args.trace} x{args.requests}, buffer {args.buffer_bytes:,} B")
    print(f"{'manager':12s} {'us/step':>9s} {'x kvchain':>9s} {'us/token':>9s} {'x kvchain':>9s}")
    for kind, wall, steps, tokens in rows:
        per_step = 1e6 * wall / max(steps, 1)
        per_tok = 1e6 * wall / max(tokens, 1)
        b_step = 1e6 * base[1] / max(base[2], 1)
        b_tok = 1e6 * base[1] / max(base[3], 1)
        print(f"{kind!s:12s} {per_step:9.1f} {per_step / b_step:9.2f} {per_tok:9.1f} "
              f"{per_tok / b_tok:9.2f}")


if __name__ == "__main__":
    main()
