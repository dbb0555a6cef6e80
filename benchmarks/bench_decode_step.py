"""The decode step's request-layer cost against the chain's take and price (issue 20).

Run: ``python benchmarks/bench_decode_step.py`` for one table of this tree, or
``python benchmarks/bench_decode_step.py --against SRC`` for a before/after in one run:
the table of the ``kvchain`` at ``SRC`` (e.g. ``/work/main/src``, put first on
``PYTHONPATH`` of a child process) and of this tree's, in alternation, ``--runs`` times
each (default 3), medians of the runs.

The step is the scheduler's path of :func:`bench_request_layer.decode_step`
(``decode_demands``, ``plan``, ``apply``, ``commit_decodes``) at batch 16, 64, 256 and
512, on the two catalog chains of ``bench_request_layer`` (gpt-oss-120b: window | full;
Jet-Nemotron-2B: state | window | full), prefix cache off and on. Per row: thread CPU
us per step, of the ``Chain.take`` inside it and of the ``Chain.price`` inside it
(``KVManager.plan`` prices the take once; the take then realizes the quote without
pricing), medians of 9 blocks of 16 steps (one page cycle), the batch sizes' blocks
alternating; ``step/take`` (the issue's ratio, written when ``take`` priced itself),
``step/(price+take)`` and the request layer's own cost per request, ``(step - take -
price) / batch``.

``--unread``: with the prefix cache on, the thread CPU time per step inside
``PrefixCache._unread`` (the eviction order's recount for the cache's window pages that
lost their last reader; cache/radix.py) and its calls per step, beside the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_request_layer as rl

BATCHES = (16, 64, 256, 512)
REPEATS = 9


def _timed_price(chain: object) -> list[float]:
    """Wrap ``chain.price`` to add up its own thread time; returns the one-cell total."""
    spent = [0.0]
    price = chain.price  # type: ignore[attr-defined]

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.thread_time()
        try:
            return price(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - t0

    chain.price = timed  # type: ignore[attr-defined]
    return spent


def table(repeats: int = REPEATS) -> dict[str, list[float]]:
    """``"model|cache|batch" -> [step, take, price]`` (thread CPU seconds per step)."""
    out: dict[str, list[float]] = {}
    clock = time.thread_time
    for _, model in rl.CATALOG_SHAPES:
        for cache in (False, True):
            rigs = {b: rl.catalog_rig(model, cache) for b in BATCHES}
            rids = {b: rl.running_batch(rig, b) for b, rig in rigs.items()}
            priced = {b: _timed_price(rig.chain) for b, rig in rigs.items()}
            rows: dict[int, list[list[float]]] = {b: [] for b in BATCHES}
            for block in range(repeats + 1):
                for b, rig in rigs.items():
                    timer = rig.timer
                    assert timer is not None
                    take0, price0, t0 = timer.spent, priced[b][0], clock()
                    for _ in range(rl.PAGE):
                        rl.decode_step(rig.kv, rids[b])
                    if block:  # the first block warms up
                        rows[b].append([(clock() - t0) / rl.PAGE,
                                        (timer.spent - take0) / rl.PAGE,
                                        (priced[b][0] - price0) / rl.PAGE])
            for b in BATCHES:
                out[f"{model}|{'on' if cache else 'off'}|{b}"] = [
                    statistics.median(r[i] for r in rows[b]) for i in range(3)]
    return out


def unread_table(steps: int = 160) -> None:
    """Print, per catalog chain and batch, the step's and ``PrefixCache._unread``'s thread
    CPU us per step (cache on; ``steps`` steps after 32 of warm-up, one wrapper around
    ``_unread``, which adds about 0.2 us a call)."""
    from kvchain.cache.radix import PrefixCache

    clock, spent = time.thread_time, [0.0, 0]
    real = PrefixCache._unread

    def timed(self, *args):  # type: ignore[no-untyped-def]
        t0 = clock()
        try:
            return real(self, *args)
        finally:
            spent[0] += clock() - t0
            spent[1] += 1

    PrefixCache._unread = timed  # type: ignore[method-assign]
    print("| chain | batch | step us | _unread us | _unread calls per step |")
    print("|---|---:|---:|---:|---:|")
    try:
        for _, model in rl.CATALOG_SHAPES:
            for b in BATCHES:
                rig = rl.catalog_rig(model, True)
                rids = rl.running_batch(rig, b)
                for _ in range(32):
                    rl.decode_step(rig.kv, rids)
                spent[:] = [0.0, 0]
                t0 = clock()
                for _ in range(steps):
                    rl.decode_step(rig.kv, rids)
                step = (clock() - t0) / steps
                print(f"| {model} | {b} | {step * 1e6:.1f} | {spent[0] / steps * 1e6:.1f} | "
                      f"{spent[1] / steps:.2f} |")
    finally:
        PrefixCache._unread = real  # type: ignore[method-assign]


def _child(src: str | None) -> dict[str, list[float]]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    got = subprocess.run([sys.executable, __file__, "--json"], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(got.stdout)  # type: ignore[no-any-return]


def _print(before: dict[str, list[float]] | None, after: dict[str, list[float]]) -> None:
    head = ("| chain | prefix cache | batch | step us | take us | price us | step/take | "
            "step/(price+take) | own us per request |")
    if before is not None:
        head += " before: step us | before: step/take | before: step/(price+take) | " \
                "before: own us per request | step after/before |"
    print(head)
    print("|" + "---:|" * (head.count("|") - 1))
    for key, (step, take, price) in after.items():
        model, cache, batch = key.split("|")
        n = int(batch)
        row = (f"| {model} | {cache} | {n} | {step * 1e6:.1f} | {take * 1e6:.1f} | "
               f"{price * 1e6:.1f} | {step / take:.2f}x | {step / (price + take):.2f}x | "
               f"{(step - take - price) / n * 1e6:.3f} |")
        if before is not None:
            s0, t0, p0 = before[key]
            row += (f" {s0 * 1e6:.1f} | {s0 / t0:.2f}x | {s0 / (p0 + t0):.2f}x | "
                    f"{(s0 - t0 - p0) / n * 1e6:.3f} | {step / s0:.2f} |")
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one table as JSON (a child)")
    parser.add_argument("--against", metavar="SRC",
                        help="a kvchain source folder to compare with, in alternation")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--unread", action="store_true",
                        help="PrefixCache._unread's time per step, cache on")
    args = parser.parse_args()
    if args.unread:
        unread_table()
        return
    if args.json:
        print(json.dumps(table()))
        return
    if args.against is None:
        _print(None, table())
        return
    runs: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for _ in range(args.runs):
        runs["before"].append(_child(args.against))
        runs["after"].append(_child(None))

    def med(side: str) -> dict[str, list[float]]:
        keys = runs[side][0]
        return {k: [statistics.median(r[k][i] for r in runs[side]) for i in range(3)]
                for k in keys}

    print(f"medians of {args.runs} runs each, before ({args.against}) and after (this tree) "
          f"alternating; us per step, thread CPU time")
    _print(med("before"), med("after"))


if __name__ == "__main__":
    main()
