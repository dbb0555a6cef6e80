"""The default CPU backend: the buffer is one uint8 numpy array."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvchain.buffer.base import (
    CompletedFence,
    CountingBackend,
    check_copy,
    check_page,
    grid_pages,
    page_data,
)
from kvchain.buffer.copy_plan import plan_copy
from kvchain.buffer.page_layout import layer_placements, view_geometry
from kvchain.layout import BandLayout
from kvchain.model.layers import CacheDtype, LayerCache

#: Bytes staged per copy chunk: bounds the temporary memory of ``copy_pages`` (a chunk
#: holds at least one page, so a state slot larger than this is staged alone).
DEFAULT_CHUNK_BYTES = 64 * 2**20

#: numpy has no bfloat16 or fp8: those views hold the raw bits (uint16, uint8).
NUMPY_DTYPES: dict[CacheDtype, type[np.generic]] = {
    CacheDtype.BF16: np.uint16,
    CacheDtype.FP16: np.float16,
    CacheDtype.FP8: np.uint8,
    CacheDtype.FP32: np.float32,
}


def chunk_pages_for(page_bytes: int, chunk_bytes: int) -> int:
    """Pages per copy chunk: ``max(1, chunk_bytes // page_bytes)``."""
    return max(1, chunk_bytes // page_bytes)


class NumpyBuffer(CountingBackend):
    """A zero-filled uint8 numpy buffer of ``nbytes`` (see :class:`BufferBackend`: its
    methods, shapes and errors).

    ``copy_pages`` runs in place in chunks of at most ``chunk_bytes`` (one page at least),
    ordered by :func:`~kvchain.buffer.copy_plan.plan_copy`: temporary memory is one chunk
    plus one page per cycle of the copy (none for slides).

    Args:
        nbytes: buffer bytes (``B``), >= 0.
        chunk_bytes: staging bytes per copy chunk.

    Raises:
        BufferArgumentError: negative ``nbytes`` or ``chunk_bytes < 1``.
    """

    def __init__(self, nbytes: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(nbytes, chunk_bytes)
        self._array = np.zeros(nbytes, dtype=np.uint8)

    @property
    def array(self) -> np.ndarray:
        """The whole buffer (uint8, aliases the bytes)."""
        return self._array

    def _pages(self, band: BandLayout) -> np.ndarray:
        num = grid_pages(band, self.nbytes)
        start = band.grid_base
        return self._array[start:start + num * band.page_bytes].reshape(num, band.page_bytes)

    def copy_pages(self, band: BandLayout, src: np.ndarray, dst: np.ndarray) -> None:
        """:meth:`BufferBackend.copy_pages`, in chunks (the class doc)."""
        s, d = check_copy(band, src, dst, self.nbytes)
        pages = self._pages(band)
        plan = plan_copy(s, d, chunk_pages_for(band.page_bytes, self._chunk_bytes))
        spill = pages[plan.spill_pages] if plan.spill_pages.size else None
        for chunk in plan.chunks:
            staged = pages[chunk.src]
            if chunk.spill_slot is not None:
                assert spill is not None
                from_spill = chunk.spill_slot >= 0
                staged[from_spill] = spill[chunk.spill_slot[from_spill]]
            pages[chunk.dst] = staged
        self._counter.count_copy(int(s.size), band.page_bytes)

    def zero_pages(self, band: BandLayout, idx: np.ndarray) -> None:
        """:meth:`BufferBackend.zero_pages`."""
        self._pages(band)[self._zero_index(band, idx)] = 0

    def write_page(self, band: BandLayout, j: int, data: bytes | np.ndarray) -> None:
        """:meth:`BufferBackend.write_page`."""
        j = check_page(band, j, self.nbytes)
        raw = page_data(band, data)
        start = band.grid_base + j * band.page_bytes
        self._array[start:start + band.page_bytes] = raw

    def read_page(self, band: BandLayout, j: int) -> np.ndarray:
        """:meth:`BufferBackend.read_page`."""
        j = check_page(band, j, self.nbytes)
        start = band.grid_base + j * band.page_bytes
        return self._array[start:start + band.page_bytes].copy()

    def layer_views(self, band: BandLayout, layer: LayerCache) -> dict[str, Any]:
        """:meth:`BufferBackend.layer_views`; bf16 as raw uint16 bits, fp8 as uint8 (numpy
        has neither type)."""
        num = grid_pages(band, self.nbytes)
        views: dict[str, Any] = {}
        for placement in layer_placements(band, layer):
            geo = view_geometry(band, placement, num)
            dtype = np.dtype(NUMPY_DTYPES[geo.dtype])
            views[geo.name] = np.ndarray(
                geo.shape, dtype=dtype, buffer=self._array.data,
                offset=geo.base_byte if num else 0,
                strides=tuple(s * dtype.itemsize for s in geo.strides))
        return views

    def fence(self) -> CompletedFence:
        """CPU work is synchronous: the fence is complete."""
        return CompletedFence()

    def __repr__(self) -> str:
        return f"NumpyBuffer(nbytes={self.nbytes:,})"
