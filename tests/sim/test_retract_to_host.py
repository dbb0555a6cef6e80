"""Retraction by host copy in the scheduler and the simulator (issue 23 item 5): a
memory-bound run whose victims go to host and come back admits nothing it cannot allocate
(the load-back priced in the one prefill budget), leaks no device page and no host slot,
recomputes nothing; its sibling, whose admission forgets the load-back, counts divergences;
a host too small falls back to recompute (counted); ``auto`` follows the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import Suspended
from kvchain.sched.admission import ReserveConfig, ReservePolicy
from kvchain.sched.request import Request
from kvchain.sched.retraction import RetractTo
from kvchain.sched.scheduler import Scheduler, SchedulerConfig
from kvchain.sim.cost import GPUCostModel, HostRetractionCost
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.run_options import RunOptions
from kvchain.sim.traces import load_trace

# The scaled-down retraction storm (docs/benchmarks-history.md, "Reservations"): 24
# requests of (125 prompt, 500 output) tokens at t = 0, gemma-3-27b in 2.5 GB under the
# sglang ratio, which over-admits and retracts (5 times with recompute).
N, PROMPT, OUTPUT, BUFFER = 24, 125, 500, 2_500_000_000
HOST = 100_000_000_000


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("storm") / "storm24.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": PROMPT,
                                        "output_length": OUTPUT, "hash_ids": [i]}) + "\n"
                            for i in range(N)))
    return path


def config(storm: Path, mode: RetractTo, strict: bool = True,
           host_bytes: int | None = HOST) -> SimConfig:
    sched = SchedulerConfig(strict=strict, retract_to=mode,
                            reserve=ReserveConfig(ReservePolicy.SGLANG))
    return SimConfig(load_model("gemma-3-27b"), get_gpu("h200"), load_trace(str(storm)),
                     buffer_bytes=BUFFER, scheduler=sched, host_bytes=host_bytes)


def test_memory_bound_host_retraction_is_exact(storm: Path) -> None:
    base = simulate(config(storm, RetractTo.RECOMPUTE)).summary
    assert base.retractions > 0 and base.extra["recomputed_tokens"] > 0
    assert "retractions_to_host" not in base.extra  # the default run's summary: unchanged
    # strict: an admitted-but-unallocatable step would raise; audits after every step
    # (device pages and host slots: every page in one place)
    s = simulate(config(storm, RetractTo.HOST), audit_every_step=True).summary
    x = s.extra
    assert (s.requests_finished, s.admitted_but_unallocatable, s.leaked_pages) == (N, 0, 0)
    assert s.retractions > 0 and x["retractions_to_host"] == s.retractions
    assert x["recomputed_tokens"] == 0 and x["host_retract_fallbacks"] == 0
    assert x["host_slots_leaked"] == 0  # every suspension came back
    assert x["resume_bytes_loaded"] == x["host_bytes_retracted"] > 0
    # a victim holds at most its whole life's KV: prompt + output - 1 tokens
    assert x["recompute_tokens_saved"] <= s.retractions * (PROMPT + OUTPUT - 1)
    # both copies of a round trip are charged at the H200's PCIe 5.0 x16 x 0.8 = 51.2 GB/s
    assert x["resume_load_time_s"] == pytest.approx(x["resume_bytes_loaded"] / 51.2e9, abs=1e-6)
    assert x["host_write_time_s"] == pytest.approx(x["host_bytes_retracted"] / 51.2e9,
                                                   abs=1e-6)


def test_admission_that_forgets_the_load_back_is_caught(storm: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted sibling: a resume is priced by its future alone, not the pages it loads back.
    original = Scheduler._resume_demand

    def future_only(self: Scheduler, r: Request) -> Demand:
        demand, load = original(self, r), self.kv.resume_demand(r.rid)
        return Demand(tuple(a - b for a, b in zip(demand.pages, load.pages, strict=True)))

    monkeypatch.setattr(Scheduler, "_resume_demand", future_only)
    s = simulate(config(storm, RetractTo.HOST, strict=False)).summary
    assert s.admitted_but_unallocatable is not None and s.admitted_but_unallocatable > 0
    assert s.leaked_pages == 0


def test_a_full_host_falls_back_to_recompute(storm: Path) -> None:
    # 1 MB of host memory holds no victim (each holds 10s of MB): every host retraction
    # is refused and recomputed, counted
    s = simulate(config(storm, RetractTo.HOST, host_bytes=1_000_000),
                 audit_every_step=True).summary
    x = s.extra
    assert (s.requests_finished, s.admitted_but_unallocatable, s.leaked_pages) == (N, 0, 0)
    assert x["retractions_to_host"] == 0
    assert x["host_retract_fallbacks"] == s.retractions > 0
    assert x["recomputed_tokens"] > 0


def test_auto_follows_the_roofline(storm: Path) -> None:
    cost = HostRetractionCost(GPUCostModel(load_model("gemma-3-27b"), get_gpu("h200")))
    # By hand: 51.2e9 B at 51.2 GB/s is 1 s each way
    assert cost.transfer_s(51_200_000_000) == pytest.approx(1.0)
    assert not cost.host_is_cheaper(0, 0)  # nothing computed: nothing to save
    # 100 tokens' prefill (well over a microsecond) against 2 x 1 KB / 51.2 GB/s = 39 ns
    assert cost.host_is_cheaper(100, 1_000)
    # the same prefill against 2 x 51.2 GB (2 s)
    assert not cost.host_is_cheaper(100, 51_200_000_000)
    # The docstring's example: gpt-oss-120b, 8,192 tokens of full pages (36,864 B a token):
    # 301,989,888 B / 51.2e9 B/s = 5.898 ms each way, far below the prefill
    oss = HostRetractionCost(GPUCostModel(load_model("gpt-oss-120b"), get_gpu("h200")))
    assert oss.transfer_s(8_192 * 36_864) == pytest.approx(5.898e-3, rel=1e-3)
    assert oss.host_is_cheaper(8_192, 8_192 * 36_864)
    # On the storm the copies are far cheaper than the prefill: auto copies every victim
    s = simulate(config(storm, RetractTo.AUTO)).summary
    assert s.extra["retractions_to_host"] == s.retractions > 0


def test_options_are_checked(storm: Path) -> None:
    with pytest.raises(ConfigError, match="--host-bytes"):
        RunOptions(retract_to=RetractTo.HOST)
    with pytest.raises(ConfigError, match="roofline"):
        RunOptions(retract_to=RetractTo.AUTO, host_bytes=HOST, clock="steps")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="host-bytes"):
        config(storm, RetractTo.HOST, host_bytes=None)
    cfg = config(storm, RetractTo.HOST)
    kv = KVManager(Chain(cfg.layout()))
    with pytest.raises(ConfigError, match="host slots"):
        Scheduler(kv, SchedulerConfig(retract_to=RetractTo.HOST))
    assert RunOptions().retract_to is RetractTo.RECOMPUTE
    opts = RunOptions.from_mapping({"retract_to": "host", "host_bytes": HOST})
    assert opts.scheduler_config().retract_to is RetractTo.HOST
    assert SimConfig.of(opts, cfg.model, cfg.gpu, cfg.trace).host_bytes == HOST


def test_cli_exits_2_on_a_bad_combination() -> None:
    _load_commands()
    result = CliRunner().invoke(app, ["simulate", "--retract-to", "host", "--requests", "5"])
    assert result.exit_code == 2
    assert "--host-bytes" in result.output


def test_same_tokens_as_recompute(storm: Path) -> None:
    # the same requests finish with the same output either way (only times differ)
    a = simulate(config(storm, RetractTo.RECOMPUTE)).recorder
    b = simulate(config(storm, RetractTo.HOST)).recorder
    done = [(r.request_id, r.output_done) for r in a.records]
    assert done == [(r.request_id, r.output_done) for r in b.records]
    assert sorted(n for _, n in done) == [OUTPUT] * N


def test_a_resume_that_keeps_its_host_slots_is_counted(storm: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted sibling of host_slots_leaked: a load-back that never frees its host slots.
    monkeypatch.setattr(Suspended, "free_slots", lambda self: None)
    s = simulate(config(storm, RetractTo.HOST)).summary
    assert s.extra["host_slots_leaked"] > 0


@pytest.mark.parametrize(("model", "buffer"), [("gemma-3-27b", 3_000_000_000),
                                               ("qwen3-next-80b-a3b", 600_000_000)])
def test_victims_with_prefix_cache_hits_and_state_slots(tmp_path: Path, model: str,
                                                        buffer: int) -> None:
    # 24 requests of 1,100 prompt tokens sharing their first two 512-token blocks (hits),
    # 400 output tokens, arriving 50 ms apart: victims hold a hit's shared pages (copied to
    # host with the rest) and, on qwen3-next, a state slot; audited after every step
    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0.05 * i, "input_length": 1100,
                                        "output_length": 400, "hash_ids": [0, 1, 100 + i]})
                            + "\n" for i in range(N)))
    runs = {}
    for mode in (RetractTo.RECOMPUTE, RetractTo.HOST):
        sched = SchedulerConfig(retract_to=mode, reserve=ReserveConfig(ReservePolicy.SGLANG))
        cfg = SimConfig(load_model(model), get_gpu("h200"), load_trace(str(path)),
                        buffer_bytes=buffer, scheduler=sched, host_bytes=HOST)
        runs[mode] = simulate(cfg, audit_every_step=True).summary
    s, x = runs[RetractTo.HOST], runs[RetractTo.HOST].extra
    assert (s.requests_finished, s.admitted_but_unallocatable, s.leaked_pages) == (N, 0, 0)
    assert x["retractions_to_host"] == s.retractions > 0 and x["recomputed_tokens"] == 0
    assert x["host_slots_leaked"] == 0
    # hits are counted at a request's first admission: the same with either mode
    assert x["prefix_hit_rate_pct"] == runs[RetractTo.RECOMPUTE].extra["prefix_hit_rate_pct"] > 0
    if model == "gemma-3-27b":
        # auto recomputes every victim here: each one's first 1,024 prompt tokens are read
        # by the other running requests (KVManager.shared_by_others > 0), so a host copy
        # would come back as a private second copy of them; the run equals recompute's
        cfg = SimConfig(load_model(model), get_gpu("h200"), load_trace(str(path)),
                        buffer_bytes=buffer, host_bytes=HOST, scheduler=SchedulerConfig(
                            retract_to=RetractTo.AUTO,
                            reserve=ReserveConfig(ReservePolicy.SGLANG)))
        auto = simulate(cfg).summary
        assert auto.extra["retractions_to_host"] == 0
        base = runs[RetractTo.RECOMPUTE]
        assert (auto.steps, auto.retractions, auto.extra["recomputed_tokens"]) == (
            base.steps, base.retractions, base.extra["recomputed_tokens"])


def test_one_host_budget_for_the_prefix_tier_and_the_suspensions(storm: Path) -> None:
    # With the prefix cache on, --host-bytes is one budget: the host prefix tier writes the
    # prompts through, and the suspensions take their slots from the same pools (lent, not
    # a second split of the same bytes), so the host never holds more than --host-bytes.
    from kvchain.requests.suspend import LentPool
    from kvchain.sim.engine import retraction_host

    cfg = config(storm, RetractTo.HOST)
    layout = cfg.layout()
    own = retraction_host(layout, HOST, 512)
    assert not any(isinstance(p, LentPool) for p in own.pools.values())
    s = simulate(cfg, audit_every_step=True).summary
    x = s.extra
    assert x["host_bytes_written"] > 0 and x["retractions_to_host"] > 0  # both used
    assert x["host_slots_leaked"] == 0 and x["host_stranded_full_pages"] == 0
    assert x["host_peak_held_bytes"] <= x["host_bytes"] <= HOST

