"""A spec file without weights: the roofline clock's error names only the violated
conditions (it printed all of them, the satisfied ``weight_bytes >= 0 (0)`` among them),
and the step clock, which reads no weights, is not warned that it counts no weight reads."""

from __future__ import annotations

import json

from .helpers import flat, run

NEEDS = ("a model declared without weights needs them (spec file: weight_bytes, "
         "total_params, active_params) or the step clock (--clock steps)")


def _spec(tmp_path, **extra):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "m", "full": 1000, "window": 1000,
                                "window_tokens": 64, **extra}))
    return str(path)


def test_roofline_error_names_only_the_violated_conditions(tmp_path):
    result = run("simulate", "--spec", _spec(tmp_path), "--requests", "5", columns=400)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: model m: need total_params >= 1 (0) and active_params >= 1 "
                     f"(0); {NEEDS}"]
    # total 10, active 20: only the order is violated
    result = run("simulate", "--spec", _spec(tmp_path, total_params=10, active_params=20,
                                             weight_bytes=20), "--requests", "5",
                 columns=400)
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: model m: need active_params (20) <= "
                                     f"total_params (10); {NEEDS}")


def test_step_clock_is_not_warned_of_weight_reads(tmp_path):
    spec = _spec(tmp_path)
    result = run("simulate", "--spec", spec, "--requests", "5", "--clock", "steps",
                 "--buffer-bytes", "1000000000", "--json")
    assert result.exit_code == 0, result.output
    assert "declares no weights" not in flat(result.stderr)
    # without --buffer-bytes the buffer still takes the whole GPU: that part stays
    result = run("simulate", "--spec", spec, "--requests", "5", "--clock", "steps", "--json")
    assert result.exit_code == 0, result.output
    said = flat(result.stderr)
    assert ("declares no weights (weight_bytes): the KV buffer from --mem-fraction takes "
            "the whole GPU") in said
    assert "weight reads" not in said
    # plan prices no step: the same
    result = run("plan", "--spec", spec, "--buffer-bytes", "1000000000")
    assert result.exit_code == 0, result.output
    assert "declares no weights" not in flat(result.stderr)
