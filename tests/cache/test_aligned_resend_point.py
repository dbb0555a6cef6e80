"""A block-aligned prompt (``L = nP`` tokens) keeps a resume point at ``n - 1`` pages (its
*resend point*) as well as at ``n``, so its own resend hits ``(L - 1) // P = n - 1`` pages,
the most any hit may cover (one token is always computed), on window, state and
multi-window chains; a prompt that extends it still resumes at ``n``.

The bug (a breaker, round 9): a prompt saved points only every interval and at its last
whole page ``n``; a hit on the same prompt is capped at ``n - 1`` pages, so the point at
``n`` never served the resend: gpt-oss-120b (window bands) resent 1,008 tokens and hit 512,
jet-nemotron-2b (a state band) resent 1,024 and hit 0.

Toy geometry, by hand: ``P = 4`` tokens, points every ``I = 32`` tokens (8 pages); windows
``W = 16`` (a hit after ``q`` pages reads the tail ``[(4q - 15) // 4, q)``: 4 pages) and
``W = 32`` (``[(4q - 31) // 4, q)``: 8 pages; from 0 for ``q <= 7``). The prompt is
``L = 52`` tokens (13 pages, aligned); its resend is capped at ``51 // 4 = 12`` pages.

* Old points 8, 13. State: the deepest checkpoint <= 12 is 8: hit 32 tokens. ``W = 16``:
  the tails kept are ``[4, 8)`` (point 8) and ``[9, 13)`` (point 13, the live window at the
  insert: the next token, 52, reads from token 37 = page 9); a hit after any ``q`` in
  ``9 .. 12`` reads page 8 (``(4q - 15) // 4 <= 8``), which nobody kept: hit 8 = 32 tokens.
  ``W = 32`` alone keeps ``[0, 8)`` and ``[5, 13)``, all of ``[0, 13)`` (12 would hit), but
  with ``W = 16`` beside it the hit is still 8.
* New points 8, 12, 13: the checkpoint (state) and the tails ``[8, 12)`` (``W = 16``) and
  ``[4, 12)`` (``W = 32``) at 12 are kept: hit 12 pages = 48 tokens = ``L - P``; 4
  tokens computed.
* An extension (``L = 60``, its first 52 tokens the same prompt; cap ``59 // 4 = 14``,
  matched 13 pages: page 13 differs) resumes at point 13: 52 tokens under both rules. Had
  the resend point *replaced* the last page's (the rejected alternative), it would
  resume at 12 (48 tokens) on a state chain: ``_ResendInsteadOfEnd`` below.
* ``L = 53`` (13 whole pages, not aligned): cap 13 = the last page; nothing added, hit 52.
"""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import (
    CacheGeometry,
    PrefixCache,
    ResumePolicy,
    resend_point,
    resume_points,
)
from kvchain.errors import InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

P = 4
STATE = declared_class(LC.STATE, 4_000)
FULL = declared_class(LC.FULL, 100)
W16, W32 = declared_class(LC.WINDOW, 100, 16), declared_class(LC.WINDOW, 100, 32)
CHAINS = {
    "state|full": [STATE, FULL],
    "window|full": [W16, FULL],
    "window|window|full": [W16, W32, FULL],
    "state|window|full": [STATE, W16, FULL],
}


class _EndPointOnly(PrefixCache):
    """Planted sibling: the old rule, the prompt's points without its resend point (its
    length not passed on)."""

    def resume_points(self, whole_pages: int, hit: int = 0, matched: int = 0,
                      prompt_tokens: int | None = None) -> tuple[tuple[int, ...], int]:
        return super().resume_points(whole_pages, hit, matched)


class _ResendInsteadOfEnd(PrefixCache):
    """The rejected alternative: the resend point *replaces* the last page's (``n - 1``
    instead of ``n``, last round's ``min(n, (L - 1) // P)``)."""

    def resume_points(self, whole_pages: int, hit: int = 0, matched: int = 0,
                      prompt_tokens: int | None = None) -> tuple[tuple[int, ...], int]:
        pts, junction = super().resume_points(whole_pages, hit, matched, prompt_tokens)
        if prompt_tokens is not None and prompt_tokens == whole_pages * P:
            pts = tuple(q for q in pts if q != whole_pages)
        return pts, junction


def _second_hit(chain: str, first: int, second: int,
                cache: type[PrefixCache] = PrefixCache) -> tuple[int, int]:
    """Run a prompt of ``first`` tokens (2 output tokens) to its end, then one of
    ``second`` tokens sharing its first ``min(first, second)`` tokens, through the
    scheduler with every step audited. Returns the second's ``(hit_tokens, tokens it
    computed of its prompt)``."""
    layout = plan_layout(CHAINS[chain], 400_000, P)
    kv = KVManager(Chain(layout, debug_audit=True),
                   cache(CacheGeometry.of(layout), interval_tokens=32))
    s = Scheduler(kv, SchedulerConfig(max_running=2, chunk_size=64, max_prefill_tokens=64,
                                      audit_every_step=True))
    computed = 0
    t = 0.0
    for rid, length in ((0, first), (1, second)):
        keys = page_keys_from_tokens(list(range(100, 100 + length)), P)
        assert s.add(Request(rid, length, 2, t, page_keys=keys), t)
        while not s.idle:
            batch = s.step(t)
            computed += sum(c.tokens + c.recompute for c in batch.prefills if c.rid == 1)
            s.complete(batch, StepOutcome(0.0), t)
            t += 1.0
    assert s.counters.divergences == 0
    return s.request(1).hit_tokens, computed


def test_the_resend_point_of_a_prompt_by_hand() -> None:
    # min(n, (L - 1) // P): aligned 52 = 13 x 4 -> 12; 53 -> 13; 4 (one page) -> 0 (no
    # point: a hit of one page is capped at 0); keys short of the prompt (13 of 15 pages)
    # -> 13
    assert resend_point(P, 13, 52) == 12
    assert resend_point(P, 13, 53) == 13
    assert resend_point(P, 1, 4) == 0
    assert resend_point(P, 13, 60) == 13
    assert resend_point(16, 63, 1_008) == 62  # gpt-oss-120b's resend: 992 tokens


def test_the_points_of_an_aligned_prompt_gain_its_resend_point() -> None:
    geom = CacheGeometry.of(plan_layout(CHAINS["state|full"], 400_000, P))
    assert resume_points(geom, 13, 8) == (8, 13)  # the length unknown: as before
    assert resume_points(geom, 13, 8, prompt_tokens=52) == (8, 12, 13)
    assert resume_points(geom, 13, 8, prompt_tokens=53) == (8, 13)
    # n - 1 already an interval point (L = 36, 9 pages, interval 8): nothing added
    assert resume_points(geom, 9, 8, prompt_tokens=36) == (8, 9)
    assert resume_points(geom, 1, 8, prompt_tokens=4) == (1,)  # cap 0: no resend point
    cache = PrefixCache(geom, interval_tokens=32)
    assert cache.resume_points(13, prompt_tokens=52) == ((8, 12, 13), 0)


@pytest.mark.parametrize("bad", [51, -1, 52.0, True])
def test_a_prompt_shorter_than_its_keys_is_refused(bad: object) -> None:
    geom = CacheGeometry.of(plan_layout(CHAINS["state|full"], 400_000, P))
    with pytest.raises(InvalidRequestError):
        resume_points(geom, 13, 8, prompt_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        PrefixCache(geom, interval_tokens=32).resume_points(13, prompt_tokens=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("chain", CHAINS)
def test_an_aligned_resend_hits_all_but_its_last_page(chain: str) -> None:
    # L - P = 48 tokens hit, P = 4 computed (the module docstring)
    assert _second_hit(chain, 52, 52) == (48, 4)


@pytest.mark.parametrize("chain", CHAINS)
def test_planted_end_point_only_misses_the_resend(chain: str) -> None:
    # The sibling: the old rule hits the interval point 8 only (32 tokens), 20 computed.
    assert _second_hit(chain, 52, 52, _EndPointOnly) == (32, 20)


@pytest.mark.parametrize("chain", CHAINS)
def test_an_extension_still_resumes_at_the_last_page(chain: str) -> None:
    # the next turn (60 tokens) resumes at point 13: 52 hit, 8 computed. The rejected
    # alternative (no point at 13) resumes at 12 on a state chain (no checkpoint at 13):
    # 48 hit, 12 computed; on a window-only chain the live window at the insert (pages
    # [9, 13), the tail at 13) is cached anyway, so it too resumes at 13.
    assert _second_hit(chain, 52, 60) == (52, 8)
    instead = (48, 12) if chain.startswith("state") else (52, 8)
    assert _second_hit(chain, 52, 60, _ResendInsteadOfEnd) == instead


@pytest.mark.parametrize("chain", CHAINS)
def test_an_unaligned_resend_is_unchanged(chain: str) -> None:
    # L = 53: 13 whole pages, cap 13 = its last point: 52 hit, 1 computed, both rules
    assert _second_hit(chain, 53, 53) == (52, 1)
    assert _second_hit(chain, 53, 53, _EndPointOnly) == (52, 1)


def _model_resend(name: str, prompt: int, cache: type[PrefixCache] = PrefixCache) -> int:
    """The hit tokens of an identical resend of a ``prompt``-token prompt on the model
    ``name`` (16-token pages, a 4 GB buffer, the cache's defaults: 512-token interval,
    ``AUTO`` policy), through the scheduler."""
    from kvchain.catalog.loader import load_model

    layout = plan_layout(load_model(name).classes, 4_000_000_000, 16)
    kv = KVManager(Chain(layout), cache(CacheGeometry.of(layout),
                                        policy=ResumePolicy.AUTO))
    s = Scheduler(kv, SchedulerConfig(max_running=2, chunk_size=2_048,
                                      max_prefill_tokens=2_048))
    keys = page_keys_from_tokens(list(range(100, 100 + prompt)), 16)
    t = 0.0
    for rid in (0, 1):
        assert s.add(Request(rid, prompt, 2, t, page_keys=keys), t)
        while not s.idle:
            batch = s.step(t)
            s.complete(batch, StepOutcome(0.0), t)
            t += 1.0
    return s.request(1).hit_tokens


@pytest.mark.parametrize(("model", "prompt", "hit", "old"), [
    # window bands (W = 128), blocks: points 32, 62, 63 pages; the tail at 62 kept: 992.
    # Old points 32, 63: a hit after 33 .. 62 pages reads pages 32 .. 54, none kept: 512.
    ("gpt-oss-120b", 1_008, 992, 512),
    # a state band, spaced with a budget of 2 (S = 14,745,600 B a slot, 64 pages x 32,768
    # B of full pages < S): old points 64 only, cap 63: no checkpoint, hit 0; now 63, 64:
    # L - P = 1,008.
    ("jet-nemotron-2b", 1_024, 1_008, 0),
])
def test_the_breakers_resends_hit_all_but_the_last_page(model: str, prompt: int, hit: int,
                                                        old: int) -> None:
    assert _model_resend(model, prompt) == hit
    assert _model_resend(model, prompt, _EndPointOnly) == old  # the planted old rule
