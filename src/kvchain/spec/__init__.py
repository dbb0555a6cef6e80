"""Layer declarations -> lifetime classes, bytes per token / per slot; HF config loading."""

from kvchain.spec.declared import declare_model, declared_class, declared_layer
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import (
    CacheClass,
    CacheDtype,
    LayerCache,
    LifetimeClass,
    TensorDecl,
    group_classes,
)
from kvchain.spec.model import ModelSpec
from kvchain.spec.params import ParamCounts, WeightFormat, count_params, weight_bytes

__all__ = [
    "CacheClass",
    "CacheDtype",
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
    "weight_bytes",
]
