"""Cache tensors of one layer on one tensor-parallel rank: attention KV and recurrent state.

Pure functions of geometry numbers; they know nothing of config files.

Attention (per token, per rank)::

    k: (kv_heads_per_rank, k_head_dim)    v: (kv_heads_per_rank, v_head_dim)
    MLA: latent: (1, kv_lora_rank + qk_rope_head_dim)      (one shared latent per token)

Recurrent state (per request, per rank), shapes from vLLM's ``MambaStateShapeCalculator``
(vllm-project/vllm ``vllm/model_executor/layers/mamba/mamba_utils.py``, commit
02d710837549, conv layout "SD" = ``(state_len, dim)``)::

    Mamba-1          conv (K-1, d_inner/tp)            ssm (d_inner/tp, d_state)
    Mamba-2          conv (K-1, conv_dim/tp)           ssm (heads/tp, head_dim, d_state)
                     conv_dim = d_inner + 2 * n_groups' * d_state
    Gated DeltaNet   conv (K-1, conv_dim/tp)           recurrent (v_heads/tp, v_dim, k_dim)
                     conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    lightning        recurrent (heads/tp, head_dim, head_dim)        (no conv state)
    JetBlock         recurrent (heads/tp, k_dim, v_dim)   conv (heads * v_dim / tp, K)

JetBlock follows NVlabs/Jet-Nemotron ``jetai/modeling/hf/jet_block.py`` (gated delta rule,
``head_v_dim = head_dim * expand_v``) and ``dynamic_conv.py`` (its conv cache is
``[N, D, W]`` with ``W = kernel_size``: all K columns, unlike vLLM Mamba's K-1).

Tensor parallelism, what is split and what is replicated:

* KV heads are split over ranks. When ``kv_heads < tp`` and ``tp % kv_heads == 0`` each
  rank keeps one whole head (the head is **replicated** ``tp / kv_heads`` times, as vLLM
  does); other combinations raise :class:`~kvchain.errors.ConfigError`.
* An MLA latent is not split by heads: every rank keeps the whole latent (replicated).
* State heads and conv channels are split. Mamba-2 groups are split when
  ``n_groups % tp == 0``; when ``tp % n_groups == 0`` each group is **replicated** so each
  rank has one (vLLM ``extra_groups_for_head_shards``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvchain.errors import ConfigError
from kvchain.model.layers import CacheDtype, TensorDecl


@dataclass(frozen=True, slots=True)
class StateDtypes:
    """Element types of a recurrent layer's state.

    Attributes:
        conv: dtype of the convolution state (vLLM ``mamba_cache_dtype``).
        temporal: dtype of the SSM / recurrent state (vLLM ``mamba_ssm_cache_dtype``).
    """

    conv: CacheDtype
    temporal: CacheDtype


def split(total: int, tp: int, what: str) -> int:
    """``total / tp`` for a quantity split over ranks.

    Raises:
        ConfigError: ``tp`` does not divide ``total`` (names ``what`` and both numbers).
    """
    if total % tp:
        raise ConfigError(f"tp={tp} does not divide {what}={total}")
    return total // tp


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads one rank keeps: ``kv_heads / tp``, or 1 (replicated) when ``kv_heads < tp``.

    Raises:
        ConfigError: neither ``tp`` divides ``kv_heads`` nor ``kv_heads`` divides ``tp``.
    """
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    raise ConfigError(
        f"tp={tp} does not divide num_key_value_heads={kv_heads} (nor divides it evenly "
        "for replication)"
    )


def attention_tensors(
    kv_heads: int, k_head_dim: int, v_head_dim: int, tp: int, dtype: CacheDtype
) -> tuple[TensorDecl, ...]:
    """K and V of one attention layer, per token and rank.

    Example: gpt-oss-120b, 8 KV heads x 64, bf16, tp=1: k (8, 64) + v (8, 64) =
    2,048 B per token.

    Raises:
        ConfigError: see :func:`kv_heads_per_rank`.
    """
    heads = kv_heads_per_rank(kv_heads, tp)
    return (
        TensorDecl("k", (heads, k_head_dim), dtype),
        TensorDecl("v", (heads, v_head_dim), dtype),
    )


def mla_tensors(kv_lora_rank: int, qk_rope_head_dim: int,
                dtype: CacheDtype) -> tuple[TensorDecl, ...]:
    """The MLA latent of one layer per token (replicated on every rank).

    Example: DeepSeek-V3, 512 + 64 in bf16: 1,152 B per token per layer.
    """
    return (TensorDecl("latent", (1, kv_lora_rank + qk_rope_head_dim), dtype),)


def mamba1_tensors(
    d_inner: int, d_state: int, conv_kernel: int, tp: int, dtypes: StateDtypes
) -> tuple[TensorDecl, ...]:
    """Mamba-1 state per request and rank (vLLM ``mamba1_state_shape``).

    Example: Jamba-v0.1 (d_inner 8192, d_state 16, K 4), bf16: conv (3, 8192) + ssm
    (8192, 16) = 311,296 B per layer.

    Raises:
        ConfigError: ``tp`` does not divide ``d_inner``.
    """
    local = split(d_inner, tp, "mamba d_inner")
    return (
        TensorDecl("conv", (conv_kernel - 1, local), dtypes.conv),
        TensorDecl("ssm", (local, d_state), dtypes.temporal),
    )


def mamba2_sharded_groups(n_groups: int, tp: int) -> int:
    """Groups counted in ``conv_dim`` once the groups are sharded with their heads.

    Raises:
        ConfigError: ``n_groups`` and ``tp`` divide neither way.
    """
    if n_groups % tp == 0:
        return n_groups
    if tp % n_groups == 0:
        return tp
    raise ConfigError(f"tp={tp} does not divide mamba n_groups={n_groups} (nor the reverse)")


def mamba2_tensors(
    d_inner: int,
    n_groups: int,
    heads: int,
    head_dim: int,
    d_state: int,
    conv_kernel: int,
    tp: int,
    dtypes: StateDtypes,
) -> tuple[TensorDecl, ...]:
    """Mamba-2 state per request and rank (vLLM ``mamba2_state_shape``).

    Example: Nemotron-H-56B (d_inner 16384, 8 groups, d_state 256, 256 heads x 64, K 4),
    bf16: conv (3, 20480) + ssm (256, 64, 256) = 8,511,488 B per layer.

    Raises:
        ConfigError: ``tp`` does not divide the heads or the conv channels.
    """
    groups = mamba2_sharded_groups(n_groups, tp)
    conv_dim = d_inner + 2 * groups * d_state
    return (
        TensorDecl("conv", (conv_kernel - 1, split(conv_dim, tp, "mamba conv_dim")), dtypes.conv),
        TensorDecl(
            "ssm", (split(heads, tp, "mamba num_heads"), head_dim, d_state), dtypes.temporal
        ),
    )


def gated_delta_net_tensors(
    k_heads: int,
    v_heads: int,
    k_head_dim: int,
    v_head_dim: int,
    conv_kernel: int,
    tp: int,
    dtypes: StateDtypes,
) -> tuple[TensorDecl, ...]:
    """Gated DeltaNet state per request and rank (vLLM ``gated_delta_net_state_shape``).

    Example: Qwen3-Next-80B-A3B (16 k heads, 32 v heads, 128 x 128, K 4), bf16: conv
    (3, 8192) + recurrent (32, 128, 128) = 1,097,728 B per layer.

    Raises:
        ConfigError: ``tp`` does not divide the key or value heads.
    """
    split(k_heads, tp, "linear_num_key_heads")
    conv_dim = 2 * k_heads * k_head_dim + v_heads * v_head_dim
    return (
        TensorDecl("conv", (conv_kernel - 1, split(conv_dim, tp, "conv_dim")), dtypes.conv),
        TensorDecl(
            "recurrent",
            (split(v_heads, tp, "linear_num_value_heads"), v_head_dim, k_head_dim),
            dtypes.temporal,
        ),
    )


def lightning_tensors(
    heads: int, head_dim: int, tp: int, dtypes: StateDtypes
) -> tuple[TensorDecl, ...]:
    """Lightning (linear) attention state per request and rank (vLLM
    ``linear_attention_state_shape``): ``(heads/tp, head_dim, head_dim)``, no conv state.

    Example: MiniMax-M1 (64 heads x 128), bf16: 2,097,152 B per layer.

    Raises:
        ConfigError: ``tp`` does not divide the heads.
    """
    return (
        TensorDecl(
            "recurrent",
            (split(heads, tp, "num_attention_heads"), head_dim, head_dim),
            dtypes.temporal,
        ),
    )


def jet_tensors(
    heads: int, k_head_dim: int, v_head_dim: int, conv_kernel: int, tp: int, dtypes: StateDtypes
) -> tuple[TensorDecl, ...]:
    """JetBlock state per request and rank (see the module docstring for the source).

    Example: Jet-Nemotron-2B (12 heads, k 96, v 256, K 4), bf16: recurrent (12, 96, 256)
    = 589,824 B + conv (3072, 4) = 24,576 B: 614,400 B per layer.

    Raises:
        ConfigError: ``tp`` does not divide the heads.
    """
    local = split(heads, tp, "jet num_heads")
    return (
        TensorDecl("recurrent", (local, k_head_dim, v_head_dim), dtypes.temporal),
        TensorDecl("conv", (local * v_head_dim, conv_kernel), dtypes.conv),
    )


def shared_kv_tensors(
    kv_heads: int, head_dim: int, tp: int, dtype: CacheDtype
) -> tuple[TensorDecl, ...]:
    """One tensor serving as both K and V, per token and rank (DeepSeek-V4 shared-KV MQA:
    transformers' ``DeepseekV4HCACache.update`` keeps ``values`` as the same storage as
    ``keys``).

    Example: DeepSeek-V4, 1 head x 512 in bf16: 1,024 B per token per layer.

    Raises:
        ConfigError: see :func:`kv_heads_per_rank`.
    """
    return (TensorDecl("kv", (kv_heads_per_rank(kv_heads, tp), head_dim), dtype),)


def compressed_tensors(
    group_tokens: int, entry_dims: tuple[int, ...], dtype: CacheDtype
) -> tuple[TensorDecl, ...]:
    """Compressed KV per token (replicated on every rank, like the single KV head).

    One entry of ``entry_dims[i]`` elements is stored per ``group_tokens`` source tokens,
    so a token owns ``entry_dims[i] / group_tokens`` elements of each tensor: bytes per
    token = bytes per entry / group size. A page of ``P`` tokens (``P`` a multiple of the
    group) holds ``P / group_tokens`` whole entries laid out contiguously.

    Example: DeepSeek-V4 CSA (group 4; KV entry 512, indexer key 128) in bf16:
    (512 + 128) / 4 x 2 B = 320 B per token; HCA (group 128, entry 512): 8 B per token.

    Raises:
        ConfigError: an entry size that the group size does not divide (names both).
    """
    names = ("compressed_kv", "compressed_index_k")
    out = []
    for name, dims in zip(names, entry_dims, strict=False):
        if dims % group_tokens:
            raise ConfigError(
                f"compressed entry of {dims} elements is not a whole number of elements per "
                f"token for a group of {group_tokens} tokens"
            )
        out.append(TensorDecl(name, (dims // group_tokens,), dtype))
    return tuple(out)
