"""Load a Hugging Face ``config.json`` as a :class:`~kvchain.model.spec.ModelSpec`.

Pipeline: :func:`~kvchain.model.hf_layers.layer_plans` says what each layer runs,
:mod:`~kvchain.model.hf_geometry` reads the numbers of each mixer,
:mod:`~kvchain.model.cache_tensors` turns them into per-rank cache tensors, and
:mod:`~kvchain.model.params` counts parameters and weight bytes.

Lifetime of each mixer::

    full attention, MLA       -> FULL    (E_full bytes per token)
    compressed KV (DeepSeek-V4
    CSA/HCA)                  -> FULL    (entry bytes / tokens per entry, per token)
    sliding-window attention  -> WINDOW  (window = W tokens; one class per window size)
    chunked attention         -> LOCAL   (window = C tokens, the attention chunk)
    Mamba-1/2, Gated DeltaNet,
    KDA, lightning, JetBlock  -> STATE   (S bytes per request)

Every family and the source of its rule: ``docs/models.md``.

A Falcon-H1 layer runs attention and Mamba-2 in parallel: it yields two
:class:`~kvchain.model.layers.LayerCache` entries with the same index (one FULL, one STATE).

Worked example, Jet-Nemotron-2B (bf16, tp=1): 2 full layers x 2 KV heads x (128 + 128)
x 2 B = 1,024 B each, ``E_full = 2,048 B``; 2 window layers, ``E_win = 2,048 B``,
``W = 1,152``; 24 JetBlocks x (12 x 96 x 256 x 2 B + 3,072 x 4 x 2 B) = ``S =
14,745,600 B``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kvchain.errors import ConfigError
from kvchain.model import cache_tensors as ct
from kvchain.model.hf_dtypes import config_dtypes, parse_dtype
from kvchain.model.hf_geometry import (
    attention_geometry,
    compressed_geometry,
    gated_delta_net_geometry,
    hidden_size,
    jet_geometry,
    kda_geometry,
    layer_overrides,
    mamba1_geometry,
    mamba2_geometry,
)
from kvchain.model.hf_layers import HFConfig, LayerPlan, Mixer, layer_plans, read_config
from kvchain.model.hf_transformers import ReadThrough
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.params import WeightFormat, count_params, weight_bytes, weight_format_of
from kvchain.model.spec import ModelSpec

_LIFETIME = {
    Mixer.FULL: LifetimeClass.FULL,
    Mixer.WINDOW: LifetimeClass.WINDOW,
    Mixer.LOCAL: LifetimeClass.LOCAL,
    Mixer.CSA: LifetimeClass.FULL,  # compressed entries live as long as the request
    Mixer.HCA: LifetimeClass.FULL,
}

_KIND = {
    Mixer.MAMBA1: "mamba1",
    Mixer.MAMBA2: "mamba2",
    Mixer.GATED_DELTA_NET: "gated_delta_net",
    Mixer.LIGHTNING: "lightning",
    Mixer.JET: "jet",
    Mixer.KDA: "kda",
    Mixer.CSA: "csa",
    Mixer.HCA: "hca",
}


def _state_dtypes(cfg: HFConfig, state_dtype: CacheDtype | None) -> ct.StateDtypes:
    if state_dtype is not None:
        return ct.StateDtypes(conv=state_dtype, temporal=state_dtype)
    declared = config_dtypes(cfg)
    return ct.StateDtypes(
        conv=declared.conv or CacheDtype.BF16, temporal=declared.temporal or CacheDtype.BF16
    )


_DTYPE_RULE = ("kvchain default: 2-byte bf16, as vLLM's 'auto' cache dtype gives a model "
               "without a 16-bit torch_dtype")


def _note_dtype_defaults(cfg: HFConfig, layers: tuple[LayerCache, ...],
                         kv_dtype: CacheDtype | None, state_dtype: CacheDtype | None) -> None:
    """Record the cache dtypes taken as bf16 because neither the caller nor the config
    chose one; a config whose ``torch_dtype`` (``dtype``) is 16-bit sets them itself (the
    cache follows the model's dtype, 2 bytes either way)."""
    for key in ("torch_dtype", "dtype"):
        try:
            model = parse_dtype(cfg.get(key), key)
        except ConfigError:
            model = None
        if model in (CacheDtype.BF16, CacheDtype.FP16):
            return
    declared = config_dtypes(cfg)
    has_state = any(layer.lifetime is LifetimeClass.STATE for layer in layers)
    if kv_dtype is None and declared.kv is None and not all(
            layer.lifetime is LifetimeClass.STATE for layer in layers):
        cfg.note_default("kv_cache_dtype", CacheDtype.BF16.value, _DTYPE_RULE)
    if state_dtype is None and has_state:
        if declared.temporal is None:
            cfg.note_default("mamba_ssm_cache_dtype", CacheDtype.BF16.value, _DTYPE_RULE)
        if declared.conv is None:
            cfg.note_default("mamba_conv_dtype", CacheDtype.BF16.value, _DTYPE_RULE)


def _attention_cache(
    cfg: HFConfig, mixer: Mixer, tp: int, kv_dtype: CacheDtype, layer: int
) -> tuple[str, tuple[TensorDecl, ...], int | None]:
    if mixer.is_compressed:
        comp = compressed_geometry(cfg, mixer)
        tensors = ct.compressed_tensors(comp.group_tokens, comp.entry_dims, kv_dtype)
        return _KIND[mixer], tensors, None
    geo = attention_geometry(cfg, mixer, layer)
    ct.split(geo.q_heads, tp, "num_attention_heads")
    if geo.mla_latent_dim is not None:
        rope = cfg.positive_int("qk_rope_head_dim")
        tensors = ct.mla_tensors(geo.mla_latent_dim - rope, rope, kv_dtype)
        return "mla", tensors, geo.window
    if geo.kv_shared:
        tensors = ct.shared_kv_tensors(geo.kv_heads, geo.k_head_dim, tp, kv_dtype)
        return "shared_kv", tensors, geo.window
    tensors = ct.attention_tensors(geo.kv_heads, geo.k_head_dim, geo.v_head_dim, tp, kv_dtype)
    return "gqa", tensors, geo.window


def _state_tensors(
    cfg: HFConfig, mixer: Mixer, tp: int, dtypes: ct.StateDtypes
) -> tuple[TensorDecl, ...]:
    if mixer is Mixer.MAMBA1:
        m1 = mamba1_geometry(cfg)
        return ct.mamba1_tensors(m1.d_inner, m1.d_state, m1.conv_kernel, tp, dtypes)
    if mixer is Mixer.MAMBA2:
        m2 = mamba2_geometry(cfg)
        return ct.mamba2_tensors(
            m2.d_inner, m2.n_groups, m2.heads, m2.head_dim, m2.d_state, m2.conv_kernel, tp, dtypes
        )
    if mixer in (Mixer.GATED_DELTA_NET, Mixer.KDA):
        gd = gated_delta_net_geometry(cfg) if mixer is Mixer.GATED_DELTA_NET else kda_geometry(cfg)
        return ct.gated_delta_net_tensors(
            gd.k_heads, gd.v_heads, gd.k_head_dim, gd.v_head_dim, gd.conv_kernel, tp, dtypes
        )
    if mixer is Mixer.LIGHTNING:
        geo = attention_geometry(cfg, Mixer.FULL)
        return ct.lightning_tensors(geo.q_heads, geo.k_head_dim, tp, dtypes)
    jet = jet_geometry(cfg)
    return ct.jet_tensors(jet.heads, jet.k_head_dim, jet.v_head_dim, jet.conv_kernel, tp, dtypes)


def _window_key(cfg: HFConfig, mixer: Mixer, layer: int) -> object:
    if mixer is not Mixer.WINDOW:
        return None
    windows = cfg.get("sliding_window")
    return layer if isinstance(windows, list | tuple) else None


def layer_caches(
    cfg: HFConfig,
    plans: tuple[LayerPlan, ...],
    *,
    kv_dtype: CacheDtype | None = None,
    tp: int = 1,
    state_dtype: CacheDtype | None = None,
) -> tuple[LayerCache, ...]:
    """Cache declarations of every cache-keeping mixer, in model order, per rank.

    Tensors of one kind of mixer are built once and shared by its layers (per distinct
    per-layer geometry and window when the config has them). ``kv_dtype=None``: the
    config's declared KV dtype, else bf16 (:mod:`~kvchain.model.hf_dtypes`).

    Raises:
        ConfigError: ``tp`` does not divide the heads or channels of a mixer, a zero or
            negative window, or other invalid geometry (names the field).
        MissingFieldError: a field a mixer needs.
    """
    dtypes = _state_dtypes(cfg, state_dtype)
    kv = kv_dtype if kv_dtype is not None else (config_dtypes(cfg).kv or CacheDtype.BF16)
    built: dict[tuple[object, ...], tuple[str, tuple[TensorDecl, ...], int | None]] = {}
    out: list[LayerCache] = []
    for plan in plans:
        for mixer in plan.mixers:
            key = (mixer, layer_overrides(cfg, mixer, plan.index),
                   _window_key(cfg, mixer, plan.index))
            if key not in built:
                if mixer.is_attention or mixer.is_compressed:
                    built[key] = _attention_cache(cfg, mixer, tp, kv, plan.index)
                else:
                    built[key] = (_KIND[mixer], _state_tensors(cfg, mixer, tp, dtypes), None)
            kind, tensors, window = built[key]
            lifetime = _LIFETIME.get(mixer, LifetimeClass.STATE)
            out.append(LayerCache(plan.index, lifetime, kind, tensors, window))
    return tuple(out)


def _default_name(cfg: HFConfig) -> str:
    if cfg.origin:
        stem = Path(cfg.origin).name
        if stem.endswith(".json"):
            stem = stem[: -len(".json")]
        return stem.split("--", 1)[-1] if "--" in stem else stem
    return cfg.model_types[0] if cfg.model_types else "model"


def load_hf_config(
    config: str | Path | Mapping[str, object],
    *,
    name: str | None = None,
    kv_dtype: CacheDtype | None = None,
    tp: int = 1,
    state_dtype: CacheDtype | None = None,
    weight_format: WeightFormat | None = None,
    source: str | None = None,
    use_transformers: bool = True,
    read_as: ReadThrough | None = None,
) -> ModelSpec:
    """Build the :class:`ModelSpec` of one tensor-parallel rank from a ``config.json``.

    Args:
        config: path of a ``config.json`` or its parsed mapping.
        name: display name (default: the file name without ``org--`` and ``.json``, or the
            ``model_type``).
        kv_dtype: element type of attention K/V (MLA latents, compressed KV); ``None``:
            what the config declares (``kv_cache_dtype``, ``quantization_config``), else
            bf16 (see :mod:`~kvchain.model.hf_dtypes`).
        tp: tensor-parallel ranks; bytes are per rank. KV heads split over ranks (one
            replicated head per rank when ``kv_heads < tp``); MLA latents are replicated;
            state heads and conv channels split (see :mod:`kvchain.model.cache_tensors`).
        state_dtype: element type of all recurrent state tensors; default: what the
            config declares (``mamba_ssm_cache_dtype`` of Nemotron 3, ``mamba_ssm_dtype``
            of Qwen3.5, ``mamba_cache_dtype``...), else bf16.
        weight_format: how the checkpoint stores weights; default from
            ``quantization_config`` (see :func:`~kvchain.model.params.weight_format_of`).
        source: where the config came from (default: its path or ``_name_or_path``).
        use_transformers: read the config through transformers' configuration class
            when transformers is installed and knows the ``model_type`` (see
            :mod:`~kvchain.model.hf_transformers`); ``False`` reads the raw dict only.
        read_as: a reading of ``config`` made before (a bundled model's frozen
            transformers view), used instead of reading it now.

    Returns:
        The model's cache layers (grouped into lifetime classes by ``ModelSpec``), its
        layer count, width, query heads per rank, parameters and weight bytes per rank, and
        its context length (``max_position_embeddings``, ``None`` if absent), and
        ``defaulted``: every field read that the file did not set, with its value and
        who supplied it (see :class:`~kvchain.model.spec.DefaultedField`).

    Raises:
        UnknownFamilyError: nothing maps the config's layers (names ``model_type`` and
            ``architectures``), or a per-layer kind kvchain does not know.
        MissingFieldError: a needed field is absent (e.g. no ``head_dim`` and no
            ``hidden_size``/``num_attention_heads``; no ``sliding_window`` for window
            layers; no ``vocab_size``).
        ConfigError: invalid values: ``tp < 1``, ``tp`` not dividing the query heads, KV
            heads, state heads or channels; a zero or negative window; a per-layer list
            whose length is not ``num_hidden_layers``.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tp must be a positive integer, got {tp!r}")
    cfg = read_config(config, use_transformers=use_transformers, read_as=read_as)
    plans = layer_plans(cfg)
    layers = layer_caches(cfg, plans, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    if not layers:
        raise ConfigError(f"config ({cfg.family}) declares no cache-keeping layer")
    _note_dtype_defaults(cfg, layers, kv_dtype, state_dtype)
    counts = count_params(cfg, plans)
    fmt = weight_format if weight_format is not None else weight_format_of(cfg)
    heads = cfg.optional_int("num_attention_heads", default=0, minimum=0)
    context = context_tokens(cfg)
    return ModelSpec(
        name=name or _default_name(cfg),
        layers=layers,
        num_layers=len(plans),
        hidden_size=hidden_size(cfg),
        num_attention_heads=heads // tp,
        total_params=counts.total,
        active_params=counts.active,
        weight_bytes=weight_bytes(counts, fmt, tp),
        tp=tp,
        source=cfg.origin if source is None else source,
        max_context_tokens=context,
        defaulted=cfg.noted(),
    )


def context_tokens(cfg: HFConfig) -> int | None:
    """The model's context length in tokens: ``max_position_embeddings`` (or
    ``model_max_length``, ``max_sequence_length``, ``seq_length``); ``None`` if absent.

    Raises:
        ConfigError: a present but non-positive value.
    """
    for key in ("max_position_embeddings", "model_max_length", "max_sequence_length",
                "seq_length"):
        if cfg.has(key):
            return cfg.positive_int(key)
    return None
