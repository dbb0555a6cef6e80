"""Paged attention in torch (a reference, not a kernel), registered with transformers.

For each row of the batch: gather its pages of the layer's band through the physical page
table (``[B, pages] -> [B, pages * P, kv_heads, head_dim]``), mask, attend::

    key j visible to query i  iff  j <= i                         (causal)
                              and  j > i - W                      (sliding window W)
                              or   j // C == i // C               (chunked local, C)

(transformers' ``sliding_window_overlay`` and ``chunked_overlay`` in ``masking_utils``).
Without sinks it is ``torch.nn.functional.scaled_dot_product_attention``; with attention
sinks (gpt-oss: one learned logit per head that joins the softmax and is dropped after it,
as transformers' ``GptOssAttention`` eager path does) the softmax is written out.

Registered as ``"kvchain_paged"`` in ``transformers.AttentionInterface``; no mask function
is registered for it, so transformers builds no mask (its custom-attention path).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from kvchain.hf.context import current_batch

ATTENTION_NAME = "kvchain_paged"


def _gather(view: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``[N, P, H, D]`` view, ``[B, n]`` table -> ``[B, H, n * P, D]``."""
    pages = view[table]  # [B, n, P, H, D]
    b, n, p, h, d = pages.shape
    return pages.reshape(b, n * p, h, d).transpose(1, 2)


def paged_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None,
                    dropout: float = 0.0, s_aux: torch.Tensor | None = None,
                    softcap: float | None = None, **kwargs: Any
                    ) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature: ``query`` ``[B, q_heads, T, D]``; ``key``
    and ``value`` (this step's, already written to the pages) are not read. Returns
    ``([B, T, q_heads, D_v], None)``.

    Raises:
        NoForwardContextError: called outside a forward context.
        NotImplementedError: logit soft-capping (no family tested here uses it).
    """
    if softcap is not None:
        raise NotImplementedError("kvchain_paged attention has no logit soft-capping")
    batch = current_batch()
    binding = batch.layers[module.layer_idx]
    table = batch.tables[binding.band]
    k = _gather(binding.views["k"], table).to(query.dtype)
    v = _gather(binding.views["v"], table).to(query.dtype)
    groups = query.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    i = batch.positions()[:, None, :, None]  # [B, 1, T, 1]
    j = torch.arange(k.shape[2], device=query.device)[None, None, None, :]
    mask = j <= i
    if binding.window is not None:
        if binding.local:
            mask = mask & (j // binding.window == i // binding.window)
        else:
            mask = mask & (j > i - binding.window)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if s_aux is None:
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)
    else:
        logits = torch.matmul(query, k.transpose(2, 3)) * scale
        logits = logits.masked_fill(~mask, float("-inf"))
        sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[2], 1)
        logits = torch.cat([logits, sinks.to(logits.dtype)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits, dim=-1)[..., :-1]
        out = torch.matmul(probs, v)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, paged_attention)
