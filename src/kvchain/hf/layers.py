"""A transformers model's cache layers as kvchain :class:`~kvchain.model.layers.LayerCache` s.

Two sources, each for what it knows:

* **Lifetimes and windows** come from kvchain's own config loader,
  :func:`kvchain.model.hf.load_hf_config` on ``model.config.to_dict()``. Where the loader
  refuses a config (e.g. transformers' ``NemotronHConfig.to_dict()`` names its layer list
  ``layers_block_type`` and carries no ``num_hidden_layers``), they come from the model's
  own ``config.layer_types`` (``full_attention``, ``sliding_attention`` with
  ``sliding_window``, ``chunked_attention`` with ``attention_chunk_size``,
  ``linear_attention``).
* **Tensor shapes and dtypes** come from the model itself: one 2-token forward with
  transformers' ``DynamicCache`` shows what each layer stores. The pages must hold exactly
  the bytes the model reads: transformers keeps a Mamba-2 / Gated DeltaNet conv state of
  all ``K`` kernel columns (``[conv_dim, K]``), where the loader's vLLM-style declaration
  has ``K - 1`` rows (``[K - 1, conv_dim]``), so the loader's state shapes are not used.

Attention tensors per token: ``k`` and ``v`` of shape ``(kv_heads, head_dim)``; state
tensors per request: ``conv`` and ``recurrent`` in transformers' shapes (e.g. Qwen3-Next
Gated DeltaNet: conv ``(2 * k_heads * k_dim + v_heads * v_dim, K)``, recurrent
``(v_heads, k_dim, v_dim)``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

from kvchain.errors import ConfigError, KVChainError
from kvchain.model.hf import load_hf_config
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.spec import ModelSpec

_DTYPES = {
    torch.float32: CacheDtype.FP32,
    torch.bfloat16: CacheDtype.BF16,
    torch.float16: CacheDtype.FP16,
}

_TYPES = {
    "full_attention": LifetimeClass.FULL,
    "sliding_attention": LifetimeClass.WINDOW,
    "chunked_attention": LifetimeClass.LOCAL,
    "linear_attention": LifetimeClass.STATE,
}


def cache_dtype(dtype: torch.dtype) -> CacheDtype:
    """kvchain's element type for a torch dtype (fp32, bf16, fp16).

    Raises:
        ConfigError: any other dtype.
    """
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"cache dtype {dtype} is not supported by kvchain.hf") from None


def _probe(model: Any) -> dict[int, tuple[TensorDecl, ...]]:
    """Per layer index, the tensors transformers' own cache keeps after a 2-token forward
    (layers with no cache omitted)."""
    config = model.config.get_text_config(decoder=True)
    cache = DynamicCache(config=config)
    ids = torch.zeros((1, 2), dtype=torch.long, device=model.device)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    out: dict[int, tuple[TensorDecl, ...]] = {}
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            tensors = []
            for name, states in (("conv", layer.conv_states), ("recurrent",
                                                                layer.recurrent_states)):
                t = states.get(0)
                if t is not None:
                    tensors.append(TensorDecl(name, tuple(t.shape[1:]), cache_dtype(t.dtype)))
            out[i] = tuple(tensors)
        elif (isinstance(layer, CacheLayerMixin) and layer.keys is not None
              and layer.values is not None):
            k, v = layer.keys, layer.values
            out[i] = (TensorDecl("k", (k.shape[1], k.shape[3]), cache_dtype(k.dtype)),
                      TensorDecl("v", (v.shape[1], v.shape[3]), cache_dtype(v.dtype)))
    return out


def _lifetimes_from_loader(config: Any) -> dict[int, tuple[LifetimeClass, int | None]] | None:
    try:
        spec = load_hf_config(config.to_dict())
    except KVChainError:
        return None
    return {layer.index: (layer.lifetime, layer.window) for layer in spec.layers}


def _lifetimes_from_config(config: Any) -> dict[int, tuple[LifetimeClass, int | None]]:
    types = getattr(config, "layer_types", None)
    if not types:
        raise ConfigError(f"{type(config).__name__} has no layer_types and kvchain's loader "
                          f"refuses it: cannot tell the layers' lifetimes")
    out: dict[int, tuple[LifetimeClass, int | None]] = {}
    for i, kind in enumerate(types):
        lifetime = _TYPES.get(kind)
        if lifetime is None:
            continue
        window = None
        if lifetime is LifetimeClass.WINDOW:
            window = int(config.sliding_window)
        elif lifetime is LifetimeClass.LOCAL:
            window = int(config.attention_chunk_size)
        out[i] = (lifetime, window)
    return out


def model_layer_caches(model: Any) -> tuple[LayerCache, ...]:
    """Every cache-keeping layer of ``model`` (a transformers causal LM), in model order.

    Runs one 2-token forward of the model (no gradient) to read its cache tensors.

    Returns:
        ``LayerCache`` per layer: attention layers with ``k``/``v`` per token (lifetime
        full, window with ``W = sliding_window``, or local with ``C =
        attention_chunk_size``), recurrent layers (lifetime state, kind ``"recurrent"``)
        with transformers' ``conv``/``recurrent`` shapes per request.

    Raises:
        ConfigError: a layer whose lifetime cannot be told, a layer kind the probe and the
            config disagree on, or a cache dtype other than fp32/bf16/fp16.
    """
    config = model.config.get_text_config(decoder=True)
    tensors = _probe(model)
    lifetimes = _lifetimes_from_loader(config)
    if lifetimes is None or set(lifetimes) != set(tensors):
        lifetimes = _lifetimes_from_config(config)
    if set(lifetimes) != set(tensors):
        raise ConfigError(f"layers with a cache {sorted(tensors)} differ from the layers the "
                          f"config declares {sorted(lifetimes)}")
    out = []
    for i in sorted(tensors):
        lifetime, window = lifetimes[i]
        is_state = tensors[i][0].name != "k"
        if is_state != (lifetime is LifetimeClass.STATE):
            raise ConfigError(f"layer {i}: the config says {lifetime} but the model keeps "
                              f"{[t.name for t in tensors[i]]}")
        kind = "recurrent" if is_state else "attention"
        out.append(LayerCache(i, lifetime, kind, tensors[i], window))
    return tuple(out)


def model_spec(model: Any) -> ModelSpec:
    """A :class:`~kvchain.model.spec.ModelSpec` of a loaded transformers model: its cache
    layers (:func:`model_layer_caches`, one probe forward), layer count, width and heads
    from its text config, and its parameters counted from the module itself
    (``total_params = active_params`` = every parameter's element count, since which
    experts a token reads is not known here; ``weight_bytes`` = elements x element size).
    What :func:`kvchain.model.with_draft` joins a draft model with.

    Raises:
        ConfigError: as :func:`model_layer_caches`.
    """
    config = model.config.get_text_config(decoder=True)
    layers = model_layer_caches(model)
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    return ModelSpec(
        name=str(getattr(config, "model_type", type(model).__name__)), layers=layers,
        num_layers=int(getattr(config, "num_hidden_layers", 0) or len(layers)),
        hidden_size=int(config.hidden_size),
        num_attention_heads=int(getattr(config, "num_attention_heads", 0) or 0),
        total_params=count, active_params=count,
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
        max_context_tokens=getattr(config, "max_position_embeddings", None))
