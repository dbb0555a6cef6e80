"""Partial prefix-cache hits (issue 22 item 3, ``--partial-hits``, off by default).

On a chain with a state band an ordinary hit ends at the deepest checkpoint ``C`` on the
matched path. A partial hit shares the cache's full (and window) pages up to ``H``, the
deepest page count ``<= C + max_gap`` (and the match cap) where every window band holds its
tail, copies the checkpoint at ``C`` (none at 0), and its first chunk recomputes the gap
``[C, H)`` (every layer runs; no KV is written there) before its own tokens. Pages are
saved, not compute: the hit rate counts ``C``, ``partial_tokens`` the gap.

Layouts: qwen3-next-80b-a3b at 16 GiB (state S = 39,518,208 B, full E = 393,216 B per
page, P = 16 tokens); a declared full + window + state chain. Spaced points of an
8,000-token prompt (500 whole pages, interval 32 pages) on qwen3-next at 16 GiB:
``C = min(6, 4) = 4`` points, ``K = ceil(15 / 3) = 5``: 160, 320, 480, 500 pages
(and 499, the resend point of a block-aligned prompt: 8,000 = 500 x 16 tokens)
(tests/cache/test_spaced_checkpoints.py derives them).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy
from kvchain.catalog.loader import load_model
from kvchain.errors import AuditError, InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

from .test_junction_checkpoints import tokens

P = 16
GIB = 1 << 30


class CountingChain(Chain):
    """A chain that counts the pages (state slots) taken per band: what a hit spares."""

    def __init__(self, layout):  # type: ignore[no-untyped-def]
        self.taken = [0] * len(layout.bands)
        super().__init__(layout)
        self.taken = [0] * len(layout.bands)  # not the null pages the chain reserves

    def take(self, demand, quote=None, copies=()):  # type: ignore[no-untyped-def]
        grant = super().take(demand, quote, copies)
        for b, n in enumerate(demand.pages):
            self.taken[b] += n
        return grant


def qwen_scheduler(partial: bool, buffer_bytes: int = 16 * GIB, *,
                   policy: ResumePolicy = ResumePolicy.AUTO, chunk: int = 8192) -> Scheduler:
    """qwen3-next-80b-a3b at ``buffer_bytes``, resume interval 512 tokens, ``chunk``
    prefill tokens per step and per chunk, audits after every step."""
    layout = plan_layout(load_model("qwen3-next-80b-a3b").classes, buffer_bytes, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=512, policy=policy)
    return Scheduler(KVManager(CountingChain(layout), cache),
                     SchedulerConfig(max_prefill_tokens=chunk, chunk_size=chunk,
                                     partial_hits=partial, audit_every_step=True))


def serve(sched: Scheduler, prompts: list[list[int]]):  # type: ignore[no-untyped-def]
    """Each prompt alone to the end (2 output tokens), the audits after every step.
    Returns per request: hit tokens, prefill chunks as (tokens, recompute), and the
    pages it took per band (the chain's takes while it ran)."""
    hits, chunks, taken = [], [], []
    now = 0.0
    chain = sched.chain
    for rid, prompt in enumerate(prompts):
        before = list(chain.taken)
        sched.add(Request(rid, len(prompt), 2, now,
                          page_keys=page_keys_from_tokens(prompt, P)), now)
        sizes: list[tuple[int, int]] = []
        for _ in range(1000):
            batch = sched.step(now)
            sizes += [(c.tokens, c.recompute) for c in batch.prefills if c.rid == rid]
            now += 0.01
            sched.complete(batch, StepOutcome(0.01, frozenset()), now)
            sched.drain_events()
            if sched.idle:
                break
        assert sched.idle
        sched.audit()
        hits.append(sched.request(rid).hit_tokens)
        chunks.append(sizes)
        taken.append([a - b for a, b in zip(chain.taken, before, strict=True)])
    return hits, chunks, taken


SHARED = [tokens(1, 6000) + tokens(10 + i, 2000) for i in range(8)]


def test_shared_system_prompt_partial_hit_reuses_the_gap_pages():
    # Request 1's keys match 375 pages (6,000 / 16); its deepest checkpoint on the path is
    # request 0's spaced point C = 320 (5,120 tokens). Partial: H = 375 (no window band:
    # every page boundary holds its "tails"; the cap is min(375, 7,999 // 16 = 499)), gap
    # 55 pages = 880 tokens. Its full pages: [375, 500) for the prompt + page 500 for the
    # second output token (position 8,000) = 126, against [320, 501) = 181 for the hit
    # at C: the 55 gap pages are the cache's. Its state slots: the working one, and
    # checkpoints at 375 (the junction: from C, 375 - 320 = 55 >= 32 pages; the state
    # passes H at the gap's end), 480, 499 (the resend point: 8,000 = 500 x 16 tokens is
    # block-aligned) and 500: 5 either way. One chunk: 2,000 tokens after
    # recomputing 880 (the junction at H needs no cut). Requests 2..7 hit the junction at
    # 375 whole: 6,000 tokens, no gap. Hit tokens count C for request 1 (compute saved).
    sched = qwen_scheduler(partial=True)
    hits, chunks, taken = serve(sched, SHARED)
    assert hits == [0, 5120] + [6000] * 6
    assert chunks[1] == [(2000, 880)]
    assert chunks[2] == [(2000, 0)]
    state, full = 0, 1
    assert taken[1][full] == 126 and taken[1][state] == 5
    assert taken[2][full] == 126 - 0  # [375, 501): an ordinary hit at 375
    c = sched.counters
    assert (c.partial_hits, c.partial_tokens) == (1, 880)
    assert sched.kv.glue.cow_state_copies == 7  # request 1 copied C's checkpoint, 2..7 H's


def test_without_partial_hits_the_hit_stops_at_the_checkpoint():
    # The default: request 1 hits C = 320 pages and recomputes [320, 375) as its own
    # prefill (the junction cut: 880, then 2,000 tokens), taking [320, 501) = 181 full
    # pages and 5 state slots (as above).
    sched = qwen_scheduler(partial=False)
    hits, chunks, taken = serve(sched, SHARED)
    assert hits == [0, 5120] + [6000] * 6
    assert chunks[1] == [(880, 0), (2000, 0)]
    assert taken[1][1] == 181 and taken[1][0] == 5
    assert (sched.counters.partial_hits, sched.counters.partial_tokens) == (0, 0)


def test_a_partial_hit_from_a_fresh_state():
    # ends placement (points 480, 499, 500 only): request 1 has no checkpoint at or below 375,
    # so C = 0: the partial hit shares 375 pages and recomputes all 6,000 tokens from a
    # fresh state (no copy); its full pages are 126 instead of 501.
    sched = qwen_scheduler(True, policy=ResumePolicy.ENDS, chunk=8192)
    hits, chunks, taken = serve(sched, SHARED[:3])
    assert hits == [0, 0, 6000]
    assert chunks[1] == [(2000, 6000)]
    assert taken[1][1] == 126
    assert sched.kv.glue.cow_state_copies == 1  # request 2 only: request 1 started fresh


def test_a_gap_past_the_chunk_is_shortened():
    # chunk 4,096 tokens: max_gap = 4,096 // 16 - 1 = 255 pages. Fresh state (ends), 375
    # pages matched: H = min(375, 0 + 255) = 255 pages (4,080 tokens), gap 4,080; the
    # first chunk is 4,096 - 4,080 = 16 tokens (one page), then the rest in chunks.
    sched = qwen_scheduler(True, policy=ResumePolicy.ENDS, chunk=4096)
    hits, chunks, _ = serve(sched, SHARED[:2])
    assert hits == [0, 0]
    assert chunks[1][0] == (16, 4080)
    assert sum(t for t, _ in chunks[1]) == 8000 - 4080


# --- the audit: a request resumes at a checkpoint it really has ---------------------------

def attached_manager():  # type: ignore[no-untyped-def]
    """Request 0 (8,000 tokens, spaced points 160, 320, 480, 500 and its resend point
    499) inserted; request 1 (6,000 shared) attached with partial hits: H = 375, C =
    320."""
    sched = qwen_scheduler(partial=False)
    serve(sched, SHARED[:1])
    kv = sched.kv
    hit = kv.attach(1, page_keys_from_tokens(SHARED[1], P), 8000, True, max_gap=511)
    return kv, hit


def test_the_attach_of_a_partial_hit():
    kv, hit = attached_manager()
    view = kv.pages(1)
    assert hit == 6000 and view.tokens == 6000 and view.shared == 375
    assert kv.recompute_tokens(1) == 880 and kv.hit_tokens(1) == 5120
    assert kv.partial_tokens(1) == 880
    assert view.cow_src >= 0 and view.points == (375, 480, 499, 500)
    kv.audit()  # consistent: 320 x 16 + 880 = 6,000 and the cache has 320's checkpoint
    kv.detach(1)
    kv.audit()


@pytest.mark.parametrize("defect", ["gap_dropped", "state_at_h"])
def test_a_request_resuming_where_no_checkpoint_is_fails_the_audit(defect):
    # Planted: the gap forgotten (the state would resume at C but the prefill at H), or
    # the state taken at H (no checkpoint there: 375 is not one of request 0's points).
    kv, _ = attached_manager()
    facts = kv._facts(1)
    facts.gap = 0
    if defect == "state_at_h":
        facts.cow_at = 375
    with pytest.raises(AuditError):
        kv.audit()


def test_a_chunk_that_skips_the_gap_is_refused():
    # Planted: a scheduler that does not recompute the gap (nor charge it to the token
    # budget): the step is refused before anything changes.
    class SkipsGap(Scheduler):
        def schedule(self, now):  # type: ignore[no-untyped-def]
            step = super().schedule(now)
            step.prefills[:] = [replace(p, recompute=0) for p in step.prefills]
            return step

    layout = plan_layout(load_model("qwen3-next-80b-a3b").classes, 16 * GIB, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=512,
                        policy=ResumePolicy.AUTO)
    sched = SkipsGap(KVManager(CountingChain(layout), cache),
                     SchedulerConfig(max_prefill_tokens=8192, chunk_size=8192,
                                     partial_hits=True))
    with pytest.raises(InvalidRequestError, match="recomputes 0 tokens"):
        serve(sched, SHARED[:2])  # request 0 runs; request 1's partial chunk is refused


# --- window + state: H stops where a window tail is missing -----------------------------

WINDOW_STATE = [declared_class(LC.FULL, 1_000), declared_class(LC.WINDOW, 1_000, 128),
                declared_class(LC.STATE, 50_000)]


def window_state_cache() -> tuple[PrefixCache, list[int]]:
    """A 40-page path inserted by hand: window band (W = 128: a tail is the 8 pages
    before its point) present on pages [0, 30) only, one checkpoint at 10 pages."""
    layout = plan_layout(WINDOW_STATE, 400_000_000, P)
    g = CacheGeometry.of(layout)
    cache = PrefixCache(g, interval_tokens=512, policy=ResumePolicy.BLOCKS)
    keys = page_keys_from_tokens(tokens(3, 40 * P), P)
    wband = g.windows[0].band
    full = {b: list(range(1000, 1040)) for b in g.fulls}
    cache.insert(keys, 0, full, {wband: {i: 2000 + i for i in range(30)}}, {10: 3000})
    return cache, keys


def test_window_state_partial_hit_stops_where_a_tail_is_missing():
    # The prompt is the path + 1 token: cap = min(40, 640 // 16) = 40 pages. Ordinary hit:
    # the checkpoint at 10 with its tail [2, 10) present: C = 10. Partial: the deepest
    # u <= 40 whose tail [u - 8, u) is present: pages < 30 are, page 30 is not: H = 30
    # (u = 31..40 need page 30). The checkpoint copied is C's, the gap 20 pages.
    cache, keys = window_state_cache()
    hit = cache.match(keys, 40 * P + 1, max_gap=100)
    assert (hit.pages, hit.gap, hit.checkpoint, hit.matched) == (30, 20, 3000, 40)
    wband = cache.geom.windows[0].band
    assert hit.window[wband] == tuple(2000 + i for i in range(22, 30))
    # max_gap caps H at C + 15 = 25 (tail [17, 25) present); without it, the ordinary hit.
    assert (cache.match(keys, 40 * P + 1, max_gap=15).pages, ) == (25, )
    plain = cache.match(keys, 40 * P + 1)
    assert (plain.pages, plain.gap, plain.checkpoint) == (10, 0, 3000)


def test_a_negative_max_gap_is_refused():
    cache, keys = window_state_cache()
    with pytest.raises(InvalidRequestError):
        cache.match(keys, 40 * P + 1, max_gap=-1)


def test_window_state_chain_with_overlapping_tails_reuses_the_gap():
    # full + window (W = 1,024: 64-page tails) + state, blocks points every 32 pages: the
    # tails of consecutive points overlap, so request 0 leaves every window page of
    # [0, 500) present. Request 1 (6,000 shared: 375 pages): C = 352 (11 x 32), H = 375
    # (tail [311, 375) present), gap 23 pages = 368 tokens; its junction from C at 375
    # (gain 23 >= min(32, ceil(375 / 20) = 19)) is H: kept at the gap's end. Requests 2..
    # hit 375 whole. Full pages of request 1: [375, 501) = 126 (181 - 55 would be at 320;
    # at C = 352: [352, 501) = 149).
    classes = [declared_class(LC.FULL, 1_000), declared_class(LC.WINDOW, 1_000, 1_024),
               declared_class(LC.STATE, 50_000)]
    out = {}
    for partial in (False, True):
        layout = plan_layout(classes, 400_000_000, P)
        cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=512,
                            policy=ResumePolicy.BLOCKS)
        sched = Scheduler(KVManager(CountingChain(layout), cache),
                          SchedulerConfig(max_prefill_tokens=8192, chunk_size=8192,
                                          partial_hits=partial, audit_every_step=True))
        full = layout.index_of(LC.FULL)
        hits, chunks, taken = serve(sched, SHARED[:4])
        out[partial] = (hits, chunks[1], taken[1][full])
    assert out[False] == ([0, 5632, 6000, 6000], [(368, 0), (2000, 0)], 149)
    assert out[True] == ([0, 5632, 6000, 6000], [(2000, 368)], 126)


def test_the_gap_takes_the_steps_token_budget():
    # 4,096 prefill tokens per step (chunk 4,096). Request 1 (partial, fresh state under
    # ends: gap 4,080 tokens, first chunk 16) and request 2 (a cold 100-token prompt)
    # wait together: request 1's first chunk takes 16 + 4,080 = 4,096 tokens, the whole
    # budget, so request 2 starts only in the next step (with 4,096 - 16 = 4,080 left for
    # it, had the gap not been charged, it would have started in the same step).
    sched = qwen_scheduler(True, policy=ResumePolicy.ENDS, chunk=4096)
    serve(sched, SHARED[:1])
    now = 100.0
    sched.add(Request(1, 8000, 2, now, page_keys=page_keys_from_tokens(SHARED[1], P)), now)
    sched.add(Request(2, 100, 2, now, page_keys=page_keys_from_tokens(tokens(9, 100), P)),
              now)
    first = sched.step(now)
    assert [(c.rid, c.tokens, c.recompute) for c in first.prefills] == [(1, 16, 4080)]
    sched.complete(first, StepOutcome(0.01, frozenset()), now + 0.01)
    second = sched.step(now + 0.01)
    assert (2, 100, 0) in [(c.rid, c.tokens, c.recompute) for c in second.prefills]
