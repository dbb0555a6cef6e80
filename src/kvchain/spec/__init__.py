"""Layer declarations -> lifetime classes, bytes per token / per slot; HF config loading."""

from kvchain.spec.layers import (
    CacheClass,
    CacheDtype,
    LayerCache,
    LifetimeClass,
    TensorDecl,
    group_classes,
)
from kvchain.spec.model import ModelSpec

__all__ = [
    "CacheClass",
    "CacheDtype",
    "LayerCache",
    "LifetimeClass",
    "ModelSpec",
    "TensorDecl",
    "group_classes",
]
