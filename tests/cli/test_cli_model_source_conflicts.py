"""Options that name the model twice, or that a spec file cannot act on, exit 2: the
loader's precedence (spec file, then config, then bundled name) dropped them silently."""

from __future__ import annotations

import json

import pytest

from .helpers import flat, run, spec_file


@pytest.fixture
def spec(tmp_path):
    return str(spec_file(tmp_path, weight_bytes=1_000_000_000, total_params=500_000_000,
                         active_params=500_000_000))


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n")
    return str(path)


def _refused(result, words):
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and words in flat(result.stderr)


@pytest.mark.parametrize("command", ["plan", "simulate", "compare"])
def test_config_and_spec_together_exit_2(spec, trace, command, tmp_path):
    # Regression: the spec file won and --config was never read (plan exited 0).
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    extra = [] if command == "plan" else ["--trace", trace, "--clock", "steps"]
    _refused(run(command, "--spec", spec, "--config", str(config), *extra),
             "give --config or --spec, not both")


@pytest.mark.parametrize("command", ["plan", "simulate", "compare"])
def test_a_model_beside_a_spec_file_exits_2(spec, trace, command):
    # Regression: --model Jamba-v0.1 was dropped for the spec file without a word.
    extra = [] if command == "plan" else ["--trace", trace, "--clock", "steps"]
    _refused(run(command, "--model", "Jamba-v0.1", "--spec", spec, *extra),
             "give --model or --spec, not both")


def test_tp_with_a_spec_file_exits_2(spec, trace):
    # Regression: plan --spec --tp 2 said "per rank of --tp 2" and printed the file's
    # bytes unsplit (weights 1,000,000,000 B, not 500,000,000 B a rank).
    _refused(run("plan", "--spec", spec, "--tp", "2"),
             "--tp 2 does not apply to --spec: a spec file declares one rank's bytes")
    _refused(run("simulate", "--spec", spec, "--tp", "2", "--trace", trace, "--clock",
                 "steps"), "--tp 2 does not apply to --spec")


def test_a_spec_file_alone_still_runs(spec, trace):
    # The sibling that must keep passing: the default --model and --tp 1 with --spec.
    result = run("plan", "--spec", spec, "--tp", "1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "m"
    result = run("simulate", "--spec", spec, "--trace", trace, "--clock", "steps", "--json")
    assert result.exit_code == 0, result.output
