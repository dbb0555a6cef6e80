"""A request admitted with a prefix-cache hit must still be able to finish alone.

A hit's window tails (and, on a state chain, its checkpoint) stay locked for the request's
whole life, beyond its own peak: the window moves on, the tail is dead but locked. On
gemma-3-27b (W = 1,024) in a 2 GB buffer, request 9 (17,450 prompt tokens) hit 512 tokens
whose 32-page window tail (6,815,744 B a page: 218 MB) stayed locked; its own lifetime
(1,129 full pages and a 66-page window peak) left no room for it, and once alone it could
neither take its next chunk nor be retracted: the run stopped stuck at t = 50.559 s with
40 requests waiting. Now a hit that would not fit alone with the request is not taken (the
request is served uncached)."""

from __future__ import annotations

import pytest

from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sched import scheduler as sched_module
from kvchain.sim.engine import SimConfig, SimulationStuckError, simulate
from kvchain.sim.traces import load_trace


def _config() -> SimConfig:
    return SimConfig(model=load_model("gemma-3-27b"), gpu=get_gpu("h200"),
                     trace=load_trace("mooncake", first=60), buffer_bytes=2_000_000_000)


def test_a_hit_that_cannot_finish_alone_is_not_taken():
    result = simulate(_config())
    s = result.summary
    assert s.requests_finished + s.requests_rejected == 60  # no request left stuck
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0


def test_the_hit_locks_its_window_tail_beyond_the_lifetime():
    # W = 1,024, P = 16: a 512-token hit is 32 pages; the tail a resume after page 32 needs
    # starts at max(0, 512 - 1,023) // 16 = 0, so all 32 window pages stay locked.
    from kvchain.alloc.chain import Chain
    from kvchain.cache.radix import CacheGeometry, PrefixCache
    from kvchain.layout import plan_layout
    from kvchain.requests.manager import KVManager

    layout = plan_layout(load_model("gemma-3-27b").classes, 2_000_000_000, 16)
    chain = Chain(layout)
    kv = KVManager(chain, PrefixCache(CacheGeometry.of(layout)))
    s = sched_module.Scheduler(kv)
    window = next(i for i, b in enumerate(layout.bands) if b.label == "window")
    extra = s._hit_extra(512)
    assert extra.pages[window] == 32 and sum(extra.pages) == 32


def test_planted_no_check_gets_stuck(monkeypatch: pytest.MonkeyPatch):
    # The sibling: a hit counted as locking nothing beyond the lifetime is the old code.
    from kvchain.alloc.snapshot import Demand
    from kvchain.requests.manager import KVManager

    monkeypatch.setattr(sched_module.Scheduler, "_hit_extra",
                        lambda self, hit, gap=0: Demand((0,) * self.kv.geom.num_bands))
    monkeypatch.setattr(KVManager, "hit_holds",
                        lambda self, rid: Demand((0,) * self.geom.num_bands))
    with pytest.raises(SimulationStuckError):
        simulate(_config())


def _small_gpt_oss() -> SimConfig:
    """gpt-oss-120b in 100 MB (169 pages a band), 35 Mooncake requests: request 2's hit
    cannot finish alone, so its attach locks the path (splitting a node) and unlocks it
    again: the cache's eviction order moves on by two versions in the middle of the
    admission loop."""
    return SimConfig(model=load_model("gpt-oss-120b"), gpu=get_gpu("h200"),
                     trace=load_trace("mooncake", first=35), buffer_bytes=100_000_000)


def test_an_undone_attach_leaves_no_stale_snapshot_in_the_ledger():
    # Regression: the ledger kept pricing on the snapshot from before the undone attach
    # and its lazy eviction order refused to grow ("eviction order of cache version 44
    # asked for row 1 at version 46"): `kvchain simulate --buffer-bytes 100000000
    # --requests 35` stopped with PlanMismatchError.
    result = simulate(_small_gpt_oss())
    s = result.summary
    assert s.requests_finished + s.requests_rejected == 35
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0


def test_planted_stale_ledger_is_caught(monkeypatch: pytest.MonkeyPatch):
    # The sibling: a ledger not rebased after an attach prices on a stale eviction
    # order, which the order itself refuses.
    from kvchain.errors import PlanMismatchError

    monkeypatch.setattr(sched_module.Scheduler, "_rebased", lambda self, budget: True)
    with pytest.raises(PlanMismatchError, match="asked for row"):
        simulate(_small_gpt_oss())
