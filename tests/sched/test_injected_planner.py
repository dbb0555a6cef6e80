"""Admission prices with the allocator's own pricing strategy (``Allocator.planner``): on a
chain given another planner, what admission fits is what the chain's take fits, so nothing
admitted is refused; a budget that prices with the general planner instead is caught."""

from __future__ import annotations

import pytest

from kvchain.alloc import pricing
from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import GENERAL_PLANNER, Planner
from kvchain.alloc.snapshot import ChainSnapshot, Demand, RefusalReason
from kvchain.errors import AdmissionDivergenceError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched import admission
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

LIMIT = 12  # pages: the planted planner refuses any demand of more pages than this in all


def _at_most_limit(snapshot: ChainSnapshot, demand: Demand) -> object:
    if sum(demand.pages) > LIMIT:
        return pricing._Refusal(RefusalReason.BYTES, 1)
    return pricing._solve(snapshot, demand)


def _run() -> tuple[Scheduler, list[int]]:
    # One full band, 16-token pages, a buffer far larger than the workload: only the
    # planner limits. Each request (100-token prompt, 20 output tokens) needs
    # ceil((100 + 19) / 16) = 8 pages over its life (the last sampled token is not fed
    # back), 7 of them for its prompt: it fits alone (8 <= 12), two first chunks do not
    # fit one step (8 + 8 = 16 > 12).
    layout = plan_layout([declared_class(LC.FULL, 1_000)], 100_000_000, 16)
    chain = Chain(layout, planner=Planner(_at_most_limit))
    sched = Scheduler(KVManager(chain), SchedulerConfig(max_prefill_tokens=512,
                                                        chunk_size=256))
    for rid in range(4):
        assert sched.add(Request(rid, 100, 20, 0.0), 0.0)
    admitted_per_step, now = [], 0.0
    for _ in range(500):
        batch = sched.step(now)
        admitted_per_step.append(sum(1 for p in batch.prefills if p.start == 0))
        now += 0.01
        sched.complete(batch, StepOutcome(0.01), now)
        if sched.idle:
            break
    return sched, admitted_per_step


def test_admission_and_the_take_share_the_chain_planner() -> None:
    sched, admitted = _run()
    assert sched.chain.planner.solve is _at_most_limit
    assert sched.counters.finished == 4
    assert sched.counters.divergences == 0
    assert max(admitted) == 1  # never two first chunks in one step (16 > 12 pages)
    assert sum(admitted) == 4


def test_a_budget_priced_by_another_planner_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted defect: admission ignores the allocator's planner and prices with the general
    # one, which fits all four prompts at once (4 x 8 = 32 pages in a 100 MB buffer); the
    # chain refuses that step's take (4 prompts of 7 pages: 28 > 12), a divergence.
    real_init = admission.ChainPrefillBudget.__init__

    def general_only(self, snapshot, rules, planner=GENERAL_PLANNER):  # type: ignore[no-untyped-def]
        real_init(self, snapshot, rules, GENERAL_PLANNER)

    monkeypatch.setattr(admission.ChainPrefillBudget, "__init__", general_only)
    # strict (the scheduler's default) raises at the first refused take: 4 x 7 = 28 pages
    with pytest.raises(AdmissionDivergenceError, match=r"demand \(28,\) does not fit"):
        _run()
