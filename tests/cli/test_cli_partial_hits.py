"""``--partial-hits`` (issue 22 item 3): declared once in the run options, taken by simulate,
compare and sweep; off by default; wrong values and a model without a recurrent state are
refused with exit 2 and the message on stderr (nothing on stdout)."""

from __future__ import annotations

import json

import pytest

from kvchain.errors import ConfigError
from kvchain.sim.run_options import RunOptions

from .helpers import run


def test_off_by_default_and_declared_for_the_three_commands():
    assert RunOptions().partial_hits is False
    assert RunOptions().scheduler_config().partial_hits is False
    assert RunOptions(partial_hits=True).scheduler_config().partial_hits is True
    for command in ("simulate", "compare", "sweep"):
        result = run(command, "--help", columns=200)
        assert "--partial-hits" in result.stdout, command


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_value_that_is_not_a_bool_is_refused(value):
    with pytest.raises(ConfigError, match="partial_hits"):
        RunOptions(partial_hits=value)


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_value_given_to_the_flag_exits_2(command):
    result = run(command, "--partial-hits=yes")
    assert result.exit_code == 2
    assert "--partial-hits" in result.stderr and not result.stdout


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_model_without_a_state_band_is_refused(command):
    # gpt-oss-120b: full + window bands, no recurrent state: every hit already ends where
    # its pages match, so the option could never take effect.
    result = run(command, "--model", "gpt-oss-120b", "--trace", "mooncake",
                 "--requests", "5", "--partial-hits")
    assert result.exit_code == 2, result.output
    assert "--partial-hits" in result.stderr and "recurrent state" in result.stderr
    assert not result.stdout


def test_ignored_while_the_cache_is_off():
    result = run("simulate", "--model", "gpt-oss-120b", "--trace", "mooncake",
                 "--requests", "5", "--partial-hits", "--no-prefix-cache", "--json")
    assert result.exit_code == 0, result.output
    # ... and says so (it did nothing silently)
    assert "--partial-hits has no effect: the prefix cache is off" in result.stderr


def test_a_sweep_grid_value_that_is_not_a_bool_exits_2(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('models = ["qwen3-next-80b-a3b"]\nrequests = 5\npartial_hits = "maybe"\n')
    result = run("sweep", "--grid", str(grid), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "partial_hits" in result.stderr


def test_simulate_reports_the_partial_counters(tmp_path):
    # 40 Mooncake requests on qwen3-next: the run goes through and its metrics carry the
    # two counters (their values are measured in docs/benchmarks.md; the hand-derived
    # cases are tests/cache/test_partial_hits.py).
    out = tmp_path / "out"
    result = run("simulate", "--model", "qwen3-next-80b-a3b", "--trace", "mooncake",
                 "--requests", "40", "--buffer-bytes", "17179869184", "--partial-hits",
                 "--out", str(out))
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    section = metrics["prefix_cache"]
    assert {"partial_hits", "partial_tokens"} <= set(section)
    assert section["partial_tokens"] >= 0
