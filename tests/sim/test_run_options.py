"""RunOptions: one validated value behind simulate, compare and sweep (kvchain.sim.run_options)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sched.admission import ReservePolicy
from kvchain.sched.scheduler import QueuePolicy, SchedulerConfig
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimConfig
from kvchain.sim.run_options import (
    DEMO,
    PREFILL_TOKENS_FLOOR,
    RunOptions,
    resolve_run,
)
from kvchain.sim.sweep import SweepGrid, SweepPoint, point_config


def test_prefill_tokens_per_step_is_one_rule():
    # max(chunk, 8192): a small chunk keeps the 8,192-token step budget, a big one raises it
    assert RunOptions(chunk_size=4096).scheduler_config().max_prefill_tokens == 8192
    assert RunOptions(chunk_size=16_384).scheduler_config().max_prefill_tokens == 16_384
    assert PREFILL_TOKENS_FLOOR == 8192


def test_options_reach_the_scheduler_and_the_sim_config():
    run = RunOptions(policy=QueuePolicy.SPF, max_running=7, chunk_size=512,
                     reserve=ReservePolicy.SGLANG, new_token_ratio="0.5,0.1,0.01",
                     clock=ClockKind.STEPS, step_ms=12.5, buffer_bytes=10**9, page_size=32,
                     truncate=True, prefix_cache=False)
    sched = run.scheduler_config()
    assert (sched.policy, sched.max_running, sched.chunk_size, sched.strict) == (
        QueuePolicy.SPF, 7, 512, False)
    assert sched.reserve.policy is ReservePolicy.SGLANG and sched.reserve.ratio == (0.5, 0.1,
                                                                                    0.01)
    trace = RunOptions(requests=3).load_trace("azure-conv")
    cfg = SimConfig.of(run, load_model("gpt-oss-120b"), get_gpu("h200"), trace)
    assert (cfg.clock, cfg.step_ms, cfg.buffer_bytes, cfg.page_size) == (
        ClockKind.STEPS, 12.5, 10**9, 32)
    assert cfg.truncate is True and cfg.prefix_cache is False


def test_bad_values_are_refused_naming_the_flag():
    for kwargs, needle in [({"requests": 0}, "--requests must be >= 1, got 0"),
                           ({"rate_scale": 0.0}, "--rate-scale must be a finite number > 0"),
                           ({"mem_fraction": 1.5}, "--mem-fraction must be in (0, 1]"),
                           ({"page_size": 32, "chunk_size": 16},
                            "--chunk-size (16) must be at least --page-size (32 tokens)"),
                           ({"step_ms": 1e308}, "--step-ms must be at most 3,600,000"),
                           ({"new_token_ratio": "0.5,0.1,0.01"}, "sglang"),
                           ({"block_tokens": 0}, "--block-tokens must be >= 1")]:
        with pytest.raises(ConfigError) as info:
            RunOptions(**kwargs)
        assert needle in str(info.value), (kwargs, str(info.value))


@pytest.mark.parametrize(("kwargs", "needle"), [
    # A float page size reached the layout (page arithmetic on 16.5 tokens); a bool passed
    # as a count (True = 1 page); the string "no" for a flag is truthy (fast-forward ON);
    # an enum's string reached the scheduler, which compares members; a string count
    # raised a bare TypeError from the range check.
    ({"page_size": 16.5}, "page_size must be of type int, got 16.5 (float)"),
    ({"buffer_bytes": 1e9}, "buffer_bytes must be of type int"),
    ({"page_size": True}, "page_size must be of type int, got True (bool)"),
    ({"requests": "5"}, "requests must be of type int, got '5' (str)"),
    ({"rate_scale": "2"}, "rate_scale must be a number"),
    ({"fast_forward": "no"}, "fast_forward must be True or False, got 'no'"),
    ({"truncate": 1}, "truncate must be True or False"),
    ({"policy": "fcfs"}, "policy must be a QueuePolicy"),
    ({"reserve": "full"}, "reserve must be a ReservePolicy"),
    ({"clock": "steps"}, "clock must be a ClockKind"),
    ({"new_token_ratio": 0.5}, "new_token_ratio must be of type str"),
])
def test_values_of_the_wrong_type_are_refused_typed(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        RunOptions(**kwargs)
    assert needle in str(info.value), str(info.value)


def test_numbers_of_a_float_field_may_be_ints():
    assert RunOptions(rate_scale=2, end_s=5).rate_scale == 2  # 2 x the rate, 5 s: valid


def test_strict_is_the_same_everywhere():
    """simulate, compare and every sweep point run non-strict unless told (before, sweep
    points ran strict while simulate did not)."""
    assert RunOptions().strict is False
    assert RunOptions().scheduler_config().strict is False
    point = SweepGrid(options=RunOptions(requests=2)).points()[0]
    assert point_config(point).scheduler.strict is False
    strict = SweepGrid(options=RunOptions(requests=2, strict=True)).points()[0]
    assert point_config(strict).scheduler.strict is True
    assert "strict=True" in strict.key()
    assert SchedulerConfig().strict is True  # the library's own default stays strict (tests)


def test_demo_settings_apply_only_without_a_trace():
    demo = resolve_run(None, {})
    assert demo.demo and demo.trace == DEMO.trace == "mooncake"
    assert (demo.options.requests, demo.options.rate_scale) == (600, 0.3)
    assert any("demo" in item for item in demo.chosen)
    # a trace the user names: whole, at its own rate, nothing chosen for the demo
    own = resolve_run("my-trace.csv", {"requests": None, "rate_scale": None})
    assert not own.demo and own.trace == "my-trace.csv"
    assert (own.options.requests, own.options.rate_scale) == (None, 1.0)
    assert own.chosen == ()
    # what the user gives wins over the demo
    told = resolve_run(None, {"requests": 50, "rate_scale": 2.0})
    assert (told.options.requests, told.options.rate_scale) == (50, 2.0)


def test_seed_draws_the_poisson_arrivals():
    """sharegpt has no arrival times: --seed draws them (compare had no --seed and drew
    with seed 0 whatever was asked)."""
    a = RunOptions(requests=5, seed=0).load_trace("sharegpt")
    b = RunOptions(requests=5, seed=3).load_trace("sharegpt")
    assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in b.requests]


def test_sweep_takes_every_run_option_as_a_grid_key():
    grid = SweepGrid.from_mapping({"reserve": "full", "policy": "spf", "clock": "steps",
                                   "buffer_bytes": 2 * 10**9, "requests": 4})
    point = grid.points()[0]
    cfg = point_config(point)
    assert cfg.scheduler.reserve.policy is ReservePolicy.FULL
    assert cfg.scheduler.policy is QueuePolicy.SPF
    assert cfg.clock is ClockKind.STEPS and cfg.buffer_bytes == 2 * 10**9
    # options away from their defaults enter the row and the key; defaults stay out, so
    # keys written before these options existed still match
    params = point.params()
    assert (params["reserve"], params["policy"], params["clock"]) == ("full", "spf", "steps")
    assert "reserve='full'" in point.key()
    plain = SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 1.0, 0.9, "kvchain")
    assert plain.key().endswith("|chunk_size=8192|seed=0")
    with pytest.raises(ConfigError, match="reserve"):
        SweepGrid.from_mapping({"reserve": "most"})
    with pytest.raises(ConfigError, match="unknown grid keys"):
        SweepGrid.from_mapping({"rate_scale": 2.0})  # an axis: rate_scales


def test_every_field_has_help():
    for f in fields(RunOptions):
        assert f.metadata.get("help"), f.name
