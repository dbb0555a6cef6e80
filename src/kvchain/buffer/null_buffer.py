"""A bookkeeping-only backend for simulated chains too large to hold (e.g. 140 GB)."""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from kvchain.buffer.base import CompletedFence, CountingBackend, check_copy, check_page
from kvchain.errors import BufferUnsupportedError
from kvchain.layout import BandLayout
from kvchain.model.layers import LayerCache


class NullBuffer(CountingBackend):
    """A buffer of ``nbytes`` that holds no bytes (see :class:`BufferBackend`).

    ``copy_pages`` and ``zero_pages`` validate their input exactly like the real backends
    and count pages and bytes in :attr:`stats`; reading, writing and views raise
    :class:`~kvchain.errors.BufferUnsupportedError`. The simulator uses it to run the chain
    allocator on a full-size GPU buffer while counting the bytes moves would copy.

    Args:
        nbytes: buffer bytes (``B``), >= 0.

    Raises:
        BufferArgumentError: negative ``nbytes``.
    """

    def copy_pages(self, band: BandLayout, src: np.ndarray, dst: np.ndarray) -> None:
        """Validate and count a copy (:meth:`BufferBackend.copy_pages`); no bytes move."""
        s, _ = check_copy(band, src, dst, self._nbytes)
        self._counter.count_copy(int(s.size), band.page_bytes)

    def zero_pages(self, band: BandLayout, idx: np.ndarray) -> None:
        """Validate and count a zeroing; no bytes change."""
        self._zero_index(band, idx)

    def _no_bytes(self, what: str) -> NoReturn:
        raise BufferUnsupportedError(f"NullBuffer holds no bytes: cannot {what}")

    def write_page(self, band: BandLayout, j: int, data: bytes | np.ndarray) -> None:
        """Raises :class:`~kvchain.errors.BufferUnsupportedError` (after validating ``j``)."""
        check_page(band, j, self._nbytes)
        self._no_bytes("write a page")

    def read_page(self, band: BandLayout, j: int) -> np.ndarray:
        """Raises :class:`~kvchain.errors.BufferUnsupportedError` (after validating ``j``)."""
        check_page(band, j, self._nbytes)
        self._no_bytes("read a page")

    def layer_views(self, band: BandLayout, layer: LayerCache) -> dict[str, Any]:
        """Raises :class:`~kvchain.errors.BufferUnsupportedError`."""
        self._no_bytes("make tensor views")

    def fence(self) -> CompletedFence:
        """Nothing runs: the fence is complete."""
        return CompletedFence()

    def __repr__(self) -> str:
        return f"NullBuffer(nbytes={self._nbytes:,})"
