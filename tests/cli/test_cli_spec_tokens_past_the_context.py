"""``--spec-tokens`` at or past the model's context exits 2 with the message on stderr, from
``plan`` and ``simulate`` (Qwen3-8B: context 40,960 tokens; tests/sim has the library
side)."""

from __future__ import annotations

import pytest

from .helpers import flat, run


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_cli_refuses_k_past_the_context(command: str) -> None:
    extra = ["--requests", "2"] if command == "simulate" else []
    result = run(command, "--model", "Qwen3-8B", "--spec-tokens", "100000", *extra)
    assert result.exit_code == 2
    err = flat(result.stderr)
    assert "spec_tokens 100,000" in err and "context of 40,960 tokens" in err
    assert "Traceback" not in err
