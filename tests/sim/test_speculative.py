"""Speculative decoding in the simulator and the scheduler (issue 24 items 3, 4, 6): a
memory-bound run with ``k = 3`` audited after every step (every rollback: no leaked page or
slot, no rejected draft's page or window slack kept) admits nothing it cannot allocate; the
sibling whose admission does not count ``k`` counts divergences."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from kvchain.bands.geometry import StateRollback
from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sched.scheduler import Scheduler, SchedulerConfig
from kvchain.sim.cost import StepWorkBuilder
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.run_options import RunOptions
from kvchain.sim.traces import load_trace

# Jet-Nemotron-2B (state + full attention) on the first 40 Mooncake requests in 300 MB:
# memory binds, so an admission that forgets k over-admits (without the prefix cache: with
# it, the take evicts cached pages for what admission forgot).
MODEL, TRACE, FIRST, BUFFER = "jet-nemotron-2b", "mooncake", 40, 300_000_000


def config(k: int, strict: bool = True, p: float = 0.7, cache: bool = False) -> SimConfig:
    return SimConfig(load_model(MODEL), get_gpu("h200"), load_trace(TRACE, first=FIRST),
                     buffer_bytes=BUFFER, scheduler=SchedulerConfig(strict=strict),
                     spec_tokens=k, spec_acceptance=p, prefix_cache=cache)


def test_memory_bound_speculative_run_is_exact() -> None:
    # strict: an admitted-but-unallocatable step would raise
    result = simulate(config(3), audit_every_step=True)  # audits after every rollback
    s = result.summary
    assert (s.requests_finished, s.admitted_but_unallocatable, s.leaked_pages) == (FIRST, 0, 0)


def test_memory_bound_speculative_run_with_the_prefix_cache() -> None:
    result = simulate(config(3, cache=True), audit_every_step=True)
    s, extra = result.summary, result.summary.extra
    assert (s.requests_finished, s.admitted_but_unallocatable, s.leaked_pages) == (FIRST, 0, 0)
    assert extra["spec_decodes"] > 0
    # tokens a decode keeps: 1 + E[a] = 1 + 0.7 + 0.49 + 0.343 = 2.533 uncapped; the last
    # step of a request keeps fewer, so at most that, and well above 1
    assert 2.0 < extra["spec_tokens_per_decode"] <= 2.6
    # each running request holds k = 3 checkpoint slots: the overhead is never 0
    assert extra["spec_overhead_peak_bytes"] > 0
    # memory binds on this run (the prefix cache is evicted to make room: what makes the
    # sibling bite); rolled-back drafts never reached the cache (it holds prompts only,
    # and the audits found every cached page accounted for)
    assert extra["prefix_evicted_pages"] > 0


def test_replay_rollback_holds_one_slot_and_pays_recompute() -> None:
    # Same draws (seed 0) under both modes: replay holds 1 extra slot per request instead
    # of 3 (less overhead) and recomputes 1 + a tokens after every decode with a < k
    checkpoints = simulate(config(3)).summary
    replay = simulate(replace(config(3), spec_rollback=StateRollback.REPLAY),
                      audit_every_step=True).summary
    assert (replay.requests_finished, replay.admitted_but_unallocatable,
            replay.leaked_pages) == (FIRST, 0, 0)
    c, r = checkpoints.extra, replay.extra
    assert c["spec_replayed_tokens"] == 0
    # every decode with a < 3 replays at least 1 token: with E[a] ~ 1.5 most of them do
    assert r["spec_replayed_tokens"] >= r["spec_decodes"] // 2
    assert r["spec_overhead_mean_bytes"] < c["spec_overhead_mean_bytes"]
    assert r["spec_accepted_drafts"] == c["spec_accepted_drafts"]  # same draws, same tokens
    with pytest.raises(ConfigError, match="spec_rollback"):
        RunOptions.from_mapping({"spec_rollback": "copy"})


def test_admission_that_does_not_count_k_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted sibling: the decode check, the futures and admission price plain decodes
    # (0 drafts) while every decode computes 1 + 3 tokens.
    monkeypatch.setattr(Scheduler, "_drafts_priced", lambda self: 0)
    s = simulate(config(3, strict=False)).summary
    assert s.admitted_but_unallocatable is not None and s.admitted_but_unallocatable > 0
    assert (s.requests_finished, s.leaked_pages) == (FIRST, 0)


def test_seeded_and_deterministic() -> None:
    a, b = (simulate(replace(config(3), seed=7)).summary.extra for _ in range(2))
    assert a == b
    c = simulate(replace(config(3), seed=8)).summary.extra
    assert c["spec_accepted_drafts"] != a["spec_accepted_drafts"]


def test_acceptance_extremes() -> None:
    # p = 0: every draft rejected, one token per decode as without speculation; the same
    # tokens, so as many decodes as output tokens less each request's first (sampled by
    # its last prefill chunk)... retractions aside; p = 1: every draft kept (but a
    # request's last steps, capped by its output)
    none = simulate(config(3, p=0.0)).summary.extra
    assert none["spec_tokens_per_decode"] == 1.0 and none["spec_accepted_drafts"] == 0
    every = simulate(config(3, p=1.0)).summary.extra
    assert 3.0 < every["spec_tokens_per_decode"] <= 4.0


def test_verify_forward_is_a_chunk_of_1_plus_k() -> None:
    a, b = StepWorkBuilder(window=8), StepWorkBuilder(window=8)
    a.add_verify(100, 3)
    b.add_prefill(4, 100)
    assert a.build() == b.build()
    a.reset()
    a.add_verify(100, 0)
    b.reset()
    b.add_decode(100)
    assert a.build() == b.build()  # k = 0: a plain decode's work


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="--spec-tokens"):
        RunOptions(spec_tokens=-1)
    with pytest.raises(ConfigError, match="--spec-acceptance"):
        RunOptions(spec_acceptance=1.5)
    opts = RunOptions(spec_tokens=2, spec_acceptance=0.5, seed=3)
    cfg = SimConfig.of(opts, load_model(MODEL), get_gpu("h200"), load_trace(TRACE, first=2))
    assert (cfg.spec_tokens, cfg.spec_acceptance, cfg.seed) == (2, 0.5, 3)
    _load_commands()
    out = CliRunner().invoke(app, ["simulate", "--trace", TRACE, "--requests", "2",
                                   "--spec-tokens", "-1"])
    assert out.exit_code == 2 and "--spec-tokens" in out.output
