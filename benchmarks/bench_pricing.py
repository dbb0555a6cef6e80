"""Planner speed: ``price`` and ``fits`` on cached snapshots of every chain shape.

Run: ``python benchmarks/bench_pricing.py``. Prints microseconds per call (best of 5
rounds of 20,000 calls) for an in-place demand, a demand that needs compaction or float
relocation, and a refused one - and the ratio of ``price`` to ``fits`` (which builds no
plan) measured in the same run, and of four- and five-band ``price`` to the three-band one
of the same kind (in place, moves, refused) measured in the same run. The ``price`` column
repeats one call, so after the first it is a memo hit; ``fits`` runs the planner each time.

``--cold``: the planner itself on the same cases, this thread's CPU time per call (best
of 5 rounds): ``_price_uncached`` (the planner behind ``price``, snapshot object reused),
``price`` on a memo miss (validation, the memo's hashing and store included; the memo is
cleared before each call and the clearing alone subtracted), and ``_price_general`` (the
general solver without the in-place shortcut) when this tree has it. With
``--baseline-src DIR`` (a ``src`` folder of another commit, e.g. from
``git archive <commit> src | tar -x -C /tmp/base``) the same measurement runs in
subprocesses on both trees, alternating, three times each, and the table shows the best
of each and their ratio. Targets on an idle core (issues 12 and 14): the cold three-band
``price <= 5 us``; with evictable supply (a full chain whose prefix cache offers 2,000
eviction units, the "two ENDs + cache" case: the least eviction prefix is searched)
``price <= 10 us``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import timeit
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvchain.alloc import pricing
from kvchain.alloc.pricing import _price_uncached, fits, price
from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot, Demand, EvictionOrder
from kvchain.layout import Anchor

# Trees before the price memo moved onto the chain kept a module-level memo to empty first;
# on later trees ``price`` keeps nothing between calls.
clear_price_memo = getattr(pricing, "clear_price_memo", lambda: None)


def _low(label, p, live, holes):
    return BandSnapshot(label, Anchor.LOW, p, 0, (live + holes) * p, live, holes, 1 << 20)


def _high(label, p, live, holes, b):
    return BandSnapshot(label, Anchor.HIGH, p, b - (live + holes) * p, b, live, holes, 1 << 20)


def _float(label, p, page, live, holes):
    return BandSnapshot(
        label, Anchor.FLOAT, p, page * p, (page + live + holes) * p, live, holes, 1 << 20
    )


CASES = {
    "one band": (
        ChainSnapshot(32 * 1000, (_low("full", 32, 600, 50),)),
        [Demand((40,)), Demand((100,)), Demand((400,))],
    ),
    "two ENDs": (
        ChainSnapshot(6_400, (_low("window", 32, 60, 40), _high("full", 32, 20, 80, 6_400))),
        [Demand((30, 30)), Demand((50, 50)), Demand((61, 61))],
    ),
    "three bands": (
        ChainSnapshot(
            6_784,
            (
                _low("state", 48, 41, 0),
                _float("window", 32, 200, 1, 0),
                _high("full", 32, 0, 0, 6_784),
            ),
        ),
        [Demand((0, 10, 10)), Demand((0, 70, 74)), Demand((0, 76, 76))],
    ),
    # Two floats (tests/alloc/test_pricing_n_bands.py): the window's holes; the state END
    # pushing the window float (relocation); the grid refusal short by 4 B.
    "four bands": (
        ChainSnapshot(200, (
            BandSnapshot("state", Anchor.LOW, 10, 0, 40, 4, 0, 20),
            BandSnapshot("window", Anchor.FLOAT, 4, 40, 60, 3, 2, 50),
            BandSnapshot("local", Anchor.FLOAT, 6, 120, 132, 2, 0, 33),
            BandSnapshot("full", Anchor.HIGH, 10, 160, 200, 4, 0, 20))),
        [Demand((0, 2, 0, 0)), Demand((3, 0, 0, 0)), Demand((7, 0, 1, 2))],
    ),
    # Three floats: the full END grows in place; the state END pushes two floats; a grid
    # refusal (short by 5 B) after both sweeps ran.
    "five bands": (
        ChainSnapshot(300, (
            BandSnapshot("state", Anchor.LOW, 10, 0, 40, 4, 0, 30),
            BandSnapshot("window8", Anchor.FLOAT, 4, 40, 52, 3, 0, 75),
            BandSnapshot("window64", Anchor.FLOAT, 6, 54, 66, 2, 0, 50),
            BandSnapshot("local", Anchor.FLOAT, 5, 100, 110, 2, 0, 60),
            BandSnapshot("full", Anchor.HIGH, 10, 260, 300, 4, 0, 30))),
        [Demand((0, 0, 0, 0, 2)), Demand((3, 0, 0, 0, 0)), Demand((0, 0, 0, 1, 18))],
    ),
    # A full buffer (no free byte, no hole) whose prefix cache offers 2,000 units of
    # (2 window, 8 full) pages: demands that need 5 and 250 units, and one refused after
    # evicting everything.
    "two ENDs + cache": (
        ChainSnapshot(
            32 * 100_000,
            (_low("window", 32, 20_000, 0), _high("full", 32, 80_000, 0, 32 * 100_000)),
            0,
            EvictionOrder.from_units([(2, 8)] * 2_000, 2),
        ),
        [Demand((10, 40)), Demand((500, 2_000)), Demand((20_000, 80_000))],
    ),
}


def _cpu_us(fn, n: int) -> float:
    """Best of 5 rounds of ``n`` calls, this thread's CPU time, microseconds per call."""
    return min(timeit.Timer(fn, timer=time.thread_time).repeat(5, n)) / n * 1e6


COLD_SHAPES = ("two ENDs", "three bands", "four bands", "two ENDs + cache")


def cold_times(n: int = 2_000) -> dict[str, dict[str, float | str]]:
    """Cold planner times per case ``"shape (demand)"``: ``planner`` (``_price_uncached``),
    ``price`` (a memo miss) and, if this tree has it, ``general`` (``_price_general``)."""
    general = getattr(pricing, "_price_general", None)
    out: dict[str, dict[str, float | str]] = {}
    clear = _cpu_us(clear_price_memo, n)
    for shape in COLD_SHAPES:
        snap, demands = CASES[shape]
        for d in demands:
            q = _price_uncached(snap, d)
            kind = "refused" if not q.fits else ("moves" if q.needs_moves else "in place")
            if q.fits and q.evicted_units:
                kind = f"evict {q.evicted_units}" + (" + moves" if q.needs_moves else "")
            row: dict[str, float | str] = {"kind": kind}
            row["planner"] = _cpu_us(lambda d=d, snap=snap: _price_uncached(snap, d), n)
            row["price"] = _cpu_us(
                lambda d=d, snap=snap: (clear_price_memo(), price(snap, d)), n) - clear
            if general is not None:
                row["general"] = _cpu_us(lambda d=d, snap=snap: general(snap, d), n)
            out[f"{shape} {d.pages}"] = row
    return out


def _cold_in(src: str) -> dict[str, dict[str, float | str]]:
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run([sys.executable, __file__, "--cold-json"], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def cold_table(baseline_src: str | None) -> None:
    """Print the cold table (this tree; with a baseline, both trees and their ratio)."""
    here = str(Path(pricing.__file__).resolve().parents[2])
    if baseline_src is None:
        runs = {"after": [cold_times()]}
    else:
        runs = {"before": [], "after": []}
        for _ in range(3):
            runs["before"].append(_cold_in(baseline_src))
            runs["after"].append(_cold_in(here))
    best = {tree: {case: {k: min(r[case][k] for r in rs) if k != "kind" else rs[0][case][k]
                          for k in rs[0][case]} for case in rs[0]}
            for tree, rs in runs.items()}
    title = "cold planner (us of thread CPU time per call, best of 5 x 2,000"
    title += (", best of 3 alternating runs per tree)" if baseline_src else ")")
    table = Table(title=title)
    cols = ["case", "plan"]
    if baseline_src:
        cols += ["planner before", "planner after", "after / before",
                 "price before", "price after", "after / before"]
    else:
        cols += ["planner", "price (memo miss)"]
    cols += ["general solver", "planner / general"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("case", "plan") else "right")
    after = best["after"]
    for case, row in after.items():
        cells = [case, str(row["kind"])]
        if baseline_src:
            b = best["before"][case]
            cells += [f"{b['planner']:.2f}", f"{row['planner']:.2f}",
                      f"{row['planner'] / b['planner']:.2f}x",
                      f"{b['price']:.2f}", f"{row['price']:.2f}",
                      f"{row['price'] / b['price']:.2f}x"]
        else:
            cells += [f"{row['planner']:.2f}", f"{row['price']:.2f}"]
        if "general" in row:
            cells += [f"{row['general']:.2f}", f"{row['planner'] / row['general']:.2f}x"]
        else:
            cells += ["-", "-"]
        table.add_row(*cells)
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", action="store_true", help="the cold planner table")
    parser.add_argument("--baseline-src", default=None,
                        help="a src folder of another commit to compare the cold planner with")
    parser.add_argument("--cold-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_json:
        print(json.dumps(cold_times()))
        return
    if args.cold or args.baseline_src:
        cold_table(args.baseline_src)
        return
    table = Table(title="planner speed (us per call, best of 5 x 20,000)")
    for col in ("shape", "demand", "plan", "price", "fits", "price / fits",
                "price / 3 bands"):
        table.add_column(col, justify="right" if col not in ("shape", "demand", "plan") else "left")
    n = 20_000
    three: dict[int, float] = {}  # the three-band price per demand kind, this run
    for shape, (snap, demands) in CASES.items():
        for k, d in enumerate(demands):
            q = price(snap, d)
            kind = "refused" if not q.fits else ("moves" if q.needs_moves else "in place")
            if q.fits and q.evicted_units:
                kind = f"evict {q.evicted_units}" + (" + moves" if q.needs_moves else "")
            t_price = (
                min(timeit.repeat(lambda d=d, snap=snap: price(snap, d), number=n, repeat=5)) / n
            )
            t_fits = (
                min(timeit.repeat(lambda d=d, snap=snap: fits(snap, d), number=n, repeat=5)) / n
            )
            if shape == "three bands":
                three[k] = t_price
            table.add_row(
                shape,
                str(d.pages),
                kind,
                f"{t_price * 1e6:.2f}",
                f"{t_fits * 1e6:.2f}",
                f"{t_price / t_fits:.1f}x",
                f"{t_price / three[k]:.1f}x" if k in three else "-",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
