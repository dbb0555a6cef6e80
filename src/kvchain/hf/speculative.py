"""Speculative decoding pieces for :class:`kvchain.hf.ChainEngine`: the draft and the verify.

A speculative decode step of a request with ``L`` tokens in its cache (the last sampled
token ``t`` not yet computed) runs:

1. the **draft** proposes ``k`` tokens ``d_1 .. d_k`` continuing the sequence;
2. the target computes ``t, d_1 .. d_k`` (``1 + k`` tokens, positions ``L .. L + k``) in one
   forward over the chain's pages and takes its own greedy argmax ``g_0 .. g_k`` at every
   position;
3. :func:`accepted_drafts`: ``a`` = the longest prefix with ``d_i == g_{i-1}``; the step
   emits ``g_0 .. g_a`` (``1 + a`` tokens: the accepted drafts, then the target's own token
   where the first draft was wrong, or its bonus token after ``d_k``). These are exactly
   the tokens greedy decoding of the target emits (Leviathan et al. 2023, "Fast Inference
   from Transformers via Speculative Decoding", greedy case), so speculation never changes
   the output.

The draft here keeps its own cache in transformers (one ``generate`` per step over the
whole sequence: its cache is rebuilt each step, never in the chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from kvchain.errors import ConfigError


class Draft(Protocol):
    """Proposes draft tokens for a speculative step."""

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """``k`` token ids continuing ``tokens`` (the request's prompt and generated tokens,
        the last sampled one included)."""
        ...


class ModelDraft:
    """A draft model: greedy ``generate`` of a transformers causal LM with its own cache.

    Each :meth:`propose` runs ``model.generate`` over the whole sequence (transformers
    builds and drops its ``DynamicCache``; the draft's KV and state are not in the chain).

    Args:
        model: a transformers causal LM sharing the target's vocabulary (token ids).

    Raises:
        ConfigError: a model without ``generate``.
    """

    def __init__(self, model: Any) -> None:
        if not hasattr(model, "generate"):
            raise ConfigError(f"a draft model needs generate(); got {type(model).__name__}")
        self.model = model
        self.proposed = 0

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """``k`` greedy tokens of the draft model after ``tokens`` (``k >= 1``)."""
        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=k, min_new_tokens=k, do_sample=False)
        self.proposed += k
        return [int(t) for t in out[0, ids.shape[1]:].tolist()]


def accepted_drafts(drafts: Sequence[int], greedy: Sequence[int]) -> int:
    """Drafts the verify accepts: the longest prefix of ``drafts`` (``k`` tokens) equal to
    the target's greedy tokens ``greedy`` at the same positions (``greedy[i]`` is the
    target's argmax after the step's token ``i``; ``len(greedy) >= k``), so ``0 <= a <= k``.
    """
    a = 0
    for d, g in zip(drafts, greedy, strict=False):
        if d != g:
            break
        a += 1
    return a
