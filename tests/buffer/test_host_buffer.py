"""HostBuffer: per-class regions, byte-exact copies device <-> host, typed refusals that
change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.buffer import (
    CompletedFence,
    HostBuffer,
    HostRegion,
    ManualFence,
    NullBuffer,
    NumpyBuffer,
    TorchBuffer,
    copy_runs,
    host_regions,
)
from kvchain.errors import BufferArgumentError, BufferUnsupportedError, HostPoolFullError
from kvchain.layout import plan_layout
from kvchain.model.layers import group_classes

from .conftest import HAS_CUDA, HAS_TORCH, NO_TORCH_REASON, buffer_bytes
from .host_fixtures import DEVICE_BYTES, FULL, FULL_BAND, LAYOUT, SLOTS, STATE_BAND, WIN_BAND, fill

DEVICES = [
    pytest.param(lambda: NumpyBuffer(DEVICE_BYTES), id="dev-numpy"),
    pytest.param(lambda: TorchBuffer(DEVICE_BYTES, "cpu"), id="dev-torch-cpu",
                 marks=pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH_REASON)),
    pytest.param(lambda: TorchBuffer(DEVICE_BYTES, "cuda"), id="dev-torch-cuda",
                 marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")),
]
HOSTS = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH,
                                                                   reason=NO_TORCH_REASON))]


def test_regions_by_hand():
    # state 3 x 48 = 144 B at 0; window base ceil(144 / 256) x 256 = 256, 5 x 8 = 40 B;
    # full base ceil(296 / 256) x 256 = 512, 4 x 16 = 64 B: the store is 576 B.
    regions = host_regions(LAYOUT, SLOTS)
    assert regions == (HostRegion("state", 48, 0, 3), HostRegion("window", 8, 256, 5),
                       HostRegion("full", 16, 512, 4))
    assert HostBuffer(LAYOUT, SLOTS).nbytes == 576
    # A class left out gets no slots (and no bytes): full base = ceil(144 / 256) x 256.
    assert host_regions(LAYOUT, {"state": 3, "full": 1})[2] == HostRegion("full", 16, 256, 1)


@pytest.mark.parametrize("host_backend", HOSTS)
@pytest.mark.parametrize("make_device", DEVICES)
def test_round_trip_is_byte_exact_for_every_class(make_device, host_backend):
    device = make_device()
    host = HostBuffer(LAYOUT, SLOTS, backend=host_backend)
    for band, pages, seed in ((FULL_BAND, 6, 1), (WIN_BAND, 9, 2), (STATE_BAND, 4, 3)):
        fill(device, band, pages, seed)
        src = np.array([5, 2, 3][:min(3, SLOTS[band.label])], dtype=np.int64)
        want = [device.read_page(band, int(j)).copy() for j in src]
        slots = host.alloc(band.label, src.size)
        fence = host.to_host(device, band, src, slots)
        fence.wait()
        for j, slot in enumerate(slots):
            np.testing.assert_array_equal(host.read_slot(band.label, int(slot)), want[j])
        device.zero_pages(band, src)
        back = np.array([0, 1, 4][:src.size], dtype=np.int64)  # other pages than the sources
        host.to_device(device, band, slots, back).wait()
        for j, page in enumerate(back):
            np.testing.assert_array_equal(device.read_page(band, int(page)), want[j])
    host.audit()
    stats = host.stats
    # 3 classes x (3 full + 3 window + 3 state pages): 9 pages each way,
    # bytes 3 x 16 + 3 x 8 + 3 x 48 = 216.
    assert (stats.to_host_calls, stats.pages_to_host, stats.bytes_to_host) == (3, 9, 216)
    assert (stats.to_device_calls, stats.pages_to_device, stats.bytes_to_device) == (3, 9, 216)


def test_after_fence_is_waited_before_the_copy():
    device, host = NumpyBuffer(DEVICE_BYTES), HostBuffer(LAYOUT, SLOTS)
    fence = ManualFence()
    slots = host.alloc("full", 1)
    assert isinstance(host.to_host(device, FULL_BAND, [0], slots, after=fence), CompletedFence)
    assert fence.waits == 1 and fence.query()


def _state(device, host):
    return (buffer_bytes(device), host.array.copy(),
            {r.label: (host.pool(r.label).free_count, host.pool(r.label)._held.copy())
             for r in host.regions}, host.stats)


def _same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        assert a[2][k][0] == b[2][k][0]
        np.testing.assert_array_equal(a[2][k][1], b[2][k][1])
    assert a[3] == b[3]


@pytest.mark.parametrize("make_device", DEVICES[:2])
def test_refusals_are_typed_and_change_nothing(make_device):
    device = make_device()
    host = HostBuffer(LAYOUT, SLOTS)
    fill(device, FULL_BAND, 6, 4)
    held = host.alloc("full", 2)  # slots 0 and 1
    host.to_host(device, FULL_BAND, [0, 1], held)
    before = _state(device, host)
    # grid of the full band: (1,000 - 8) // 16 = 62 pages, so page 62 is outside.
    other = plan_layout((FULL_BAND.cache_class.labelled("local"),), 64, page_size=4).bands[0]
    wider = plan_layout(group_classes((FULL,)), 1_000, page_size=8).bands[0]
    cases = [
        (BufferArgumentError, "no cache class", lambda: host.to_host(device, other, [0], [0])),
        (BufferArgumentError, "pages of 32 B", lambda: host.to_host(device, wider, [0], [0])),
        (BufferArgumentError, "outside the full band", lambda: host.to_host(
            device, FULL_BAND, [62, 0], held)),
        (BufferArgumentError, "not allocated", lambda: host.to_host(device, FULL_BAND, [0],
                                                                    [2])),
        (BufferArgumentError, "outside host pool", lambda: host.to_device(
            device, FULL_BAND, [4], [0])),
        (BufferArgumentError, "as many device pages", lambda: host.to_host(
            device, FULL_BAND, [0], held)),
        (BufferArgumentError, "host slot 0 appears twice", lambda: host.to_host(
            device, FULL_BAND, [1, 2], [0, 0])),
        (BufferArgumentError, "device page 3 appears twice", lambda: host.to_device(
            device, FULL_BAND, held, [3, 3])),
        (HostPoolFullError, "2 free slots of 4", lambda: host.alloc("full", 3)),
        (BufferArgumentError, "no cache class 'nope'", lambda: host.alloc("nope", 1)),
        (BufferArgumentError, "whole number", lambda: host.alloc("full", -1)),
        (BufferArgumentError, "not allocated", lambda: host.free("full", [1, 2])),
        (BufferArgumentError, "freed twice", lambda: host.free("full", [1, 1])),
        (BufferArgumentError, "has 3 B", lambda: host.write_slot("full", 0, b"abc")),
        (BufferUnsupportedError, "NullBuffer", lambda: host.to_host(
            NullBuffer(DEVICE_BYTES), FULL_BAND, [0], [0])),
        # Regression: an after that is no fence raised AttributeError ('str' has no wait).
        (BufferArgumentError, "after must be a fence", lambda: host.to_host(
            device, FULL_BAND, [0], [0], after="done")),  # type: ignore[arg-type]
        (BufferArgumentError, "got int", lambda: host.to_device(
            device, FULL_BAND, [0], [5], after=1)),  # type: ignore[arg-type]
    ]
    for error, words, call in cases:
        with pytest.raises(error, match=words):
            call()
        _same(before, _state(device, host))
    with pytest.raises(HostPoolFullError) as info:
        host.alloc("full", 3)
    assert (info.value.label, info.value.wanted, info.value.free) == ("full", 3, 2)


def test_auto_backend_is_torch_when_installed():
    assert HostBuffer(LAYOUT, SLOTS, backend="auto").backend == ("torch" if HAS_TORCH
                                                                 else "numpy")
    assert "numpy" in HostBuffer(LAYOUT, SLOTS).pin_note


def test_constructor_refusals():
    with pytest.raises(BufferArgumentError, match="no cache class 'local'"):
        HostBuffer(LAYOUT, {"local": 1})
    with pytest.raises(BufferArgumentError, match="whole number"):
        HostBuffer(LAYOUT, {"full": -2})
    with pytest.raises(BufferArgumentError, match="numpy, torch or auto"):
        HostBuffer(LAYOUT, SLOTS, backend="cupy")
    with pytest.raises(BufferArgumentError, match="needs backend='torch'"):
        HostBuffer(LAYOUT, SLOTS, pin=True)


@pytest.mark.skipif(not HAS_TORCH or HAS_CUDA, reason="a CPU-only torch")
def test_cpu_only_torch_falls_back_to_plain_memory_and_says_so():
    host = HostBuffer(LAYOUT, SLOTS, backend="torch")
    assert host.pinned is False
    assert "pinning needs CUDA" in host.pin_note
    assert host.tensor.is_pinned() is False
    with pytest.raises(BufferUnsupportedError, match="pinning is a CUDA driver call"):
        HostBuffer(LAYOUT, SLOTS, backend="torch", pin=True)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_cuda_host_memory_is_pinned_and_copies_are_fenced():  # pragma: no cover - GPU only
    device = TorchBuffer(DEVICE_BYTES, "cuda")
    host = HostBuffer(LAYOUT, SLOTS, backend="torch")
    assert host.pinned and host.tensor.is_pinned()
    fill(device, FULL_BAND, 4, 9)
    want = [device.read_page(FULL_BAND, j) for j in (0, 1, 2, 3)]
    slots = host.alloc("full", 4)
    fence = host.to_host(device, FULL_BAND, [0, 1, 2, 3], slots)
    fence.wait()
    assert fence.query()
    for j, slot in enumerate(slots):
        np.testing.assert_array_equal(host.read_slot("full", int(slot)), want[j])


def test_copy_runs_by_hand():
    # Sorted by slot: (7, 0), (8, 1), (9, 2), (3, 5): one run of 3, one of 1.
    runs = copy_runs(np.array([7, 8, 3, 9]), np.array([0, 1, 5, 2]))
    assert runs == [(7, 0, 3), (3, 5, 1)]
    assert copy_runs(np.zeros(0, np.int64), np.zeros(0, np.int64)) == []


def test_slots_not_a_mapping_is_refused():
    # Regression: None raised a bare TypeError, and a list of pairs was read as labels
    # ("no cache class ('full', 3)").
    for slots in (None, [("full", 3)], 3):
        with pytest.raises(BufferArgumentError, match="mapping of band label"):
            HostBuffer(LAYOUT, slots)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", HOSTS)
def test_host_memory_that_cannot_be_allocated_is_a_typed_error(backend):
    # Regression: numpy's MemoryError escaped. 10**15 full slots need 9 x 10**15 B of free
    # list (8 B a slot id + 1 B a flag) and 16 x 10**15 B of store: more than any
    # machine's address space; the pool is built first and says so.
    with pytest.raises(BufferUnsupportedError, match="host pool 'full': cannot allocate the "
                                                     "free list of 1,000,000,000,000,000 "
                                                     "slots"):
        HostBuffer(LAYOUT, {"full": 10**15}, backend=backend)


def test_a_page_outside_the_grid_is_named_once():
    # Regression: the message said "device page page 62".
    device = NumpyBuffer(DEVICE_BYTES)
    host = HostBuffer(LAYOUT, SLOTS)
    held = host.alloc("full", 1)
    with pytest.raises(BufferArgumentError) as info:
        host.to_host(device, FULL_BAND, [62], held)
    assert str(info.value).startswith("device page 62 is outside the full band's grid of 62")
