"""Junction checkpoints: a request whose prompt leaves a cached path past its hit keeps a
resume point (state checkpoint, window tail) there, its prefill chunk is cut there, and
later prompts sharing the prefix resume from it. Each reuse pattern runs on the real
layouts of the state hybrids (qwen3-next-80b-a3b: state | full; jet-nemotron-2b:
state | window | full) with the ``ends`` placement plus junctions (the default before
spaced checkpoints; the default ``spaced`` placement: tests/cache/test_spaced_checkpoints.py)
and, as a sibling, with the old placement (``ends`` without junctions), which misses.

Requests arrive one after the other (each once the previous one has finished), memory to
spare, page P = 16 tokens, resume-point interval 512 tokens (32 pages), chunks of 8,192
tokens. Hit lengths are derived by hand in each test."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.bands.policies import FullPolicy, StatePolicy
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import (
    CacheGeometry,
    PrefixCache,
    ResumePolicy,
    junction_point,
)
from kvchain.catalog.loader import load_model
from kvchain.layout import plan_layout
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

P = 16
MODELS = ("qwen3-next-80b-a3b", "jet-nemotron-2b")


def scheduler(model: str, junctions: bool = True, policy: ResumePolicy = ResumePolicy.ENDS,
              buffer_bytes: int = 40 << 30) -> Scheduler:
    layout = plan_layout(load_model(model).classes, buffer_bytes, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=512,
                        policy=policy, junctions=junctions)
    return Scheduler(KVManager(Chain(layout), cache),
                     SchedulerConfig(max_prefill_tokens=8192, chunk_size=8192))


def serve_one_by_one(sched: Scheduler, prompts: list[list[int]]) -> tuple[list[int],
                                                                          list[list[int]]]:
    """Each prompt alone, to the end (2 output tokens); returns every request's hit tokens
    and its prefill chunk sizes."""
    hits, chunks = [], []
    now = 0.0
    for rid, prompt in enumerate(prompts):
        sched.add(Request(rid, len(prompt), 2, now,
                          page_keys=page_keys_from_tokens(prompt, P)), now)
        sizes: list[int] = []
        for _ in range(1000):
            batch = sched.step(now)
            sizes += [c.tokens for c in batch.prefills if c.rid == rid]
            now += 0.01
            sched.complete(batch, StepOutcome(0.01, frozenset()), now)
            sched.drain_events()
            if sched.idle:
                break
        assert sched.idle
        sched.audit()
        hits.append(sched.request(rid).hit_tokens)
        chunks.append(sizes)
    c = sched.counters
    assert c.divergences == 0 and c.finished == len(prompts) and c.retractions == 0
    return hits, chunks


def tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 + seed * 50_000 for i in range(n)]


@pytest.mark.parametrize("model", MODELS)
def test_shared_system_prompt_is_hit_from_the_junction(model):
    # 8 x (6,000 shared + 2,000 own) tokens: 500 whole pages each. Own points (ends): the
    # last interval boundary 480 (15 x 32 pages) and 500. Request 0 meets an empty cache:
    # no junction, hit 0. Request 1's keys share 375 pages (6,000 / 16) with request 0's
    # path, no checkpoint at or below 375 (480 and 500 lie in request 0's own part): hit
    # 0, junction 375 (it adds 375 >= 32 pages); its first chunk is cut there: 6,000, then
    # 2,000. Requests 2..7 resume at the junction: 375 pages = 6,000 tokens, 100 % of the
    # shared prefix (the page-rounded limit: 6,000 is a page multiple).
    shared = tokens(1, 6000)
    prompts = [shared + tokens(10 + i, 2000) for i in range(8)]
    hits, chunks = serve_one_by_one(scheduler(model), prompts)
    assert hits == [0, 0] + [6000] * 6
    assert chunks[1] == [6000, 2000]
    assert chunks[0] == [8000] and chunks[2] == [2000]


@pytest.mark.parametrize("model", MODELS)
def test_shared_system_prompt_misses_with_the_old_placement(model):
    # Without junctions every request keeps only 480 and 500: nothing lies in the shared
    # 375 pages, so nothing ever hits.
    shared = tokens(1, 6000)
    prompts = [shared + tokens(10 + i, 2000) for i in range(8)]
    hits, _ = serve_one_by_one(scheduler(model, junctions=False), prompts)
    assert hits == [0] * 8


def branching_prompts() -> list[list[int]]:
    a, b = tokens(2, 1000), tokens(3, 1000)
    return [a + b + tokens(20 + i, 500) for i in range(4)]  # A+B+C, then A+B+D, E, F


@pytest.mark.parametrize("model", MODELS)
def test_branching_off_a_cached_path_is_hit_at_the_branch(model):
    # A+B+C: 2,500 tokens, 156 whole pages; own points 128 (4 x 32) and 156. A+B+D shares
    # A+B = 2,000 tokens = 125 pages with it (page 125 holds D's first tokens), no
    # checkpoint at or below 125: hit 0, junction 125 (gain 125 >= 32), chunk cut
    # [2,000, 500]. A+B+E and A+B+F resume at 125 pages: 2,000 tokens each.
    hits, chunks = serve_one_by_one(scheduler(model), branching_prompts())
    assert hits == [0, 0, 2000, 2000]
    assert chunks[1] == [2000, 500] and chunks[2] == [500]


@pytest.mark.parametrize("model", MODELS)
def test_branching_misses_with_the_old_placement(model):
    hits, _ = serve_one_by_one(scheduler(model, junctions=False), branching_prompts())
    assert hits == [0, 0, 0, 0]


def static_context_prompts() -> list[list[int]]:
    context = tokens(4, 60_000)
    return [context + tokens(40 + i, 600) for i in range(4)]


@pytest.mark.parametrize("model", MODELS)
def test_long_static_context_is_hit_up_to_the_queries(model):
    # 60,000 context tokens (3,750 pages) + 600-token queries: 60,600 tokens, 3,787 whole
    # pages; own points 3,776 (118 x 32: inside the query) and 3,787. The second request
    # shares 3,750 pages, no checkpoint at or below: hit 0, junction 3,750; its chunks are
    # 8,192 x 7 = 57,344, then 2,656 to the junction (60,000), then the query's 600. Later
    # requests resume at 3,750 pages: 60,000 tokens, the whole context.
    hits, chunks = serve_one_by_one(scheduler(model), static_context_prompts())
    assert hits == [0, 0, 60_000, 60_000]
    assert chunks[1] == [8192] * 7 + [2656, 600]
    assert chunks[0] == [8192] * 7 + [3256]


@pytest.mark.parametrize("model", MODELS)
def test_long_static_context_misses_with_the_old_placement(model):
    hits, _ = serve_one_by_one(scheduler(model, junctions=False), static_context_prompts())
    assert hits == [0, 0, 0, 0]


def test_a_repeated_branch_point_gets_one_checkpoint():
    # After the junction at 125 pages is cached, a fourth branch resumes there (hit 125 =
    # matched): no new junction, its prompt keeps only its own points.
    sched = scheduler("qwen3-next-80b-a3b")
    serve_one_by_one(sched, branching_prompts()[:2])
    cache = sched.kv.cache
    assert cache is not None
    keys = page_keys_from_tokens(branching_prompts()[3], P)
    hit = cache.match(keys, 2500)
    assert (hit.pages, hit.matched) == (125, 125)
    assert junction_point(cache.geom, hit.pages, hit.matched, len(keys), (128, 156), 32) == 0


GEOM_STATE = CacheGeometry(P, (StatePolicy(0, P), FullPolicy(1, P)))
GEOM_FULL = CacheGeometry(P, (FullPolicy(0, P),))


@pytest.mark.parametrize(("hit", "matched", "n", "points", "gain", "want"), [
    (0, 375, 500, (480, 500), 32, 375),   # the shared-prompt junction
    (0, 375, 500, (480, 500), 376, 375),  # 375 < 376 pages, but >= ceil(375 / 20) = 19
    (372, 375, 500, (480, 500), 4, 0),    # adds 3 < min(4, 19) pages: not worth it
    (371, 375, 500, (480, 500), 4, 375),  # adds 4 = min(4, 19)
    (352, 375, 500, (480, 500), 32, 375),  # 23 >= ceil(375 / 20) = 19: over 5 % of it
    (360, 375, 500, (480, 500), 32, 0),   # 15 < 19 and < 32: not worth it
    (320, 375, 500, (480, 500), 32, 375),  # 55 pages past the hit
    (0, 375, 500, (360, 500), 32, 0),     # own point 360 lies 15 pages below
    (0, 500, 500, (480, 500), 32, 0),     # the whole prompt matches: its own last page
    (0, 600, 500, (480, 500), 32, 0),     # a cached path longer than the prompt
    (375, 375, 500, (480, 500), 32, 0),   # resumable at the match already
    (0, 0, 500, (480, 500), 32, 0),       # nothing matched
])
def test_junction_point_by_hand(hit, matched, n, points, gain, want):
    assert junction_point(GEOM_STATE, hit, matched, n, points, gain) == want


def test_no_junction_on_a_full_attention_chain():
    # Every page boundary resumes there: the hit is the match already.
    assert junction_point(GEOM_FULL, 0, 375, 500, (), 1) == 0
