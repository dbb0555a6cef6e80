"""``compare`` gives every manager the cache settings ``simulate`` gives kvchain: on by
default when the trace has content keys, off with ``prefix_cache=False``; kvchain's run in
``compare`` is the ``simulate`` run."""

from __future__ import annotations

from dataclasses import replace

from kvchain.baselines.managers import ManagerKind
from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.compare import run_manager
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace


def test_compare_runs_kvchain_with_the_cache_that_simulate_uses():
    config = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                       load_trace("mooncake", first=20), buffer_bytes=4_000_000_000)
    alone = simulate(config)
    assert alone.prefix_cache is not None  # content keys: on by default
    run = run_manager(config, ManagerKind.KVCHAIN)
    assert run.prefix_cache is not None
    assert run.prefix_cache.hit_tokens == alone.prefix_cache.hit_tokens > 0
    assert run.summary.extra["prefix_hit_tokens"] == alone.prefix_cache.hit_tokens
    assert run.summary.steps == alone.summary.steps
    assert run.summary.admitted_but_unallocatable == 0 and run.summary.leaked_pages == 0
    off = run_manager(replace(config, prefix_cache=False), ManagerKind.FIXED_POOLS)
    assert off.prefix_cache is None and "prefix_hit_rate_pct" not in off.summary.extra
