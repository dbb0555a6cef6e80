"""Parameter counts and weight bytes of a model, from its Hugging Face config.

What is counted: every weight *matrix* of the text model - token embedding, output head
(unless tied), attention projections (MLA's low-rank factors; Qwen3-Next's doubled query
projection that also yields the output gate), Mamba-1/Mamba-2/Gated DeltaNet/lightning/
JetBlock projections and conv kernels (plus Mamba-1's ``A`` matrix), dense MLPs, routed
experts, shared experts, routers and latent-MoE projections.

What is ignored (each well under 0.1 % of any bundled model): vectors - norm weights,
biases, per-head ``A_log``/``D``/``dt_bias``, attention sinks - and everything outside the
language model: vision towers (Llama 4, Gemma 3 >= 4B), multi-token-prediction layers
(``num_nextn_predict_layers``), quantization scales.

Active parameters (read per token) follow the convention of OpenAI's gpt-oss model card
(openai.com/index/gpt-oss-model-card, table 1: 116.83B total / 5.13B active for
gpt-oss-120b): everything except the routed experts a token does not use and except the
input embedding table (a lookup reads one row); the output head is counted (a tied
embedding counts once, as the head).

Per layer (h = hidden size)::

    attention      h*q*dk (x2 with output gate) + h*kv*dk + h*kv*dv + q*dv*h
    gated MLP      3 * h * inter        (gate, up, down; Nemotron-H relu2 MLP: 2 * h * inter)
    MoE            E experts of one MLP each (latent MoE: on the latent width) + router h*E
                   + shared experts + latent projections 2*h*latent
    Mamba-2        h*(2*d_inner + 2*G*N + H) + conv_dim*K + d_inner*h
    Gated DeltaNet h*(2*k_heads*dk + 2*v_heads*dv) + h*2*v_heads + conv_dim*K + v_heads*dv*h
    lightning      5 * h * heads * head_dim      (qkv 3, output gate 1, out 1)
    KDA            4*h*H*d (q, k, v, out) + 3*H*d*K (conv) + 2*(h*d + d*H*d) (forget and
                   output gates, low rank) + h*H         (transformers' KimiDeltaAttention)
    DeepSeek-V4    h*q_lora + q_lora*H*hd + h*hd (shared K=V) + o_lora*H*hd + groups*o_lora*h
    attention      (transformers' DeepseekV4Attention: grouped low-rank output projection)
    SambaY cross   GMU 2*h*d_inner; cross-attention h*q*dk + q*dv*h (query and output
    decoder        only: the KV comes from layer n/2 + 1)   (Phi-4-mini-flash)
    HCA compressor 2*h*hd                                  (kv and gate projections)
    CSA compressor 4*h*hd + 4*h*ihd + q_lora*nih*ihd + h*nih   (two overlapping series;
                   the Lightning Indexer's projections and head weights)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvchain.errors import ConfigError
from kvchain.model.hf_geometry import (
    AttentionGeometry,
    attention_geometry,
    gated_delta_net_geometry,
    hidden_size,
    jet_geometry,
    kda_geometry,
    layer_overrides,
    mamba1_geometry,
    mamba2_geometry,
)
from kvchain.model.hf_layers import (
    EXPERT_FIELDS,
    Ffn,
    HFConfig,
    LayerPlan,
    Mixer,
    num_experts,
    sambay_cross_from,
)

# MXFP4 (OCP Microscaling Formats v1.0): blocks of 32 FP4 (4-bit) values share one 8-bit
# E8M0 scale: 32 * 4 + 8 = 136 bits per 32 parameters = 4.25 bits = 17/32 byte.
MXFP4_BYTES_NUM = 17
MXFP4_BYTES_DEN = 32


class WeightFormat(StrEnum):
    """How a checkpoint stores its weights.

    * ``BF16``: every weight 2 bytes.
    * ``FP8``: weight matrices of the layers 1 byte; embedding and output head 2 bytes
      (DeepSeek-style block FP8, e.g. MiMo-V2-Flash ``quant_method: fp8``; scales ignored).
    * ``MXFP4_EXPERTS``: routed experts in MXFP4 (4.25 bits per parameter), everything
      else 2 bytes (gpt-oss ``quant_method: mxfp4``; attention, router, embeddings and
      head are in ``modules_to_not_convert``).
    """

    BF16 = "bf16"
    FP8 = "fp8"
    MXFP4_EXPERTS = "mxfp4-experts"


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters of a model by part (counts, whole model, no tensor parallelism).

    Attributes:
        embedding: input embedding table (``vocab * hidden``).
        lm_head: output head (``vocab * hidden``), 0 when tied to the embedding.
        tied: whether the head is the embedding table.
        mixers: attention and recurrent-mixer weights of all layers.
        dense_mlp: dense feed-forward weights of all layers.
        routed_experts: all routed experts of all MoE layers.
        active_experts: the routed experts one token runs through (top-k per layer).
        shared: always-active MoE weights: shared experts, routers, latent projections.
    """

    embedding: int
    lm_head: int
    tied: bool
    mixers: int
    dense_mlp: int
    routed_experts: int
    active_experts: int
    shared: int

    @property
    def total(self) -> int:
        """All parameters."""
        return (
            self.embedding
            + self.lm_head
            + self.mixers
            + self.dense_mlp
            + self.routed_experts
            + self.shared
        )

    @property
    def active(self) -> int:
        """Parameters read per token (see the module docstring for the convention)."""
        head = self.embedding if self.tied else self.lm_head
        return head + self.mixers + self.dense_mlp + self.active_experts + self.shared


def _attention_params(h: int, g: AttentionGeometry, cfg: HFConfig) -> int:
    out = g.q_heads * g.v_head_dim * h
    if g.mla_latent_dim is not None:
        q_lora = cfg.optional_int("q_lora_rank", default=0) or None
        q_out = g.q_heads * g.k_head_dim
        q = h * q_out if q_lora is None else h * q_lora + q_lora * q_out
        kv_lora = cfg.positive_int("kv_lora_rank")
        nope = g.k_head_dim - cfg.positive_int("qk_rope_head_dim")
        kv = h * g.mla_latent_dim + kv_lora * g.q_heads * (nope + g.v_head_dim)
        return q + kv + out
    q = h * g.q_heads * g.k_head_dim * (2 if g.output_gate else 1)
    kv = h * g.kv_heads * (g.k_head_dim + g.v_head_dim)
    return q + kv + out


def _deepseek_v4_params(cfg: HFConfig, mixer: Mixer, h: int) -> int:
    hd = cfg.positive_int("head_dim")
    if mixer is Mixer.HCA:
        return 2 * h * hd
    q_lora = cfg.positive_int("q_lora_rank")
    if mixer is Mixer.CSA:
        ihd = cfg.optional_int("index_head_dim", default=128)
        nih = cfg.optional_int("index_n_heads", default=64)
        return 4 * h * hd + 4 * h * ihd + q_lora * nih * ihd + h * nih
    heads = cfg.positive_int("num_attention_heads")
    groups = cfg.optional_int("o_groups", default=8)
    o_lora = cfg.optional_int("o_lora_rank", default=1024)
    return h * q_lora + q_lora * heads * hd + h * hd + o_lora * heads * hd + groups * o_lora * h


def _mixer_params(cfg: HFConfig, mixer: Mixer, h: int, layer: int) -> int:
    if mixer.is_compressed or (mixer.is_attention and cfg.is_family("deepseek_v4")):
        return _deepseek_v4_params(cfg, mixer, h)
    if mixer.is_attention:
        return _attention_params(h, attention_geometry(cfg, mixer, layer), cfg)
    if mixer is Mixer.KDA:
        kda = kda_geometry(cfg)
        width = kda.v_heads * kda.v_head_dim
        gates = 2 * (h * kda.v_head_dim + kda.v_head_dim * width)
        return 4 * h * width + 3 * width * kda.conv_kernel + gates + h * kda.v_heads
    if mixer is Mixer.MAMBA1:
        m1 = mamba1_geometry(cfg)
        d, n, r = m1.d_inner, m1.d_state, m1.dt_rank
        return 2 * h * d + d * m1.conv_kernel + d * (r + 2 * n) + r * d + d * n + d * h
    if mixer is Mixer.MAMBA2:
        m2 = mamba2_geometry(cfg)
        group_width = 2 * m2.n_groups * m2.d_state
        in_proj = h * (2 * m2.d_inner + group_width + m2.heads)
        return in_proj + (m2.d_inner + group_width) * m2.conv_kernel + m2.d_inner * h
    if mixer is Mixer.GATED_DELTA_NET:
        gd = gated_delta_net_geometry(cfg)
        key, value = gd.k_heads * gd.k_head_dim, gd.v_heads * gd.v_head_dim
        conv = (2 * key + value) * gd.conv_kernel
        return h * (2 * key + 2 * value) + h * 2 * gd.v_heads + conv + value * h
    if mixer is Mixer.LIGHTNING:
        g = attention_geometry(cfg, Mixer.FULL)
        return 5 * h * g.q_heads * g.k_head_dim
    jet = jet_geometry(cfg)
    key, value = jet.heads * jet.k_head_dim, jet.heads * jet.v_head_dim
    generator = value // jet.generator_reduction
    dconv = h * generator + generator * value * jet.conv_kernel
    return 2 * h * key + h * value + 2 * h * jet.heads + dconv + h * value + value * h


def _sambay_cross_params(cfg: HFConfig, h: int, layer: int, n: int) -> int:
    """Matrices of a SambaY cross-decoder layer (no cache, so no mixer in its plan).

    microsoft/Phi-4-mini-flash-reasoning ``modeling_phi4flash.py``: a gated memory unit
    (``i % mb_per_layer == 0``) projects ``h -> d_inner`` and back (``in_proj``,
    ``out_proj``; ``d_inner = mamba_expand x h``); a cross-attention layer keeps only the
    query part of ``Wqkv`` (``h -> heads x head_dim``) and ``out_proj``, reading the KV of
    layer ``n / 2 + 1``. Check: Phi-4-mini-flash-reasoning's checkpoint index
    (``model.safetensors.index.json``) lists only ``in_proj``/``out_proj`` weights for
    layer 18 and ``total_size`` = 7,706,608,640 B, i.e. 3,853,304,320 bf16 parameters:
    the 3,851,980,800 counted here plus 1,323,520 in vectors (norms, biases, ``D``).
    """
    if not cfg.is_family("phi4flash", "sambay") or layer < sambay_cross_from(n):
        return 0
    if layer % cfg.positive_int("mb_per_layer") == 0:
        return 2 * h * mamba1_geometry(cfg).d_inner
    g = attention_geometry(cfg, Mixer.FULL)
    return h * g.q_heads * g.k_head_dim + g.q_heads * g.v_head_dim * h


def _mlp_matrices(cfg: HFConfig) -> int:
    """3 for gated MLPs (SwiGLU/GeGLU), 2 for Nemotron-H's squared-ReLU MLP."""
    act = str(cfg.get("mlp_hidden_act", "")).lower()
    return 2 if act == "relu2" or cfg.is_family("nemotron_h") else 3


@dataclass(frozen=True, slots=True)
class _MoeShape:
    experts: int
    top_k: int
    expert_params: int
    always_active: int


_TOP_K_FIELDS = (
    "num_experts_per_tok",
    "experts_per_token",
    "moe_num_active_primary_experts",
    "top_k_experts",  # Gemma 4 (transformers' Gemma4TextConfig)
    "num_experts_per_token",  # Kimi-Linear (transformers' KimiLinearConfig)
)


def _moe_shape(cfg: HFConfig, h: int) -> _MoeShape:
    """Shape of one MoE layer; called only when the plans hold MoE layers.

    Raises:
        ConfigError: no positive expert count, a top-k above the expert count, or a
            non-positive (negative for shared sizes, where 0 means none) size (names the
            field).
    """
    experts = num_experts(cfg)
    if experts < 1:
        raise ConfigError(
            f"config ({cfg.family}) has MoE layers but no positive expert count "
            f"(one of {', '.join(EXPERT_FIELDS)}), got {experts}"
        )
    top_k = cfg.positive_int(*_TOP_K_FIELDS)
    if top_k > experts:
        key = next(k for k in _TOP_K_FIELDS if cfg.has(k))
        raise ConfigError(
            f"config field {key!r} = {top_k} routes to more experts than the {experts} "
            "routed experts"
        )
    mats = _mlp_matrices(cfg)
    inter = cfg.positive_int("moe_intermediate_size", "moe_ffn_hidden_size", "intermediate_size")
    latent = cfg.optional_int("moe_latent_size", default=0) or None
    width = latent or h
    always = h * experts + (2 * h * latent if latent else 0)

    def shared_size(key: str) -> int:
        return cfg.optional_int(key, default=0, minimum=0)  # 0: no shared expert (MiniMax)

    if cfg.is_family("llama4", "llama4_text"):
        always += 3 * h * cfg.positive_int("intermediate_size")  # one shared expert
    elif cfg.has("shared_expert_intermediate_size"):
        always += mats * h * shared_size("shared_expert_intermediate_size")
    elif cfg.has("moe_shared_expert_intermediate_size"):
        count = cfg.optional_int("n_shared_experts", default=1, minimum=0)
        always += count * mats * h * shared_size("moe_shared_expert_intermediate_size")
    elif cfg.has("shared_intermediate_size"):
        always += mats * h * shared_size("shared_intermediate_size")
    elif cfg.has("n_shared_experts"):
        always += cfg.optional_int("n_shared_experts", default=0, minimum=0) * mats * h * inter
    return _MoeShape(experts, top_k, mats * width * inter, always)


def _tied(cfg: HFConfig) -> bool:
    """``tie_word_embeddings``; when absent: True for Gemma (ties by design), else False."""
    value = cfg.get("tie_word_embeddings")
    if value is None:
        return cfg.is_family("gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")
    return bool(value)


def _dense_beside_moe(cfg: HFConfig) -> bool:
    """Gemma 4 MoE layers keep their dense MLP and add the experts beside it
    (transformers' ``Gemma4TextDecoderLayer``: ``mlp`` always, ``router`` + ``experts``
    when ``enable_moe_block``)."""
    return cfg.is_family("gemma4", "gemma4_text") and cfg.get("enable_moe_block") is True


def count_params(cfg: HFConfig, plans: Sequence[LayerPlan]) -> ParamCounts:
    """Count the parameters of the model the config and its layer plans describe.

    Example: Llama-3.1-8B: 128,256 x 4,096 embedding and head, 32 layers of attention
    (41.9M) and gated MLP (176.2M): 8,030,261,248 parameters (model card: 8.03B).

    Raises:
        MissingFieldError: no ``vocab_size``, or a field a mixer or MLP needs (e.g.
            ``intermediate_size``).
        ConfigError: a non-positive size or count, MoE layers without a positive expert
            count, a top-k above the expert count, or active > total parameters.
    """
    h = hidden_size(cfg)
    vocab = cfg.positive_int("vocab_size", "padded_vocab_size")
    tied = _tied(cfg)
    per_mixer: dict[tuple[object, ...], int] = {}
    mixers = dense = routed = active = shared = 0
    moe = _moe_shape(cfg, h) if any(p.ffn is Ffn.MOE for p in plans) else None
    for plan in plans:
        for mixer in plan.mixers:
            key = (mixer, layer_overrides(cfg, mixer, plan.index))
            if key not in per_mixer:
                per_mixer[key] = _mixer_params(cfg, mixer, h, plan.index)
            mixers += per_mixer[key]
        if not plan.mixers:
            mixers += _sambay_cross_params(cfg, h, plan.index, len(plans))
        if plan.ffn is Ffn.DENSE:
            inter = cfg.positive_int("intermediate_size_mlp", "intermediate_size")
            dense += _mlp_matrices(cfg) * h * inter
        elif plan.ffn is Ffn.MOE and moe is not None:
            routed += moe.experts * moe.expert_params
            active += moe.top_k * moe.expert_params
            shared += moe.always_active
            if _dense_beside_moe(cfg):
                dense += _mlp_matrices(cfg) * h * cfg.positive_int("intermediate_size")
    counts = ParamCounts(
        embedding=vocab * h,
        lm_head=0 if tied else vocab * h,
        tied=tied,
        mixers=mixers,
        dense_mlp=dense,
        routed_experts=routed,
        active_experts=active,
        shared=shared,
    )
    if not 0 < counts.active <= counts.total:
        # Guards the formulas above: a config that slipped past the field checks.
        raise ConfigError(
            f"config ({cfg.family}) gives {counts.active} active of {counts.total} total "
            "parameters; check num_experts_per_tok, the expert count and the "
            "*intermediate_size fields"
        )
    return counts


def weight_format_of(cfg: HFConfig) -> WeightFormat:
    """The checkpoint's weight format from ``quantization_config.quant_method``.

    ``mxfp4`` -> ``MXFP4_EXPERTS``; ``fp8`` -> ``FP8``; no quantization config -> ``BF16``.

    Raises:
        ConfigError: another quantization method (pass ``weight_format`` explicitly).
    """
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict):
        return WeightFormat.BF16
    method = str(quant.get("quant_method", "")).lower()
    if method == "mxfp4":
        return WeightFormat.MXFP4_EXPERTS
    if method == "fp8":
        return WeightFormat.FP8
    raise ConfigError(
        f"quantization_config.quant_method={method!r} is not supported; pass weight_format "
        f"(on the command line --weight-format: bf16, fp8, mxfp4-experts)"
    )


def weight_bytes(counts: ParamCounts, fmt: WeightFormat, tp: int = 1) -> int:
    """Bytes of the weights on one of ``tp`` ranks (rounded up).

    The split is taken as even over ranks (vocab-parallel embedding and head, column/row
    parallel projections, experts spread over ranks); pieces that engines replicate (norms,
    routers, KV projections when KV heads < tp) are not added per rank.

    Example: gpt-oss-120b: 114.7B expert parameters x 17/32 B + 2.1B others x 2 B =
    about 65.2 GB on one rank.

    Raises:
        ConfigError: ``tp < 1``.
    """
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    embed = counts.embedding + counts.lm_head
    layers = counts.mixers + counts.dense_mlp + counts.shared
    experts = counts.routed_experts
    if fmt is WeightFormat.BF16:
        total = 2 * (embed + layers + experts)
    elif fmt is WeightFormat.FP8:
        total = 2 * embed + layers + experts
    else:
        expert_bytes = -(-experts * MXFP4_BYTES_NUM // MXFP4_BYTES_DEN)
        total = 2 * (embed + layers) + expert_bytes
    return -(-total // tp)
