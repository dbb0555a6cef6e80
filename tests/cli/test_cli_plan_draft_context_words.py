"""``kvchain plan`` names where a drafted model's context comes from. with_draft caps the
joined model's context at the shorter of the two (a draft computes every token): gemma-3-27b
declares 131,072 tokens (max_position_embeddings), its draft gemma-3-1b 32,768, so the plan
is bound at 32,768. The line said "the model's context 32,768 tokens
(max_position_embeddings)", a number gemma-3-27b's config does not hold."""

from __future__ import annotations

from .helpers import flat, run


def test_plan_says_the_draft_shortens_the_context() -> None:
    result = run("plan", "--model", "gemma-3-27b", "--draft-model", "gemma-3-1b")
    assert result.exit_code == 0
    out = flat(result.stdout)
    assert "the model's context 32,768 tokens (max_position_embeddings)" not in out
    assert ("the context 32,768 tokens (the shorter max_position_embeddings of the "
            "target and the draft gemma-3-1b)") in out


def test_plan_without_a_draft_keeps_the_models_context_words() -> None:
    out = flat(run("plan", "--model", "gemma-3-27b").stdout)
    assert "the model's context 131,072 tokens (max_position_embeddings)" in out
