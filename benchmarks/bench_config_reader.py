"""Benchmark of reading configs through transformers' configuration classes.

Run: ``PYTHONPATH=src python benchmarks/bench_config_reader.py [--repeats N]``. Not a
test (no timed assertions). Prints, measured in this run:

- the one-time import cost: ``import kvchain.model`` and ``import transformers`` in fresh
  interpreters (wall seconds, best of ``--repeats``), and whether ``import kvchain``
  pulls transformers in (it must not);
- per bundled config: ``load_hf_config`` through transformers vs the raw dict (ms per
  load after warm-up, best of ``--repeats`` x 20 loads) and their ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from importlib import resources

from kvchain.model import load_hf_config


def fresh_import_s(statement: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        best = min(best, time.perf_counter() - started)
    return best


def load_ms(path: str, use_transformers: bool, repeats: int) -> float:
    load_hf_config(path, use_transformers=use_transformers)  # warm-up (first import)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(20):
            load_hf_config(path, use_transformers=use_transformers)
        best = min(best, (time.perf_counter() - started) / 20)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bare = fresh_import_s("pass", args.repeats)
    core = fresh_import_s("import kvchain, kvchain.model", args.repeats)
    tf = fresh_import_s("import transformers", args.repeats)
    pulled = subprocess.run(
        [sys.executable, "-c", "import sys, kvchain, kvchain.model, kvchain.cli;"
         "print('transformers' in sys.modules)"], capture_output=True, text=True, check=True)
    print(f"interpreter start          {bare:7.3f} s")
    print(f"import kvchain, kvchain.model {core - bare:7.3f} s over start")
    print(f"import transformers        {tf - bare:7.3f} s over start (paid once, lazily)")
    print(f"import kvchain pulls transformers: {pulled.stdout.strip()}")
    root = resources.files("kvchain.catalog").joinpath("data").joinpath("model_configs")
    print(f"{'config':52} {'transformers ms':>16} {'raw ms':>8} {'ratio':>6}")
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        path = str(entry)
        with_tf = load_ms(path, True, args.repeats)
        raw = load_ms(path, False, args.repeats)
        print(f"{entry.name:52} {with_tf:16.2f} {raw:8.2f} {with_tf / raw:6.1f}")


if __name__ == "__main__":
    main()
