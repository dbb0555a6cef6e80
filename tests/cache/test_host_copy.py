"""A request's pages to the host tier and back, byte for byte, on a numpy chain.

The request layer is stood in for by :class:`_Tables` (the two things the host copy reads:
``page_table`` and ``chain``), so these tests hold whatever the request layer becomes; the
real-model proof is ``tests/hf/test_hf_host_offload.py``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.buffer import HostBuffer, NullBuffer, NumpyBuffer
from kvchain.cache.host_copy import (
    RequestHostCopy,
    free_host_copy,
    host_slots_needed,
    load_back_request,
    offload_request,
)
from kvchain.errors import (
    BufferArgumentError,
    BufferUnsupportedError,
    HostPoolFullError,
    StaleHostCopyError,
    UnknownRequestError,
)
from kvchain.layout import plan_layout
from kvchain.model.layers import LayerCache, LifetimeClass, TensorDecl, group_classes

from .host_layout import FP8, FULL, LAYOUT, STATE, WIN  # noqa: F401 (shared)

S, W, F = 0, 1, 2  # band indices
GARBAGE = 0xEE


class _Tables:
    """Page tables by hand: rid -> per band, the virtual ids in token order."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.tables: dict[int, list[list[int]]] = {}

    def page_table(self, rid: int, band: int) -> np.ndarray:
        if rid not in self.tables:
            raise UnknownRequestError(f"request {rid} holds no pages")
        return np.asarray(self.tables[rid][band], dtype=np.int64)


def _pattern(band: int, entry: int) -> int:
    """The byte every page of request 1 is filled with: distinct per (band, entry)."""
    return 16 * band + entry + 1


def _setup() -> tuple[Chain, NumpyBuffer, _Tables]:
    """Request 0 takes (1 slot, 2 window, 3 full) first, then request 1 takes (1, 3, 4); request
    1's first window page is released (its entry becomes the null page): it holds 1 + 2 + 4
    pages. Request 1's pages are filled with :func:`_pattern`."""
    device = NumpyBuffer(LAYOUT.buffer_bytes)
    chain = Chain(LAYOUT, device)
    kv = _Tables(chain)
    for rid, demand in ((0, (1, 2, 3)), (1, (1, 3, 4))):
        grant = chain.take(Demand(demand))
        kv.tables[rid] = [list(v) for v in grant.pages]
    chain.release(W, [kv.tables[1][W][0]])
    kv.tables[1][W][0] = chain.null_page(W)
    for band in (S, W, F):
        vids = np.asarray(kv.tables[1][band])
        for entry, page in enumerate(chain.translate(band, vids)):
            if band == W and entry == 0:
                continue  # the null page stays zeros
            device.write_page(LAYOUT.bands[band], int(page),
                              np.full(LAYOUT.bands[band].page_bytes, _pattern(band, entry),
                                      dtype=np.uint8))
    return chain, device, kv


def _read(chain: Chain, device: NumpyBuffer, kv: _Tables, band: int) -> list[int]:
    """The first byte of each page of request 1 in ``band``, through today's translation."""
    pages = chain.translate(band, kv.page_table(1, band))
    return [int(device.read_page(LAYOUT.bands[band], int(p))[0]) for p in pages]


def _offload_garbage_move(chain: Chain, device: NumpyBuffer, kv: _Tables
                          ) -> tuple[HostBuffer, RequestHostCopy, list[np.ndarray]]:
    host = HostBuffer(LAYOUT, host_slots_needed(kv, 1))
    copy, fence = offload_request(kv, device, host, 1)
    fence.wait()
    for band in (S, W, F):
        for entry, page in enumerate(chain.translate(band, kv.page_table(1, band))):
            if not (band == W and entry == 0):
                device.write_page(LAYOUT.bands[band], int(page),
                                  np.full(LAYOUT.bands[band].page_bytes, GARBAGE,
                                          dtype=np.uint8))
    before = [chain.translate(b, kv.page_table(1, b)) for b in (S, W, F)]
    done = kv.tables.pop(0)
    for band in (S, W, F):  # request 0 finishes: holes nearer each anchor
        chain.release(band, done[band])
    return host, copy, before


def test_round_trip_lands_in_the_moved_pages() -> None:
    chain, device, kv = _setup()
    # Hand count: state 1 slot, window entries 1 and 2 (entry 0 is the null page), full 4.
    assert host_slots_needed(kv, 1) == {"state": 1, "window": 2, "full": 4}
    host, copy, before = _offload_garbage_move(chain, device, kv)
    assert [b.entries.tolist() for b in copy.bands] == [[0], [1, 2], [0, 1, 2, 3]]
    # The host slots hold the patterns: slot i of a class has entry i's bytes.
    assert [int(host.read_slot("window", int(s))[0]) for s in copy.bands[W].slots] == [
        _pattern(W, 1), _pattern(W, 2)]
    # 1 x 48 + 2 x 8 + 4 x 16 = 128 B copied.
    assert copy.nbytes(host) == 128 == host.stats.bytes_to_host
    assert chain.flush_idle() > 0
    after = [chain.translate(b, kv.page_table(1, b)) for b in (S, W, F)]
    assert all(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))
    assert _read(chain, device, kv, F) == [GARBAGE] * 4  # the move carried the garbage
    fence = load_back_request(kv, device, host, copy)
    assert _read(chain, device, kv, S) == [_pattern(S, 0)]
    assert _read(chain, device, kv, W) == [0, _pattern(W, 1), _pattern(W, 2)]  # null: zeros
    assert _read(chain, device, kv, F) == [_pattern(F, e) for e in range(4)]
    assert host.stats.bytes_to_device == 128
    free_host_copy(host, copy, after=fence)
    assert all(host.pool(label).held_count == 0 for label in ("state", "window", "full"))
    host.audit()
    chain.audit()


@pytest.mark.parametrize("skip", [S, W, F])
def test_planted_defect_a_skipped_page_is_read_as_garbage(skip: int) -> None:
    """A load-back that leaves out the last copied page of one band: that page reads the
    garbage, so the byte comparison above fails there."""
    chain, device, kv = _setup()
    host, copy, _ = _offload_garbage_move(chain, device, kv)
    chain.flush_idle()
    part = copy.bands[skip]
    short = replace(copy, bands=tuple(
        replace(b, entries=b.entries[:-1], vids=b.vids[:-1], slots=b.slots[:-1])
        if b is part else b for b in copy.bands))
    load_back_request(kv, device, host, short)
    expect = {S: [_pattern(S, 0)], W: [0, _pattern(W, 1), _pattern(W, 2)],
              F: [_pattern(F, e) for e in range(4)]}
    expect[skip][-1] = GARBAGE
    for band in (S, W, F):
        assert _read(chain, device, kv, band) == expect[band]


def test_refusals_are_typed_and_change_nothing() -> None:
    chain, device, kv = _setup()
    need = host_slots_needed(kv, 1)
    # One full slot short: refused before any slot is taken.
    host = HostBuffer(LAYOUT, dict(need, full=3))
    with pytest.raises(HostPoolFullError) as info:
        offload_request(kv, device, host, 1)
    assert (info.value.label, info.value.wanted, info.value.free) == ("full", 4, 3)
    assert all(host.pool(label).held_count == 0 for label in need)
    # A device backend without bytes.
    host = HostBuffer(LAYOUT, need)
    with pytest.raises(BufferUnsupportedError):
        offload_request(kv, NullBuffer(LAYOUT.buffer_bytes), host, 1)  # type: ignore[arg-type]
    # A host laid out for other page bytes (the same labels): full pages of 32 B.
    wide = LayerCache(0, LifetimeClass.FULL, "gqa",
                      (TensorDecl("k", (4,), FP8), TensorDecl("v", (4,), FP8)))
    other = plan_layout(group_classes((wide, WIN, STATE)), 1_000, page_size=4)
    with pytest.raises(BufferArgumentError):
        offload_request(kv, device, HostBuffer(other, need), 1)
    assert all(host.pool(label).held_count == 0 for label in need)
    with pytest.raises(UnknownRequestError):
        offload_request(kv, device, host, 7)
    assert host.stats.to_host_calls == 0
    # A stale copy: request 1's full table grew a page since the copy.
    copy, _ = offload_request(kv, device, host, 1)
    kv.tables[1][F].append(chain.take(Demand((0, 0, 1))).pages[F][0])
    raw = device.array.copy()
    with pytest.raises(StaleHostCopyError):
        load_back_request(kv, device, host, copy)
    kv.tables[1][F].pop()
    kv.tables[1][W][1] = chain.null_page(W)  # a window page released since
    with pytest.raises(StaleHostCopyError):
        load_back_request(kv, device, host, copy)
    assert np.array_equal(device.array, raw) and host.stats.to_device_calls == 0
    free_host_copy(host, copy)
    with pytest.raises(BufferArgumentError):
        free_host_copy(host, copy)  # twice
