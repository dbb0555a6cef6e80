"""The host tier's bytes: a second byte store in host memory, one slot pool per cache class.

A :class:`HostBuffer` is one uint8 array in host memory - numpy by default, a torch CPU tensor
with ``backend="torch"`` (pinned when torch sees a CUDA device: pinning needs the CUDA
driver, so on a CPU-only torch the tensor is plain host memory and :attr:`HostBuffer.pin_note`
says so). It is laid out per cache class of a device chain (:class:`~kvchain.layout.ChainLayout`):
one region per band, in the chain's band order, each a run of fixed-size **slots** of that
band's page bytes, so one device page of a class fits one host slot of that class exactly::

    byte 0                                                                        nbytes
    | state: slots x S | pad | window: slots x P*E_win | pad | full: slots x P*E_full |
      ^ each region starts on a 256-byte boundary (HOST_ALIGN_BYTES)

    slot i of a class lies at bytes [base + i * page_bytes, base + (i + 1) * page_bytes)

Each region has its own allocator, a :class:`~kvchain.buffer.host_pool.HostPool` (a free list
of slots; why not a chain: that module's docstring). How many slots each class gets is the
caller's choice; :func:`kvchain.cache.host_tier.host_tier_plan` sizes them from a byte budget
(:func:`kvchain.cache.host_tier.host_buffer` builds the buffer it sizes).

Copies (:meth:`HostBuffer.to_host`, :meth:`HostBuffer.to_device`) move whole pages of one
band between a device backend and held host slots of the same class:

==========================  ===============================================================
device backend              copy
==========================  ===============================================================
``NumpyBuffer``             numpy gather/scatter, in chunks of at most ``chunk_bytes``
``TorchBuffer`` on the CPU  the same, on the tensor's memory (shared with numpy)
``TorchBuffer`` on CUDA     one ``copy_(non_blocking=True)`` per run of consecutive
                            (page, slot) pairs, issued on the current stream; returns a
                            :class:`~kvchain.buffer.CudaFence` recorded after the last copy
==========================  ===============================================================

Ordering and fences follow the device moves (docs/design.md §2, "Moves are gated"): a copy
that reads or writes device pages that an in-flight forward may still write (or read) passes
that forward's fence as ``after``; it is waited on before anything is issued. On CUDA the
copies are stream-ordered after work already issued on the current stream, and the returned
fence marks their end: the host bytes of a ``to_host`` may be read, and the host slots of a
``to_device`` may be freed or overwritten, only once it completes. On the CPU every copy is
synchronous and the fence is complete.

Per-run copies (not one gather kernel into pinned memory) are what vLLM's CPU swap path does
(one ``cudaMemcpyAsync`` per block); merging consecutive runs keeps the count of transfers
low when pages and slots were taken in order.

Every call validates all of its input before it touches a byte: a refused call changes
nothing (house rule; docs/design.md §3, contract 2).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvchain.buffer.base import (
    CompletedFence,
    Fence,
    check_distinct,
    check_in_grid,
    grid_pages,
    page_data,
    page_index_array,
)
from kvchain.buffer.host_pool import HostPool
from kvchain.buffer.numpy_buffer import DEFAULT_CHUNK_BYTES, NumpyBuffer, chunk_pages_for
from kvchain.buffer.torch_buffer import CudaFence, TorchBuffer, import_torch
from kvchain.errors import BufferArgumentError, BufferUnsupportedError
from kvchain.field_types import is_whole
from kvchain.layout import BandLayout, ChainLayout

#: Alignment of each class's region in the host buffer (bytes): the device buffer's own
#: alignment (``kvchain.gpu.KV_BUFFER_ALIGN_BYTES``), so typed views and the 8-byte word rows
#: the torch copies use start aligned as they do on the device.
HOST_ALIGN_BYTES = 256


@dataclass(frozen=True, slots=True)
class HostRegion:
    """One class's slots in the host buffer.

    Attributes:
        label: the band's label (``"full"``, ``"window"``, ``"window128"``, ``"state"``...).
        page_bytes: bytes of one slot: the band's device page bytes.
        base: byte offset of slot 0.
        slots: number of slots.
    """

    label: str
    page_bytes: int
    base: int
    slots: int

    @property
    def nbytes(self) -> int:
        """Bytes of the region's slots: ``slots x page_bytes``."""
        return self.slots * self.page_bytes


@dataclass(frozen=True, slots=True)
class HostStats:
    """Copy counters of a host buffer (calls that passed validation).

    Attributes:
        to_host_calls, pages_to_host, bytes_to_host: device -> host copies.
        to_device_calls, pages_to_device, bytes_to_device: host -> device copies.
    """

    to_host_calls: int = 0
    pages_to_host: int = 0
    bytes_to_host: int = 0
    to_device_calls: int = 0
    pages_to_device: int = 0
    bytes_to_device: int = 0


def host_regions(layout: ChainLayout, slots: Mapping[str, int]) -> tuple[HostRegion, ...]:
    """The regions of a host buffer for ``layout`` with ``slots[label]`` slots per band (a
    band the mapping leaves out gets 0), in the chain's band order, each base rounded up to
    :data:`HOST_ALIGN_BYTES`.

    Example: bands ``state`` (S = 1,000 B) and ``full`` (4,096 B pages), 3 and 2 slots:
    state at ``[0, 3,000)``, full from ``ceil(3,000 / 256) x 256 = 3,072`` to ``11,264``.

    Raises:
        BufferArgumentError: ``slots`` not a mapping, a label that is no band of the
            layout, or a slot count that is not a whole number >= 0.
    """
    if not isinstance(slots, Mapping):
        raise BufferArgumentError(f"host slots must be a mapping of band label -> slots, got "
                                  f"{type(slots).__name__}")
    labels = [b.label for b in layout.bands]
    unknown = sorted(set(slots) - set(labels))
    if unknown:
        raise BufferArgumentError(f"no cache class {unknown[0]!r} in this chain (its classes: "
                                  f"{', '.join(labels)})")
    out = []
    offset = 0
    for band in layout.bands:
        n = slots.get(band.label, 0)
        if not is_whole(n) or n < 0:
            raise BufferArgumentError(f"host slots of class {band.label!r} must be a whole "
                                      f"number >= 0, got {n!r}")
        base = -(-offset // HOST_ALIGN_BYTES) * HOST_ALIGN_BYTES
        out.append(HostRegion(band.label, band.page_bytes, base, int(n)))
        offset = base + int(n) * band.page_bytes
    return tuple(out)


class HostBuffer:
    """Host memory for evicted pages and state slots of a chain, one slot pool per class
    (module docstring).

    Args:
        layout: the device chain whose classes (bands) and page bytes the host mirrors.
        slots: slots per band label (bands left out get none).
        backend: ``"numpy"`` (default), ``"torch"`` (a torch CPU tensor, pinned when CUDA is
            available), or ``"auto"`` (torch when installed, else numpy).
        pin: pin the torch tensor (default: when CUDA is available); ``True`` without CUDA
            is refused.
        chunk_bytes: most bytes staged per gather/scatter chunk on the CPU paths.

    Raises:
        BufferArgumentError: ``slots`` not a mapping, an unknown label, a bad slot count, an
            unknown backend, ``chunk_bytes < 1``, or ``pin`` with the numpy backend.
        BufferUnsupportedError: ``backend="torch"`` without torch, ``pin=True`` where
            torch sees no CUDA device, or host memory that cannot be allocated (the store's
            bytes, or a pool's free list, :class:`~kvchain.buffer.HostPool`).
    """

    def __init__(self, layout: ChainLayout, slots: Mapping[str, int], *,
                 backend: str = "numpy", pin: bool | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if backend not in ("numpy", "torch", "auto"):
            raise BufferArgumentError(f"host backend must be numpy, torch or auto, got "
                                      f"{backend!r}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise BufferArgumentError(f"chunk_bytes must be an integer >= 1, got {chunk_bytes!r}")
        regions = host_regions(layout, slots)
        if backend == "auto":
            backend = "torch" if importlib.util.find_spec("torch") is not None else "numpy"
        if backend == "numpy" and pin:
            raise BufferArgumentError("pinned host memory needs backend='torch'")
        nbytes = max((r.base + r.nbytes for r in regions), default=0)
        self._layout = layout
        self._regions = {r.label: r for r in regions}
        self._pools = {r.label: HostPool(r.label, r.slots) for r in regions}
        self._chunk_bytes = chunk_bytes
        self._counts = [0, 0, 0, 0, 0, 0]
        self._backend = backend
        self._tensor: Any = None
        if backend == "torch":
            torch = import_torch()
            cuda = bool(torch.cuda.is_available())
            if pin and not cuda:
                raise BufferUnsupportedError("pinned host memory needs CUDA (pinning is a "
                                             "CUDA driver call); torch sees no CUDA device")
            self._pinned = cuda if pin is None else bool(pin)
            self._pin_note = ("pinned (page-locked) host memory" if self._pinned else
                              "plain host memory, not pinned: "
                              + ("pin=False" if cuda else
                                 "torch sees no CUDA device and pinning needs CUDA"))
            try:
                self._tensor = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=self._pinned)
            except RuntimeError as exc:  # torch's allocator reports no memory this way
                raise _no_memory(nbytes, exc) from None
            self._array = self._tensor.numpy()  # the same bytes
        else:
            self._pinned = False
            self._pin_note = "plain host memory (numpy backend)"
            try:
                self._array = np.zeros(nbytes, dtype=np.uint8)
            except (MemoryError, ValueError) as exc:  # ValueError: past numpy's size limit
                raise _no_memory(nbytes, exc) from None

    # --- geometry and allocation ----------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of the host store (regions and their alignment padding)."""
        return int(self._array.size)

    @property
    def backend(self) -> str:
        """``"numpy"`` or ``"torch"``."""
        return self._backend

    @property
    def pinned(self) -> bool:
        """Whether the store is pinned (page-locked) memory."""
        return self._pinned

    @property
    def pin_note(self) -> str:
        """What kind of host memory the store is, and why (e.g. not pinned on a CPU-only
        torch)."""
        return self._pin_note

    @property
    def array(self) -> np.ndarray:
        """The whole store as a numpy uint8 array (aliases the bytes, torch backend too)."""
        return self._array

    @property
    def tensor(self) -> Any:
        """The torch tensor of the store (``None`` for the numpy backend)."""
        return self._tensor

    @property
    def regions(self) -> tuple[HostRegion, ...]:
        """The classes' regions, in the chain's band order."""
        return tuple(self._regions.values())

    @property
    def stats(self) -> HostStats:
        """Copy counters so far (a frozen snapshot)."""
        return HostStats(*self._counts)

    def region(self, label: str) -> HostRegion:
        """The region of band ``label``.

        Raises:
            BufferArgumentError: no such class in this host buffer.
        """
        try:
            return self._regions[label]
        except (KeyError, TypeError):
            raise BufferArgumentError(
                f"no cache class {label!r} in this host buffer (its classes: "
                f"{', '.join(self._regions)})") from None

    def pool(self, label: str) -> HostPool:
        """The slot allocator of band ``label``.

        Raises:
            BufferArgumentError: no such class.
        """
        return self._pools[self.region(label).label]

    def alloc(self, label: str, n: int) -> np.ndarray:
        """Take ``n`` free slots of class ``label`` (sorted int64 slot ids).

        Raises:
            BufferArgumentError: unknown class or bad ``n``.
            HostPoolFullError: fewer than ``n`` free slots (nothing taken).
        """
        return self.pool(label).alloc(n)

    def free(self, label: str, slots: Any) -> None:
        """Return held slots of class ``label`` to its pool.

        Raises:
            BufferArgumentError: unknown class, or a slot out of range, free, or repeated.
        """
        self.pool(label).free(slots)

    def audit(self) -> None:
        """Every pool's invariant (:meth:`HostPool.audit`): each slot free or held, once.

        Raises:
            AuditError: the first pool whose invariant fails.
        """
        for p in self._pools.values():
            p.audit()

    # --- single slots (tests, tooling) ----------------------------------------------------

    def _rows(self, region: HostRegion) -> np.ndarray:
        """The region as a ``[slots, page_bytes]`` numpy view."""
        return self._array[region.base:region.base + region.nbytes].reshape(
            region.slots, region.page_bytes)

    def write_slot(self, label: str, slot: int, data: bytes | np.ndarray) -> None:
        """Overwrite held slot ``slot`` of class ``label`` with exactly ``page_bytes`` bytes.

        Raises:
            BufferArgumentError: unknown class, a slot not held, or data of the wrong length.
        """
        region = self.region(label)
        idx = self._pools[label].check_held(np.array([slot]) if is_whole(slot) else slot)
        if idx.size != 1:
            raise BufferArgumentError(f"write_slot takes one slot, got {slot!r}")
        raw = page_data(self._layout_band(label), data)
        self._rows(region)[int(idx[0])] = raw

    def read_slot(self, label: str, slot: int) -> np.ndarray:
        """A copy of held slot ``slot`` of class ``label`` (uint8, ``page_bytes`` long).

        Raises:
            BufferArgumentError: unknown class or a slot not held.
        """
        region = self.region(label)
        idx = self._pools[label].check_held(np.array([slot]) if is_whole(slot) else slot)
        if idx.size != 1:
            raise BufferArgumentError(f"read_slot takes one slot, got {slot!r}")
        return self._rows(region)[int(idx[0])].copy()

    def _layout_band(self, label: str) -> BandLayout:
        return next(b for b in self._layout.bands if b.label == label)

    # --- copies ---------------------------------------------------------------------------

    def _check(self, device: Any, band: BandLayout, pages: Any, slots: Any,
               pages_written: bool, after: Any) -> tuple[HostRegion, np.ndarray, np.ndarray]:
        """Validate a copy between ``pages`` of ``band`` on ``device`` and held ``slots``
        (and its ``after`` fence: one with ``query``/``wait``, or ``None``)."""
        if after is not None and not isinstance(after, Fence):
            raise BufferArgumentError(f"after must be a fence (query() and wait()) or None, "
                                      f"got {type(after).__name__}")
        if not isinstance(device, NumpyBuffer | TorchBuffer):
            raise BufferUnsupportedError(
                f"host copies need a NumpyBuffer or TorchBuffer device backend, got "
                f"{type(device).__name__} (a NullBuffer holds no bytes)")
        if not isinstance(band, BandLayout):
            raise BufferArgumentError(f"band must be a BandLayout, got {type(band).__name__}")
        region = self.region(band.label)
        if band.page_bytes != region.page_bytes:
            raise BufferArgumentError(
                f"the {band.label} band has pages of {band.page_bytes:,} B but this host "
                f"buffer's {band.label} slots hold {region.page_bytes:,} B")
        p = page_index_array(pages, "device page")
        check_in_grid(band, p, grid_pages(band, device.nbytes), "device")
        s = self._pools[band.label].check_held(slots)
        if p.size != s.size:
            raise BufferArgumentError(f"a host copy needs as many device pages as host slots, "
                                      f"got {p.size} and {s.size}")
        check_distinct(p if pages_written else s, "device page" if pages_written else "host slot")
        return region, p, s

    def to_host(self, device: NumpyBuffer | TorchBuffer, band: BandLayout, pages: Any,
                slots: Any, *, after: Fence | None = None) -> Fence:
        """Copy device pages ``pages[i]`` of ``band`` into held host slots ``slots[i]`` of
        the same class (``len(pages) == len(slots)``; slots distinct; a page may repeat).

        Args:
            device: the device backend holding the chain's bytes.
            band: the band of the pages (its label names the host class).
            pages: physical device page indices on the band's grid.
            slots: held host slots of that class.
            after: a fence to wait on first (a forward that may still write the pages).

        Returns:
            A fence marking the end of the copies (complete on the CPU).

        Raises:
            BufferArgumentError: unknown class, page bytes that differ, a page outside the
                band's grid, a slot out of range or not held, lengths that differ, a slot
                twice, or an ``after`` that is no fence (nothing is copied).
            BufferUnsupportedError: a device backend without bytes.
        """
        return self._move(device, band, pages, slots, after, to_host=True)

    def to_device(self, device: NumpyBuffer | TorchBuffer, band: BandLayout, slots: Any,
                  pages: Any, *, after: Fence | None = None) -> Fence:
        """Copy held host slots ``slots[i]`` into device pages ``pages[i]`` of ``band``
        (pages distinct; a slot may repeat).

        Args and returns: as :meth:`to_host` (``after``: a forward that may still read the
        pages); free or overwrite the slots only after the returned fence completes.

        Raises:
            BufferArgumentError: as :meth:`to_host`, with a repeated device page instead of
                a repeated slot (nothing is copied).
            BufferUnsupportedError: a device backend without bytes.
        """
        return self._move(device, band, pages, slots, after, to_host=False)

    def _move(self, device: NumpyBuffer | TorchBuffer, band: BandLayout, pages: Any,
              slots: Any, after: Fence | None, *, to_host: bool) -> Fence:
        """The one copy path of :meth:`to_host` and :meth:`to_device`: check everything,
        wait on ``after``, copy, count (to host: counters 0-2; to the device: 3-5)."""
        region, p, s = self._check(device, band, pages, slots, pages_written=not to_host,
                                   after=after)
        if after is not None:
            after.wait()
        fence = self._copy(device, band, region, p, s, to_host=to_host)
        self._count(0 if to_host else 3, int(p.size), band.page_bytes)
        return fence

    def _count(self, at: int, pages: int, page_bytes: int) -> None:
        self._counts[at] += 1
        self._counts[at + 1] += pages
        self._counts[at + 2] += pages * page_bytes

    def _copy(self, device: NumpyBuffer | TorchBuffer, band: BandLayout, region: HostRegion,
              p: np.ndarray, s: np.ndarray, *, to_host: bool) -> Fence:
        host = self._rows(region)
        if isinstance(device, TorchBuffer) and device.device.type == "cuda":
            return self._copy_cuda(device, band, region, p, s, to_host)
        raw = device.array if isinstance(device, NumpyBuffer) else device.tensor.numpy()
        num = grid_pages(band, device.nbytes)
        dev = raw[band.grid_base:band.grid_base + num * band.page_bytes].reshape(
            num, band.page_bytes)
        step = chunk_pages_for(band.page_bytes, self._chunk_bytes)
        for lo in range(0, p.size, step):
            hp, hs = p[lo:lo + step], s[lo:lo + step]
            if to_host:
                host[hs] = dev[hp]
            else:
                dev[hp] = host[hs]
        return CompletedFence()

    def _copy_cuda(self, device: TorchBuffer, band: BandLayout, region: HostRegion,
                   p: np.ndarray, s: np.ndarray, to_host: bool) -> Fence:
        torch = import_torch()
        store = self._tensor if self._tensor is not None else torch.from_numpy(self._array)
        host = store[region.base:region.base + region.nbytes].view(region.slots,
                                                                   region.page_bytes)
        num = grid_pages(band, device.nbytes)
        dev = device.tensor[band.grid_base:band.grid_base + num * band.page_bytes].view(
            num, band.page_bytes)
        for p0, s0, n in copy_runs(p, s):
            if to_host:
                host[s0:s0 + n].copy_(dev[p0:p0 + n], non_blocking=True)
            else:
                dev[p0:p0 + n].copy_(host[s0:s0 + n], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device.device))
        return CudaFence(event)

    def __repr__(self) -> str:
        held = ", ".join(f"{label} {pool.held_count:,}/{pool.slots:,}"
                         for label, pool in self._pools.items())
        return f"HostBuffer({self.nbytes:,} B, {self._backend}, {held})"


def copy_runs(pages: np.ndarray, slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs ``(first page, first slot, length)`` of consecutive pairs: pairs sorted by slot,
    a run continues while both the page and the slot go up by one.

    Example: pages ``[7, 8, 3, 9]``, slots ``[0, 1, 5, 2]`` -> sorted by slot: (7, 0),
    (8, 1), (9, 2), (3, 5) -> ``[(7, 0, 3), (3, 5, 1)]``.
    """
    if pages.size == 0:
        return []
    order = np.argsort(slots, kind="stable")
    ps, ss = pages[order], slots[order]
    breaks = np.flatnonzero((np.diff(ps) != 1) | (np.diff(ss) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [ps.size]))
    return [(int(ps[a]), int(ss[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]


def _no_memory(nbytes: int, exc: BaseException) -> BufferUnsupportedError:
    return BufferUnsupportedError(f"cannot allocate a host buffer of {nbytes:,} B in this "
                                  f"machine's memory ({exc})")

