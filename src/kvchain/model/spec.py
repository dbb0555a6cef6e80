"""A model as kvchain sees it: cache classes plus what the cost model needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kvchain.model.layers import TARGET, CacheClass, LayerCache, LifetimeClass, group_classes


class DraftKind(StrEnum):
    """How a speculative-decoding draft joins its target (:func:`kvchain.model.with_draft`).

    ``MODEL``: a separate small language model (e.g. Qwen3-0.6B drafting for Qwen3-32B):
    its own embedding, decoder layers and KV cache for every one of its layers; it
    computes the prompt too. ``EAGLE``: an EAGLE-style head fed the target's hidden states;
    it owns the KV of its own decoder layer (EAGLE-3: one layer, vLLM groups it with the
    target's KV groups, vllm-project/vllm#16370 and #48691). ``MTP``: the target's own
    multi-token-prediction layer(s) with KV of their own (DeepSeek-V3's NextN module is a
    one-layer MLA decoder, docs.modular.com ``deepseekV3_nextn``; the Qwen3.5 family's MTP
    layer gets a KV cache of its own, ggml-org/llama.cpp#27781). ``MTP_SHARED``: an MTP
    head whose attention is query-only and reads the target's KV (Gemma-4's MTP drafter
    "has no K/V projections and no KV cache of its own", vllm-project/speculators#586;
    vllm-project/tpu-inference#2771 redirects its layers to the target's): no bands of
    its own.
    """

    MODEL = "model"
    EAGLE = "eagle"
    MTP = "mtp"
    MTP_SHARED = "mtp_shared"

    @property
    def shares_target_kv(self) -> bool:
        """True when the draft keeps no KV of its own (``MTP_SHARED``): zero extra bands."""
        return self is DraftKind.MTP_SHARED


@dataclass(frozen=True, slots=True)
class DefaultedField:
    """A value a model's bytes rest on that its ``config.json`` did not set.

    Attributes:
        field: the config field (e.g. ``"max_position_embeddings"``, ``"mamba_expand"``).
        value: the value used, as short text (a list as ``"[full_attention] x 45"`` or
            ``"45 entries"``).
        by: who supplied it: ``"transformers 5.24.0 Qwen3_5TextConfig"`` (the class's
            default), a custom-code family's configuration class
            (:mod:`~kvchain.model.hf_family_defaults`), or a kvchain rule (e.g.
            ``"kvchain default: bf16, as vLLM's kv_cache_dtype auto"``).
    """

    field: str
    value: str
    by: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value} ({self.by})"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything kvchain needs to know about one model (one tensor-parallel rank).

    Attributes:
        name: display name (e.g. ``"gpt-oss-120b"``).
        layers: cache of every cache-holding layer, in model order (MLP-only layers omitted).
        num_layers: all decoder layers (``num_hidden_layers``).
        hidden_size: model width.
        num_attention_heads: query heads of the attention layers (per rank).
        total_params: all parameters (count).
        active_params: parameters read per token (MoE: shared + top-k experts).
        weight_bytes: bytes of the weights on one rank (mixed dtypes summed, e.g. MXFP4
            experts at 4.25 bits per parameter for gpt-oss).
        tp: tensor-parallel size the bytes are per rank of.
        source: where the config came from (repo, path, license).
        max_context_tokens: the model's context length in tokens (prompt + output of one
            request), from ``max_position_embeddings``; ``None`` when unknown (declared
            models). The KV cache of a model without full attention never bounds a
            request's length; this does: ``plan`` caps the longest request at it and
            ``simulate`` refuses (or truncates) requests past it.
        defaulted: the fields the bytes, weights and context rest on that the config did
            not set, each with its value and who supplied it (a configuration class's
            default, a custom-code family's defaults, a kvchain rule), by field name;
            empty for declared models and for configs that set everything read.
        draft: the speculative-decoding draft model joined by
            :func:`kvchain.model.with_draft`, as its own spec (its weights, parameters,
            layers and bytes, for the cost model), or ``None``. Its cache layers appear in
            ``layers`` too, tagged ``owner = "draft"`` (unless ``draft_kind`` shares the
            target's KV), so ``classes`` holds its bands (``"draft.full"``, ...).
        draft_kind: how the draft joins (:class:`DraftKind`); ``None`` without a draft.
    """

    name: str
    layers: tuple[LayerCache, ...]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    total_params: int
    active_params: int
    weight_bytes: int
    tp: int = 1
    source: str = ""
    max_context_tokens: int | None = None
    defaulted: tuple[DefaultedField, ...] = ()
    draft: ModelSpec | None = None
    draft_kind: DraftKind | None = None
    classes: tuple[CacheClass, ...] = field(init=False)

    def __post_init__(self) -> None:
        from kvchain.errors import ConfigError

        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ConfigError(
                f"max_context_tokens must be >= 1 token, got {self.max_context_tokens}")
        if (self.draft is None) != (self.draft_kind is None):
            raise ConfigError("a draft and its draft_kind come together (both or neither)")
        object.__setattr__(self, "classes", group_classes(self.layers))

    def cache_classes(self, lifetime: LifetimeClass, owner: str | None = TARGET
                      ) -> tuple[CacheClass, ...]:
        """Every class of that lifetime (several window sizes give several), low -> high,
        of ``owner``'s layers (default: the target's; ``"draft"``: the draft's bands;
        ``None``: every owner's)."""
        return tuple(c for c in self.classes if c.lifetime is lifetime
                     and (owner is None or c.owner == owner))

    def cache_class(self, lifetime: LifetimeClass, owner: str = TARGET) -> CacheClass | None:
        """The class of that lifetime of ``owner``'s layers (default: the target's), or
        ``None`` if there is none.

        Raises:
            ConfigError: several classes of that lifetime (use :meth:`cache_classes`).
        """
        found = self.cache_classes(lifetime, owner)
        if len(found) > 1:
            from kvchain.errors import ConfigError

            raise ConfigError(f"{self.name} has {len(found)} {lifetime} classes "
                              f"({', '.join(c.label for c in found)}); use cache_classes")
        return found[0] if found else None

    def bytes_per_token(self, lifetime: LifetimeClass, owner: str = TARGET) -> int:
        """``E`` of that lifetime in bytes per token, summed over ``owner``'s classes
        (default: the target's; 0 if absent)."""
        return sum(c.bytes_per_token for c in self.cache_classes(lifetime, owner))

    @property
    def state_bytes(self) -> int:
        """``S``: bytes per request of the target's state layers (0 if none)."""
        c = self.cache_class(LifetimeClass.STATE)
        return c.bytes_per_slot if c else 0

    @property
    def resident_weight_bytes(self) -> int:
        """Bytes of weights the GPU holds per rank: the target's plus the draft's (a draft
        model, EAGLE head or MTP layer is loaded beside the target; the KV buffer gets
        what is left, :func:`kvchain.gpu.kv_buffer_bytes`)."""
        return self.weight_bytes + (self.draft.weight_bytes if self.draft else 0)

    @property
    def draft_bands(self) -> tuple[CacheClass, ...]:
        """The draft's own classes (bands of the chain), low -> high in model order; empty
        without a draft or for a draft that shares the target's KV."""
        return tuple(c for c in self.classes if c.owner != TARGET)
