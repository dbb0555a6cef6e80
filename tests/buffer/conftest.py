"""Shared fixtures of the buffer tests: backends and small bands."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import numpy as np
import pytest

from kvchain.buffer import NumpyBuffer, TorchBuffer
from kvchain.layout import Anchor, BandLayout
from kvchain.model.layers import CacheClass, CacheDtype, LayerCache, LifetimeClass, TensorDecl

HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH_REASON = "torch not installed (pip install -e '.[torch]'); numpy covers these bytes"
if HAS_TORCH:
    import torch

    HAS_CUDA = torch.cuda.is_available()
else:  # pragma: no cover
    HAS_CUDA = False

BACKENDS: dict[str, Callable[..., object]] = {
    "numpy": lambda nbytes, **kw: NumpyBuffer(nbytes, **kw),
    "torch-cpu": lambda nbytes, **kw: TorchBuffer(nbytes, "cpu", **kw),
    "torch-cuda": lambda nbytes, **kw: TorchBuffer(nbytes, "cuda", **kw),
}


@pytest.fixture(params=[
    "numpy",
    pytest.param("torch-cpu", marks=pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON)),
    pytest.param("torch-cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")),
])
def make_buffer(request: pytest.FixtureRequest) -> Callable[..., object]:
    """A factory ``make_buffer(nbytes, chunk_bytes=...)`` for each real backend."""
    return BACKENDS[request.param]


def byte_band(page_bytes: int, grid_base: int = 0, anchor: Anchor = Anchor.FLOAT
              ) -> BandLayout:
    """A window band of one 1-byte-per-token fp8 layer with ``page_bytes`` tokens per page:
    pages are plain byte ranges, for copy tests."""
    layer = LayerCache(0, LifetimeClass.WINDOW, "gqa",
                       (TensorDecl("k", (1,), CacheDtype.FP8),), window=8)
    cls = CacheClass.of((layer,))
    return BandLayout(cls, anchor, page_bytes, page_bytes, grid_base, 1_000, 0)


def fill_pattern(buf: object, band: BandLayout, num_pages: int, seed: int = 0) -> None:
    """Write distinct random bytes to pages ``0 .. num_pages - 1``."""
    rng = np.random.default_rng(seed)
    for j in range(num_pages):
        buf.write_page(band, j, rng.integers(0, 256, band.page_bytes, dtype=np.uint8))


def buffer_bytes(buf: object) -> np.ndarray:
    """All bytes of a numpy or torch backend, as a numpy uint8 copy."""
    if isinstance(buf, NumpyBuffer):
        return buf.array.copy()
    return buf.tensor.cpu().numpy().copy()
