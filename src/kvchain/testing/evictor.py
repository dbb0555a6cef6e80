"""A reference prefix cache for tests: units of held pages, evicted in insertion order.

It knows nothing of content: a unit is any set of virtual pages (per band) that the cache
holds and would free together - a leaf node with its full pages, window pages and state
checkpoint, a window tombstoning, a checkpoint drop. Units are evicted least recently
inserted (or touched) first; locked units are not offered. It implements the chain's
:class:`~kvchain.alloc.evictor.Evictor` protocol, so the planner prices its supply and
``Chain.take`` evicts through it, and it exposes which pages each unit frees so the
exhaustive oracle can evict the same positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.errors import InvalidDemandError, PlanMismatchError


@dataclass(slots=True)
class EvictionUnit:
    """Pages one unit frees, per band (virtual ids), its stable id, and its lock count."""

    uid: int
    pages: tuple[tuple[int, ...], ...]
    locks: int = 0


class ReferenceEvictor:
    """Units of held pages in LRU order (oldest first).

    Args:
        num_bands: bands of the chain it holds pages of.
        defect: a planted defect for sibling tests: ``"short"`` hands back one page fewer
            than the order said (a leak), ``"order"`` publishes the order of the first two
            offered units swapped (a wrong prediction).
    """

    def __init__(self, num_bands: int, *, defect: str | None = None) -> None:
        self.num_bands = num_bands
        self.units: list[EvictionUnit] = []
        self.defect = defect
        self._version = 0
        self._next_uid = 0
        self._order: EvictionOrder | None = None

    @property
    def version(self) -> int:
        """Bumped by every insert, lock, unlock, touch and eviction."""
        return self._version

    def _changed(self) -> None:
        self._version += 1
        self._order = None

    def insert(self, pages: Sequence[Sequence[int]]) -> int:
        """Add a unit (the newest); returns its stable id (0, 1, 2, ... in insert order).

        Raises:
            InvalidDemandError: not one id list per band, or an empty unit.
        """
        if len(pages) != self.num_bands or not any(pages):
            raise InvalidDemandError(f"a unit is one non-empty id list per band, got {pages}")
        uid = self._next_uid
        self._next_uid += 1
        self.units.append(EvictionUnit(uid, tuple(tuple(int(v) for v in p) for p in pages)))
        self._changed()
        return uid

    def _find(self, uid: int) -> int:
        for i, u in enumerate(self.units):
            if u.uid == uid:
                return i
        raise InvalidDemandError(f"no cached unit {uid}")

    def lock(self, uid: int) -> None:
        """A running request uses the unit: it is not evictable until unlocked; a lock is
        a hit, so the unit also becomes the most recently used.

        Raises:
            InvalidDemandError: no such unit (evicted or never inserted).
        """
        unit = self.units.pop(self._find(uid))
        unit.locks += 1
        self.units.append(unit)
        self._changed()

    def unlock(self, uid: int) -> None:
        """Drop one lock of the unit.

        Raises:
            InvalidDemandError: no such unit, or it is not locked.
        """
        unit = self.units[self._find(uid)]
        if unit.locks == 0:
            raise InvalidDemandError(f"unit {uid} is not locked")
        unit.locks -= 1
        self._changed()

    def held(self) -> list[set[int]]:
        """Virtual ids per band held by the cache (locked or not)."""
        out: list[set[int]] = [set() for _ in range(self.num_bands)]
        for u in self.units:
            for i, p in enumerate(u.pages):
                out[i].update(p)
        return out

    def offered(self) -> list[EvictionUnit]:
        """Unlocked units in eviction order."""
        units = [u for u in self.units if u.locks == 0]
        if self.defect == "order" and len(units) >= 2:
            units[0], units[1] = units[1], units[0]
        return units

    def eviction_order(self) -> EvictionOrder:
        """Cumulative pages per band of the offered units (cached per version)."""
        if self._order is None:
            self._order = EvictionOrder.from_units(
                [tuple(len(p) for p in u.pages) for u in self.offered()], self.num_bands)
        return self._order

    def unit_pages(self, k: int) -> tuple[tuple[int, ...], ...]:
        """Virtual ids per band freed by evicting the first ``k`` offered units (truth,
        never affected by the planted defects)."""
        units = [u for u in self.units if u.locks == 0][:k]
        return tuple(tuple(v for u in units for v in u.pages[i]) for i in range(self.num_bands))

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        """Forget the first ``units`` unlocked units; return their pages per band.

        Raises:
            PlanMismatchError: ``units`` outside ``[1, offered]``.
        """
        truth = [u for u in self.units if u.locks == 0]
        if not 1 <= units <= len(truth):
            raise PlanMismatchError(f"evict({units}) with {len(truth)} evictable units")
        gone = truth[:units]
        ids = {id(u) for u in gone}
        self.units = [u for u in self.units if id(u) not in ids]
        self._changed()
        out = [np.asarray([v for u in gone for v in u.pages[i]], dtype=np.int64)
               for i in range(self.num_bands)]
        if self.defect == "short":
            i = next(i for i, a in enumerate(out) if a.size)
            out[i] = out[i][:-1]
        return tuple(out)
