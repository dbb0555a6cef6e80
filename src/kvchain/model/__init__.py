"""Layer declarations -> lifetime classes, bytes per token / per slot; HF config loading."""

from kvchain.model.declared import declare_model, declared_class, declared_layer
from kvchain.model.draft import with_draft
from kvchain.model.hf import load_hf_config
from kvchain.model.layers import (
    DRAFT,
    TARGET,
    CacheClass,
    CacheDtype,
    LayerCache,
    LifetimeClass,
    TensorDecl,
    group_classes,
)
from kvchain.model.params import ParamCounts, WeightFormat, count_params, weight_bytes
from kvchain.model.spec import DefaultedField, DraftKind, ModelSpec
from kvchain.model.spec_file import load_spec_file

__all__ = [
    "DRAFT",
    "TARGET",
    "CacheClass",
    "CacheDtype",
    "DefaultedField",
    "DraftKind",
    "LayerCache",
    "LifetimeClass",
    "ModelSpec",
    "ParamCounts",
    "TensorDecl",
    "WeightFormat",
    "count_params",
    "declare_model",
    "declared_class",
    "declared_layer",
    "group_classes",
    "load_hf_config",
    "load_spec_file",
    "weight_bytes",
    "with_draft",
]
