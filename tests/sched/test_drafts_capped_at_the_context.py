"""Drafts near the end of the context: a request whose prompt + output fills the model's
context ``C`` exactly must not be priced (nor allocated) KV past ``C``.

Chain: one full class of 1 B per token, ``P = 16``, ``C = 64`` (``max_context_tokens``),
``k = 3``. Request (60 prompt, 4 output): 60 + 4 = 64 = C, so it is admitted. Its KV never
needs more than ``C = 64`` tokens = 4 pages: positions past ``C - 1`` do not exist, so an
engine drafts at most ``C - L - 1`` tokens at length ``L`` (vLLM's scheduler cuts a
step's tokens, drafts included, at ``max_model_len - 1 - num_computed_tokens``). kvchain
priced ``prompt + output - 1 + k = 66`` tokens (5 pages) and each decode drafted ``k``
whatever its length. Now the last step's drafts are cut at the context
(:func:`context_drafts`) in the lifetime, the reservations and the decode batch (a step's
drafts are the least any of its decodes may take), so the request runs on a 4-page chain.
"""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.demand import context_drafts, lifetime_demand
from kvchain.requests.manager import KVManager
from kvchain.sched.request import DecodeSeq, Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

C, K, P = 64, 3, 16


def test_lifetime_demand_stays_within_the_context() -> None:
    layout = plan_layout([declared_class(LC.FULL, 1)], 64 * 16, 16)
    kv = KVManager(Chain(layout), spec_tokens=3)
    sched = Scheduler(kv, SchedulerConfig(max_context_tokens=64))
    # capped: ceil(64 / 16) = 4 full pages (uncapped: ceil(66 / 16) = 5)
    assert sched._lifetime_demand(60, 4).pages == (4,)


def test_context_drafts() -> None:
    # min(k, C - 1 - L), never below 0; no context: k
    assert context_drafts(3, 60, 64) == 3  # 64 - 1 - 60 = 3
    assert context_drafts(3, 61, 64) == 2
    assert context_drafts(3, 62, 64) == 1
    assert context_drafts(3, 63, 64) == 0
    assert context_drafts(3, 70, 64) == 0
    assert context_drafts(3, 62, None) == 3


def test_lifetime_demand_without_a_context_is_uncapped() -> None:
    geom = KVManager(Chain(plan_layout([declared_class(LC.FULL, 1)], 64 * 16, P)),
                     spec_tokens=K).geom
    assert lifetime_demand(geom, 60, 4).pages == (5,)  # 60 + 4 - 1 + 3 = 66 -> 5 pages
    assert lifetime_demand(geom, 60, 4, context=C).pages == (4,)  # 63 + 1 = 64 -> 4
    # far from the context the drafts are whole: 20 + 4 - 1 + 3 = 26 -> 2 pages
    assert lifetime_demand(geom, 20, 4, context=C).pages == (2,)
    # an output limit past the context is cut at it: min(60 + 10 - 1, 64) + 0 -> 4 pages
    assert lifetime_demand(geom, 60, 10, context=C).pages == (4,)


def _run(sched: Scheduler, max_steps: int = 20) -> list[int]:
    """Drive ``sched`` to idle (every draft rejected) with audits; the drafts per decode
    step."""
    drafts, now = [], 0.0
    for _ in range(max_steps):
        if sched.idle:
            break
        batch = sched.step(now)
        if batch.decodes:
            drafts.append(batch.decodes[0].drafts)
        now += 1.0
        sched.complete(batch, StepOutcome(1.0, accepted={}), now)
    return drafts


def _four_page_scheduler(cls: type[Scheduler] = Scheduler) -> Scheduler:
    # one full band, 1 B per token, P = 16: 64 B = exactly 4 pages (no null page)
    layout = plan_layout([declared_class(LC.FULL, 1)], 64, P)
    return cls(KVManager(Chain(layout), spec_tokens=K),
               SchedulerConfig(max_context_tokens=C, audit_every_step=True))


def test_a_request_filling_its_context_runs_on_its_context_pages() -> None:
    sched = _four_page_scheduler()
    assert sched.add(Request(0, 60, 4, 0.0), 0.0)  # lifetime 64 tokens = 4 pages: fits
    # prefill 60 (1st token), then every draft rejected: decodes at L = 60, 61, 62 draft
    # min(3, 63 - L) = 3, 2, 1, each step's 1 + d tokens ending at position 63 (64 tokens,
    # the 4 pages); each keeps 1 token: output 1 -> 4, done.
    assert _run(sched) == [3, 2, 1]
    assert sched.idle and sched.counters.retractions == 0
    assert sched.counters.divergences == 0 and not sched.unallocatable
    assert sched.counters.drafted_tokens == 3 + 2 + 1


class _UncappedDecodes(Scheduler):
    """Planted: the decode batch drafts k whatever the request's length (the old rule)."""

    def _step_drafts(self, drafts: int, decoding: object) -> int:  # type: ignore[override]
        return drafts


def test_planted_uncapped_decodes_are_retracted() -> None:
    sched = _four_page_scheduler(_UncappedDecodes)
    assert sched.add(Request(0, 60, 4, 0.0), 0.0)  # the lifetime is still capped: admitted
    # prefill 60; decode at L = 60: 1 + 3 tokens, 64 (fits); at L = 61 a step of 1 + 3
    # tokens needs 65 tokens = 5 pages of the 4: the decode check retracts the request,
    # which recomputes its 62 tokens (prompt + 2 generated, sampling the 3rd); at L = 62
    # 66 tokens: retracted again, recomputes 63 and samples the 4th: 2 retractions that
    # the capped drafts never cause (0 above), 4 steps, one of them a decode.
    assert _run(sched) == [3]
    assert sched.counters.retractions == 2 and sched.counters.steps == 4 and sched.idle


def test_a_decode_far_from_the_context_keeps_its_drafts() -> None:
    sched = _four_page_scheduler()
    assert sched.add(Request(0, 16, 4, 0.0), 0.0)
    # L = 16, 17, 18: min(3, 63 - L) = 3 each (the cap does not bind)
    assert _run(sched) == [3, 3, 3]
    assert DecodeSeq(0, 16, 3).drafts == 3


class _UncappedLifetime(Scheduler):
    """Planted: the lifetime demand prices k drafts past the context (the old rule)."""

    def _lifetime_demand(self, prompt: int, output: int,
                         points: tuple[int, ...] = ()) -> Demand:
        return lifetime_demand(self.kv.geom, prompt, output, points)


def test_planted_uncapped_lifetime_rejects_a_request_that_fits() -> None:
    # 60 + 4 - 1 + 3 = 66 tokens = 5 pages > the 4: rejected as never fitting
    assert not _four_page_scheduler(_UncappedLifetime).add(Request(0, 60, 4, 0.0), 0.0)
