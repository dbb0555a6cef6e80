"""The cache-aware waiting order: within a look-ahead of the queue's head, the longest
prefix-cache hit first (ties in queue order); a request passed over ``max_passes`` times
goes first; the rest in queue order. Orders derived by hand."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import ConfigError, InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.queue import QueuePolicy, WaitingQueue
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig


def queue(n: int, lookahead: int = 4, max_passes: int = 2) -> tuple[WaitingQueue,
                                                                      list[Request]]:
    q = WaitingQueue(QueuePolicy.CACHE_AWARE, lookahead, max_passes)
    reqs = [Request(i, 100, 1) for i in range(n)]
    for r in reqs:
        q.append(r)
    return q, reqs


HITS = {0: 0, 1: 100, 2: 0, 3: 500, 4: 900, 5: 100}


def order(q: WaitingQueue) -> list[int]:
    return [r.rid for r in q.cache_aware_order(lambda r: HITS[r.rid])]


def test_lookahead_ranks_by_hit_then_queue_order():
    q, _ = queue(6)
    # Head (look-ahead 4): 0 (0), 1 (100), 2 (0), 3 (500) -> 3, 1, then 0, 2 (ties in
    # queue order); 4 and 5 lie beyond it: queue order, although 4 would hit more.
    assert order(q) == [3, 1, 0, 2, 4, 5]
    assert [r.rid for r in q] == [0, 1, 2, 3, 4, 5]  # plain iteration stays FCFS


def test_admitting_from_inside_the_queue_counts_passes():
    q, reqs = queue(6)
    q.remove(reqs[3])  # 0, 1, 2 are passed over once
    assert q.passes == {0: 1, 1: 1, 2: 1}
    q.remove(reqs[1])  # 0 passed twice: max_passes reached; 1 leaves (its count goes)
    assert q.passes == {0: 2, 2: 1}
    # Head now 0, 2, 4, 5: 0 starved goes first; then 4 (900), 5 (100), 2 (0).
    assert order(q) == [0, 4, 5, 2]
    q.remove(reqs[0])  # the head: nobody is passed over
    assert q.passes == {2: 1}


def test_a_cold_request_is_passed_over_at_most_max_passes_times():
    # A cold request at the head, warm ones arriving behind it forever; each round admits
    # the first request of the order (what a walk that stops at the first misfit does when
    # one fits): the cold one is admitted after exactly max_passes = 3 warm ones.
    q = WaitingQueue(QueuePolicy.CACHE_AWARE, lookahead=32, max_passes=3)
    cold = Request(0, 100, 1)
    q.append(cold)
    admitted: list[int] = []
    for rid in range(1, 10):
        q.append(Request(rid, 100, 1))
        first = next(iter(q.cache_aware_order(lambda r: 0 if r.rid == 0 else 64)))
        q.remove(first)
        admitted.append(first.rid)
        if first is cold:
            break
    assert admitted == [1, 2, 3, 0]


def test_max_passes_zero_is_fcfs():
    q, _ = queue(6, max_passes=0)
    assert order(q) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(("lookahead", "max_passes"), [(0, 1), (4, -1), (1.5, 1)])
def test_bad_bounds_are_refused(lookahead, max_passes):
    with pytest.raises(InvalidRequestError):
        WaitingQueue(QueuePolicy.CACHE_AWARE, lookahead, max_passes)


def test_scheduler_config_refuses_bad_bounds():
    with pytest.raises(ConfigError):
        SchedulerConfig(cache_lookahead=0)
    with pytest.raises(ConfigError):
        SchedulerConfig(cache_max_passes=-1)


P = 16


def tiny(policy: QueuePolicy) -> Scheduler:
    layout = plan_layout([declared_class(LC.FULL, 1_000)], 1_000 * P * 40, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=64)
    return Scheduler(KVManager(Chain(layout), cache),
                     SchedulerConfig(max_prefill_tokens=64, chunk_size=64, max_running=1,
                                     policy=policy))


def drive(sched: Scheduler, prompts: list[list[int]]) -> list[int]:
    """Request 0 runs first and caches its prompt; then 1..n wait together; returns the
    admission order."""
    order: list[int] = []
    now = 0.0
    for rid, p in enumerate(prompts):
        sched.add(Request(rid, len(p), 1, 0.0, page_keys=page_keys_from_tokens(p, P)), 0.0)
        if rid == 0:  # alone: prefilled (one chunk) and finished before the others arrive
            while not sched.idle:
                b = sched.step(now)
                order += [c.rid for c in b.prefills if c.start == 0]
                now += 1
                sched.complete(b, StepOutcome(1.0, frozenset()), now)
    while not sched.idle:
        b = sched.step(now)
        order += [c.rid for c in b.prefills if c.start == sched.request(c.rid).hit_tokens]
        now += 1
        sched.complete(b, StepOutcome(1.0, frozenset()), now)
        sched.drain_events()
    return order


def test_scheduler_admits_the_warm_request_first():
    # Full-attention chain, one running request at a time. Request 0 (48 tokens) caches 3
    # pages. Then 1 (cold, 48 tokens), 2 (cold) and 3 (request 0's 48 tokens + 16: hits 3
    # pages = 48 tokens) wait. FCFS: 1, 2, 3. Cache-aware: 3 first (48 hit tokens), then
    # 1 and 2 (0 each, queue order).
    warm = list(range(48))
    prompts = [warm, list(range(100, 148)), list(range(200, 248)), warm + list(range(50, 66))]
    assert drive(tiny(QueuePolicy.FCFS), prompts) == [0, 1, 2, 3]
    assert drive(tiny(QueuePolicy.CACHE_AWARE), prompts) == [0, 3, 1, 2]
