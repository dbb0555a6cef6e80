"""`--reserve`, `--new-token-ratio` and the copy-time figures through the real CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()

SLICE = ("--model", "jet-nemotron-2b", "--trace", "mooncake", "--requests", "30",
         "--buffer-bytes", "600000000")


@pytest.mark.parametrize("reserve", ["sglang", "adaptive", "full"])
def test_simulate_reserve_policies_report_copies_and_recompute(reserve: str) -> None:
    result = runner.invoke(app, ["simulate", *SLICE, "--reserve", reserve, "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["config"]["reserve"] == reserve
    extra = d["summary"]["extra"]
    assert d["summary"]["requests_finished"] == 30
    for key in ("copy_time_s", "copy_time_pct", "pages_copied", "recomputed_tokens"):
        assert key in extra
    # The charge: 2 x bytes copied / (4.8e12 B/s x 0.7), rounded to 6 decimals.
    assert extra["copy_time_s"] == round(2 * extra["bytes_copied"] / (4.8e12 * 0.7), 6)


def test_simulate_new_token_ratio_knob() -> None:
    ok = runner.invoke(app, ["simulate", *SLICE, "--reserve", "sglang",
                             "--new-token-ratio", "1,1,0", "--json"])
    assert ok.exit_code == 0, ok.output
    for bad in (["--new-token-ratio", "1,x,0"],
                ["--new-token-ratio", "0.2,0.7,0"],
                ["--reserve", "full", "--new-token-ratio", "1,1,0"]):
        result = runner.invoke(app, ["simulate", *SLICE, *bad])
        assert result.exit_code == 2, result.output
        assert "error" in result.output


def test_compare_shows_copy_time_per_manager() -> None:
    result = runner.invoke(app, ["compare", *SLICE, "--managers", "kvchain,fixed-pools",
                                 "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    kv, fixed = d["kvchain"]["summary"]["extra"], d["fixed-pools"]["summary"]["extra"]
    assert fixed["copy_time_s"] == 0.0 and fixed["pages_copied"] == 0  # pools never copy
    assert kv["copy_time_s"] == round(2 * kv["bytes_copied"] / (4.8e12 * 0.7), 6)
    bad = runner.invoke(app, ["compare", *SLICE, "--new-token-ratio", "1,1,0"])
    assert bad.exit_code == 2
