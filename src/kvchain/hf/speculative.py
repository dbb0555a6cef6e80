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

Two drafts: :class:`ModelDraft` keeps its own cache in transformers (one ``generate`` per
step over the whole sequence: its cache is rebuilt each step, never in the chain);
:class:`ChainDraft` keeps its KV and state in the chain's draft bands, decoded and rolled
back by :class:`kvchain.hf.ChainEngine` beside the target's.
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


class ChainDraft:
    """A draft model whose cache lives in the chain: its layers become bands of their own
    (``draft.full``, ``draft.window``, ``draft.state``; :func:`kvchain.model.with_draft`)
    in the target's chain, priced with the target's in one buffer.
    :class:`kvchain.hf.ChainEngine` prefills every prompt chunk through it into its pages,
    has it propose ``k`` tokens by one-token decodes over its pages, and rolls it back
    with the target (its pages by ``KVManager.verify``, its state by the engine's
    rollback mode).

    Args:
        model: a transformers causal LM with the target's vocabulary (token ids), in eval
            mode on the target's device.

    Raises:
        ConfigError: ``model`` is not a transformers model (no ``config``).
    """

    def __init__(self, model: Any) -> None:
        if not hasattr(model, "config"):
            raise ConfigError(f"a chain draft needs a transformers model; got "
                              f"{type(model).__name__}")
        self.model = model


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
