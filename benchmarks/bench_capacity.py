"""Capacity benchmark: every memory manager on memory-bound slices of real traces.

Regenerate ``docs/benchmarks.md`` (a few minutes on 2 CPU cores)::

    .venv/bin/python benchmarks/bench_capacity.py --write docs/benchmarks.md

Setup: 5 hybrid models x 3 bundled traces (first ``--requests`` requests, arrivals
x ``--rate-scale`` so requests queue), H200 cost model, default scheduler. The KV buffer is
sized so memory binds: ``B = N x mean bytes a request needs at its end`` (``N =
--concurrency``, bytes by the ideal formula ``(prompt + output) x E_full + min(., W) x
E_win + (. mod C) x E_loc + S``), raised if needed so the longest request of the slice
fits every manager's pages. Same B for every manager.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvchain.baselines import ManagerKind
from kvchain.catalog import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.compare import NeededBytes, compare_managers
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import load_trace

MODELS = ("gpt-oss-120b", "qwen3-next-80b-a3b", "gemma-3-27b", "jamba-v0.1", "llama-4-scout")
TRACES = ("azure-conv", "azure-code", "mooncake")


def buffer_for(model, trace, concurrency: int) -> int:
    """``concurrency`` x the mean ideal bytes of a request at its end, at least 3x the
    largest request's ideal bytes (headroom for page rounding and the equal-page blocks)."""
    needed = NeededBytes.of(model.classes)
    sizes = [needed.of_request(r.prompt_tokens + r.output_tokens, True) for r in trace.requests]
    return max(int(concurrency * sum(sizes) / len(sizes)), 3 * max(sizes))


def run(requests: int, rate_scale: float, concurrency: int) -> list[dict[str, object]]:
    rows = []
    for name in MODELS:
        model = load_model(name)
        for trace_name in TRACES:
            trace = load_trace(trace_name, first=requests, rate_scale=rate_scale)
            buffer = buffer_for(model, trace, concurrency)
            cfg = SimConfig(model, get_gpu("h200"), trace, buffer_bytes=buffer)
            t0 = time.perf_counter()
            runs = compare_managers(cfg)
            secs = time.perf_counter() - t0
            base = runs[ManagerKind.KVCHAIN].summary.output_tokens_per_s or 0.0
            for kind, r in runs.items():
                s = r.summary
                tput = s.output_tokens_per_s or 0.0
                rows.append({
                    "model": name, "trace": trace_name, "manager": str(kind),
                    "buffer_gb": buffer / 1e9, "tput": tput,
                    "kvchain_x": base / tput if tput else float("nan"),
                    "u_star": r.u_star, "eff": r.alloc_efficiency,
                    "ttft_p50": s.ttft.p50_s if s.ttft else None,
                    "tpot_p50": s.tpot.p50_s if s.tpot else None,
                    "retractions": s.retractions, "peak_running": s.peak_running,
                    "finished": s.requests_finished, "rejected": s.requests_rejected,
                })
            print(f"{name:22s} {trace_name:11s} B={buffer / 1e9:6.2f} GB  {secs:5.1f} s",
                  file=sys.stderr)
    return rows


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1000 * x:.1f}"


def markdown(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    out = [
        "# Benchmarks",
        "",
        "## Capacity: memory managers under the same scheduler",
        "",
        "Regenerate: `.venv/bin/python benchmarks/bench_capacity.py --write docs/benchmarks.md`",
        f"(`--requests {args.requests} --rate-scale {args.rate_scale} "
        f"--concurrency {args.concurrency}`).",
        "",
        "Each model x trace: the first requests of the bundled trace, arrivals sped up so "
        "requests queue, H200 roofline cost model, default scheduler (FCFS, chunk 8,192). "
        "KV buffer `B = concurrency x mean ideal bytes of a request at its end` (at least 3x "
        "the largest request), the same for every manager, so memory binds. "
        "`U*` = mean over steps with a non-empty waiting queue of bytes needed / B; "
        "`eff` = bytes needed / bytes held; `kvchain x` = kvchain throughput / this "
        "manager's. Bytes needed = `L x E_full + min(L, W) x E_win + (L mod C) x E_loc + S`.",
        "",
        "Targets: kvchain U* >= 99 %; throughput >= 1.3x fixed pools, >= 1.1x equal-page, "
        ">= 0.98x ideal.",
        "",
        "| model | trace | B (GB) | manager | out tok/s | kvchain x | U* % | eff % | "
        "TTFT p50 ms | TPOT p50 ms | retractions | peak running | finished | rejected |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['trace']} | {r['buffer_gb']:.2f} | {r['manager']} | "
            f"{r['tput']:,.0f} | {r['kvchain_x']:.3f} | {_pct(r['u_star'])} | "
            f"{_pct(r['eff'])} | {_ms(r['ttft_p50'])} | {_ms(r['tpot_p50'])} | "
            f"{r['retractions']} | {r['peak_running']} | {r['finished']} | {r['rejected']} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--rate-scale", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--write", help="write the markdown here (else print it)")
    args = parser.parse_args()
    text = markdown(run(args.requests, args.rate_scale, args.concurrency), args)
    if args.write:
        with open(args.write, "w") as fh:
            fh.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
