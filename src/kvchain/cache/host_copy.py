"""A running request's pages and state slots copied to the host tier and loaded back.

This is the byte path of retraction by host copy (issue 23, item 5) and of a host hit's
load-back, for one request whose pages the request layer still names: every page the
request holds in every band is copied into host slots of its class
(:meth:`HostBuffer.to_host <kvchain.buffer.HostBuffer.to_host>`), and later copied back
(:meth:`~kvchain.buffer.HostBuffer.to_device`) into whatever physical pages those virtual
pages occupy *then*. What "every page it holds" means per class:

==================  ========================================================================
band                pages copied (entries ``j`` of ``page_table(rid, band)``)
==================  ========================================================================
full attention      every entry: page ``j`` holds tokens ``[j P, (j + 1) P)``
sliding window /    the live entries only: released entries name the band's null page
chunked local       (zeros, the chain's own), and no token the request will read lies there
state               every slot the request holds (its working slot, and checkpoints if any)
==================  ========================================================================

Addressing is by **virtual** page id: the copy records each entry's virtual id and
translates it (``chain.translate``) at the moment of each copy, so a load-back after the
chain compacted or relocated the request's pages (their physical places changed, their
virtual ids did not) lands where the request's page tables now point - as the forward
itself reads them.

Ordering: on CUDA the copies are stream-ordered on the current stream (as the forwards and
the chain's moves are) and each call returns the fence of its last copy; the host slots of a
copy may be read after :func:`offload_request`'s fence completes, and freed
(:func:`free_host_copy`) only after :func:`load_back_request`'s. On the CPU every fence is
complete.

What this module does not decide: *when* a request goes to host and comes back, and which
device pages it holds meanwhile - that is the scheduler's and the request layer's (priced
load-back, issue 23 item 3). It only needs the request layer's read side
(:class:`PageTables`: ``page_table`` and ``chain``), so it works on any version of it that
keeps those two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.buffer.base import CompletedFence, Fence
from kvchain.buffer.host import HostBuffer
from kvchain.buffer.numpy_buffer import NumpyBuffer
from kvchain.buffer.torch_buffer import TorchBuffer
from kvchain.errors import (
    BufferArgumentError,
    BufferUnsupportedError,
    HostPoolFullError,
    StaleHostCopyError,
)


class PageTables(Protocol):
    """What the host copy reads of the request layer (``kvchain.requests.manager.KVManager``
    has both)."""

    @property
    def chain(self) -> Allocator:
        """The allocator whose bands hold the pages (``layout``, ``translate``,
        ``null_page``)."""
        ...

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """Virtual page ids of ``rid`` in ``band`` in token order (state: its slots);
        released window entries hold the band's null page."""
        ...


@dataclass(frozen=True, slots=True)
class BandCopy:
    """The part of a request's host copy in one band.

    Attributes:
        band: band index in the chain (low -> high).
        label: the band's label (the host class).
        entries: int64 ``[n]``, the indices into ``page_table(rid, band)`` copied (token
            bands: entry ``j`` holds tokens ``[j P, (j + 1) P)``; state: slot index).
        vids: int64 ``[n]``, the virtual page ids at those entries when copied.
        slots: int64 ``[n]``, the host slots of class ``label`` holding them.
        table_pages: length of ``page_table(rid, band)`` when copied (entries, null ones
            included).
    """

    band: int
    label: str
    entries: np.ndarray
    vids: np.ndarray
    slots: np.ndarray
    table_pages: int


@dataclass(frozen=True, slots=True)
class RequestHostCopy:
    """One request's pages in host memory (:func:`offload_request`).

    Attributes:
        rid: the request.
        bands: one :class:`BandCopy` per band of the chain, in band order (a band where the
            request holds nothing has ``n = 0``).
    """

    rid: int
    bands: tuple[BandCopy, ...]

    @property
    def pages(self) -> int:
        """Pages and state slots copied, over all bands."""
        return sum(int(b.slots.size) for b in self.bands)

    def nbytes(self, host: HostBuffer) -> int:
        """Bytes the copy holds in ``host``: ``sum(n_band x page_bytes_band)``."""
        return sum(int(b.slots.size) * host.region(b.label).page_bytes for b in self.bands)


def request_pages(kv: PageTables, rid: int) -> tuple[tuple[np.ndarray, np.ndarray, int], ...]:
    """Per band (band order), ``(entries, vids, table_pages)`` of the pages ``rid`` holds:
    every entry of its page table except the band's null page (module docstring's table),
    both int64 ``[n]``, and the table's length.

    Raises:
        UnknownRequestError: ``rid`` holds no pages (from ``page_table``).
    """
    out = []
    for band, layout in enumerate(kv.chain.layout.bands):
        table = np.asarray(kv.page_table(rid, band), dtype=np.int64).reshape(-1)
        live = np.ones(table.shape, dtype=bool)
        if layout.reserved_pages:
            live = table != kv.chain.null_page(band)
        entries = np.flatnonzero(live).astype(np.int64)
        out.append((entries, table[entries], int(table.size)))
    return tuple(out)


def host_slots_needed(kv: PageTables, rid: int) -> dict[str, int]:
    """Host slots per band label that :func:`offload_request` of ``rid`` takes now.

    Raises:
        UnknownRequestError: ``rid`` holds no pages.
    """
    return {band.label: int(entries.size) for band, (entries, _, _) in
            zip(kv.chain.layout.bands, request_pages(kv, rid), strict=True)}


def offload_request(kv: PageTables, device: NumpyBuffer | TorchBuffer, host: HostBuffer,
                    rid: int, *, after: Fence | None = None) -> tuple[RequestHostCopy, Fence]:
    """Copy every page and state slot ``rid`` holds into newly taken host slots of its
    class. The device pages are left as they are (the caller may free or overwrite them
    once the returned fence completes).

    Args:
        kv: the request layer (its ``page_table`` and ``chain``).
        device: the backend holding the chain's bytes.
        host: a host buffer laid out for the same chain (same labels and page bytes).
        rid: the request.
        after: a fence to wait on before the first copy (the last forward's).

    Returns:
        ``(copy, fence)``: the copy's record, and the fence of its last copy.

    Raises:
        UnknownRequestError: ``rid`` holds no pages.
        BufferArgumentError: ``host`` has no class of a band, or its page bytes differ.
        HostPoolFullError: some class has fewer free host slots than the request holds
            pages there (checked for every class first: no slot is taken, nothing copied).
        BufferUnsupportedError: a device backend without bytes.
    """
    if not isinstance(device, NumpyBuffer | TorchBuffer):
        raise BufferUnsupportedError(f"host copies need a NumpyBuffer or TorchBuffer device "
                                     f"backend, got {type(device).__name__}")
    held = request_pages(kv, rid)
    bands = kv.chain.layout.bands
    for layout, (entries, _, _) in zip(bands, held, strict=True):
        region = host.region(layout.label)  # raises for a class the host lacks
        if region.page_bytes != layout.page_bytes:
            raise BufferArgumentError(
                f"the {layout.label} band has pages of {layout.page_bytes:,} B but the host "
                f"buffer's {layout.label} slots hold {region.page_bytes:,} B")
        pool = host.pool(layout.label)
        if entries.size > pool.free_count:
            raise HostPoolFullError(
                f"request {rid} holds {entries.size:,} {layout.label} pages but the host "
                f"pool has {pool.free_count:,} free slots", label=layout.label,
                wanted=int(entries.size), free=pool.free_count)
    if after is not None:
        after.wait()
    copies = []
    fence: Fence = CompletedFence()
    for band, (layout, (entries, vids, width)) in enumerate(zip(bands, held, strict=True)):
        slots = host.alloc(layout.label, int(entries.size))
        if entries.size:
            fence = host.to_host(device, layout, kv.chain.translate(band, vids), slots)
        copies.append(BandCopy(band, layout.label, entries, vids, slots, width))
    return RequestHostCopy(rid, tuple(copies)), fence


def load_back_request(kv: PageTables, device: NumpyBuffer | TorchBuffer, host: HostBuffer,
                      copy: RequestHostCopy, *, after: Fence | None = None) -> Fence:
    """Copy a request's host copy back into the device pages its page tables name now
    (translated at this call: the physical places may differ from the copy's). The host
    slots stay held: free them with :func:`free_host_copy` once the fence completes.

    Args:
        kv: the request layer.
        device: the backend holding the chain's bytes.
        host: the host buffer holding ``copy``.
        copy: what :func:`offload_request` returned.
        after: a fence to wait on before the first copy (the last forward's, or the
            chain's moves').

    Returns:
        The fence of the last copy.

    Raises:
        UnknownRequestError: ``copy.rid`` holds no pages.
        StaleHostCopyError: a page table of the request is longer or shorter than when
            copied, or no longer has the copied virtual ids at the copied entries (it grew
            by a page, released window pages, or was freed and taken again since), or the
            copy has the wrong number of bands (nothing copied). Tokens committed inside
            the last page, or a state slot updated in place, change no page table and are
            not detected: the caller keeps an offloaded request out of every forward until
            it is loaded back (as an engine keeps a swapped-out request off the batch).
        BufferArgumentError: a host slot not held (already freed).
    """
    bands = kv.chain.layout.bands
    if len(copy.bands) != len(bands):
        raise StaleHostCopyError(f"the copy of request {copy.rid} has {len(copy.bands)} bands, "
                                 f"the chain {len(bands)}")
    targets = []
    for band, part in enumerate(copy.bands):
        table = np.asarray(kv.page_table(copy.rid, band), dtype=np.int64).reshape(-1)
        if table.size != part.table_pages or not np.array_equal(table[part.entries],
                                                                part.vids):
            raise StaleHostCopyError(
                f"request {copy.rid}'s {part.label} page table no longer names the pages "
                f"its host copy was taken from")
        host.pool(part.label).check_held(part.slots)
        targets.append(kv.chain.translate(band, part.vids))
    if after is not None:
        after.wait()
    fence: Fence = CompletedFence()
    for part, pages in zip(copy.bands, targets, strict=True):
        if part.slots.size:
            fence = host.to_device(device, bands[part.band], part.slots, pages)
    return fence


def free_host_copy(host: HostBuffer, copy: RequestHostCopy, *,
                   after: Fence | None = None) -> None:
    """Return a copy's host slots to their pools, after waiting on ``after`` (the fence of
    the load-back that read them).

    Raises:
        BufferArgumentError: a slot not held (freed twice); checked for every band before
            any is freed.
    """
    for part in copy.bands:
        host.pool(part.label).check_held(part.slots)
    if after is not None:
        after.wait()
    for part in copy.bands:
        host.free(part.label, part.slots)

