"""The host tier in the simulator: ``SimConfig.host_bytes`` / ``--host-bytes``, its
metrics, its load-back time, and its refusals.

One memory-bound slice: gpt-oss-120b on the first 200 Mooncake requests in a 4 GB KV
buffer with a 64 GB host tier (later turns find their prefix evicted from the device and
still on the host: load-backs happen).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sim.cost import host_transfer_time
from kvchain.sim.engine import SimConfig, SimResult, simulate
from kvchain.sim.traces import load_trace

_load_commands()
runner = CliRunner()
ARGS = ["--model", "gpt-oss-120b", "--trace", "mooncake", "--requests", "200",
        "--rate-scale", "1", "--end-s", "1e9", "--buffer-bytes", "4000000000"]


def config(host_bytes: int | None, **kw) -> SimConfig:
    return SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                     load_trace("mooncake", first=200), buffer_bytes=4_000_000_000,
                     host_bytes=host_bytes, **kw)


@pytest.fixture(scope="module")
def with_host() -> SimResult:
    return simulate(config(64_000_000_000))


def test_the_host_tier_loads_back_and_every_must_be_zero_is_zero(with_host: SimResult) -> None:
    s = with_host.summary
    e = s.extra
    assert (s.admitted_but_unallocatable, s.leaked_pages) == (0, 0)
    assert e["host_stranded_full_pages"] == 0
    assert e["host_loads"] > 0 and e["host_hit_tokens"] > 0
    assert e["host_bytes_loaded"] > 0 and e["host_bytes_written"] > 0
    # host hits are part of the prefix-cache hits (a loaded prefix is a device hit)
    assert e["host_hit_tokens"] <= e["prefix_hit_tokens"]
    assert e["host_peak_held_bytes"] <= e["host_bytes"] <= 64_000_000_000


def test_load_time_is_the_bytes_over_the_host_link(with_host: SimResult) -> None:
    # Each step's load-back takes bytes / (64e9 B/s x 0.8) on the H200's PCIe 5.0 x16
    # (kvchain.sim.cost.host_transfer_time); linear, so the run's sum is the same
    # formula over the run's bytes.
    e = with_host.summary.extra
    expected = host_transfer_time(e["host_bytes_loaded"], get_gpu("h200"))
    assert e["load_time_s"] == pytest.approx(expected, abs=2e-6)
    assert expected == pytest.approx(e["host_bytes_loaded"] / 51.2e9)


def test_fast_forward_gives_the_per_step_loop_s_numbers(with_host: SimResult) -> None:
    # The per-step loop is the oracle of fast-forward (tests/sim/test_fast_forward.py);
    # load-backs happen only in steps with waiting requests, which are never
    # fast-forwarded, and write-through only at prompt inserts: the same run.
    slow = simulate(config(64_000_000_000, fast_forward=False)).summary
    fast = with_host.summary
    assert (slow.steps, slow.ttft, slow.tpot) == (fast.steps, fast.ttft, fast.tpot)
    assert {k: v for k, v in slow.extra.items()} == dict(fast.extra)


def test_without_host_bytes_nothing_of_the_tier_shows() -> None:
    # The default (no host tier) is the device-only run: no host counters at all.
    result = simulate(config(None))
    assert not any(k.startswith("host_") or k == "load_time_s"
                   for k in result.summary.extra)


def test_bad_host_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="--host-bytes must be >= 1"):
        config(0)
    with pytest.raises(ConfigError, match="prefix cache"):
        simulate(config(1_000_000_000, prefix_cache=False))


def test_cli_host_bytes_shows_in_the_summary_and_refuses_bad_values(tmp_path: Path) -> None:
    out = runner.invoke(app, ["simulate", *ARGS, "--host-bytes", "64000000000", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout[out.stdout.index("{"):])
    assert data["summary"]["extra"]["host_loads"] > 0
    assert data["config"]["options"]["host_bytes"] == 64_000_000_000
    bad = runner.invoke(app, ["simulate", *ARGS, "--host-bytes", "0"])
    assert bad.exit_code == 2 and "--host-bytes must be >= 1" in bad.output
    off = runner.invoke(app, ["simulate", *ARGS, "--host-bytes", "1000000", "--no-prefix-cache"])
    assert off.exit_code == 2 and "prefix cache" in off.output


def test_a_prompt_loaded_in_several_steps_counts_every_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the scheduler kept only a prompt's last load-back (device hit -> end),
    # so a prompt that loaded 512 -> 4,608, then -> 15,872, then -> 19,456 counted 3,584
    # host tokens instead of 18,944. The host's part of a prompt's hit is from its first
    # load's start to its last load's end (capped at the hit it is admitted with).
    from kvchain.sched.scheduler import Scheduler

    spans: dict[int, list[tuple[int, int]]] = {}
    admitted_hit: dict[int, int] = {}
    original = Scheduler.allocate

    def recording(self: Scheduler, step, now):  # type: ignore[no-untyped-def]
        for ld in step.loads:
            spans.setdefault(ld.rid, []).append((ld.start, ld.end))
        batch = original(self, step, now)
        for p in batch.prefills:
            r = self.requests[p.rid]
            if r.rid not in admitted_hit and r.hit_tokens is not None:
                admitted_hit[r.rid] = r.hit_tokens
        return batch

    monkeypatch.setattr(Scheduler, "allocate", recording)
    s = simulate(config(64_000_000_000)).summary
    assert any(len(v) > 1 for v in spans.values())  # the slice has multi-step loads
    expected = sum(max(0, min(max(e for _, e in v), admitted_hit.get(rid, 0))
                          - min(st for st, _ in v)) for rid, v in spans.items())
    assert s.extra["host_hit_tokens"] == expected > 0


def test_host_bytes_without_the_cache_serve_retraction_alone() -> None:
    # A trace without content keys: no prefix cache, so no host tier; --host-bytes still
    # gives --retract-to host its slots (before: refused for the missing cache).
    from kvchain.sched.admission import ReserveConfig, ReservePolicy
    from kvchain.sched.retraction import RetractTo
    from kvchain.sched.scheduler import SchedulerConfig

    trace = load_trace("azure-conv", first=400, rate_scale=4.0)
    sched = SchedulerConfig(retract_to=RetractTo.HOST,
                            reserve=ReserveConfig(ReservePolicy.SGLANG))
    cfg = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"), trace,
                    buffer_bytes=1_000_000_000, host_bytes=68_719_476_736, scheduler=sched)
    s = simulate(cfg).summary
    assert (s.admitted_but_unallocatable, s.leaked_pages) == (0, 0)
    assert s.extra["retractions_to_host"] > 0 and s.extra["host_slots_leaked"] == 0
    assert "host_hit_tokens" not in s.extra  # no host prefix tier without the cache
    # without retraction to host, the same bytes serve nothing: refused with the reason
    with pytest.raises(ConfigError, match="no content keys"):
        simulate(SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"), trace,
                           buffer_bytes=1_000_000_000, host_bytes=68_719_476_736))


def test_a_host_tier_too_small_for_one_interval_is_refused() -> None:
    # gpt-oss-120b: one 512-token interval is 32 full pages + the window tail's pages, far
    # more than 1,000 B: the tier would hold nothing and write nothing (before: it ran).
    with pytest.raises(ConfigError, match="holds no resume interval"):
        simulate(config(1_000))
