"""HostPool: random alloc / free / copy sequences keep every host slot in exactly one place
(free or held) and every held slot's bytes as last written; planted-defect pools make the
audit fail."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.buffer import HostBuffer, HostPool, NumpyBuffer
from kvchain.errors import AuditError, BufferUnsupportedError, HostPoolFullError

from .conftest import HAS_TORCH, NO_TORCH_REASON
from .host_fixtures import DEVICE_BYTES, FULL_BAND, LAYOUT, STATE_BAND, WIN_BAND, fill

BANDS = {"full": FULL_BAND, "window": WIN_BAND, "state": STATE_BAND}
SLOTS = {"full": 6, "window": 5, "state": 4}
# Grid pages per band in the 1,000 B device buffer: full (1,000 - 8) // 16 = 62,
# window 1,000 // 8 = 125, state 1,000 // 48 = 20; the ops use pages 0 .. 11.
DEVICE_PAGES = 12

op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(sorted(SLOTS)), st.integers(0, 7)),
    st.tuples(st.just("free"), st.sampled_from(sorted(SLOTS)), st.integers(0, 2**16)),
    st.tuples(st.just("save"), st.sampled_from(sorted(SLOTS)), st.integers(0, 2**16)),
    st.tuples(st.just("load"), st.sampled_from(sorted(SLOTS)), st.integers(0, 2**16)),
)


class Driver:
    """Runs ops on a HostBuffer beside a model: the held slots per class and the bytes each
    held slot must hold."""

    def __init__(self, pool_type: type[HostPool] = HostPool, backend: str = "numpy") -> None:
        self.device = NumpyBuffer(DEVICE_BYTES)
        for i, band in enumerate(BANDS.values()):
            fill(self.device, band, DEVICE_PAGES, seed=i)
        self.host = HostBuffer(LAYOUT, SLOTS, backend=backend)
        if pool_type is not HostPool:  # the planted defect replaces the pools' class
            for pool in self.host._pools.values():
                pool.__class__ = pool_type
        self.held: dict[str, set[int]] = {k: set() for k in SLOTS}
        self.bytes: dict[tuple[str, int], bytes] = {}

    def run(self, o: tuple) -> None:
        kind, label, n = o
        band, held = BANDS[label], self.held[label]
        rng = np.random.default_rng(n)
        if kind == "alloc":
            if n > SLOTS[label] - len(held):
                with pytest.raises(HostPoolFullError):
                    self.host.alloc(label, n)
                return
            got = self.host.alloc(label, n)
            assert not held & set(got.tolist())
            held |= set(got.tolist())
        elif kind == "free" and held:
            chosen = rng.choice(sorted(held), size=rng.integers(1, len(held) + 1),
                                replace=False)
            self.host.free(label, chosen)
            held -= set(chosen.tolist())
            for s in chosen:
                self.bytes.pop((label, int(s)), None)
        elif kind == "save" and held:
            slots = rng.choice(sorted(held), size=rng.integers(1, len(held) + 1),
                               replace=False)
            pages = rng.integers(0, DEVICE_PAGES, slots.size)  # a page may repeat
            self.host.to_host(self.device, band, pages, slots)
            for s, p in zip(slots, pages, strict=True):
                self.bytes[(label, int(s))] = self.device.read_page(band, int(p)).tobytes()
        elif kind == "load" and held:
            slots = rng.choice(sorted(held), size=rng.integers(1, len(held) + 1))
            pages = rng.choice(DEVICE_PAGES, size=slots.size, replace=False)
            self.host.to_device(self.device, band, slots, pages)
            for s, p in zip(slots, pages, strict=True):
                got = self.device.read_page(band, int(p)).tobytes()
                if (label, int(s)) in self.bytes:
                    assert got == self.bytes[(label, int(s))]

    def check(self) -> None:
        self.host.audit()
        for label, held in self.held.items():
            pool = self.host.pool(label)
            assert set(np.flatnonzero(pool._held).tolist()) == held
            assert pool.free_count == SLOTS[label] - len(held)
        for (label, s), data in self.bytes.items():
            assert self.host.read_slot(label, s).tobytes() == data


@pytest.mark.parametrize("backend", [
    "numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH,
                                                              reason=NO_TORCH_REASON))])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(op, max_size=30))
def test_random_sequences_keep_every_slot_in_one_place(backend, ops):
    d = Driver(backend=backend)
    for o in ops:
        d.run(o)
        d.check()


class ForgetsHeld(HostPool):
    """Planted defect: freeing pushes slots on the free list but leaves them marked held."""

    __slots__ = ()

    def free(self, slots):
        idx = self.check_held(slots)
        self._free[self._top:self._top + idx.size] = np.sort(idx)[::-1]
        self._top += idx.size


class DropsFree(HostPool):
    """Planted defect: freeing clears the held mark but never pushes the slots (a leak)."""

    __slots__ = ()

    def free(self, slots):
        self._held[self.check_held(slots)] = False


@pytest.mark.parametrize(("defect", "words"), [(ForgetsHeld, "both free and held"),
                                               (DropsFree, "neither free nor held")])
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_planted_defects_fail_the_audit(defect, words, n, seed):
    d = Driver(defect)
    d.run(("alloc", "full", n))
    d.check()  # the defect only shows once a slot is freed
    d.run(("free", "full", seed))
    with pytest.raises(AuditError, match=words):
        d.host.audit()


def test_pool_by_hand():
    pool = HostPool("full", 4)
    assert pool.alloc(2).tolist() == [0, 1]  # a fresh pool hands out 0, 1, ...
    assert pool.alloc(1).tolist() == [2]
    pool.free([1, 0])
    assert (pool.free_count, pool.held_count) == (3, 1)
    assert pool.alloc(3).tolist() == [0, 1, 3]  # the freed slots come back smallest first
    pool.audit()
    pool._free[0] = pool._free[1]  # planted: a duplicate on the free list
    pool._top = 2
    with pytest.raises(AuditError):
        pool.audit()


def test_a_pool_past_numpy_size_limit_is_a_typed_error():
    # Regression: numpy's "array is too big" ValueError escaped for 2**60 slots (its free
    # list would be 2**63 B, past numpy's largest array).
    with pytest.raises(BufferUnsupportedError, match="cannot allocate the free list of "
                                                     "1,152,921,504,606,846,976 slots"):
        HostPool("full", 2**60)
