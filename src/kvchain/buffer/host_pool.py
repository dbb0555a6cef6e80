"""The allocator of one cache class's slots in a host buffer: a free list of fixed-size slots.

A host pool holds ``slots`` slots of one page size (the class's device page bytes). Each slot
is in exactly one place: on the free list, or held (allocated to a caller). The free list is a
stack (last freed, first reused) kept as an int64 array; a boolean mask marks the held slots.
Allocation pops ``n`` slots and returns them sorted ascending, so that a copy path can merge
runs of consecutive slots into one transfer; freeing pushes them back. Both are ``O(n)`` numpy
work, independent of the pool's size.

Why a free list and not a chain (the device's layout): every slot of a pool has the same size,
so any free slot serves any request - there is no fragmentation to fight and nothing ever
needs to move. The device chain exists because one buffer is shared by classes of different
page sizes whose demand shifts at run time; a host tier sizes its pools once (per-class
shares, :mod:`kvchain.cache.host_tier`) and is large and cheap, so a fixed split costs little
and buys O(1) allocation with no moves and no fences on the host side.

:meth:`HostPool.audit` rebuilds the invariant from scratch: no slot twice on the free list,
none both free and held, none neither (leaked).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvchain.buffer.base import page_index_array
from kvchain.errors import (
    AuditError,
    BufferArgumentError,
    BufferUnsupportedError,
    HostPoolFullError,
)
from kvchain.field_types import is_whole


class HostPool:
    """Fixed-size slots ``0 .. slots - 1`` of one class, each free or held.

    Args:
        label: the class's band label (for messages).
        slots: number of slots, >= 0.

    Raises:
        BufferArgumentError: a negative or non-integer ``slots``.
        BufferUnsupportedError: the free list (9 B a slot) cannot be allocated.
    """

    __slots__ = ("_free", "_held", "_top", "label", "slots")

    def __init__(self, label: str, slots: int) -> None:
        if not is_whole(slots) or slots < 0:
            raise BufferArgumentError(f"host pool {label!r} needs a whole number of slots >= 0, "
                                      f"got {slots!r}")
        self.label = label
        self.slots = int(slots)
        # The stack's top is at the end: popping from a fresh pool gives 0, 1, 2, ...
        try:
            self._free = np.arange(self.slots - 1, -1, -1, dtype=np.int64)
            self._held = np.zeros(self.slots, dtype=bool)
        except (MemoryError, ValueError) as exc:  # ValueError: past numpy's size limit
            raise BufferUnsupportedError(
                f"host pool {label!r}: cannot allocate the free list of {self.slots:,} slots "
                f"({9 * self.slots:,} B: 8 B a slot id, 1 B its held flag) in this machine's "
                f"memory ({exc})") from None
        self._top = self.slots

    @property
    def free_count(self) -> int:
        """Slots on the free list."""
        return self._top

    @property
    def held_count(self) -> int:
        """Slots held by callers."""
        return self.slots - self._top

    def alloc(self, n: int) -> np.ndarray:
        """Take ``n`` free slots; returns them as a sorted int64 array of ``n`` slot ids.

        Raises:
            BufferArgumentError: ``n`` negative or not an integer.
            HostPoolFullError: fewer than ``n`` slots free (nothing is taken).
        """
        if not is_whole(n) or n < 0:
            raise BufferArgumentError(f"host pool {self.label!r}: slots to allocate must be a "
                                      f"whole number >= 0, got {n!r}")
        n = int(n)
        if n > self._top:
            raise HostPoolFullError(
                f"host pool {self.label!r} has {self._top:,} free slots of {self.slots:,}; "
                f"{n:,} asked for", label=self.label, wanted=n, free=self._top)
        taken = np.sort(self._free[self._top - n:self._top])
        self._top -= n
        self._held[taken] = True
        return taken

    def check_held(self, slots: Any, what: str = "host slot") -> np.ndarray:
        """``slots`` as an int64 array after checking each is a held slot of this pool.

        Raises:
            BufferArgumentError: not a 1-D integer array, a slot outside ``[0, slots)``, or a
                slot that is free (not allocated).
        """
        idx = page_index_array(slots, what)
        if idx.size == 0:
            return idx
        bad = (idx < 0) | (idx >= self.slots)
        if bad.any():
            raise BufferArgumentError(
                f"{what} {int(idx[np.argmax(bad)])} is outside host pool {self.label!r} "
                f"(slots 0 .. {self.slots - 1})")
        free = ~self._held[idx]
        if free.any():
            raise BufferArgumentError(
                f"{what} {int(idx[np.argmax(free)])} of host pool {self.label!r} is not "
                f"allocated")
        return idx

    def free(self, slots: Any) -> None:
        """Return held slots to the free list.

        Raises:
            BufferArgumentError: a slot out of range, not held, or named twice (nothing is
                freed).
        """
        idx = self.check_held(slots)
        if idx.size > 1:
            ordered = np.sort(idx)
            dup = ordered[1:] == ordered[:-1]
            if dup.any():
                raise BufferArgumentError(
                    f"host slot {int(ordered[1:][dup][0])} of pool {self.label!r} is freed "
                    f"twice in one call")
        self._held[idx] = False
        # Pushed largest first, so the next allocation pops the smallest first.
        self._free[self._top:self._top + idx.size] = np.sort(idx)[::-1]
        self._top += idx.size

    def audit(self) -> None:
        """Check from scratch that every slot is in exactly one place: free or held.

        Raises:
            AuditError: a slot twice on the free list, both free and held, or neither.
        """
        free = self._free[:self._top]
        if free.size and (int(free.min()) < 0 or int(free.max()) >= self.slots):
            raise AuditError(f"host pool {self.label!r}: free list holds a slot outside "
                             f"0 .. {self.slots - 1}")
        counts = np.bincount(free, minlength=self.slots) if free.size else \
            np.zeros(self.slots, dtype=np.int64)
        twice = counts > 1
        if twice.any():
            raise AuditError(f"host pool {self.label!r}: slot {int(np.argmax(twice))} is on "
                             f"the free list {int(counts[np.argmax(twice)])} times")
        on_free = counts == 1
        both = on_free & self._held
        if both.any():
            raise AuditError(f"host pool {self.label!r}: slot {int(np.argmax(both))} is both "
                             f"free and held")
        neither = ~on_free & ~self._held
        if neither.any():
            raise AuditError(f"host pool {self.label!r}: slot {int(np.argmax(neither))} is "
                             f"neither free nor held (leaked)")

    def __repr__(self) -> str:
        return f"HostPool({self.label!r}, held={self.held_count:,}/{self.slots:,})"
