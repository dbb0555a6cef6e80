"""Speculative options a run cannot act on are warned (they ran silently): --spec-acceptance
or --spec-rollback without --spec-tokens, --spec-rollback replay on a model without a
recurrent state band (simulate and plan); and plan --spec-tokens names only what the drafts
hold on the model's own bands."""

from __future__ import annotations

import json

import pytest

from .helpers import flat, run

NO_DRAFTS = "has no effect without --spec-tokens (no drafts in this run)"
NO_STATE = "--spec-rollback replay has no effect: the model has no recurrent state band"


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n")
    return str(path)


@pytest.fixture
def full_only(tmp_path):
    path = tmp_path / "full.json"
    path.write_text(json.dumps({"name": "f", "full": 1_000}))
    return str(path)


@pytest.fixture
def with_state(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"name": "s", "full": 1_000, "state": 50_000_000}))
    return str(path)


def _simulate(trace, spec, *args):
    result = run("simulate", "--trace", trace, "--spec", spec, "--clock", "steps",
                 "--buffer-bytes", "1000000000", "--json", *args)
    assert result.exit_code == 0, result.output
    return flat(result.stderr)


def test_simulate_warns_of_speculative_options_without_drafts(trace, with_state):
    said = _simulate(trace, with_state, "--spec-acceptance", "0.5")
    assert f"warning: --spec-acceptance {NO_DRAFTS}" in said
    said = _simulate(trace, with_state, "--spec-rollback", "replay")
    assert f"warning: --spec-rollback {NO_DRAFTS}" in said
    # with drafts, on a state band: both act, no warning
    said = _simulate(trace, with_state, "--spec-tokens", "2", "--spec-acceptance", "0.5",
                     "--spec-rollback", "replay")
    assert "has no effect" not in said


def test_replay_without_a_state_band_is_warned(trace, full_only):
    said = _simulate(trace, full_only, "--spec-tokens", "2", "--spec-rollback", "replay")
    assert NO_STATE in said and NO_DRAFTS not in said
    result = run("plan", "--spec", full_only, "--buffer-bytes", "1000000000",
                 "--spec-tokens", "2", "--spec-rollback", "replay")
    assert result.exit_code == 0, result.output
    assert NO_STATE in flat(result.stderr)
    result = run("plan", "--spec", full_only, "--buffer-bytes", "1000000000",
                 "--spec-rollback", "checkpoints")
    assert f"--spec-rollback {NO_DRAFTS}" in flat(result.stderr)


def test_plan_speculative_line_names_only_the_models_bands(full_only, with_state):
    """A full-only model has no window and no state: the line says neither 'W + k' nor
    'state slots'; a full + state model says the state slots but no window."""
    args = ["--buffer-bytes", "1000000000", "--spec-tokens", "3"]
    text = flat(run("plan", "--spec", full_only, *args).stdout)
    assert "(--spec-tokens; k more tokens of every band)" in text
    assert "W + k" not in text and "state slot" not in text
    text = flat(run("plan", "--spec", with_state, *args).stdout)
    assert ("(--spec-tokens; k more tokens of every band, checkpoints: k more state slots "
            "per request)") in text
    assert "W + k" not in text
    text = flat(run("plan", "--model", "gpt-oss-120b", *args).stdout)
    assert "k more tokens of every band, W + k window tokens until verified)" in text
    assert "state slot" not in text
