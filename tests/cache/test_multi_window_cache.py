"""The prefix cache on chains with several window and chunked-local bands (issue 22 item
5): every band keeps its own tail ``[policy.resume_start(q), q)`` for each resume point
``q``, and a hit ends at the deepest point where every windowed band holds its whole tail
(and the state band a checkpoint). Hit lengths and the pages each band keeps are derived
by hand; planted siblings (a glue that keeps the tail of the first window band only, a
cache that pins the hit's tail in the first window band only) are caught by the hit
lengths and by the audit.

Shared system prompt: 8 prompts of 6,000 shared + 2,000 own tokens (500 whole pages of
P = 16 tokens each, the shared part 375 pages), served one after the other with memory to
spare; no state band, so the placement is ``blocks``: resume points every 512 tokens (32
pages) and the last whole page, 32, 64, ..., 480 and 500.

Tails (``resume_start``, P = 16):
* window W = 128: ``first_page(16 q) = (16 q - 127) // 16 = q - 8``: 8 pages ``[q - 8, q)``;
* window W = 1,024: ``(16 q - 1023) // 16 = q - 64``: 64 pages;
* chunked local C = 2,048 tokens (128 pages): ``floor(q / 128) * 128``: the pages of the
  current chunk, none at a chunk boundary.
"""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests import cache_glue, manager
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

P = 16
SHAPES = {
    "window128|window1024|full": [declared_class(LC.FULL, 1_000),
                                  declared_class(LC.WINDOW, 1_000, 128),
                                  declared_class(LC.WINDOW, 500, 1_024)],
    "window128|local2048|full": [declared_class(LC.FULL, 1_000),
                                 declared_class(LC.WINDOW, 1_000, 128),
                                 declared_class(LC.LOCAL, 500, 2_048)],
    "window128|full": [declared_class(LC.FULL, 1_000), declared_class(LC.WINDOW, 1_000, 128)],
}


def scheduler(shape: str, cache_cls: type = PrefixCache) -> Scheduler:
    layout = plan_layout(SHAPES[shape], 400_000_000, P)
    cache = cache_cls(CacheGeometry.of(layout), interval_tokens=512,
                      policy=ResumePolicy.AUTO)
    return Scheduler(KVManager(Chain(layout), cache),
                     SchedulerConfig(max_prefill_tokens=8192, chunk_size=8192))


def tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 + seed * 50_000 for i in range(n)]


PROMPTS = [tokens(1, 6000) + tokens(10 + i, 2000) for i in range(8)]


def serve(sched: Scheduler, prompts: list[list[int]]) -> list[int]:
    """Each prompt alone, to the end (2 output tokens), the audit after each; returns the
    hit tokens of every request."""
    hits = []
    now = 0.0
    for rid, prompt in enumerate(prompts):
        sched.add(Request(rid, len(prompt), 2, now,
                          page_keys=page_keys_from_tokens(prompt, P)), now)
        for _ in range(1000):
            batch = sched.step(now)
            now += 0.01
            sched.complete(batch, StepOutcome(0.01, frozenset()), now)
            sched.drain_events()
            sched.audit()
            if sched.idle:
                break
        assert sched.idle
        hits.append(sched.request(rid).hit_tokens)
    c = sched.counters
    assert c.divergences == 0 and c.finished == len(prompts) and c.retractions == 0
    return hits


def bands(sched: Scheduler) -> dict[str, int]:
    """Band index by role: ``full``, ``w<W>`` for a window, ``c<C>`` for a local band."""
    g = sched.kv.geom
    out = {"full": g.full}
    for pol in g.windows:
        out[("w" if pol.kind == "window" else "c") + str(pol.tokens)] = pol.band
    return out  # type: ignore[return-value]


def test_two_window_sizes_hit_where_both_tails_are():
    # Request 0: empty cache, hit 0. Request 1 matches 375 pages; the deepest t <= 375
    # where both tails are present: W = 128 keeps only [q - 8, q) at the points q (multiples
    # of 32), so t = 352 (5,632 tokens; W = 1,024's [288, 352) is there: its tails overlap
    # into [0, 500)). Its junction: 375 - 352 = 23 pages >= min(32, ceil(375 / 20) = 19):
    # kept at 375 in both bands. Requests 2..7 resume at 375 pages = 6,000 tokens.
    sched = scheduler("window128|window1024|full")
    hits = serve(sched, PROMPTS)
    assert hits == [0, 5632] + [6000] * 6
    cache = sched.kv.cache
    assert cache is not None and cache.evictions == 0
    b = bands(sched)
    hit = cache.match(page_keys_from_tokens(tokens(1, 6000) + tokens(99, 2000), P), 8000)
    assert hit.pages == 375
    assert {band: len(ids) for band, ids in hit.window.items()} == {b["w128"]: 8,
                                                                     b["w1024"]: 64}
    assert hit.window_first == {b["w128"]: 367, b["w1024"]: 311}
    # Pages kept per band. Full: 375 shared + 8 x 125 own = 1,375. W = 128: request 0's
    # 15 points <= 480 and 500, 8 pages each = 128 (88 of them at the 11 points <= 352 on
    # the shared path); request 1 adds the junction's [367, 375) and 5 points in its own
    # part (40); each of the other 6 its own 40: 128 + 48 + 240 = 416; and every prompt
    # (8,000 = 500 x 16 tokens: block-aligned) keeps its resend point 499, whose tail
    # [491, 499) adds page 491 to the tail [492, 500) of 500: 416 + 8 = 424. W = 1,024: request 0
    # keeps [0, 480) u [436, 500) = all 500; every later one its own part [375, 500) (125
    # pages; request 1's [352, 375) duplicates the cache's and is released): 500 + 7 x 125.
    held = cache.held_counts
    assert (held[b["full"]], held[b["w128"]], held[b["w1024"]]) == (1375, 424, 1375)


def test_a_window_and_a_chunked_local_band_hit_where_both_tails_are():
    # Local C = 2,048 (128 pages): tails [floor(q / 128) * 128, q). Request 1's deepest t <=
    # 375: W = 128 needs t a point (352), local needs [256, 352) (request 0's tail of 352):
    # hit 352; junction at 375 as above. Requests 2..7: W = 128 [367, 375) and local
    # [256, 375) ([256, 352) from request 0, [352, 375) from request 1's junction): 375.
    sched = scheduler("window128|local2048|full")
    hits = serve(sched, PROMPTS)
    assert hits == [0, 5632] + [6000] * 6
    cache = sched.kv.cache
    assert cache is not None and cache.evictions == 0
    b = bands(sched)
    hit = cache.match(page_keys_from_tokens(tokens(1, 6000) + tokens(99, 2000), P), 8000)
    assert hit.pages == 375
    assert {band: len(ids) for band, ids in hit.window.items()} == {b["w128"]: 8,
                                                                     b["c2048"]: 119}
    # Local pages kept: request 0 [0, 96) u [128, 224) u [256, 352) u [384, 500) = 404
    # (its points 96, 224, 352, 480 and 500; 128, 256 and 384 keep none); request 1 the
    # junction's [352, 375) and its own [384, 500): 23 + 116; the 6 others 116 each:
    # 404 + 139 + 696 = 1,239 (the resend point 499's tail [384, 499) is inside the one
    # of 500). W = 128: 424, as in the test above.
    held = cache.held_counts
    assert (held[b["full"]], held[b["w128"]], held[b["c2048"]]) == (1375, 424, 1239)


def test_the_same_trace_on_one_window_band_hits_the_same():
    # One window W = 128: the same derivation, W = 128 alone decides: [0, 5,632, 6,000 x 6].
    assert serve(scheduler("window128|full"), PROMPTS) == [0, 5632] + [6000] * 6


class FirstWindowOnlyGlue(cache_glue.CacheGlue):
    """Planted defect: keeps the tails of the first window band only (the others' tail
    pages are released as the window moves, as without a cache)."""

    def attach(self, rid, facts, keys, prompt_tokens, save_points,  # type: ignore[no-untyped-def]
               max_gap=0):
        h = super().attach(rid, facts, keys, prompt_tokens, save_points, max_gap)
        first = self.geom.windows[0].band
        facts.retain = {b: s for b, s in facts.retain.items() if b == first}
        return h


@pytest.mark.parametrize("shape", ["window128|window1024|full", "window128|local2048|full"])
def test_a_glue_keeping_the_first_window_bands_tail_only_loses_the_hits(monkeypatch, shape):
    # The second windowed band keeps only the pages its window covers at each chunk's end
    # (inserted there): request 0's one chunk ends at 500 pages ([436, 500) or
    # [384, 500)): no hit point <= 375 has its tail there, so request 1 hits nothing
    # (against 5,632 above). Request 1's prefill is cut at its junction, 375 pages (the
    # scheduler's chunk cut), so the commit there inserts its window [311, 375) (local:
    # [256, 375)) as it stands: requests 2..7 still hit 6,000 tokens.
    monkeypatch.setattr(manager, "CacheGlue", FirstWindowOnlyGlue)
    assert serve(scheduler(shape), PROMPTS) == [0, 0] + [6000] * 6


class FirstWindowPinsCache(PrefixCache):
    """Planted defect: pins (and unpins) a hit's tail in the first window band only, so
    the other bands' pages a running request reads stay evictable."""

    def pin_window(self, handle, band, pages):  # type: ignore[no-untyped-def]
        if band == self.geom.windows[0].band:
            super().pin_window(handle, band, pages)

    def unpin_window(self, handle, band, pages):  # type: ignore[no-untyped-def]
        if band == self.geom.windows[0].band:
            super().unpin_window(handle, band, pages)


def test_a_cache_pinning_the_first_window_band_only_is_caught_by_the_audit():
    sched = scheduler("window128|window1024|full", cache_cls=FirstWindowPinsCache)
    with pytest.raises(AuditError, match="window page pins"):
        serve(sched, PROMPTS[:2])
