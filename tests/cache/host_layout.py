"""The small three-band chain the host-tier tests share: ``P = 4``; bands state (S = 48 B,
LOW) | window (W = 8 tokens, 8 B pages: E = 2, FLOAT, a null page) | full (16 B pages:
E = 4, HIGH) in a 1,000-byte buffer."""

from __future__ import annotations

from kvchain.layout import plan_layout
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl, group_classes

FP8 = CacheDtype.FP8
FULL = LayerCache(0, LifetimeClass.FULL, "gqa",
                  (TensorDecl("k", (2,), FP8), TensorDecl("v", (2,), FP8)))
WIN = LayerCache(1, LifetimeClass.WINDOW, "gqa",
                 (TensorDecl("k", (1,), FP8), TensorDecl("v", (1,), FP8)), window=8)
STATE = LayerCache(2, LifetimeClass.STATE, "mamba2",
                   (TensorDecl("ssm", (12,), CacheDtype.FP32),))
LAYOUT = plan_layout(group_classes((FULL, WIN, STATE)), 1_000, page_size=4)
