"""The decode step's recount of the prefix cache's unread window pages
(``PrefixCache._unread``), one call replayed.

Run: ``python benchmarks/bench_unread.py`` for this tree, or ``python
benchmarks/bench_unread.py --against SRC`` for a before/after in one run (the ``kvchain``
at ``SRC``, e.g. a ``git archive`` copy of main's ``src``, first on ``PYTHONPATH`` of a
child process, and this tree's, in alternation, ``--runs`` times each, medians).

Per catalog chain of ``bench_request_layer`` (gpt-oss-120b: window | full;
Jet-Nemotron-2B: state | window | full), prefix cache on, 256 running rows: after 40
decode steps the last step's ``_unread`` call (its band and the nodes of the pages that
lost their last reader: one per row whose window front left a cached page) is replayed
``--calls`` times, each followed by the pins put back (timed alone and subtracted), so
every replay takes the same path. Prints wall microseconds per call (``perf_counter``).
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


def replay(calls: int) -> dict[str, list[float]]:
    """``model -> [us per call, nodes per call]`` for the kvchain on the path."""
    import bench_request_layer as rl

    from kvchain.cache.radix import PrefixCache

    out: dict[str, list[float]] = {}
    real = PrefixCache._unread
    seen: list[tuple[PrefixCache, int, list[object]]] = []

    def spy(self: PrefixCache, k: int, nodes: list[object]) -> None:
        seen.append((self, k, list(nodes)))
        real(self, k, nodes)

    for _, model in rl.CATALOG_SHAPES:
        seen.clear()
        PrefixCache._unread = spy  # type: ignore[method-assign]
        try:
            rig = rl.catalog_rig(model, True)
            rids = rl.running_batch(rig, 256)
            for _ in range(40):
                rl.decode_step(rig.kv, rids)
        finally:
            PrefixCache._unread = real  # type: ignore[method-assign]
        cache, k, nodes = seen[-1]
        clock = time.perf_counter
        t0 = clock()
        for _ in range(calls):
            cache._unread(k, nodes)
            for n in nodes:
                n.pins[k] += 1  # type: ignore[attr-defined]
        t1 = clock()
        for _ in range(calls):
            for n in nodes:
                n.pins[k] += 1  # type: ignore[attr-defined]
        t2 = clock()
        for n in nodes:
            n.pins[k] -= calls  # type: ignore[attr-defined]
        out[model] = [((t1 - t0) - (t2 - t1)) / calls * 1e6, float(len(nodes))]
    return out


def main() -> None:
    """Print the table (one tree) or the before/after table (``--against``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="SRC", help="the baseline kvchain's src folder")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(replay(args.calls)))
        return
    if not args.against:
        for model, (us, nodes) in replay(args.calls).items():
            print(f"| {model} | {nodes:.0f} nodes | {us:.2f} us |")
        return
    here = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict[str, list[float]]]] = {args.against: [], here: []}
    for _ in range(args.runs):
        for src in runs:
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run([sys.executable, __file__, "--child", "--calls",
                                   str(args.calls)], env=env, check=True,
                                  capture_output=True, text=True)
            runs[src].append(json.loads(done.stdout.splitlines()[-1]))
    print("| chain | nodes per call | before us | after us | after/before |")
    print("|---|---:|---:|---:|---:|")
    for model in runs[here][0]:
        before = statistics.median(r[model][0] for r in runs[args.against])
        after = statistics.median(r[model][0] for r in runs[here])
        print(f"| {model} | {runs[here][0][model][1]:.0f} | {before:.2f} | {after:.2f} | "
              f"{after / before:.2f} |")


if __name__ == "__main__":
    main()
