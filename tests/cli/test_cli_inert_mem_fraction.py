"""``--mem-fraction`` beside ``--buffer-bytes`` sizes nothing: plan and simulate say so
(they ran silently), and only when the fraction was typed."""

from __future__ import annotations

import pytest

from .helpers import flat, run

WORDS = "warning: --mem-fraction 0.5 has no effect with --buffer-bytes"


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n")
    return str(path)


def test_plan_warns_of_a_fraction_the_buffer_overrides():
    result = run("plan", "--buffer-bytes", "10000000000", "--mem-fraction", "0.5", "--json")
    assert result.exit_code == 0, result.output
    assert WORDS in flat(result.stderr)
    # Not typed (the default 0.9) or no --buffer-bytes: no warning.
    for args in (["--buffer-bytes", "10000000000"], ["--mem-fraction", "0.5"]):
        result = run("plan", *args, "--json")
        assert result.exit_code == 0, result.output
        assert "has no effect" not in flat(result.stderr)


def test_simulate_warns_of_a_fraction_the_buffer_overrides(trace):
    result = run("simulate", "--trace", trace, "--clock", "steps", "--buffer-bytes",
                 "10000000000", "--mem-fraction", "0.5", "--json")
    assert result.exit_code == 0, result.output
    assert WORDS in flat(result.stderr)
    result = run("simulate", "--trace", trace, "--clock", "steps", "--buffer-bytes",
                 "10000000000", "--json")
    assert result.exit_code == 0, result.output
    assert "has no effect" not in flat(result.stderr)
