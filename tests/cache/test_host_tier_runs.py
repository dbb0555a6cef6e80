"""Seeded memory-bound runs with a host tier under the prefix cache, through the real
scheduler: prompts written through to host, evicted from the device, loaded back at
admission and priced by the ledger. Audits after every step (chain, request layer, device
cache, host tier: every host slot held once or free, no stranded host full page), 0
admitted-but-unallocatable, 0 leaks; and planted defects that make each "must be 0"
figure non-zero.

The stream is tests/cache/test_seeded_cache_runs.py's (conversations that extend earlier
prompts, shared system prompts) on a 2.4 MB chain of 1,000-byte pages: memory binds, the
device cache evicts, and later turns find their prefix on the host only.
"""

from __future__ import annotations

import pytest
from tests.cache.test_seeded_cache_runs import PAGE, SHAPES, run

from kvchain.alloc import pricing
from kvchain.alloc.snapshot import Demand
from kvchain.cache.host_cache import HostTier
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.cache.tiered import LoadPlan, TieredPrefixCache
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.sched import admission
from kvchain.sched.scheduler import Scheduler

BUFFER = 2_400_000
HOST = 40_000_000  # bytes of host tier: some thousands of resume intervals


def tiered(shape: str, host_bytes: int = HOST, host_cls: type = HostTier):
    """A cache factory for ``run``: the device cache over a host tier of ``host_bytes``
    (the chain's layout rebuilt as ``run`` builds it)."""
    layout = plan_layout(SHAPES[shape], BUFFER, PAGE)

    def make(geom: CacheGeometry, **kw) -> PrefixCache:
        host = host_cls(layout, host_bytes, kw["interval_tokens"], geom, audit=kw.get("audit"))
        return TieredPrefixCache(geom, host, **kw)
    return make


SHAPES_RUN = ["full", "window|full", "state|full", "state|window|full", "window|window|full"]


@pytest.mark.parametrize("shape", SHAPES_RUN)
def test_host_tier_runs_load_back_and_keep_every_invariant(shape: str) -> None:
    sched = run(shape, seed=5, n=200, cache_cls=tiered(shape))
    c = sched.counters
    cache = sched.kv.cache
    assert isinstance(cache, TieredPrefixCache)
    assert c.divergences == 0 and c.finished + c.rejected == 200
    assert c.loads > 0 and c.host_hit_tokens > 0  # later turns came back from host
    host = cache.host
    assert host.stats.bytes_loaded > 0 and host.stats.bytes_written > 0
    assert host.stranded_full_pages() == 0
    host.audit()


def test_the_host_tier_serves_more_than_the_device_alone() -> None:
    # Same seeded stream with and without the host tier: the tier's hits are added ones.
    shape = "window|full"
    alone = run(shape, seed=5, n=200)
    with_host = run(shape, seed=5, n=200, cache_cls=tiered(shape))
    assert with_host.counters.hit_tokens > alone.counters.hit_tokens
    assert alone.counters.divergences == with_host.counters.divergences == 0


class DropsTheLoadedCheckpoint(TieredPrefixCache):
    """Planted defect: a load-back that takes its pages but inserts the prefix without the
    checkpoint slot it took (the slot is bound on the chain and held by no one)."""

    def realize_load(self, keys, plan: LoadPlan, granted):
        if plan.checkpoint and self.geom.state is not None:
            granted = [list(ids) for ids in granted]
            granted[self.geom.state] = []
            pages = list(plan.demand.pages)
            pages[self.geom.state] = 0
            plan = LoadPlan(plan.device_pages, plan.host_pages, plan.full_from,
                            plan.window, False, Demand(tuple(pages)), plan.host_hit)
        return super().realize_load(keys, plan, granted)


def test_planted_load_that_leaks_a_slot_is_caught() -> None:
    shape = "state|full"
    layout = plan_layout(SHAPES[shape], BUFFER, PAGE)

    def make(geom: CacheGeometry, **kw) -> PrefixCache:
        return DropsTheLoadedCheckpoint(geom, HostTier(layout, HOST, kw["interval_tokens"],
                                                       geom), **kw)
    with pytest.raises(AuditError):
        run(shape, seed=5, n=200, cache_cls=make)


def test_planted_ledger_blind_admission_with_a_host_tier_counts_divergences(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The one prefill budget with a host tier on: a ledger that prices each candidate
    # (load-backs included) alone admits more than the chain holds, and the count says so.
    def blind(self: admission.ChainPrefillBudget, demand: Demand) -> bool:
        self.decisions += 1
        return pricing.fits(self.snapshot, demand)

    monkeypatch.setattr(admission.ChainPrefillBudget, "fits", blind)
    monkeypatch.setattr(Scheduler, "audit", lambda self: None)
    from tests.cache import test_seeded_cache_runs as seeded
    monkeypatch.setattr(seeded, "SchedulerConfig",
                        lambda **kw: admission_config(**kw))
    sched = run("window|full", seed=5, n=200, cache_cls=tiered("window|full"))
    assert sched.counters.divergences > 0


def admission_config(**kw):
    from kvchain.sched.scheduler import SchedulerConfig
    return SchedulerConfig(strict=False, **kw)
