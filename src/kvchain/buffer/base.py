"""The buffer backend protocol, fences, copy statistics and input validation.

A backend owns the bytes of the chain's one buffer. The chain's executor talks to it in
pages of one band at a time: physical page ``j`` of a band lies at bytes
``[grid_base + j * page_bytes, grid_base + (j + 1) * page_bytes)``
(:class:`~kvchain.layout.BandLayout`), and a buffer of ``nbytes`` holds
``(nbytes - grid_base) // page_bytes`` pages of that grid (see :func:`grid_pages`).

Every operation validates all of its input before it touches a byte, so a refused call
changes nothing (house rule; docs/design.md §3, contract 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from kvchain.errors import BufferArgumentError
from kvchain.field_types import is_whole
from kvchain.layout import BandLayout
from kvchain.model.layers import LayerCache

# --- fences --------------------------------------------------------------------------------


@runtime_checkable
class Fence(Protocol):
    """Marks the device work issued up to the moment the fence was recorded.

    A page may be moved only when nothing can still write it (docs/design.md §2, "Moves are
    gated"): the executor records a fence after a forward pass is issued and waits on it
    before copying that forward's pages.
    """

    def query(self) -> bool:
        """True once all work before the fence has completed (never blocks)."""
        ...

    def wait(self) -> None:
        """Block until all work before the fence has completed."""
        ...


class CompletedFence:
    """A fence that is complete from the start: work on the CPU is synchronous."""

    __slots__ = ()

    def query(self) -> bool:
        """Always True."""
        return True

    def wait(self) -> None:
        """Returns at once."""

    def __repr__(self) -> str:
        return "CompletedFence()"


class ManualFence:
    """A fence for tests: pending until :meth:`complete` (or :meth:`wait`) is called.

    ``wait()`` models blocking until the in-flight forward ends: it completes the fence
    and counts the wait in :attr:`waits`, so tests can assert how often an executor had to
    block.

    Attributes:
        waits: how many times :meth:`wait` was called (on a pending or complete fence).
    """

    __slots__ = ("_done", "waits")

    def __init__(self) -> None:
        self._done = False
        self.waits = 0

    def complete(self) -> None:
        """Mark the fenced work as finished."""
        self._done = True

    def query(self) -> bool:
        """True once completed."""
        return self._done

    def wait(self) -> None:
        """Complete the fence (the modelled forward ends) and count the wait."""
        self.waits += 1
        self._done = True

    def __repr__(self) -> str:
        return f"ManualFence(done={self._done}, waits={self.waits})"


# --- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BufferStats:
    """Snapshot of a backend's copy counters.

    Attributes:
        copy_calls: calls of ``copy_pages`` that passed validation (empty calls included).
        pages_copied: pages requested by those calls (a page copied onto itself counts too,
            so every backend, :class:`~kvchain.buffer.NullBuffer` included, reports the same
            numbers for the same calls).
        bytes_copied: ``sum(len(src) * band.page_bytes)`` over those calls.
        zero_calls: calls of ``zero_pages`` that passed validation.
        pages_zeroed: pages requested by those calls.
    """

    copy_calls: int = 0
    pages_copied: int = 0
    bytes_copied: int = 0
    zero_calls: int = 0
    pages_zeroed: int = 0


class StatsCounter:
    """Mutable counters behind :class:`BufferStats` (one per backend)."""

    __slots__ = ("bytes_copied", "copy_calls", "pages_copied", "pages_zeroed", "zero_calls")

    def __init__(self) -> None:
        self.copy_calls = 0
        self.pages_copied = 0
        self.bytes_copied = 0
        self.zero_calls = 0
        self.pages_zeroed = 0

    def count_copy(self, pages: int, page_bytes: int) -> None:
        """Record one copy call of ``pages`` pages of ``page_bytes`` bytes."""
        self.copy_calls += 1
        self.pages_copied += pages
        self.bytes_copied += pages * page_bytes

    def count_zero(self, pages: int) -> None:
        """Record one zero call of ``pages`` pages."""
        self.zero_calls += 1
        self.pages_zeroed += pages

    def snapshot(self) -> BufferStats:
        """A frozen copy of the counters."""
        return BufferStats(self.copy_calls, self.pages_copied, self.bytes_copied,
                           self.zero_calls, self.pages_zeroed)


class CountingBackend:
    """What every backend shares: ``nbytes`` checked, the :class:`StatsCounter`, and the
    validation of ``zero_pages``.

    Raises:
        BufferArgumentError: negative ``nbytes`` or ``chunk_bytes < 1``.
    """

    def __init__(self, nbytes: int, chunk_bytes: int = 1) -> None:
        if nbytes < 0 or chunk_bytes < 1:
            raise BufferArgumentError(
                f"need nbytes >= 0 and chunk_bytes >= 1, got {nbytes} and {chunk_bytes}")
        self._nbytes = nbytes
        self._chunk_bytes = chunk_bytes
        self._counter = StatsCounter()

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer."""
        return self._nbytes

    @property
    def stats(self) -> BufferStats:
        """Copy and zero counters (a frozen snapshot)."""
        return self._counter.snapshot()

    def _zero_index(self, band: BandLayout, idx: np.ndarray) -> np.ndarray:
        """``idx`` checked as pages of ``band``'s grid, and counted as one zeroing."""
        i = page_index_array(idx, "page")
        check_in_grid(band, i, grid_pages(band, self._nbytes), "page")
        self._counter.count_zero(int(i.size))
        return i


# --- the protocol ---------------------------------------------------------------------------


@runtime_checkable
class BufferBackend(Protocol):
    """The bytes of the chain: what the chain's executor (its ``Mover``) calls.

    Page arguments are physical page indices on the band's grid (int64 arrays). Every
    method raises :class:`~kvchain.errors.BufferArgumentError` on bad input (lengths that
    differ, an index outside the band's grid, a destination twice in one copy, a page index
    that is not an integer, page data of the wrong length, a layer not in the band) before
    it changes any byte; ``layer_views`` raises
    :class:`~kvchain.errors.BufferUnsupportedError` for a tensor misaligned for its element
    size. The backends' methods are these; their docstrings say only how they differ.
    """

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer (``B``)."""
        ...

    @property
    def stats(self) -> BufferStats:
        """Counters of copies and zeroings so far."""
        ...

    def copy_pages(self, band: BandLayout, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy page ``src[i]`` to page ``dst[i]`` for all ``i``, as if every source were
        read before any destination is written (sources and destinations may overlap)."""
        ...

    def zero_pages(self, band: BandLayout, idx: np.ndarray) -> None:
        """Fill the given pages with zero bytes (null pages read as zeros)."""
        ...

    def write_page(self, band: BandLayout, j: int, data: bytes | np.ndarray) -> None:
        """Overwrite page ``j`` with ``page_bytes`` bytes of ``data``."""
        ...

    def read_page(self, band: BandLayout, j: int) -> np.ndarray:
        """A copy of page ``j``: uint8, length ``page_bytes``."""
        ...

    def layer_views(self, band: BandLayout, layer: LayerCache) -> dict[str, Any]:
        """Views of the layer's tensors that alias the buffer, keyed by tensor name:
        ``[num_pages, page_tokens, *shape]`` (token band) or ``[num_slots, *shape]`` (state
        band), over every page of the band's grid."""
        ...

    def fence(self) -> Fence:
        """A fence for the work issued so far."""
        ...


# --- validation -----------------------------------------------------------------------------


def grid_pages(band: BandLayout, nbytes: int) -> int:
    """Pages of the band's grid that lie inside a buffer of ``nbytes``:
    ``(nbytes - grid_base) // page_bytes`` (0 if the grid starts past the end).

    Example: ``nbytes = 1,000``, ``page_bytes = 96``, ``grid_base = 1000 mod 96 = 40`` (a
    HIGH END): ``(1,000 - 40) // 96 = 10`` pages, page 9 at bytes ``[904, 1,000)``.

    Raises:
        BufferArgumentError: ``page_bytes < 1`` or a negative ``grid_base``.
    """
    if band.page_bytes < 1 or band.grid_base < 0:
        raise BufferArgumentError(
            f"{band.label} band has page_bytes {band.page_bytes} and grid_base "
            f"{band.grid_base}; need page_bytes >= 1 and grid_base >= 0")
    return max(0, (nbytes - band.grid_base) // band.page_bytes)


def page_index_array(values: Any, what: str) -> np.ndarray:
    """``values`` as a 1-D int64 array of page indices.

    Raises:
        BufferArgumentError: not one-dimensional, or not integers (an empty list is fine).
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise BufferArgumentError(f"{what} must be a 1-D array of page indices, got shape "
                                  f"{arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise BufferArgumentError(f"{what} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def check_in_grid(band: BandLayout, idx: np.ndarray, num_pages: int, what: str) -> None:
    """Raise if any index lies outside ``[0, num_pages)``.

    Raises:
        BufferArgumentError: naming the first offending index and the grid size.
    """
    if idx.size == 0:
        return
    bad = (idx < 0) | (idx >= num_pages)
    if bad.any():
        first = int(idx[np.argmax(bad)])
        raise BufferArgumentError(
            f"{what} page {first} is outside the {band.label} band's grid of {num_pages} "
            f"pages (page_bytes {band.page_bytes:,} B, grid_base {band.grid_base:,} B)")


def check_copy(band: BandLayout, src: Any, dst: Any, nbytes: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Validate a ``copy_pages`` call; returns ``(src, dst)`` as int64 arrays.

    Raises:
        BufferArgumentError: lengths differ, an index is outside the grid, or a destination
            page appears twice.
    """
    s = page_index_array(src, "source")
    d = page_index_array(dst, "destination")
    if s.size != d.size:
        raise BufferArgumentError(
            f"copy_pages needs as many sources as destinations, got {s.size} and {d.size}")
    num_pages = grid_pages(band, nbytes)
    check_in_grid(band, s, num_pages, "source")
    check_in_grid(band, d, num_pages, "destination")
    check_distinct(d, "page")
    return s, d


def check_distinct(dst: np.ndarray, what: str) -> None:
    """Raise if a destination ``what`` (a page, a host slot) repeats in ``dst``.

    Raises:
        BufferArgumentError: naming the first repeated index.
    """
    if dst.size > 1:
        ordered = np.sort(dst)
        dup = ordered[1:] == ordered[:-1]
        if dup.any():
            raise BufferArgumentError(
                f"destination {what} {int(ordered[1:][dup][0])} appears twice in one copy")


def check_page(band: BandLayout, j: Any, nbytes: int) -> int:
    """Validate one page index; returns it as an ``int``.

    Raises:
        BufferArgumentError: not an integer, or outside the grid.
    """
    if not is_whole(j):
        raise BufferArgumentError(f"page index must be an integer, got {j!r}")
    j = int(j)
    num_pages = grid_pages(band, nbytes)
    if not 0 <= j < num_pages:  # checked as a Python int: past int64 too (2**63)
        raise BufferArgumentError(
            f"page {j} is outside the {band.label} band's grid of {num_pages} pages "
            f"(page_bytes {band.page_bytes:,} B, grid_base {band.grid_base:,} B)")
    return j


def page_data(band: BandLayout, data: bytes | bytearray | memoryview | np.ndarray
              ) -> np.ndarray:
    """``data`` as a uint8 array of exactly ``page_bytes`` bytes (a copy).

    Raises:
        BufferArgumentError: the wrong number of bytes, or an unsupported type.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        raw = np.frombuffer(bytes(data), dtype=np.uint8)
    elif isinstance(data, np.ndarray):
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    else:
        raise BufferArgumentError(f"page data must be bytes or a numpy array, got "
                                  f"{type(data).__name__}")
    if raw.size != band.page_bytes:
        raise BufferArgumentError(
            f"page data has {raw.size:,} B, the {band.label} band's pages have "
            f"{band.page_bytes:,} B")
    return raw.copy()
