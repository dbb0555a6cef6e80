"""A model as kvchain sees it: cache classes plus what the cost model needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvchain.model.layers import CacheClass, LayerCache, LifetimeClass, group_classes


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
    classes: tuple[CacheClass, ...] = field(init=False)

    def __post_init__(self) -> None:
        from kvchain.errors import ConfigError

        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ConfigError(
                f"max_context_tokens must be >= 1 token, got {self.max_context_tokens}")
        object.__setattr__(self, "classes", group_classes(self.layers))

    def cache_classes(self, lifetime: LifetimeClass) -> tuple[CacheClass, ...]:
        """Every class of that lifetime (several window sizes give several), low -> high."""
        return tuple(c for c in self.classes if c.lifetime is lifetime)

    def cache_class(self, lifetime: LifetimeClass) -> CacheClass | None:
        """The class of that lifetime, or ``None`` if the model has none.

        Raises:
            ConfigError: the model has several classes of that lifetime (use
                :meth:`cache_classes`).
        """
        found = self.cache_classes(lifetime)
        if len(found) > 1:
            from kvchain.errors import ConfigError

            raise ConfigError(f"{self.name} has {len(found)} {lifetime} classes "
                              f"({', '.join(c.label for c in found)}); use cache_classes")
        return found[0] if found else None

    def bytes_per_token(self, lifetime: LifetimeClass) -> int:
        """``E`` of that lifetime in bytes per token, summed over its classes (0 if absent)."""
        return sum(c.bytes_per_token for c in self.cache_classes(lifetime))

    @property
    def state_bytes(self) -> int:
        """``S``: bytes per request of all state layers (0 if none)."""
        c = self.cache_class(LifetimeClass.STATE)
        return c.bytes_per_slot if c else 0
