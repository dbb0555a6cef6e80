"""An identical resend of a block-aligned prompt on a state hybrid: its hit leaves at least
one token to compute (the logits of the next token), at the deepest checkpoint at or below
``(L - 1) // P`` pages.

Round 9 pinned what kvchain did: ``PrefixCache.match`` caps a hit at ``(L - 1) // P`` pages
and, on a chain with a state band, ends it at the deepest checkpoint at or below the cap;
but a block-aligned prompt saved its last checkpoint at ``L / P``, which serves prompts
that extend it, never its own resend, so the resend fell back to the interval point below
(a breaker found the cost: jet-nemotron-2b resent 1,024 tokens and hit 0). Round 10: such
a prompt also saves its *resend point* ``L / P - 1``
(:func:`kvchain.cache.radix.resend_point`), so the resend hits the cap.

The geometry, by hand: ``P = 4`` tokens, a state band (one slot), optionally a window band
(``W = 8``), a full band; resume points every ``I`` tokens, the prompt's last whole page and
its resend point (:func:`kvchain.cache.radix.resume_points`). Request 0 runs the prompt
``L`` and finishes (its prompt stays cached); request 1 sends the same prompt.

* ``L = 16``, ``I = 8`` (2 pages): points 2, 3 (resend), 4; cap ``15 // 4 = 3``: hit 12
  tokens, its chunk computes tokens 12 .. 15 (4 tokens). Round 9: points 2, 4, hit 8.
* ``L = 16``, ``I = 4``: points 1 .. 4 (3 an interval point already); hit 3 pages = 12
  tokens, 4 computed (unchanged).
* ``L = 15``, ``I = 8``: points 2, 3 (3 whole pages, not aligned: no resend point); cap
  ``14 // 4 = 3``: hit 12, 3 computed (unchanged).
* ``L = 8``, ``I = 8``: points 1 (resend), 2; cap 1: hit 4, 4 computed. Round 9: point
  2 only, hit 0, all 8 computed.
* ``L = 16``, ``I = 8`` with partial hits: the checkpoint at the cap 3 exists, so the hit
  is an ordinary one (no gap): start 12, nothing recomputed, ``hit_tokens`` 12. Round 9:
  pages to 3, state from 2, a 4-token gap recomputed, ``hit_tokens`` 8.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, Hit, PrefixCache
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

P = 4
STATE, WINDOW, FULL = (declared_class(LC.STATE, 4_000), declared_class(LC.WINDOW, 100, 8),
                       declared_class(LC.FULL, 100))
CHAINS = {"state|full": [STATE, FULL], "state|window|full": [STATE, WINDOW, FULL]}


class _NoTokenLeft(PrefixCache):
    """Planted defect: a match capped at ``L // P`` pages (the one-token rule dropped)."""

    def match(self, keys: Sequence[int], prompt_tokens: int, max_gap: int = 0) -> Hit:
        return super().match(keys, prompt_tokens + 1, max_gap)


def _resend(chain: str, interval: int, prompt: int, partial: bool = False,
            cache: type[PrefixCache] = PrefixCache) -> tuple[int, tuple[int, int, int, int]]:
    """Run request 0 (the prompt, 2 output tokens) to its end, then request 1 (the same
    prompt). Returns request 1's ``hit_tokens`` and its first chunk ``(start, tokens,
    recompute, left)``, ``left`` = prompt tokens it computes (``L - start + recompute``)."""
    layout = plan_layout(CHAINS[chain], 400_000, P)
    kv = KVManager(Chain(layout, debug_audit=True),
                   cache(CacheGeometry.of(layout), interval_tokens=interval))
    s = Scheduler(kv, SchedulerConfig(max_running=2, chunk_size=64, max_prefill_tokens=64,
                                      audit_every_step=True, partial_hits=partial))
    keys = page_keys_from_tokens(list(range(100, 100 + prompt)), P)
    first = None
    t = 0.0
    for rid in (0, 1):
        assert s.add(Request(rid, prompt, 2, t, page_keys=keys), t)
        while not s.idle:
            batch = s.step(t)
            for c in batch.prefills:
                if c.rid == 1 and first is None:
                    first = (c.start, c.tokens, c.recompute, prompt - c.start + c.recompute)
            s.complete(batch, StepOutcome(0.0), t)
            t += 1.0
    assert first is not None
    return s.request(1).hit_tokens, first


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize(("interval", "prompt", "partial", "hit", "chunk"), [
    (8, 16, False, 12, (12, 4, 0, 4)),
    (4, 16, False, 12, (12, 4, 0, 4)),
    (8, 15, False, 12, (12, 3, 0, 3)),
    (8, 8, False, 4, (4, 4, 0, 4)),
    (8, 16, True, 12, (12, 4, 0, 4)),
])
def test_aligned_resend_hits_the_deepest_checkpoint_below_the_last_token(
        chain: str, interval: int, prompt: int, partial: bool, hit: int,
        chunk: tuple[int, int, int, int]) -> None:
    assert _resend(chain, interval, prompt, partial) == (hit, chunk)


def test_planted_cap_at_the_last_page_leaves_no_token() -> None:
    """The sibling: without the one-token cap the aligned resend (``L = 16``, ``I = 8``)
    matches its last checkpoint at 4 pages, all 16 tokens, leaving none to compute (no
    logits): the manager's attach returns 16. The scheduler then finds no chunk to run
    for the rest (0 tokens), undoes the hit and serves the prompt uncached: hit 0, 16
    tokens computed instead of the 4 above."""
    layout = plan_layout(CHAINS["state|full"], 400_000, P)
    kv = KVManager(Chain(layout), _NoTokenLeft(CacheGeometry.of(layout), interval_tokens=8))
    keys = page_keys_from_tokens(list(range(100, 116)), P)
    assert kv.attach(0, keys, 16) == 0
    kv.allocate([(0, 16)])
    kv.commit(0, 16)
    kv.free(0)
    assert kv.attach(1, keys, 16) == 16  # L - 16 = 0 tokens left to compute
    assert _resend("state|full", 8, 16, cache=_NoTokenLeft) == (0, (0, 16, 0, 16))


class _EndPointOnly(PrefixCache):
    """Planted defect: the round-9 points (the prompt's length not passed on: no resend
    point)."""

    def resume_points(self, whole_pages: int, hit: int = 0, matched: int = 0,
                      prompt_tokens: int | None = None) -> tuple[tuple[int, ...], int]:
        return super().resume_points(whole_pages, hit, matched)


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize(("interval", "prompt", "partial", "hit", "chunk"), [
    (8, 16, False, 8, (8, 8, 0, 8)),
    (8, 8, False, 0, (0, 8, 0, 8)),
    (8, 16, True, 8, (12, 4, 4, 8)),
])
def test_planted_end_point_only_gives_the_round_9_values(
        chain: str, interval: int, prompt: int, partial: bool, hit: int,
        chunk: tuple[int, int, int, int]) -> None:
    """The sibling of the three rows the resend point moved: without it they fall back to
    round 9's values (module docstring): the checkpoint below the cap is the interval's."""
    assert _resend(chain, interval, prompt, partial, _EndPointOnly) == (hit, chunk)
