"""Speculative decoding on real models: the state rollback modes and where the draft's
cache lives (docs/benchmarks.md, "Speculative decoding on real models (round 6)"; costs
explained in docs/hf.md).

Table 1, rollback: the speculative workload of ``tests/hf/test_hf_speculative.py`` (four
requests, k = 3, a noisy copy of the target as a ``ModelDraft``, a flush after every step)
on the tiny random-weight state families (weight spread 0.2) under ``REPLAY`` and
``CHECKPOINTS``, alternating, ``R`` times each after one untimed warm-up run: equal
tokens, median wall time, target forwards, tokens recomputed by replay, state bytes per
request, ratio to ``REPLAY``.

Table 2, the draft's cache: the cases of ``tests/hf/test_hf_draft_bands.py`` with the
same draft model as a ``ModelDraft`` (transformers' cache, a ``generate`` over the whole
sequence per step) and as a ``ChainDraft`` (its KV and state in the chain's draft bands),
alternating: equal tokens and proposals, median wall time, draft forwards over the
chain, ratio to ``ModelDraft``.

CPU, fp32, wall time of whole runs (the draft included). Run from the worktree root
(about 2-4 min on 2 shared CPU cores)::

    .venv/bin/python benchmarks/bench_hf_speculative.py [R]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hf.families import build_model
from tests.hf.test_hf_draft_bands import CASES, _by_request
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
from kvchain.hf import ChainDraft, ChainEngine, ModelDraft


def run(model: Any, family: str, mode: StateRollback, draft: Any = None,
        buffer: int | None = None) -> tuple[float, ChainEngine]:
    """One run of the workload; returns its wall seconds and the engine."""
    prompts = _prompts()
    engine = ChainEngine(model, buffer or CKPT_BUFFER[family], page_size=PAGE,
                         chunk_size=8, flush_every=1,
                         draft=draft or _draft(model, NOISE[family]), spec_tokens=K,
                         rollback=mode)
    for rid, _, new, arrival in WORKLOAD:
        engine.add(rid, prompts[rid], new, arrival)
    t = time.perf_counter()
    engine.run(max_steps=200)
    return time.perf_counter() - t, engine


def rollback_table(reps: int) -> None:
    """Table 1 (module docstring)."""
    modes = (StateRollback.REPLAY, StateRollback.CHECKPOINTS)
    print("family      mode         same  wall_s  forwards  replayed  state_B/req  ratio")
    for family in sorted(CKPT_BUFFER):
        model = build_model(family, init_std=CKPT_INIT_STD)
        times: dict[StateRollback, list[float]] = {m: [] for m in modes}
        last: dict[StateRollback, ChainEngine] = {}
        for mode in modes:  # warm-up, untimed (first calls of each kernel path)
            run(model, family, mode)
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


def draft_table(reps: int) -> None:
    """Table 2 (module docstring)."""
    print("case                    draft       same  props  wall_s  draft_fwd  ratio")
    for family, mode, buffer, std in CASES:
        model = build_model(family, init_std=std)
        draft_model = _draft(model, NOISE[family]).model
        kinds = (ModelDraft, ChainDraft)
        times: dict[type, list[float]] = {k: [] for k in kinds}
        last: dict[type, ChainEngine] = {}
        for kind in kinds:  # warm-up, untimed
            run(model, family, mode, kind(draft_model), buffer)
        for _ in range(reps):
            for kind in kinds:
                dt, last[kind] = run(model, family, mode, kind(draft_model), buffer)
                times[kind].append(dt)
        base = statistics.median(times[ModelDraft])
        first = last[ModelDraft]
        for kind in kinds:
            e = last[kind]
            med = statistics.median(times[kind])
            same = all(e.results[r].tokens == first.results[r].tokens for r in e.results)
            props = _by_request(e.proposals) == _by_request(first.proposals)
            print(f"{family + '-' + mode.value:23s} {kind.__name__:11s} {same!s:5s} "
                  f"{props!s:5s}  {med:6.3f}  {e.draft_forwards:9d}  {med / base:5.2f}")


def main(reps: int = 3) -> None:
    rollback_table(reps)
    print()
    draft_table(reps)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
