"""A small three-class chain for the host buffer tests, its numbers derived by hand.

Classes (page_size P = 4 tokens): full attention K and V of ``(2,)`` fp8 each (E = 4 B per
token, pages of 16 B), a sliding window of 8 tokens with K and V ``(1,)`` fp8 (E = 2 B,
pages of 8 B), a recurrent state of 12 fp32 (S = 48 B per slot). Buffer B = 1,000 B: bands
``state|window|full``; the full band is the HIGH END, so its grid starts at
``1,000 mod 16 = 8``.
"""

from __future__ import annotations

import numpy as np

from kvchain.layout import plan_layout
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl, group_classes

FP8, FP32 = CacheDtype.FP8, CacheDtype.FP32
FULL = LayerCache(0, LifetimeClass.FULL, "gqa",
                  (TensorDecl("k", (2,), FP8), TensorDecl("v", (2,), FP8)))
WIN = LayerCache(1, LifetimeClass.WINDOW, "gqa",
                 (TensorDecl("k", (1,), FP8), TensorDecl("v", (1,), FP8)), window=8)
STATE = LayerCache(2, LifetimeClass.STATE, "mamba2", (TensorDecl("ssm", (12,), FP32),))
DEVICE_BYTES = 1_000
LAYOUT = plan_layout(group_classes((FULL, WIN, STATE)), DEVICE_BYTES, page_size=4)
STATE_BAND, WIN_BAND, FULL_BAND = LAYOUT.bands
SLOTS = {"state": 3, "window": 5, "full": 4}


def fill(device: object, band: object, pages: int, seed: int) -> None:
    """Distinct random bytes in pages ``0 .. pages - 1`` of ``band``."""
    rng = np.random.default_rng(seed)
    for j in range(pages):
        device.write_page(band, j, rng.integers(0, 256, band.page_bytes, dtype=np.uint8))
