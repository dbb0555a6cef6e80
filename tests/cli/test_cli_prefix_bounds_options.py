"""`kvchain prefix-bounds`: options it was given but did not read are refused or said."""

from __future__ import annotations

import pytest

from .helpers import flat, run


@pytest.mark.parametrize(("args", "words"), [
    # Regression: a misspelt --model was never loaded without --capacity-bytes (exit 0).
    (["--model", "gpt-oss-12b"], "gpt-oss-12b"),
    # Regression: --tp was read only with --capacity-bytes, so 0 and -1 passed.
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--tp", "-1", "--model", "gpt-oss-120b"], "--tp must be >= 1, got -1"),
    (["--capacity-pages", "0"], "--capacity-pages must be >= 1, got 0"),
    (["--capacity-bytes", "0", "--model", "gpt-oss-120b"],
     "--capacity-bytes must be >= 1, got 0"),
])
def test_bad_options_exit_2_before_the_trace_is_read(args, words):
    result = run("prefix-bounds", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert flat(result.stderr).startswith("error:") and words in flat(result.stderr)


def test_a_model_without_capacity_bytes_is_said_unused():
    result = run("prefix-bounds", "--requests", "50", "--json", "--model", "gpt-oss-120b")
    assert result.exit_code == 0, result.output
    assert "warning: --model only sizes the pages of --capacity-bytes" in flat(result.stderr)
    result = run("prefix-bounds", "--requests", "50", "--json", "--tp", "2")
    assert result.exit_code == 0, result.output
    assert "warning: --tp only splits the bytes of --model's pages" in flat(result.stderr)
    result = run("prefix-bounds", "--requests", "50", "--json")
    assert result.stderr == ""
