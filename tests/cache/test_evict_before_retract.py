"""The decode check evicts cached pages before it retracts anyone (through pricing)."""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig


def test_a_decode_that_needs_a_page_evicts_the_cache_instead_of_retracting():
    # Full attention only, 1,000 B per token, pages of 16 tokens = 16,000 B: 10 pages.
    layout = plan_layout([declared_class(LC.FULL, 1_000)], 160_000, 16)
    assert layout.bands[0].reserved_pages == 0
    chain = Chain(layout, debug_audit=True)
    kv = KVManager(chain, PrefixCache(CacheGeometry.of(layout)))
    sched = Scheduler(kv, SchedulerConfig(max_prefill_tokens=256, chunk_size=256))
    now = 0.0

    def step() -> None:
        nonlocal now
        batch = sched.step(now)
        now += 1.0
        sched.complete(batch, StepOutcome(1.0), now)
        sched.audit()

    # A: a 64-token prompt (4 whole pages), one output token: finishes in its prefill
    # step and leaves its 4 pages in the cache as one unlocked leaf (one eviction unit).
    sched.add(Request(0, 64, 1, now, page_keys=page_keys_from_tokens(list(range(64)), 16)),
              now)
    step()
    assert chain.snapshot().evictable.cumulative == ((0,), (4,))
    # B: 95 tokens (6 pages: 6 free pages, no eviction), 3 output tokens. Its prefill
    # samples token 1; the decode at context 95 stays in page 6; the decode at 96 needs a
    # 7th page: no page is free, so the take evicts the cached leaf (4 pages).
    sched.add(Request(1, 95, 3, now), now)
    step()
    assert chain.stats.pages_evicted == 0 and chain.bound_pages(0) == 10
    step()
    step()
    assert chain.stats.pages_evicted == 4
    assert sched.counters.retractions == 0 and sched.counters.finished == 2
