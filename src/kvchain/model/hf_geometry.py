"""Geometry numbers of each mixer, read from a Hugging Face config (whole model, no TP).

Field names per family (aliases are tried in the order listed):

* attention: ``num_attention_heads``; ``num_key_value_heads`` (default: the query heads,
  MHA); ``head_dim`` | ``attention_head_dim`` | ``hidden_size / num_attention_heads``;
  ``v_head_dim`` (MiMo: 128 while K is 192). Window layers first try ``swa_``-prefixed
  fields (MiMo-V2-Flash: ``swa_num_key_value_heads`` 8 vs 4 for full layers).
* window tokens: ``efficient_attention_config.swa.window_size`` (Jet-Nemotron),
  ``sliding_window``, ``sliding_window_size`` (SmallThinker); chunk tokens (Llama 4):
  ``attention_chunk_size``.
* MLA (DeepSeek V2/V3): ``kv_lora_rank`` + ``qk_rope_head_dim``.
* Mamba-1 (Jamba): ``mamba_d_state``, ``mamba_d_conv``, ``mamba_expand`` (d_inner =
  expand x hidden), ``mamba_dt_rank``.
* Mamba-2: heads ``mamba_num_heads`` (Nemotron-H) | ``mamba_n_heads`` (Falcon-H1, Bamba);
  head dim ``mamba_head_dim`` | ``mamba_d_head``; d_inner ``mamba_d_ssm`` or heads x head
  dim; groups ``n_groups`` | ``mamba_n_groups``; state ``ssm_state_size`` |
  ``mamba_d_state``; kernel ``conv_kernel`` | ``mamba_d_conv``.
* Gated DeltaNet (Qwen3-Next): ``linear_num_key_heads``, ``linear_num_value_heads``,
  ``linear_key_head_dim``, ``linear_value_head_dim``, ``linear_conv_kernel_dim``.
* lightning (MiniMax): the attention heads and head dim.
* JetBlock (Jet-Nemotron): ``efficient_attention_config.jet``: ``num_heads``,
  ``head_dim``, ``expand_v``, ``conv_size``.
* Kimi Delta Attention (Kimi-Linear): ``linear_attn_config.num_heads``, ``.head_dim``,
  ``.short_conv_kernel_size`` (transformers' ``KimiLinearConfig`` copies them to
  ``linear_num_heads``, ``linear_head_dim``, ``linear_conv_kernel_dim``).
* per-layer geometry: ``per_layer_config[i]`` overrides ``head_dim`` and
  ``num_key_value_heads`` of layer ``i`` (transformers 5's ``Gemma4TextConfig`` builds it
  for full layers from ``global_head_dim``, default 512, and, when ``attention_k_eq_v``,
  ``num_global_key_value_heads``; without transformers kvchain applies the same rule).
  A per-layer ``sliding_window`` list (``Phi4FlashConfig``) gives each layer its window.
* compressed KV (DeepSeek-V4, transformers' ``DeepseekV4Config``): ``head_dim``
  (one shared K=V head), ``compress_rates`` (CSA 4, HCA 128 tokens per entry; legacy
  ``compress_rate_csa``/``compress_rate_hca``), ``index_head_dim`` (CSA's indexer keys).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvchain.errors import ConfigError, MissingFieldError
from kvchain.model.hf_layers import MAX_FIELD_VALUE, HFConfig, Mixer, whole_number


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """Heads and head sizes of one kind of attention layer (whole model, no TP).

    Attributes:
        q_heads: query heads.
        kv_heads: KV heads (``q_heads`` for MHA; the latent is one "head" for MLA).
        k_head_dim: K elements per head (MLA: ``qk_nope_head_dim + qk_rope_head_dim``).
        v_head_dim: V elements per head.
        window: sliding-window tokens (window layers), chunk tokens (chunked-local layers),
            ``None`` for full attention.
        mla_latent_dim: ``kv_lora_rank + qk_rope_head_dim`` for MLA, else ``None``.
        output_gate: the query projection also yields a sigmoid output gate (Qwen3-Next
            ``attn_output_gate``): it doubles the query projection's parameters.
        kv_shared: K and V are one tensor (DeepSeek-V4 shared-KV MQA: the cache stores
            ``keys`` and ``values`` as the same storage, ``DeepseekV4HCACache.update``).
    """

    q_heads: int
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    window: int | None
    mla_latent_dim: int | None = None
    output_gate: bool = False
    kv_shared: bool = False


@dataclass(frozen=True, slots=True)
class CompressedGeometry:
    """One compressed-KV layer (DeepSeek-V4 CSA or HCA), whole model.

    Attributes:
        group_tokens: source tokens per stored entry (CSA ``m`` = 4, HCA ``m'`` = 128).
        entry_dims: elements of each stored entry: ``(head_dim,)`` for HCA,
            ``(head_dim, index_head_dim)`` for CSA (compressed KV and the indexer's
            compressed keys).
    """

    group_tokens: int
    entry_dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Mamba1Geometry:
    """Mamba-1 numbers: ``d_inner`` channels, ``d_state``, conv kernel, ``dt_rank``."""

    d_inner: int
    d_state: int
    conv_kernel: int
    dt_rank: int


@dataclass(frozen=True, slots=True)
class Mamba2Geometry:
    """Mamba-2 numbers: heads x head_dim (= ``d_inner``), groups, ``d_state``, kernel."""

    heads: int
    head_dim: int
    d_inner: int
    n_groups: int
    d_state: int
    conv_kernel: int


@dataclass(frozen=True, slots=True)
class GatedDeltaNetGeometry:
    """Gated DeltaNet numbers: key/value heads and head dims, conv kernel."""

    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int


@dataclass(frozen=True, slots=True)
class JetGeometry:
    """JetBlock numbers: heads, K head dim, V head dim (``head_dim * expand_v``), kernel,
    and the dynamic-conv kernel generator's reduction."""

    heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    generator_reduction: int


def hidden_size(cfg: HFConfig) -> int:
    """Model width.

    Raises:
        MissingFieldError: no ``hidden_size`` (or ``d_model``).
    """
    return cfg.positive_int("hidden_size", "d_model")


def _head_dim(cfg: HFConfig, prefix: str) -> int:
    explicit = cfg.int_or_none(f"{prefix}head_dim", "head_dim", "attention_head_dim")
    if explicit is not None:
        if explicit <= 0:
            raise ConfigError(f"config field 'head_dim' must be positive, got {explicit}")
        return explicit
    heads = cfg.int_or_none("num_attention_heads")
    width = cfg.int_or_none("hidden_size", "d_model")
    if heads is None or width is None:
        raise MissingFieldError(
            f"config ({cfg.family}) has no 'head_dim' and no 'hidden_size' and "
            "'num_attention_heads' to derive it from"
        )
    if heads <= 0 or width % heads:
        raise ConfigError(
            f"cannot derive head_dim: hidden_size={width} is not a multiple of "
            f"num_attention_heads={heads}"
        )
    return width // heads


def _positive(value: object, field: str) -> int:
    number = whole_number(value, field)
    if number <= 0:
        raise ConfigError(f"config field {field!r} must be positive, got {number}")
    return number


def _efficient(cfg: HFConfig, kind: str) -> Mapping[str, object] | None:
    block = cfg.get("efficient_attention_config")
    if isinstance(block, Mapping) and isinstance(block.get(kind), Mapping):
        return block[kind]
    return None


def window_tokens(cfg: HFConfig, mixer: Mixer, layer: int | None = None) -> int | None:
    """Window (``WINDOW``) or chunk (``LOCAL``) tokens; ``None`` for other mixers.

    A ``sliding_window`` list gives each layer its own window (``layer`` indexes it).

    Raises:
        MissingFieldError: a window layer without a window field, or a chunked layer
            without ``attention_chunk_size``.
        ConfigError: a zero, negative or fractional window.
    """
    if mixer is Mixer.LOCAL:
        if not cfg.has("attention_chunk_size"):
            raise MissingFieldError(
                f"config ({cfg.family}) has chunked-local layers but no 'attention_chunk_size'"
            )
        return _positive(cfg.get("attention_chunk_size"), "attention_chunk_size")
    if mixer is not Mixer.WINDOW:
        return None
    swa = _efficient(cfg, "swa")
    if swa is not None and swa.get("window_size") is not None:
        return _positive(swa["window_size"], "efficient_attention_config.swa.window_size")
    for key in ("sliding_window", "sliding_window_size"):
        value = cfg.get(key)
        if isinstance(value, list | tuple):
            if layer is None or not 0 <= layer < len(value) or value[layer] is None:
                raise MissingFieldError(
                    f"config field {key!r} is a per-layer list with no window for layer "
                    f"{layer} ({cfg.family})"
                )
            return _positive(value[layer], f"{key}[{layer}]")
        if value is not None:
            return _positive(value, key)
    raise MissingFieldError(
        f"config ({cfg.family}) has sliding-window layers but no 'sliding_window' "
        "(nor 'sliding_window_size')"
    )


def layer_overrides(cfg: HFConfig, mixer: Mixer, layer: int | None) -> tuple[tuple[str, int], ...]:
    """Per-layer ``head_dim`` / ``num_key_value_heads`` of attention layer ``layer``.

    From ``per_layer_config`` when the config has it (transformers 5), else the Gemma 4
    rule of ``Gemma4TextConfig.__post_init__`` for full layers (see the module doc).

    Raises:
        ConfigError: an override that is not a positive whole number.
    """
    if layer is None or not mixer.is_attention:
        return ()
    table = cfg.get("per_layer_config")
    if isinstance(table, Mapping):
        # transformers serializes the keys as zero-padded strings ("05")
        entry = next((v for k, v in table.items() if str(k).strip().isdigit()
                      and int(str(k)) == layer), None)
        if not isinstance(entry, Mapping):
            return ()
        return tuple(
            (key, _positive(entry[key], f"per_layer_config[{layer}].{key}"))
            for key in ("head_dim", "num_key_value_heads")
            if entry.get(key) is not None
        )
    if cfg.is_family("gemma4", "gemma4_text") and mixer is Mixer.FULL:
        if not cfg.has("global_head_dim"):
            cfg.note_default("global_head_dim", 512, "kvchain rule (Gemma4TextConfig default)")
        out = [("head_dim", _positive(cfg.get("global_head_dim", 512), "global_head_dim"))]
        if cfg.get("attention_k_eq_v") is True and cfg.has("num_global_key_value_heads"):
            out.append(("num_key_value_heads", cfg.positive_int("num_global_key_value_heads")))
        return tuple(out)
    return ()


def attention_geometry(cfg: HFConfig, mixer: Mixer, layer: int | None = None) -> AttentionGeometry:
    """Geometry of the ``mixer`` kind of attention layer (of layer ``layer`` when the
    config has per-layer geometry or windows).

    Raises:
        MissingFieldError: no ``num_attention_heads``, or no head_dim and nothing to
            derive it from, or no window field for window/chunked layers.
        ConfigError: zero or negative heads, head dims or window.
    """
    prefix = "swa_" if mixer is Mixer.WINDOW else ""
    q_heads = cfg.positive_int(f"{prefix}num_attention_heads", "num_attention_heads")
    window = window_tokens(cfg, mixer, layer)
    gate = bool(cfg.get("attn_output_gate", cfg.is_family("qwen3_next")))
    if cfg.has("kv_lora_rank") and cfg.has("qk_rope_head_dim"):
        rope = cfg.positive_int("qk_rope_head_dim")
        nope = cfg.optional_int("qk_nope_head_dim", default=0, minimum=0)
        return AttentionGeometry(
            q_heads=q_heads,
            kv_heads=1,
            k_head_dim=nope + rope,
            v_head_dim=cfg.positive_int("v_head_dim"),
            window=window,
            mla_latent_dim=cfg.positive_int("kv_lora_rank") + rope,
            output_gate=gate,
        )
    k_dim = _head_dim(cfg, prefix)
    v_dim = cfg.optional_int(f"{prefix}v_head_dim", "v_head_dim", default=k_dim)
    kv_heads = cfg.int_or_none(f"{prefix}num_key_value_heads", "num_key_value_heads")
    if kv_heads is None:
        cfg.note_default("num_key_value_heads", q_heads,
                         "kvchain rule: = num_attention_heads (multi-head attention)")
        kv_heads = q_heads
    if kv_heads <= 0:
        raise ConfigError(f"config field 'num_key_value_heads' must be positive, got {kv_heads}")
    over = dict(layer_overrides(cfg, mixer, layer))
    if "head_dim" in over:
        k_dim = v_dim = over["head_dim"]
    kv_heads = over.get("num_key_value_heads", kv_heads)
    if kv_heads > q_heads or q_heads % kv_heads:
        # grouped-query attention: each KV head serves num_attention_heads //
        # num_key_value_heads query heads (transformers' repeat_kv repeats it that often)
        raise ConfigError(f"config field 'num_key_value_heads' ({kv_heads}) must divide "
                          f"'num_attention_heads' ({q_heads}): each KV head serves a whole "
                          f"group of query heads")
    shared = cfg.is_family("deepseek_v4")
    return AttentionGeometry(q_heads, kv_heads, k_dim, v_dim, window, None, gate, shared)


def compressed_geometry(cfg: HFConfig, mixer: Mixer) -> CompressedGeometry:
    """Compressed-KV numbers of a CSA or HCA layer (DeepSeek-V4; see the module doc).

    Raises:
        MissingFieldError: no ``head_dim``.
        ConfigError: a non-positive rate or dimension.
    """
    name = "compressed_sparse_attention" if mixer is Mixer.CSA else "heavily_compressed_attention"
    legacy = "compress_rate_csa" if mixer is Mixer.CSA else "compress_rate_hca"
    rates = cfg.get("compress_rates")
    rate: object = None
    if isinstance(rates, Mapping):
        rate = rates.get(name)
    if rate is None:
        rate = cfg.get(legacy)
    if rate is None:
        rate = 4 if mixer is Mixer.CSA else 128
        cfg.note_default(f"compress_rates.{name}", rate, "kvchain rule (DeepseekV4Config default)")
    group = _positive(rate, f"compress_rates.{name}")
    head = cfg.positive_int("head_dim")
    if mixer is Mixer.CSA:
        index = cfg.optional_int("index_head_dim", default=128,
                                 default_by="kvchain rule (DeepseekV4Config default)")
        return CompressedGeometry(group, (head, index))
    return CompressedGeometry(group, (head,))


def kda_geometry(cfg: HFConfig) -> GatedDeltaNetGeometry:
    """Kimi Delta Attention numbers as a Gated DeltaNet with equal key and value heads.

    transformers' ``KimiDeltaAttention`` (``modeling_kimi_linear.py``): q, k and v each
    project to ``num_heads x head_dim``; one depthwise conv runs over the three
    (``conv_dim = 3 x num_heads x head_dim``); the recurrent state is
    ``(num_heads, head_dim, head_dim)`` - the Gated DeltaNet shapes with
    ``k_heads = v_heads`` and ``k_dim = v_dim``.

    Raises:
        MissingFieldError: no heads, head dim or conv kernel.
    """
    block = cfg.get("linear_attn_config")
    sub = block if isinstance(block, Mapping) else {}

    def pick(flat: str, nested: str) -> int:
        if cfg.has(flat):
            return cfg.positive_int(flat)
        if sub.get(nested) is None:
            raise MissingFieldError(
                f"config ({cfg.family}) lacks {flat!r} (or linear_attn_config.{nested})"
            )
        return _positive(sub[nested], f"linear_attn_config.{nested}")

    heads = pick("linear_num_heads", "num_heads")
    dim = pick("linear_head_dim", "head_dim")
    kernel = pick("linear_conv_kernel_dim", "short_conv_kernel_size")
    return GatedDeltaNetGeometry(heads, heads, dim, dim, kernel)


def mamba1_geometry(cfg: HFConfig) -> Mamba1Geometry:
    """Mamba-1 numbers (Jamba field names; ``dt_rank`` "auto" = ``ceil(hidden / 16)``).

    Raises:
        MissingFieldError: no state size, conv kernel or expansion/d_inner.
    """
    width = hidden_size(cfg)
    if cfg.has("mamba_d_inner"):
        d_inner = cfg.positive_int("mamba_d_inner")
    else:
        d_inner = cfg.positive_int("mamba_expand", "expand") * width
    dt_rank = cfg.get("mamba_dt_rank", cfg.get("time_step_rank"))
    dt = math.ceil(width / 16) if dt_rank in (None, "auto") else _positive(dt_rank, "mamba_dt_rank")
    return Mamba1Geometry(
        d_inner=d_inner,
        d_state=cfg.positive_int("mamba_d_state", "state_size", "ssm_state_size"),
        conv_kernel=cfg.positive_int("mamba_d_conv", "conv_kernel"),
        dt_rank=dt,
    )


def mamba2_geometry(cfg: HFConfig) -> Mamba2Geometry:
    """Mamba-2 numbers (Nemotron-H, Falcon-H1 and Bamba field names).

    Raises:
        MissingFieldError: no heads, head dim, state size or conv kernel.
    """
    heads_keys: tuple[str, ...] = ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads")
    dim_keys: tuple[str, ...] = ("mamba_head_dim", "mamba_d_head", "mamba_headdim")
    if cfg.is_family("mamba2"):
        heads_keys += ("num_heads",)
        dim_keys += ("head_dim",)
    heads = cfg.positive_int(*heads_keys)
    head_dim = cfg.positive_int(*dim_keys)
    return Mamba2Geometry(
        heads=heads,
        head_dim=head_dim,
        d_inner=cfg.optional_int("mamba_d_ssm", default=heads * head_dim),
        n_groups=cfg.optional_int("n_groups", "mamba_n_groups", "mamba_ngroups", default=1,
                                  default_by="kvchain rule: one group (Mamba-2 default)"),
        d_state=cfg.positive_int("ssm_state_size", "mamba_d_state", "state_size"),
        conv_kernel=cfg.positive_int("conv_kernel", "mamba_d_conv"),
    )


def gated_delta_net_geometry(cfg: HFConfig) -> GatedDeltaNetGeometry:
    """Gated DeltaNet numbers (Qwen3-Next field names).

    Raises:
        MissingFieldError: a missing ``linear_*`` field.
    """
    return GatedDeltaNetGeometry(
        k_heads=cfg.positive_int("linear_num_key_heads"),
        v_heads=cfg.positive_int("linear_num_value_heads"),
        k_head_dim=cfg.positive_int("linear_key_head_dim"),
        v_head_dim=cfg.positive_int("linear_value_head_dim"),
        conv_kernel=cfg.positive_int("linear_conv_kernel_dim"),
    )


def jet_geometry(cfg: HFConfig) -> JetGeometry:
    """JetBlock numbers from ``efficient_attention_config.jet``.

    Example: Jet-Nemotron-2B: 12 heads, head_dim 96, expand_v 2.6666666667 -> V head dim
    256, conv_size 4.

    Raises:
        MissingFieldError: no ``efficient_attention_config.jet`` block or a field of it.
        ConfigError: ``head_dim * expand_v`` is not a whole number.
    """
    jet = _efficient(cfg, "jet")
    if jet is None:
        raise MissingFieldError(
            f"config ({cfg.family}) has jet layers but no 'efficient_attention_config.jet'"
        )
    for key in ("num_heads", "head_dim", "expand_v", "conv_size"):
        if jet.get(key) is None:
            raise MissingFieldError(f"'efficient_attention_config.jet' lacks {key!r}")
    heads = _positive(jet["num_heads"], "efficient_attention_config.jet.num_heads")
    k_dim = _positive(jet["head_dim"], "efficient_attention_config.jet.head_dim")
    expand = jet["expand_v"]
    if (
        isinstance(expand, bool)
        or not isinstance(expand, int | float)
        or not math.isfinite(expand)
        or not 0 < expand <= MAX_FIELD_VALUE
    ):
        raise ConfigError(
            f"config field 'efficient_attention_config.jet.expand_v' must be a finite "
            f"positive number, got {expand!r}"
        )
    v_exact = k_dim * float(expand)
    v_dim = round(v_exact)
    if v_dim <= 0 or v_dim > MAX_FIELD_VALUE or not math.isclose(v_exact, v_dim, rel_tol=1e-5):
        raise ConfigError(
            f"jet head_dim={k_dim} x expand_v={jet['expand_v']} is not a whole V head dim"
        )
    reduction = jet.get("dconv_generator_reduction")
    return JetGeometry(
        heads=heads,
        k_head_dim=k_dim,
        v_head_dim=v_dim,
        conv_kernel=_positive(jet["conv_size"], "efficient_attention_config.jet.conv_size"),
        generator_reduction=1 if reduction is None else _positive(reduction, "dconv_reduction"),
    )
