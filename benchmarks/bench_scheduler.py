"""Scheduler step overhead: admission + allocation + release per step, per chain shape.

Run: ``python benchmarks/bench_scheduler.py``. For each chain shape (classes declared by
bytes, bookkeeping-only chain), ``N`` requests run (N = 256 and 1,024; ``max_running = N``)
and 1,000 more wait; each timed step is ``schedule + allocate + complete`` (decode for every
running request, window-tail release, admission walk over the waiting queue). Prints
microseconds per step and per running request (median of the timed steps). Absolute times
on a shared machine are noise; compare shapes within one run.
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console
from rich.table import Table

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

SHAPES = {
    "full": [declared_class(LC.FULL, 36_864)],
    "window|full": [declared_class(LC.WINDOW, 36_864, 128), declared_class(LC.FULL, 36_864)],
    "state|full": [declared_class(LC.STATE, 39_518_208), declared_class(LC.FULL, 24_576)],
    "state|window|full": [declared_class(LC.STATE, 14_745_600),
                          declared_class(LC.WINDOW, 2_048, 1_152), declared_class(LC.FULL, 2_048)],
}


def bench(classes, running: int, waiting: int = 1_000, steps: int = 40) -> list[float]:
    layout = plan_layout(classes, 400_000_000_000, 16)
    sched = Scheduler(KVManager(Chain(layout)),
                      SchedulerConfig(max_running=running, max_prefill_tokens=1 << 20,
                                      chunk_size=4096))
    for i in range(running + waiting):
        sched.add(Request(i, 1_000 + (i * 37) % 900, 4_000, 0.0), 0.0)
    now = 0.0
    while len(sched.running) < running:  # admit (and prefill) the running set
        batch = sched.step(now)
        now += 0.01
        sched.complete(batch, StepOutcome(0.01), now)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = sched.step(now)
        now += 0.01
        sched.complete(batch, StepOutcome(0.01), now)
        times.append(time.perf_counter() - t0)
    assert sched.counters.divergences == 0
    return times


def main() -> None:
    table = Table(title="scheduler step overhead (median of 40 steps)")
    for col in ("shape", "running", "waiting", "us / step", "us / running request"):
        table.add_column(col, justify="right" if col != "shape" else "left")
    for name, classes in SHAPES.items():
        for running in (256, 1_024):
            med = statistics.median(bench(classes, running))
            table.add_row(name, f"{running:,}", "1,000", f"{med * 1e6:,.0f}",
                          f"{med * 1e6 / running:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
