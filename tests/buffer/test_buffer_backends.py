"""Backends agree with each other; NullBuffer counts; fences; page read/write errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.buffer import (
    BufferBackend,
    BufferStats,
    CompletedFence,
    Fence,
    ManualFence,
    NullBuffer,
    NumpyBuffer,
    TorchBuffer,
)
from kvchain.errors import BufferArgumentError, BufferUnsupportedError, KVBufferError

from .conftest import HAS_TORCH, NO_TORCH_REASON, buffer_bytes, byte_band

PAGE = 6
N = 12


def test_backends_satisfy_protocol():
    for buf in (NumpyBuffer(8), NullBuffer(8)):
        assert isinstance(buf, BufferBackend)
        assert isinstance(buf.fence(), Fence)


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON)
def test_torch_backend_satisfies_protocol():
    buf = TorchBuffer(8)
    assert isinstance(buf, BufferBackend)
    assert isinstance(buf.fence(), Fence)
    assert buf.fence().query() is True


op = st.one_of(
    st.tuples(st.just("copy"), st.permutations(range(N)), st.lists(st.integers(0, N - 1),
                                                                   max_size=N)),
    st.tuples(st.just("zero"), st.lists(st.integers(0, N - 1), max_size=4)),
    st.tuples(st.just("write"), st.integers(0, N - 1), st.binary(min_size=PAGE,
                                                                 max_size=PAGE)),
)


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON)
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(op, max_size=8), chunk=st.integers(1, 4))
def test_numpy_and_torch_agree(ops, chunk):
    band = byte_band(PAGE, grid_base=3)
    bufs = [NumpyBuffer(PAGE * N + 5, chunk_bytes=PAGE * chunk),
            TorchBuffer(PAGE * N + 5, "cpu", chunk_bytes=PAGE * chunk),
            NullBuffer(PAGE * N + 5)]
    for buf in bufs:
        if not isinstance(buf, NullBuffer):
            for j in range(N):
                buf.write_page(band, j, bytes((j * 7 + i) % 256 for i in range(PAGE)))
        for o in ops:
            if o[0] == "copy":
                src = np.array(o[2], dtype=np.int64)
                dst = np.array(o[1][:len(o[2])], dtype=np.int64)
                buf.copy_pages(band, src, dst)
            elif o[0] == "zero":
                buf.zero_pages(band, np.array(o[1], dtype=np.int64))
            elif not isinstance(buf, NullBuffer):
                buf.write_page(band, o[1], o[2])
    np.testing.assert_array_equal(buffer_bytes(bufs[0]), buffer_bytes(bufs[1]))
    assert bufs[0].stats == bufs[1].stats == bufs[2].stats


def test_null_buffer_counts_and_refuses_bytes():
    band = byte_band(4096)
    buf = NullBuffer(140 * 10**9)  # a full-size GPU buffer costs nothing
    buf.copy_pages(band, np.arange(1000), np.arange(1000) + 1)
    buf.copy_pages(band, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    buf.zero_pages(band, np.array([5]))
    assert buf.stats == BufferStats(copy_calls=2, pages_copied=1000, bytes_copied=4_096_000,
                                    zero_calls=1, pages_zeroed=1)
    with pytest.raises(BufferUnsupportedError):
        buf.read_page(band, 0)
    with pytest.raises(BufferUnsupportedError):
        buf.write_page(band, 0, b"\0" * 4096)
    with pytest.raises(BufferUnsupportedError):
        buf.layer_views(band, band.cache_class.layers[0])
    with pytest.raises(BufferArgumentError, match="appears twice"):
        buf.copy_pages(band, np.array([1, 2]), np.array([3, 3]))
    assert buf.stats.copy_calls == 2
    assert buf.fence().query()


@pytest.mark.parametrize("bad", [-1, N, True, 1.0, "0"])
def test_bad_page_index(make_buffer, bad):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * N)
    with pytest.raises(BufferArgumentError):
        buf.read_page(band, bad)
    with pytest.raises(BufferArgumentError):
        buf.write_page(band, bad, b"\1" * PAGE)
    assert not buffer_bytes(buf).any()


def test_bad_page_data(make_buffer):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * N)
    for data in (b"\1" * (PAGE - 1), np.ones(PAGE + 1, dtype=np.uint8), [1] * PAGE):
        with pytest.raises(BufferArgumentError):
            buf.write_page(band, 0, data)
    assert not buffer_bytes(buf).any()
    buf.write_page(band, 1, np.full(PAGE // 2, 0x0101, dtype=np.uint16))  # any dtype, 6 B
    assert buf.read_page(band, 1).tolist() == [1] * PAGE


def test_read_page_is_a_copy(make_buffer):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * N)
    page = buf.read_page(band, 0)
    page[:] = 9
    assert not buf.read_page(band, 0).any()
    assert page.dtype == np.uint8 and page.shape == (PAGE,)


def test_grid_past_buffer_end_has_no_pages():
    band = byte_band(8, grid_base=20)
    buf = NumpyBuffer(24)
    with pytest.raises(BufferArgumentError, match="grid of 0 pages"):
        buf.read_page(band, 0)


def test_manual_fence():
    fence = ManualFence()
    assert fence.query() is False
    fence.complete()
    assert fence.query() is True and fence.waits == 0
    blocked = ManualFence()
    blocked.wait()  # the modelled forward ends
    assert blocked.query() is True and blocked.waits == 1
    assert CompletedFence().query() is True


def test_errors_are_typed():
    assert issubclass(BufferArgumentError, KVBufferError)
    assert issubclass(BufferArgumentError, ValueError)
    with pytest.raises(BufferArgumentError):
        NumpyBuffer(-1)


def test_torch_missing_raises_typed_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BufferUnsupportedError, match="needs torch"):
        TorchBuffer(8)
    assert NumpyBuffer(8).nbytes == 8  # the numpy backend never needs torch


def _cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="no CUDA")
def test_cuda_fence_and_copy():  # pragma: no cover - runs on GPU machines only
    band = byte_band(1 << 20)
    buf = TorchBuffer(64 << 20, "cuda")
    buf.write_page(band, 0, np.full(1 << 20, 3, dtype=np.uint8))
    buf.copy_pages(band, np.arange(0, 40), np.arange(1, 41))
    fence = buf.fence()
    fence.wait()
    assert fence.query() is True
    assert buf.read_page(band, 1)[0] == 3 and buf.read_page(band, 41)[0] == 0


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON)
def test_cuda_unavailable_is_typed():
    if _cuda():
        pytest.skip("CUDA present")
    with pytest.raises(BufferUnsupportedError, match="CUDA is unavailable"):
        TorchBuffer(8, "cuda")
