"""StepBatch.memory_blocked: set when memory (the planner) stops admission, not when the
step's token budget or max_running does (what memory-blocked U* averages over)."""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.layout import plan_layout
from kvchain.model.declared import declare_model
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
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


def cached_scheduler(pages: int) -> Scheduler:
    """:func:`scheduler` with a prefix cache (every request below carries page keys)."""
    layout = plan_layout(FULL, pages * 16_000, 16)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=16)
    return Scheduler(KVManager(Chain(layout), cache), SchedulerConfig())


def test_memory_refusal_sets_the_flag_with_the_cache_on():
    # Regression: with a prefix cache every request with page keys is attached (a miss
    # too), and that path stopped admission without the flag: 0 memory-blocked steps
    # in every cached run. As the first test, two (100, 10) requests of 7 pages each in
    # 10 pages: the second is refused by memory.
    s = cached_scheduler(10)
    for rid in (0, 1):
        prompt = [rid * 1_000 + t for t in range(100)]
        s.add(Request(rid, 100, 10, 0.0, page_keys=page_keys_from_tokens(prompt, 16)), 0.0)
    batch = s.step(0.0)
    assert [p.rid for p in batch.prefills] == [0]
    assert batch.memory_blocked


def test_a_hit_whose_lock_leaves_the_ledger_short_sets_the_flag():
    # Request 0 (48 tokens, 1 output) caches 3 pages and ends: 7 pages free, 3 evictable.
    # Request 1 (120 tokens, 10 output: at least ceil(120 / 16) = 8 pages) is admitted by
    # evicting at least 1 of them; request 2 hits request 0's 3 pages, and locking them
    # leaves 7 pages of supply for 8 reserved: the ledger no longer fits, so memory
    # stops request 2.
    s = cached_scheduler(10)
    first = list(range(48))
    s.add(Request(0, 48, 1, 0.0, page_keys=page_keys_from_tokens(first, 16)), 0.0)
    b = s.step(0.0)
    s.complete(b, StepOutcome(1.0, frozenset()), 1.0)
    cold = [10_000 + t for t in range(120)]
    warm = first + [20_000 + t for t in range(16)]
    assert s.idle and s.kv.cached_tokens(page_keys_from_tokens(warm, 16), 64) == 48
    s.add(Request(1, 120, 10, 1.0, page_keys=page_keys_from_tokens(cold, 16)), 1.0)
    s.add(Request(2, 64, 1, 1.0, page_keys=page_keys_from_tokens(warm, 16)), 1.0)
    batch = s.step(1.0)
    assert [p.rid for p in batch.prefills] == [1]
    assert batch.memory_blocked
