"""CPU seconds of whole ``kvchain simulate`` runs: fast-forward on, off (the per-step loop)
and, optionally, another tree (a baseline checkout), alternating.

Run: ``python benchmarks/bench_fast_forward.py [--base SRC] [--repeats N] [CASE ...]``,
where ``SRC`` is the ``src`` folder of another checkout (e.g. a ``git worktree`` of the
baseline commit) and ``CASE`` one of the names in :data:`CASES` (default: all but
``hour``). Each measurement is one fresh process running the CLI command exactly as a user
would (``kvchain simulate ... --json``); its CPU time (user + system, imports and trace
loading included, as the issue's ``a + b x steps`` fit counts them) comes from
``getrusage``, and the simulation alone from ``time.process_time`` around ``simulate``.
Variants run in rotating order within each repeat, so slow phases of a shared machine
hit all of them. Prints, per case: steps, decode request-steps (one per running request
per decode step), fast-forwarded steps, median CPU seconds per variant and the ratios, and
whether every variant's summary is identical (the fast-forward must not change results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: name -> ``kvchain simulate`` arguments.
CASES: dict[str, list[str]] = {
    "default": [],
    "azure-1k": ["--trace", "azure-conv", "--requests", "1000", "--rate-scale", "1"],
    "azure-2k": ["--trace", "azure-conv", "--requests", "2000", "--rate-scale", "1"],
    "azure-4k": ["--trace", "azure-conv", "--requests", "4000", "--rate-scale", "1"],
    "azure-8k": ["--trace", "azure-conv", "--requests", "8000", "--rate-scale", "1"],
    "azure-4k-16x": ["--trace", "azure-conv", "--requests", "4000", "--rate-scale", "16"],
    "hour": ["--trace", "azure-conv", "--requests", "19366", "--end-s", "3600",
             "--rate-scale", "1"],
}

# Runs in the child: the CLI, with ``simulate`` wrapped to time it and keep its result.
CHILD = r"""
import json, resource, sys, time
import kvchain.cli.simulate as S
kept = {}
inner = S.simulate
def timed(*args, **kwargs):
    t = time.process_time()
    result = inner(*args, **kwargs)
    kept["sim_cpu_s"] = time.process_time() - t
    kept["result"] = result
    return result
S.simulate = timed
from kvchain.cli import main
out_path = sys.argv[1]
sys.argv = ["kvchain", "simulate", *sys.argv[2:], "--json"]
try:
    main()
except SystemExit:
    pass
r = kept["result"]
ru = resource.getrusage(resource.RUSAGE_SELF)
json.dump({"cpu_s": ru.ru_utime + ru.ru_stime, "sim_cpu_s": kept["sim_cpu_s"],
           "steps": r.summary.steps, "request_steps": r.recorder.step_totals.decode_tokens,
           "fast_steps": getattr(r, "fast_forward_steps", 0),
           "max_rss_kb": ru.ru_maxrss, "summary": r.summary.to_json()},
          open(out_path, "w"))
"""


def measure(src: Path, args: list[str]) -> dict:
    """One fresh process: the CLI run with ``src`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run([sys.executable, "-c", CHILD, path, *args], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(Path(path).read_text())
    finally:
        os.unlink(path)


def main() -> None:
    here = Path(__file__).resolve().parents[1] / "src"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=[c for c in CASES if c != "hour"])
    parser.add_argument("--base", type=Path, help="src folder of a baseline checkout")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    variants: list[tuple[str, Path, list[str]]] = [("fast", here, []),
                                                   ("step", here, ["--no-fast-forward"])]
    if opts.base is not None:
        variants.append(("base", opts.base.resolve(), []))
    for case in opts.cases:
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
        for rep in range(opts.repeats):
            k = rep % len(variants)
            for name, src, extra in variants[k:] + variants[:k]:  # rotate the order
                runs[name].append(measure(src, CASES[case] + extra))
                print(f"  {case} {name} #{rep}: {runs[name][-1]['cpu_s']:.2f} s CPU",
                      file=sys.stderr, flush=True)
        first = runs["fast"][0]
        same = all(r["summary"] == first["summary"] for rs in runs.values() for r in rs)
        cpu = {name: statistics.median(r["cpu_s"] for r in rs) for name, rs in runs.items()}
        sim = {name: statistics.median(r["sim_cpu_s"] for r in rs) for name, rs in runs.items()}
        steps, req_steps = first["steps"], first["request_steps"]
        line = {"case": case, "steps": steps, "request_steps": req_steps,
                "fast_forwarded_pct": round(100 * first["fast_steps"] / steps, 1),
                "identical_summaries": same, "repeats": opts.repeats,
                "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
                "simulate_cpu_s": {k: round(v, 2) for k, v in sim.items()},
                "us_per_step": {k: round(1e6 * v / steps) for k, v in sim.items()},
                "steps_per_s": {k: round(steps / v) for k, v in sim.items()},
                "request_steps_per_s": {k: round(req_steps / v) for k, v in sim.items()},
                "max_rss_mb": {k: round(max(r["max_rss_kb"] for r in rs) / 1024)
                               for k, rs in runs.items()},
                "step_over_fast": round(cpu["step"] / cpu["fast"], 2)}
        if "base" in cpu:
            line["base_over_fast"] = round(cpu["base"] / cpu["fast"], 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
