"""Prefix-cache hits by the kind of resume point they resume from (docs/benchmarks.md,
"Prefix cache on every window band (round 5)": the jet-nemotron-2b spaced-vs-ends reading).

A prompt's resume points are of five kinds: its last whole page (``end``), a block-aligned
prompt's resend point ``(L - 1) // P`` (``resend``, so that its own resend can hit), its
last content-block boundary (``last_block``), a junction where it left a cached path
(``junction``), or an earlier block boundary that only ``spaced`` (or ``blocks``) keeps
(``mid``). This runs the first ``N`` Mooncake requests on a model (H200 cost model) in a
buffer of ``B`` bytes with ``--cache-points`` ``P`` and counts, per kind, the checkpoints
handed to the cache at each prompt's insert (a point keeps the kind of the prompt that
first inserted it) and the hits that copied a checkpoint of that kind (one per hit: the
copy-on-write into the request's slot), with their hit tokens. It observes the request
layer's glue by wrapping three of its methods (``attach``: the hit; ``_insert_prompt``:
the checkpoints handed over; ``copies``: the take that copies a hit's checkpoint);
nothing it measures changes a decision.
Run from the worktree root (about 10-15 s a run on 2 CPU cores)::

    .venv/bin/python benchmarks/bench_checkpoint_kinds.py [P] [N] [B] [model]

Defaults: ``spaced``, 600 requests, 17,179,869,184 B (16 GiB), jet-nemotron-2b.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from kvchain.cache.radix import ResumePolicy, resume_points
from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.requests import cache_glue
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace

Glue = cache_glue.CacheGlue


def point_kinds(glue: Any, keys: tuple[int, ...], facts: Any, prompt_tokens: int
                ) -> dict[int, str]:
    """The kind of each of the request's resume points (page counts): its last page
    (``end``), a block-aligned prompt's resend point ``(L - 1) // P`` (``resend``), a
    junction, the last interval boundary, or one before it (``mid``)."""
    cache = glue.cache
    n, interval = len(keys), cache.interval_pages
    junction = facts.cut // glue.geom.page_size
    resend = (prompt_tokens - 1) // glue.geom.page_size
    own = set(resume_points(cache.geom, n, interval, cache.policy, prompt_tokens))
    kinds = {}
    for q in facts.points:
        if q == n:
            kinds[q] = "end"
        elif q == resend and q in own and q % interval:
            kinds[q] = "resend"
        elif q not in own and q == junction:
            kinds[q] = "junction"
        elif q == (n // interval) * interval:
            kinds[q] = "last_block"
        else:
            kinds[q] = "mid"
    return kinds


def main(points: str = "spaced", n: int = 600, buffer: int = 17_179_869_184,
         model: str = "jet-nemotron-2b") -> None:
    kind_of: dict[int, str] = {}  # key of a checkpoint's last page -> kind
    planned: dict[int, tuple[tuple[int, ...], dict[int, str]]] = {}
    saved: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    hit_tokens: Counter[str] = Counter()
    attach, insert, copies = Glue.attach, Glue._insert_prompt, Glue.copies
    hit_of: dict[int, int] = {}  # rid -> its hit tokens at its last attach

    def attach_(self: Any, rid: int, facts: Any, keys: tuple[int, ...], *a: Any) -> int:
        h = attach(self, rid, facts, keys, *a)
        if self.cache is not None and keys:
            planned[rid] = (tuple(keys), point_kinds(self, keys, facts, a[0]))
            hit_of[rid] = h
        return h

    def copies_(self: Any, ids: tuple[int, ...], slots: Any, nonzero: Any, matrix: Any,
                requests: Any) -> Any:
        done = copies(self, ids, slots, nonzero, matrix, requests)
        srcs = set(done[0].src) if done else set()
        for rid in ids:  # the hits whose checkpoint this take copies (one per hit)
            facts = requests.get(rid)
            if facts is not None and facts.cow_src >= 0 and facts.cow_src in srcs:
                kind = kind_of.get(facts.keys[facts.cow_at - 1], "?")
                hits[kind] += 1
                hit_tokens[kind] += hit_of[rid]
        return done

    def insert_(self: Any, rid: int, facts: Any, *a: Any) -> None:
        keys, kinds = planned[rid]
        for q in facts.ckpts:
            saved[kinds[q]] += 1
            kind_of.setdefault(keys[q - 1], kinds[q])
        insert(self, rid, facts, *a)

    Glue.attach, Glue._insert_prompt, Glue.copies = (  # type: ignore[method-assign]
        attach_, insert_, copies_)
    try:
        result = simulate(SimConfig(load_model(model), get_gpu("h200"),
                                    load_trace("mooncake", first=n), buffer_bytes=buffer,
                                    cache_points=ResumePolicy(points)))
    finally:
        Glue.attach, Glue._insert_prompt, Glue.copies = (  # type: ignore[method-assign]
            attach, insert, copies)
    pc = result.prefix_cache
    assert pc is not None
    print(f"{model}, {n} Mooncake requests, {buffer:,} B, --cache-points {points}: hit rate "
          f"{100 * pc.hit_rate:.2f} %, {pc.cow_state_copies} hits, {pc.checkpoints_saved} "
          f"checkpoints saved, evicted {pc.evicted_pages}")
    for kind in ("end", "resend", "last_block", "junction", "mid", "?"):
        if saved[kind] or hits[kind]:
            print(f"  {kind:10s} inserted {saved[kind]:5d}  hits {hits[kind]:4d}  "
                  f"hit tokens {hit_tokens[kind]:,}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(args[:1]), *(int(a) for a in args[1:3]), *(args[3:4]))  # type: ignore[arg-type]
