"""A refusal that comes from loading the draft model names the draft: ``--tp 32`` divides
Qwen3-8B's 32 attention heads but not Qwen3-0.6B's 16, and the message said only
``tp=32 does not divide num_attention_heads=16``, which reads as a fact about the target
the user named with ``--model``."""

from __future__ import annotations

import pytest

from kvchain.catalog.loader import load_model, load_model_source
from kvchain.errors import ConfigError

from .helpers import flat, run


def test_library_refusal_names_the_draft() -> None:
    load_model("Qwen3-8B", tp=32)  # the target alone loads: 32 / 32 heads
    with pytest.raises(ConfigError) as info:
        load_model_source("Qwen3-8B", tp=32, draft_model="Qwen3-0.6B")
    assert str(info.value).startswith("--draft-model Qwen3-0.6B: ")
    assert "num_attention_heads=16" in str(info.value)


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_cli_refusal_names_the_draft(command: str) -> None:
    args = ["--spec-tokens", "2", "--requests", "5"] if command == "simulate" else []
    result = run(command, "--model", "Qwen3-8B", "--tp", "32", "--draft-model",
                 "Qwen3-0.6B", *args)
    assert result.exit_code == 2
    err = flat(result.stderr)
    assert "--draft-model Qwen3-0.6B: tp=32 does not divide num_attention_heads=16" in err
    assert "Traceback" not in err
