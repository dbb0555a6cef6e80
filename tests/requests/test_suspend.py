"""Retraction by host copy in the request layer: suspend a request to host, resume it by a
load-back demand, byte for byte on a numpy chain (kvchain.requests.suspend).

The chain is the host-tier tests' small one (tests/cache/host_layout.py): ``P = 4``, bands
state (one 48 B slot a request) | window (``W = 8`` tokens, 8 B pages, a null page) | full
(16 B pages) in 1,000 B.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.buffer import HostBuffer, NumpyBuffer, TorchBuffer
from kvchain.buffer.host_pool import HostPool
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import (
    AuditError,
    BufferArgumentError,
    CapacityError,
    HostPoolFullError,
    InvalidDemandError,
    UnknownRequestError,
)
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import HostSide, host_side_for

from ..cache.host_layout import LAYOUT

S, W, F = 0, 1, 2
GARBAGE = 0xEE


Device = NumpyBuffer | TorchBuffer


def _fill(chain: Chain, device: Device, kv: KVManager, rid: int, base: int) -> None:
    """Write byte ``base + 16 x band + entry`` into every live page of ``rid``."""
    for band in (S, W, F):
        table = kv.page_table(rid, band)
        for entry, vid in enumerate(table.tolist()):
            if band == W and vid == chain.null_page(W):
                continue
            page = int(chain.translate(band, np.asarray([vid]))[0])
            device.write_page(LAYOUT.bands[band], page,
                              np.full(LAYOUT.bands[band].page_bytes, base + 16 * band + entry,
                                      dtype=np.uint8))


def _bytes(chain: Chain, device: Device, kv: KVManager, rid: int) -> list[list[int]]:
    """The first byte of each live page of ``rid``, per band (the null page skipped)."""
    out = []
    for band in (S, W, F):
        vids = [v for v in kv.page_table(rid, band).tolist()
                if not (band == W and v == chain.null_page(W))]
        pages = chain.translate(band, np.asarray(vids, dtype=np.int64))
        out.append([int(device.read_page(LAYOUT.bands[band], int(p))[0]) for p in pages])
    return out


HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_CUDA = HAS_TORCH and __import__("torch").cuda.is_available()


def _device(backend: str) -> NumpyBuffer | TorchBuffer:
    if backend == "numpy":
        return NumpyBuffer(LAYOUT.buffer_bytes)
    return TorchBuffer(LAYOUT.buffer_bytes, backend.removeprefix("torch-"))


def _setup(backend: str = "numpy") -> tuple[Chain, NumpyBuffer | TorchBuffer, KVManager]:
    """Request 1 prefills 20 tokens in one chunk and commits them.

    Hand count: full ``ceil(20 / 4) = 5`` pages; the window after the commit keeps the pages
    of tokens from ``20 - 8 + 1 = 13`` on, i.e. from page ``13 // 4 = 3``: entries 3 and 4
    (pages 0..2 released, their entries are the null page); state 1 slot.
    """
    device = _device(backend)
    chain = Chain(LAYOUT, device)
    kv = KVManager(chain)
    kv.allocate([(1, 20)])
    kv.commit(1, 20)
    assert kv.reads.held_per_band([1]) == (1, 2, 5)
    _fill(chain, device, kv, 1, 1)
    return chain, device, kv


EXPECT = [[1], [1 + 16 + 3, 1 + 16 + 4], [1 + 32 + e for e in range(5)]]


def test_host_side_for_splits_by_resume_interval() -> None:
    # host_tier's example: an interval of K = 16 tokens needs 1 state + 2 window + 4 full
    # slots (128 B); 10,000 B hold 76 intervals: 76 / 152 / 304 slots.
    host = host_side_for(LAYOUT, 10_000, 16)
    assert host.slots == {"state": 76, "window": 152, "full": 304}
    assert host.page_bytes == {"state": 48, "window": 8, "full": 16}
    assert host.held_bytes() == 0


@pytest.mark.parametrize("backend", [
    "numpy",
    pytest.param("torch-cpu", marks=pytest.mark.skipif(not HAS_TORCH, reason="no torch")),
    pytest.param("torch-cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")),
])
def test_suspend_and_resume_round_trip_bytes_and_price(backend: str) -> None:
    chain, device, kv = _setup(backend)
    host = HostSide.of_buffer(HostBuffer(LAYOUT, {"state": 2, "window": 4, "full": 8},
                                         backend="numpy" if backend == "numpy" else "torch"),
                              device)
    sus = kv.suspend(1, host)
    # Exactly the pages it held: 1 slot, the window's live tail (entries 3, 4), 5 full pages;
    # 48 + 2 x 8 + 5 x 16 = 144 B.
    assert sus.demand == Demand((1, 2, 5)) == kv.resume_demand(1)
    assert sus.nbytes == 144 and host.held_bytes() == 144
    assert host.held == {"state": 1, "window": 2, "full": 5}
    assert 1 not in kv and kv.suspensions.is_suspended(1) and kv.suspensions.ids == (1,)
    # On the device only the null page is bound: everything went to host.
    assert [chain.bound_pages(b) for b in (S, W, F)] == [0, 1, 0]
    kv.audit()
    kv.audit_host(host)
    # Request 2 takes the freed pages and writes garbage into them.
    kv.allocate([(2, 20)])
    _fill(chain, device, kv, 2, GARBAGE - 40)
    kv.free(2)
    quote = chain.price(kv.resume_demand(1))
    assert quote.fits
    taken = kv.suspensions.resume(1, quote)
    assert taken == Demand((1, 2, 5))
    assert chain.snapshot() == quote.after  # price == outcome
    assert kv.reads.held_per_band([1]) == (1, 2, 5) and kv.tokens(1) == 20
    assert _bytes(chain, device, kv, 1) == EXPECT
    assert host.held_bytes() == 0 and not kv.suspensions.is_suspended(1)
    kv.audit()
    kv.audit_host(host)
    # It goes on as if never suspended: 1 more token, then finishes.
    kv.allocate([(1, 1)])
    kv.commit(1, 1)
    # 21 tokens: 6 full pages; the window keeps tokens from 21 - 8 + 1 = 14 on, pages
    # 14 // 4 = 3 to 5 (page 5 taken for token 20): 3 pages; 1 slot.
    assert kv.free(1) == 1 + 3 + 6


def test_accounting_only_host_side() -> None:
    """Without a host buffer (the simulator's chain has no bytes) the slots are accounted:
    the same demand, the same pools."""
    chain = Chain(LAYOUT)
    kv = KVManager(chain)
    kv.allocate([(1, 20)])
    kv.commit(1, 20)
    host = host_side_for(LAYOUT, 10_000, 16)
    sus = kv.suspend(1, host)
    assert sus.copy is None and host.held == {"state": 1, "window": 2, "full": 5}
    kv.audit_host(host)
    kv.suspensions.resume(1)
    assert host.held == {"state": 0, "window": 0, "full": 0}
    kv.audit_host(host)


def test_refusals_are_typed_and_change_nothing() -> None:
    chain, device, kv = _setup()
    snap = chain.snapshot()
    # One full slot short: refused before anything is taken or released.
    small = HostSide.of_buffer(HostBuffer(LAYOUT, {"state": 1, "window": 2, "full": 4}), device)
    with pytest.raises(HostPoolFullError) as info:
        kv.suspend(1, small)
    assert (info.value.label, info.value.wanted, info.value.free) == ("full", 5, 4)
    assert small.held_bytes() == 0 and chain.snapshot() == snap and 1 in kv
    # Pools of other page bytes.
    wrong = HostSide({"state": HostPool("state", 4), "window": HostPool("window", 4),
                      "full": HostPool("full", 8)}, {"state": 48, "window": 8, "full": 32})
    with pytest.raises(BufferArgumentError):
        kv.suspend(1, wrong)
    assert chain.snapshot() == snap and 1 in kv
    with pytest.raises(UnknownRequestError):
        kv.suspend(9, small)
    host = HostSide.of_buffer(HostBuffer(LAYOUT, {"state": 4, "window": 8, "full": 16}), device)
    kv.suspend(1, host)
    # A resume that does not fit: request 2 takes the largest chunk the chain fits.
    c = max(c for c in range(4, 400, 4) if chain.price(kv.demand(2, c)).fits)
    kv.allocate([(2, c)])
    snap = chain.snapshot()
    assert not chain.price(kv.resume_demand(1)).fits
    with pytest.raises(CapacityError):
        kv.suspensions.resume(1)
    assert chain.snapshot() == snap and kv.suspensions.is_suspended(1)
    assert host.held == {"state": 1, "window": 2, "full": 5}
    # A suspended request computes nothing, is not resumed twice, and cannot be attached.
    with pytest.raises(InvalidDemandError):
        kv.allocate([(1, 1)])
    with pytest.raises(InvalidDemandError):
        kv.allocate([], resumes=[1, 1])
    with pytest.raises(InvalidDemandError):
        kv.allocate([], resumes=[5])
    assert chain.snapshot() == snap
    kv.audit_host(host)


def test_planted_defects_make_the_audit_fail() -> None:
    """The audit's two "must be 0" figures, each made non-zero by a planted defect: a
    suspension that leaks a host slot (one more slot taken than recorded) and a record that
    lost a page (one slot less than its demand)."""
    _, _, kv = _setup()
    host = host_side_for(LAYOUT, 10_000, 16)
    kv.suspend(1, host)
    kv.audit_host(host)
    host.pool("full").alloc(1)  # leaked: held by no suspended request
    with pytest.raises(AuditError, match="1 leaked"):
        kv.audit_host(host)
    chain2 = Chain(LAYOUT)
    kv2 = KVManager(chain2)
    kv2.allocate([(1, 20)])
    kv2.commit(1, 20)
    host2 = host_side_for(LAYOUT, 10_000, 16)
    sus = kv2.suspend(1, host2)
    host2.pool("full").free(sus.slots[F][-1:])
    sus.slots = (*sus.slots[:F], sus.slots[F][:-1])  # lost its last full page
    with pytest.raises(AuditError, match="host slots for a load-back"):
        kv2.audit_host(host2)


def test_a_request_with_a_prefix_cache_hit_comes_back_with_private_pages() -> None:
    """Request 1's 20-token prompt (5 page keys) is inserted at its prefill end; request 2
    (24 tokens: 6 page keys) shares its first 4 keys and hits 16 tokens (the last resume
    point on the 8-token interval at or below 4 pages), prefills 8 more and commits: its
    whole prompt is inserted, so it reads 6 shared full pages. Suspended, it copies all it
    reads (1 slot, 2 window, 6 full pages) and unlocks the cache; resumed, it holds them as
    its own (shared 0), the cache keeps its copies, and its bytes are back."""
    device = NumpyBuffer(LAYOUT.buffer_bytes)
    chain = Chain(LAYOUT, device)
    cache = PrefixCache(CacheGeometry.of(LAYOUT), interval_tokens=8)
    kv = KVManager(chain, cache)
    keys = (11, 12, 13, 14, 15)
    kv.attach(1, keys, 20)
    kv.allocate([(1, 20)])
    kv.commit(1, 20)
    kv.free(1)
    assert kv.attach(2, (*keys[:4], 99, 100), 24) == 16  # 24 // 4 = 6 page keys
    kv.allocate([(2, 8)])
    kv.commit(2, 8)
    assert kv.reads.held_per_band([2]) == (1, 2, 6) and kv.pages(2).shared == 6
    _fill(chain, device, kv, 2, 1)
    data = _bytes(chain, device, kv, 2)
    cached = cache.held_counts
    host = HostSide.of_buffer(HostBuffer(LAYOUT, {"state": 2, "window": 8, "full": 16}), device)
    assert kv.suspend(2, host).demand == Demand((1, 2, 6))
    kv.audit()  # the cache's pages unlocked, the request's own released
    kv.audit_host(host)
    kv.suspensions.resume(2)
    assert kv.reads.held_per_band([2]) == (1, 2, 6) and kv.pages(2).shared == 0
    assert _bytes(chain, device, kv, 2) == data
    assert cache.held_counts == cached
    kv.audit()
    kv.allocate([(2, 1)])
    kv.commit(2, 1)
    kv.free(2)  # its own pages only: the cache's copies stay
    kv.audit()
    assert cache.held_counts == cached


def test_shared_by_others_counts_the_pages_another_request_locks() -> None:
    """Request 2 (keys 11..14, 99, 100) inserts its 6-page prompt after a 4-page hit on
    request 1's; request 3 (11..14, 98, 100) hits the same 4 pages (16 tokens, a resume
    point) and locks them: request 2's path splits at page 4, the node of pages [0, 4)
    carries 2's two locks (hit, prompt) and 3's, the node of pages [4, 6) only 2's: 4 pages
    shared by others."""
    chain = Chain(LAYOUT)
    cache = PrefixCache(CacheGeometry.of(LAYOUT), interval_tokens=8)
    kv = KVManager(chain, cache)
    keys = (11, 12, 13, 14, 15)
    kv.attach(1, keys, 20)
    kv.allocate([(1, 20)])
    kv.commit(1, 20)
    kv.free(1)
    kv.attach(2, (*keys[:4], 99, 100), 24)  # 24 // 4 = 6 page keys
    kv.allocate([(2, 8)])
    kv.commit(2, 8)
    assert kv.shared_by_others(2) == 0  # alone: its locks only
    assert kv.attach(3, (*keys[:4], 98, 100), 24) == 16
    assert kv.shared_by_others(2) == 4
    assert kv.shared_by_others(9) == 0  # holds nothing
    kv.detach(3)
    assert kv.shared_by_others(2) == 0
