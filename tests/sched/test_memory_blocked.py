"""StepBatch.memory_blocked: set when memory (the planner) stops admission, not when the
step's token budget or max_running does (what memory-blocked U* averages over)."""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declare_model
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

FULL = declare_model("f", full=1_000).classes  # pages of 16 x 1,000 = 16,000 B


def scheduler(pages: int, **config: int) -> Scheduler:
    layout = plan_layout(FULL, pages * 16_000, 16)
    return Scheduler(KVManager(Chain(layout)), SchedulerConfig(**config))


def test_memory_refusal_sets_the_flag():
    # (100, 10) holds 109 tokens at its end = ceil(109 / 16) = 7 pages: two need 14 > 10.
    s = scheduler(10)
    s.add(Request(0, 100, 10, 0.0), 0.0)
    s.add(Request(1, 100, 10, 0.0), 0.0)
    batch = s.step(0.0)
    assert [p.rid for p in batch.prefills] == [0]
    assert batch.memory_blocked


def test_token_budget_does_not_set_it():
    # room for both, but one 16-token chunk per step: the budget, not memory, stops r1
    s = scheduler(1_000, max_prefill_tokens=16, chunk_size=16)
    s.add(Request(0, 100, 10, 0.0), 0.0)
    s.add(Request(1, 100, 10, 0.0), 0.0)
    batch = s.step(0.0)
    assert [(p.rid, p.tokens) for p in batch.prefills] == [(0, 16)]
    assert not batch.memory_blocked


def test_max_running_does_not_set_it():
    s = scheduler(1_000, max_running=1)
    s.add(Request(0, 100, 10, 0.0), 0.0)
    s.add(Request(1, 100, 10, 0.0), 0.0)
    batch = s.step(0.0)
    assert [p.rid for p in batch.prefills] == [0]
    assert not batch.memory_blocked
