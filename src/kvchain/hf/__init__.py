"""Hugging Face transformers causal LMs on the chain (optional extra ``kvchain[hf]``).

Nothing here is imported by ``import kvchain``; importing ``kvchain.hf`` needs torch and
transformers (:class:`HFUnavailableError` otherwise). The pieces (see ``docs/hf.md``):

* :mod:`kvchain.hf.layers` - the model's cache layers as kvchain ``LayerCache`` s;
* :mod:`kvchain.hf.cache` - a transformers ``Cache`` whose attention layers write K/V into
  the request's pages and whose recurrent layers keep conv/SSM state in its state slot;
* :mod:`kvchain.hf.attention` - the paged-attention reference, registered in
  transformers' ``AttentionInterface`` as ``"kvchain_paged"``;
* :mod:`kvchain.hf.runner` - one model bound to the chain's bands (the target, and a
  chain draft's own bands) and its forward over the requests' pages;
* :mod:`kvchain.hf.engine` - a batched generation loop on kvchain's scheduler (optionally
  speculative: ``spec_tokens`` drafts per decode, verified and rolled back);
* :mod:`kvchain.hf.speculative` - the drafts (transformers' cache, or the chain's draft
  bands) and the verify's acceptance rule;
* :mod:`kvchain.hf.checkpoints` - ``CHECKPOINTS`` rollback: the verify's recurrent mixers
  run position by position and save the state after each position.
"""

from __future__ import annotations

from kvchain.hf.compat import HFUnavailableError, require_hf

require_hf()

from kvchain.hf.attention import ATTENTION_NAME, paged_attention  # noqa: E402
from kvchain.hf.cache import ChainCache  # noqa: E402
from kvchain.hf.engine import ChainEngine, GenerationResult, SpecStats  # noqa: E402
from kvchain.hf.layers import model_layer_caches, model_spec  # noqa: E402
from kvchain.hf.runner import ModelRunner  # noqa: E402
from kvchain.hf.speculative import ChainDraft, Draft, ModelDraft, accepted_drafts  # noqa: E402

__all__ = [
    "ATTENTION_NAME",
    "ChainCache",
    "ChainDraft",
    "ChainEngine",
    "Draft",
    "GenerationResult",
    "HFUnavailableError",
    "ModelDraft",
    "ModelRunner",
    "SpecStats",
    "accepted_drafts",
    "model_layer_caches",
    "model_spec",
    "paged_attention",
    "require_hf",
]
