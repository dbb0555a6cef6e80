"""layer_views: per-layer strided views alias the buffer, on a real chain layout."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.buffer import NumpyBuffer, TorchBuffer, layer_placements
from kvchain.errors import BufferArgumentError, BufferUnsupportedError
from kvchain.layout import plan_layout
from kvchain.model.layers import (
    CacheDtype,
    LayerCache,
    LifetimeClass,
    TensorDecl,
    group_classes,
)

from .conftest import HAS_TORCH, NO_TORCH_REASON

BF16, FP32 = CacheDtype.BF16, CacheDtype.FP32
# MiMo-like full-attention layers: K head dim 192, V head dim 128, different KV heads.
FULL0 = LayerCache(0, LifetimeClass.FULL, "gqa",
                   (TensorDecl("k", (2, 192), BF16), TensorDecl("v", (2, 128), BF16)))
FULL1 = LayerCache(2, LifetimeClass.FULL, "gqa",
                   (TensorDecl("k", (1, 192), BF16), TensorDecl("v", (1, 128), BF16)))
# A Mamba-like state layer: conv state and ssm state.
STATE = LayerCache(1, LifetimeClass.STATE, "mamba2",
                   (TensorDecl("conv", (8, 3), BF16), TensorDecl("ssm", (2, 4, 8), FP32)))
P = 4
B = 10 * 7_680 + 1_000  # full pages are 4 x 1,920 B; the HIGH END's grid starts at 1,000
LAYOUT = plan_layout(group_classes((FULL0, STATE, FULL1)), B, page_size=P)
STATE_BAND, FULL_BAND = LAYOUT.bands


def bits(x) -> np.ndarray:
    """Raw element bits of a numpy or torch view as numpy (bf16 -> uint16)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    import torch

    if x.dtype == torch.bfloat16:
        return x.cpu().view(torch.int16).numpy().view(np.uint16).copy()
    return x.cpu().numpy().copy()


BACKENDS = [NumpyBuffer,
            pytest.param(lambda n: TorchBuffer(n, "cpu"), id="torch-cpu",
                         marks=pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON))]


def test_layout_numbers():
    assert FULL_BAND.page_bytes == 7_680
    assert FULL_BAND.grid_base == 1_000
    assert STATE_BAND.page_bytes == 8 * 3 * 2 + 2 * 4 * 8 * 4 == 304
    offsets = [(p.name, p.offset, p.nbytes) for p in layer_placements(FULL_BAND, FULL1)]
    assert offsets == [("k", 5_120, 1_536), ("v", 6_656, 1_024)]


@pytest.mark.parametrize("make", BACKENDS)
def test_token_view_shapes(make):
    buf = make(B)
    v0 = buf.layer_views(FULL_BAND, FULL0)
    v1 = buf.layer_views(FULL_BAND, FULL1)
    assert tuple(v0["k"].shape) == (10, 4, 2, 192)
    assert tuple(v0["v"].shape) == (10, 4, 2, 128)
    assert tuple(v1["k"].shape) == (10, 4, 1, 192)
    assert tuple(v1["v"].shape) == (10, 4, 1, 128)
    vs = buf.layer_views(STATE_BAND, STATE)
    assert tuple(vs["conv"].shape) == (B // 304, 8, 3)
    assert tuple(vs["ssm"].shape) == (B // 304, 2, 4, 8)


@pytest.mark.parametrize("make", BACKENDS)
def test_write_through_view_read_page(make):
    buf = make(B)
    v = buf.layer_views(FULL_BAND, FULL1)["v"]
    # token 3, head 0 of page 7 gets bf16 1.0 (bits 0x3F80) in all 128 lanes
    if isinstance(v, np.ndarray):
        v[7, 3, 0, :] = 0x3F80
    else:
        v[7, 3, 0, :] = 1.0
    page = buf.read_page(FULL_BAND, 7)
    start = 6_656 + 3 * 128 * 2
    expected = np.tile(np.array([0x80, 0x3F], dtype=np.uint8), 128)
    np.testing.assert_array_equal(page[start:start + 256], expected)
    assert page[:start].sum() == 0 and page[start + 256:].sum() == 0
    for j in range(10):
        if j != 7:
            assert not buf.read_page(FULL_BAND, j).any()


@pytest.mark.parametrize("make", BACKENDS)
def test_write_page_read_through_views(make):
    buf = make(B)
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, FULL_BAND.page_bytes, dtype=np.uint8)
    buf.write_page(FULL_BAND, 2, raw)
    for layer in (FULL0, FULL1):
        views = buf.layer_views(FULL_BAND, layer)
        for p in layer_placements(FULL_BAND, layer):
            expected = raw[p.offset:p.offset + p.nbytes].view(np.uint16).reshape(p.page_shape)
            np.testing.assert_array_equal(bits(views[p.name][2]), expected)
            assert not bits(views[p.name][3]).any()
    # the page lies at grid_base + 2 * page_bytes in the buffer
    assert buf.read_page(FULL_BAND, 2).tobytes() == raw.tobytes()


@pytest.mark.parametrize("make", BACKENDS)
def test_state_views_alias(make):
    buf = make(B)
    views = buf.layer_views(STATE_BAND, STATE)
    if isinstance(views["ssm"], np.ndarray):
        views["ssm"][5, 1, 2, :] = np.arange(8, dtype=np.float32)
        views["conv"][5, 0, :] = 7
    else:
        import torch

        views["ssm"][5, 1, 2, :] = torch.arange(8, dtype=torch.float32)
        views["conv"][5, 0, :] = torch.tensor([7], dtype=torch.int16).view(torch.bfloat16)
    page = buf.read_page(STATE_BAND, 5)
    ssm = page[48:].view(np.float32).reshape(2, 4, 8)
    np.testing.assert_array_equal(ssm[1, 2], np.arange(8, dtype=np.float32))
    assert ssm.sum() == 28.0
    conv = page[:48].view(np.uint16).reshape(8, 3)
    assert conv[0].tolist() == [7, 7, 7]
    assert conv[1:].sum() == 0
    assert not buf.read_page(STATE_BAND, 4).any()


@pytest.mark.parametrize("make", BACKENDS)
def test_views_follow_copies(make):
    """A page copy moves the bytes the views show: the executor's relocation is visible to
    kernels through the same views."""
    buf = make(B)
    k = buf.layer_views(FULL_BAND, FULL0)["k"]
    raw = np.arange(FULL_BAND.page_bytes, dtype=np.uint32).astype(np.uint8)
    buf.write_page(FULL_BAND, 0, raw)
    buf.copy_pages(FULL_BAND, np.array([0]), np.array([9]))
    np.testing.assert_array_equal(bits(k[9]), bits(k[0]))


def test_layer_not_in_band():
    buf = NumpyBuffer(B)
    with pytest.raises(BufferArgumentError, match="not in the full band"):
        buf.layer_views(FULL_BAND, STATE)


def test_misaligned_view_raises():
    import dataclasses

    odd = dataclasses.replace(FULL_BAND, grid_base=1_001)
    bufs = [NumpyBuffer(B)] + ([TorchBuffer(B, "cpu")] if HAS_TORCH else [])
    for buf in bufs:
        with pytest.raises(BufferUnsupportedError, match="not aligned"):
            buf.layer_views(odd, FULL0)
