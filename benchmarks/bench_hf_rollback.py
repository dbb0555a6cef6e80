"""State rollback on real models: ``REPLAY`` against ``CHECKPOINTS`` (docs/benchmarks.md,
"Speculative decoding on real models (round 6)"; costs explained in docs/hf.md).

Runs the speculative workload of ``tests/hf/test_hf_speculative.py`` (four requests, k = 3,
a noisy copy of the target as the draft, a flush after every step) on the tiny
random-weight state families of ``tests/hf/families.py`` (weight spread 0.2) under both
rollback modes, alternating, ``R`` times each, and prints per family and mode: the
tokens' equality with the other mode, the median wall time of the whole run, the target
forwards, the tokens recomputed by replay, the state bytes a request holds, and the
CHECKPOINTS / REPLAY ratio of the medians. CPU, fp32; the draft's own ``generate`` is
part of every run's time. Run from the worktree root (about 1 min on 2 CPU cores)::

    .venv/bin/python benchmarks/bench_hf_rollback.py [R]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hf.families import build_model
from tests.hf.test_hf_speculative import (
    CKPT_BUFFER,
    CKPT_INIT_STD,
    NOISE,
    PAGE,
    WORKLOAD,
    K,
    _draft,
    _prompts,
)

from kvchain.bands.geometry import StateRollback
from kvchain.hf import ChainEngine


def run(model: Any, family: str, mode: StateRollback) -> tuple[float, ChainEngine]:
    """One run of the workload; returns its wall seconds and the engine."""
    prompts = _prompts()
    engine = ChainEngine(model, CKPT_BUFFER[family], page_size=PAGE, chunk_size=8,
                         flush_every=1, draft=_draft(model, NOISE[family]), spec_tokens=K,
                         rollback=mode)
    for rid, _, new, arrival in WORKLOAD:
        engine.add(rid, prompts[rid], new, arrival)
    t = time.perf_counter()
    engine.run(max_steps=200)
    return time.perf_counter() - t, engine


def main(reps: int = 3) -> None:
    modes = (StateRollback.REPLAY, StateRollback.CHECKPOINTS)
    print("family      mode         same  wall_s  forwards  replayed  state_B/req  ratio")
    for family in sorted(CKPT_BUFFER):
        model = build_model(family, init_std=CKPT_INIT_STD)
        times: dict[StateRollback, list[float]] = {m: [] for m in modes}
        last: dict[StateRollback, ChainEngine] = {}
        for _ in range(reps):
            for mode in modes:
                dt, last[mode] = run(model, family, mode)
                times[mode].append(dt)
        tokens = {m: [last[m].results[r].tokens for r in sorted(last[m].results)]
                  for m in modes}
        base = statistics.median(times[StateRollback.REPLAY])
        for mode in modes:
            e = last[mode]
            med = statistics.median(times[mode])
            slot = e.layout.bands[e.kv.geom.state].page_bytes
            print(f"{family:11s} {mode.value:12s} {tokens[mode] == tokens[modes[0]]!s:5s} "
                  f"{med:6.3f}  {e.forwards:8d}  {e.spec.replayed_tokens:8d}  "
                  f"{e.kv.geom.state_slots * slot:11,d}  {med / base:5.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
