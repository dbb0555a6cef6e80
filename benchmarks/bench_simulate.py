"""Simulator speed: the full Azure 2023 conversation trace (19,366 requests) for
gpt-oss-120b on one H200, as ``kvchain simulate`` runs it by default.

Run: ``python benchmarks/bench_simulate.py [--profile] [--requests N]``. Prints wall time,
steps, steps per second and requests per second; ``--profile`` adds the top functions by
cumulative time (cProfile). Target: the whole trace in <= 60 s of wall time on one core.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from rich.console import Console
from rich.table import Table

from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    config = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                       load_trace("azure-conv", first=args.requests))
    profiler = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = simulate(config)
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - started
    s = result.summary
    table = Table(title="kvchain simulate: gpt-oss-120b / H200 / azure-conv")
    for col in ("requests", "steps", "simulated s", "wall s", "steps/s", "requests/s"):
        table.add_column(col, justify="right")
    table.add_row(f"{s.requests_finished:,}", f"{s.steps:,}", f"{s.duration_s:,.1f}",
                  f"{wall:,.1f}", f"{s.steps / wall:,.0f}", f"{s.requests_finished / wall:,.0f}")
    Console().print(table)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
