"""Seeded memory-bound runs with the prefix cache on every chain shape: audits after every
step (every page held by a request, by the cache, or a null page; lock counts equal the
running hits), 0 divergences, 0 leaks; and planted defects that make each figure non-zero."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

SHAPES = {
    "full": [declared_class(LC.FULL, 1_000)],
    "window|full": [declared_class(LC.WINDOW, 1_000, 128), declared_class(LC.FULL, 1_000)],
    "local|full": [declared_class(LC.LOCAL, 1_000, 256), declared_class(LC.FULL, 1_000)],
    "state|full": [declared_class(LC.STATE, 48_000), declared_class(LC.FULL, 1_000)],
    "state|window|full": [declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 96),
                          declared_class(LC.FULL, 1_000)],
    # Several windowed bands (issue 22 item 5): each keeps its own tails.
    "window|window|full": [declared_class(LC.WINDOW, 1_000, 48),
                           declared_class(LC.WINDOW, 500, 200), declared_class(LC.FULL, 1_000)],
    "state|local|window|full": [declared_class(LC.STATE, 48_000),
                                declared_class(LC.LOCAL, 1_000, 128),
                                declared_class(LC.WINDOW, 1_000, 96),
                                declared_class(LC.FULL, 1_000)],
}
PAGE = 16


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Conversations: each request extends an earlier prompt of its conversation (a later
    turn) or shares a system prompt, so prefixes repeat at many lengths."""
    systems = [[rng.randrange(50_000) for _ in range(rng.choice((64, 100, 200)))]
               for _ in range(3)]
    convs: list[list[int]] = []
    out = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            c = rng.randrange(len(convs))
            convs[c] = convs[c] + [rng.randrange(50_000) for _ in range(rng.randint(1, 200))]
            p = convs[c]
        else:
            p = rng.choice(systems) + [rng.randrange(50_000) for _ in range(rng.randint(1, 300))]
            convs.append(p)
        out.append(p[:900])
    return out


def arrive(sched: Scheduler, rng: random.Random, texts: list[list[int]], rid: int,
           now: float, page: int, max_output: int) -> int:
    """Add 0, 0, 1 or 2 (drawn) of the next prompts of ``texts`` at ``now`` (s), each with
    an output limit drawn from 1 to ``max_output`` tokens and its page keys; returns the
    next request id (``rid`` plus those added, at most ``len(texts)``)."""
    for _ in range(rng.choice((0, 0, 1, 2))):
        if rid < len(texts):
            t = texts[rid]
            sched.add(Request(rid, len(t), rng.randint(1, max_output), now,
                              page_keys=page_keys_from_tokens(t, page)), now)
            rid += 1
    return rid


def run(shape: str, seed: int, buffer: int = 2_400_000, cache_cls: type = PrefixCache,
        n: int = 300, policy: ResumePolicy = ResumePolicy.BLOCKS,
        audit: bool | None = None, partial: bool = False) -> Scheduler:
    layout = plan_layout(SHAPES[shape], buffer, PAGE)
    chain = Chain(layout, audit=audit)
    cache = cache_cls(CacheGeometry.of(layout), interval_tokens=64, policy=policy,
                      audit=audit)
    sched = Scheduler(KVManager(chain, cache),
                      SchedulerConfig(max_prefill_tokens=512, chunk_size=256, max_running=64,
                                      partial_hits=partial))
    rng = random.Random(seed)
    texts = prompts(rng, n)
    now, rid = 0.0, 0
    for _ in range(40_000):
        rid = arrive(sched, rng, texts, rid, now, PAGE, max_output=120)
        batch = sched.step(now)
        now += 0.01
        stopped = frozenset(d.rid for d in batch.decodes if rng.random() < 0.01)
        sched.complete(batch, StepOutcome(0.01, stopped), now)
        sched.audit()
        sched.drain_events()
        if rid >= n and sched.idle:
            break
    assert sched.idle
    return sched


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cached_runs_are_exact_and_leak_nothing(shape):
    sched = run(shape, seed=5, n=200)
    c = sched.counters
    assert c.divergences == 0
    assert c.finished + c.rejected == 200
    assert c.hit_tokens > 0
    assert sched.kv.cache is not None and sched.kv.cache.evictions > 0
    if shape == "full":  # every page boundary resumes: no junction is ever needed
        assert sched.kv.glue.junctions_saved == 0


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "full"])
def test_cached_runs_with_junction_checkpoints(shape):
    # ``ends`` keeps a prompt's points near its end only, so later prompts leave cached
    # paths between points (conversations branch, system prompts of 64-200 tokens):
    # junction checkpoints and tails are saved, hit and evicted under the same audits.
    sched = run(shape, seed=7, n=150, policy=ResumePolicy.ENDS)
    c = sched.counters
    assert c.divergences == 0 and c.finished + c.rejected == 150
    assert sched.kv.glue.junctions_saved > 0 and c.hit_tokens > 0
    assert sched.kv.cache is not None and sched.kv.cache.evictions > 0


def test_ends_policy_on_the_three_band_shape():
    sched = run("state|window|full", seed=9, n=150, policy=ResumePolicy.ENDS)
    c = sched.counters
    assert c.divergences == 0 and c.finished + c.rejected == 150 and c.hit_tokens > 0
    assert sched.kv.glue.junctions_saved > 0


def test_junctions_add_hits_on_the_state_shape_under_eviction():
    # Same seeded stream, junctions off vs on (ends): the junctions' checkpoints are where
    # the system prompts branch, so more prompt tokens hit; both exact.
    on = run("state|full", seed=9, n=150, policy=ResumePolicy.ENDS)
    off = run("state|full", seed=9, n=150, policy=ResumePolicy.ENDS,
              cache_cls=lambda *a, **k: PrefixCache(*a, junctions=False, **k))
    assert on.counters.divergences == off.counters.divergences == 0
    assert off.kv.glue.junctions_saved == 0 < on.kv.glue.junctions_saved
    assert on.counters.hit_tokens > off.counters.hit_tokens


def spaced_cache(budget: int):
    """A spaced cache whose checkpoint budget is ``budget`` points (its geometry's buffer
    set to ``budget x 64`` slots; the chain's real buffer stays what ``run`` lays out)."""
    def make(geom: CacheGeometry, **kw) -> PrefixCache:
        return PrefixCache(replace(geom, buffer_bytes=budget * 64 * geom.slot_bytes), **kw)
    return make


@pytest.mark.parametrize("shape", ["state|full", "state|window|full"])
def test_cached_runs_with_spaced_checkpoints(shape):
    # Budget 4: a prompt of up to 900 tokens (L <= 14 boundaries of 64 tokens) keeps
    # every ceil(L / 3)-th boundary counted back from its last, and its last page: spaced
    # points (neither blocks nor ends), junctions on top, under eviction and the audits.
    sched = run(shape, seed=11, n=150, policy=ResumePolicy.SPACED, cache_cls=spaced_cache(4))
    c = sched.counters
    cache = sched.kv.cache
    assert cache is not None and cache.policy is ResumePolicy.SPACED
    assert c.divergences == 0 and c.finished + c.rejected == 150
    assert c.hit_tokens > 0 and cache.evictions > 0


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.startswith("state")])
@pytest.mark.parametrize("policy", [ResumePolicy.ENDS, ResumePolicy.BLOCKS])
def test_cached_runs_with_partial_hits(shape, policy):
    # Partial hits (gaps of up to 256 // 16 - 1 = 15 pages) under eviction, early stops
    # and the audits after every step (which check where each request's state resumes):
    # exact, and on the shapes whose window tails outlast the checkpoints some hits are
    # partial (a gap is at least one page). With a 128-token chunked-local band a tail
    # past a checkpoint is rarely whole (its chunk's pages are kept only up to each point),
    # so H mostly stops at C there: exact all the same.
    sched = run(shape, seed=13, n=150, policy=policy, partial=True)
    c = sched.counters
    assert c.divergences == 0 and c.finished + c.rejected == 150
    assert c.partial_tokens >= c.partial_hits * PAGE
    if "local" not in shape:
        assert c.partial_hits > 0
    assert sched.kv.cache is not None and sched.kv.cache.evictions > 0


class CountingCache(PrefixCache):
    """Counts, around every eviction, the live unlocked full pages evicted while dead ones
    (no checkpoint at or below them: :meth:`PrefixCache.dead_full_page_ids`, taken before
    the eviction) stayed cached."""

    live_while_dead = 0

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        dead = set(self.dead_full_page_ids(unlocked_only=True))
        freed = super().evict(units)
        assert self.geom.full is not None
        gone = set(freed[self.geom.full].tolist())
        self.live_while_dead += min(len(gone - dead), len(dead - gone))
        return freed


class LruOnlyCache(CountingCache):
    """Planted defect: the old order (plain LRU, dead leaves not first), kept consistently
    in both walks, so the run stays exact but evicts pages that can hit before dead ones."""

    def _dead(self, node, tails_gone):  # type: ignore[no-untyped-def]
        return False

    def _dies(self, node, joined):  # type: ignore[no-untyped-def]
        return False


@pytest.mark.parametrize("shape", ["state|full", "state|window|full"])
def test_no_page_that_can_hit_is_evicted_before_a_dead_one(shape):
    # ends: every prompt keeps 2 checkpoints, so under eviction many cached pages have no
    # checkpoint below them. The order never takes a live page while a dead one stays; the
    # planted old order does (same stream: the figure is not 0 by construction).
    sched = run(shape, seed=5, n=200, policy=ResumePolicy.ENDS, cache_cls=CountingCache)
    cache = sched.kv.cache
    assert isinstance(cache, CountingCache) and cache.evictions > 0
    assert sched.counters.divergences == 0
    assert cache.live_while_dead == 0
    old = run(shape, seed=5, n=200, policy=ResumePolicy.ENDS, cache_cls=LruOnlyCache)
    assert isinstance(old.kv.cache, LruOnlyCache) and old.counters.divergences == 0
    assert old.kv.cache.live_while_dead > 0


# --- planted defects: each "must be 0" figure made non-zero -----------------------------


class ForgetfulCache(PrefixCache):
    """Planted defect: on insert it forgets to hand back the request's duplicate pages
    (neither the cache nor the request holds them any more: leaked)."""

    def insert(self, keys, shared, full, window, ckpts):  # type: ignore[no-untyped-def]
        dups = super().insert(keys, shared, full, window, ckpts)
        return [ids[:-1] for ids in dups]


class MisorderedCache(PrefixCache):
    """Planted defect: publishes its LRU walk but evicts the most recent units instead."""

    def evict(self, units):  # type: ignore[no-untyped-def]
        self.eviction_order().materialize()  # the whole walk, then turned around
        assert self._published is not None
        self._published[2].reverse()
        return super().evict(units)


def test_a_cache_that_forgets_its_duplicates_is_caught_as_a_leak():
    from kvchain.errors import AuditError

    with pytest.raises(AuditError, match="leaked"):
        run("window|full", seed=5, cache_cls=ForgetfulCache, n=120)


def test_a_cache_evicting_out_of_order_is_caught_as_a_divergence():
    """With the audit flag off, the take's O(bands) check (pages freed per band against
    the order's prediction) still catches it."""
    from kvchain.errors import PlanMismatchError

    with pytest.raises(PlanMismatchError):
        run("state|window|full", seed=5, cache_cls=MisorderedCache, n=120, audit=False)


def test_the_audit_catches_a_cache_evicting_out_of_order_before_it_evicts():
    """With the audit flag on, the cache's rebuild-and-compare (its kept walk against a
    whole-tree walk) names it before anything is evicted."""
    from kvchain.errors import AuditError

    with pytest.raises(AuditError, match="other units"):
        run("state|window|full", seed=5, cache_cls=MisorderedCache, n=120, audit=True)


def test_admission_without_the_recheck_after_locking_diverges(monkeypatch):
    """Planted defect: the ledger is not rebased after a hit locks its pages, so admission
    still counts them as evictable supply: an admitted batch the allocator refuses."""
    from kvchain.errors import AdmissionDivergenceError
    from kvchain.sched.admission import ChainPrefillBudget

    assert run("full", seed=5, buffer=700_000, n=200).counters.divergences == 0
    monkeypatch.setattr(ChainPrefillBudget, "rebase", lambda self, snapshot: True)
    with pytest.raises(AdmissionDivergenceError):
        run("full", seed=5, buffer=700_000, n=200)
