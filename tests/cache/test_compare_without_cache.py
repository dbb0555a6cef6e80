"""``compare`` keeps managers like for like: no manager caches prefixes there (the baselines
have no prefix cache), while ``simulate`` turns kvchain's on for the same trace."""

from __future__ import annotations

from kvchain.baselines.managers import ManagerKind
from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.compare import run_manager
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace


def test_compare_runs_kvchain_without_the_cache_that_simulate_uses():
    config = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                       load_trace("mooncake", first=20), buffer_bytes=4_000_000_000)
    assert simulate(config).prefix_cache is not None  # content keys: on by default
    run = run_manager(config, ManagerKind.KVCHAIN)
    assert "prefix_hit_rate_pct" not in run.summary.extra
    assert run.summary.admitted_but_unallocatable == 0 and run.summary.leaked_pages == 0
