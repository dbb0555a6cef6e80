"""The window slack of a speculative decode whose drafts are all rejected (found by the
breaker's random runs: an admission followed by a retraction in the very next step).

A decode of ``1 + k`` tokens from ``s`` ends at ``stop = s + 1 + k``; when the verify
rejects every draft the request is left at ``s + 1`` and its next decode reads the window
from ``s + 1`` on. The window policy capped a later step's span from the window of
``stop`` instead, so with a small window (``W = 1``) the later step's second page was never
reserved: admission gave it to a new request and the running decode was retracted in the
next step. The cap now starts at the window of ``stop - min(k, extend)``.
"""

from __future__ import annotations

from tests.cases.helpers import run_to_completion

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

FULL = CacheClass(LifetimeClass.FULL, 8, 0, None, ())
WINDOW1 = CacheClass(LifetimeClass.WINDOW, 100, 0, 1, ())  # W = 1
STATE = CacheClass(LifetimeClass.STATE, 0, 64, None, ())


def _kv(k: int) -> KVManager:
    return KVManager(Chain(plan_layout([FULL, WINDOW1], 1_000_000, 32)), spec_tokens=k)


def test_future_reserves_the_window_page_of_a_rejected_step() -> None:
    # P = 32, W = 1, k = 7. The request holds 24 tokens: full page 0, window page 0.
    # This step computes tokens 24..31 (1 + 7, all on page 0). If all 7 drafts are
    # rejected it holds 25 tokens and its next decode computes 25..32: window tokens
    # [25, 32] (W = 1: each token reads itself) lie on pages 0 and 1 -> 2 pages, 1 held,
    # so its future must add 1 window page (before the fix: 0). Full: [0, 32 + 27) is
    # ceil(59 / 32) = 2 pages, 1 held -> 1.
    kv = _kv(7)
    kv.allocate([(9, 24)])
    kv.commit(9, 24)
    assert kv.demand(9, 8, 27, 1, 27).pages == (1, 1)  # (window, full)
    kv.allocate([(9, 8)])
    kv.verify([9], [0], 7)  # every draft rejected: L = 25
    assert kv.decode_demands([9], 7).total.pages == (1, 1)  # what the future reserved


def test_without_drafts_the_later_span_is_unchanged() -> None:
    # the sibling with k = 0: a decode of 1 token at 24 ends at 25; later decodes start
    # at 25 (window page 0) and reach token 25 + 27 - 1 = 51 (page 1) but W = 1 reads one
    # token at a time: later_peak_pages(1) = ceil(1 / 32) + ceil(0 / 32) = 1 page, held:
    # 0 more; full: ceil((25 + 27) / 32) = 2 pages, 1 held -> 1.
    kv = _kv(0)
    kv.allocate([(9, 24)])
    kv.commit(9, 24)
    assert kv.demand(9, 1, 27, 1, 27).pages == (0, 1)


class _RejectAll:
    """Every step one second; every draft rejected."""

    step_s = 1.0

    def run(self, batch: object) -> StepOutcome:
        return StepOutcome(1.0)


def test_no_retraction_right_after_an_admission_with_rejected_drafts() -> None:
    # The random run that found it (seed 2653): P = 32, W = 1, k = 7, 8 state slots per
    # request, a 14,337 B buffer, every draft rejected; arrivals (step, rid, prompt,
    # output). The harness fails a retraction in the step right after an admission.
    layout = plan_layout([FULL, WINDOW1, STATE], 14_337, 32, state_slots_per_request=8)
    sched = Scheduler(KVManager(Chain(layout, debug_audit=True), spec_tokens=7),
                      SchedulerConfig(chunk_size=8192, max_prefill_tokens=64,
                                      audit_every_step=True))
    arrivals = [(1, 0, 1, 8), (1, 1, 33, 2), (1, 2, 32, 2), (1, 3, 33, 2), (5, 4, 2, 2),
                (1, 5, 47, 2), (0, 6, 119, 2), (0, 7, 269, 2), (0, 8, 1, 1), (0, 9, 24, 30)]
    result = run_to_completion(
        sched, arrivals=[(a, Request(rid, p, o, 0.0)) for a, rid, p, o in arrivals],
        driver=_RejectAll())  # type: ignore[arg-type]
    assert sched.counters.retractions == 0
    assert sched.counters.divergences == 0
    assert result.steps > 0
