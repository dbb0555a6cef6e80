"""The interface between the chain and a prefix cache that lives above it.

The chain knows nothing of requests or content: a prefix cache (``kvchain.cache``) holds
virtual pages of the chain like a request does, and offers the ones no running request
uses as *evictable supply*. The chain asks it two things, through this protocol:

* :meth:`Evictor.eviction_order` - what eviction could free, unit by unit, in the exact
  order the cache would evict (:class:`~kvchain.alloc.snapshot.EvictionOrder`); the chain
  puts it in its snapshot, so the planner prices "fits after evicting these" exactly;
* :meth:`Evictor.evict` - evict the first ``units`` units now and hand back the virtual
  pages the cache gave up, per band; the chain releases them (they become holes) inside
  the ``Evict`` step of a plan, and checks the snapshot it predicted.

:class:`EvictorHost` is that side of an allocator written once: the chain
(:class:`~kvchain.alloc.chain.Chain`) and the baselines' pools
(:class:`~kvchain.baselines.pools.PoolAllocator`) both attach, read and check their
evictor through it. :func:`page_ids` is the one check of ids handed to an allocator (by a
``release`` or back by an evictor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.errors import InvalidDemandError, PlanMismatchError, UnknownPageError


def page_ids(band: int, vids: object) -> np.ndarray:
    """The virtual page ids of one band handed to a ``release`` (or back by an evictor), as
    a flat int64 array: the one check of their shape and type every allocator runs before
    it changes anything.

    Args:
        band: the band the ids belong to (named in the message only).
        vids: a flat sequence of integer ids (a list or tuple of Python or NumPy ints, or
            a 1-D integer array); empty is fine.

    Returns:
        The ids, int64, shape ``(n,)`` (a view of ``vids`` when it already is one).

    Raises:
        UnknownPageError: ``vids`` is not one-dimensional (a scalar, a nested or 2-D
            sequence such as every band's ``Grant.pages`` at once, whose ids would be read
            as this band's) or ragged, or its ids are not integers (floats, bools,
            strings, ``None``).
    """
    try:
        v = np.asarray(vids)
    except (ValueError, TypeError):  # ragged nesting, e.g. ((), (0, 1))
        raise UnknownPageError(f"band {band}: virtual ids must be a flat sequence of ints, "
                               f"got a ragged {type(vids).__name__}") from None
    if v.ndim != 1:
        raise UnknownPageError(f"band {band}: virtual ids must be a flat sequence of ints "
                               f"(one band's ids per call), got shape {v.shape}")
    if v.size == 0:
        return np.empty(0, dtype=np.int64)
    if v.dtype.kind not in "iu":
        raise UnknownPageError(f"band {band}: virtual ids must be integers, got dtype {v.dtype}")
    return v.astype(np.int64, copy=False)


@runtime_checkable
class Evictor(Protocol):
    """A holder of chain pages whose unlocked pages may be evicted on demand.

    Contract (checked by the chain on every ``Evict`` step):

    * ``version`` changes whenever the eviction order may have changed (an insert, a
      lock or unlock, an eviction, an LRU touch);
    * ``eviction_order()`` is a pure read of the cache's state (same version, same order);
    * ``evict(k)`` frees exactly the first ``k`` units of that order, returns their
      virtual page ids per band (``freed(k)[i]`` ids for band ``i``; ids it holds, bound,
      never a null page), forgets them, and leaves as its new order exactly
      ``order.after(k)``.
    """

    @property
    def version(self) -> int:
        """A counter bumped by every change that may change the eviction order."""
        ...

    def eviction_order(self) -> EvictionOrder:
        """The evictable supply, in eviction order (cumulative pages per band)."""
        ...

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        """Evict the first ``units`` units; return the freed virtual ids per band (int64).

        Raises:
            PlanMismatchError: ``units`` outside ``[1, eviction_order().units]``.
        """
        ...


class EvictorHost:
    """The evictor side of an allocator: attach one, read its checked order, check what
    an ``Evict`` step hands back. The host class provides ``num_bands`` (the width every
    order and every eviction must have), ``_new_epoch()`` (drop its cached snapshot and
    quotes), ``_holds(band, ids)`` (whether ``ids`` are distinct held pages of ``band``,
    none a null page) and ``_holder`` (its name in messages: ``"chain"``, ``"allocator"``).
    """

    _holder: ClassVar[str] = "allocator"
    _evictor: Evictor | None
    _evictor_version: int  # the evictor version the cached snapshot saw; -1 none

    @property
    def num_bands(self) -> int:
        """Bands of the allocator."""
        raise NotImplementedError

    def _new_epoch(self) -> None:
        raise NotImplementedError

    def _holds(self, band: int, ids: np.ndarray) -> bool:
        raise NotImplementedError

    @property
    def evictor(self) -> Evictor | None:
        """The prefix cache whose unlocked pages the planner may evict, or ``None``."""
        return self._evictor

    def set_evictor(self, evictor: Evictor | None) -> None:
        """Attach (or detach, with ``None``) the prefix cache that offers evictable supply.

        From then on every snapshot carries ``evictor.eviction_order()`` and every plan
        may start with an ``Evict`` step (the planner evicts only when a demand does not
        fit otherwise). One epoch bump (issued quotes are void).

        Raises:
            InvalidDemandError: ``evictor`` does not implement :class:`Evictor`.
        """
        if evictor is not None and not isinstance(evictor, Evictor):
            raise InvalidDemandError(f"expected an Evictor, got {type(evictor).__name__}")
        self._evictor = evictor
        self._evictor_version = -1
        self._new_epoch()

    def _checked_order(self) -> EvictionOrder:
        """The evictor's current order, checked to be an :class:`EvictionOrder` as wide as
        the allocator (the canonical empty order ``((),)`` fits any width).

        Raises:
            PlanMismatchError: the evictor broke its contract (not an order, or another
                number of bands).
        """
        assert self._evictor is not None
        order = self._evictor.eviction_order()
        if not isinstance(order, EvictionOrder):
            raise PlanMismatchError(f"the evictor's eviction_order() returned "
                                    f"{type(order).__name__}, not an EvictionOrder")
        if order.units and order.width != self.num_bands:
            raise PlanMismatchError(f"the evictor's order has {order.width} bands, the "
                                    f"{self._holder} {self.num_bands}")
        return order

    def _evicted_ids(self, what: str, units: int,
                     expected: Sequence[int]) -> list[np.ndarray]:
        """Have the evictor give up its first ``units`` units and return the ids it freed
        per band (int64), each band checked: flat integer ids (:func:`page_ids`),
        ``expected[i]`` of them, distinct held pages, no null page (``_holds``). The
        evictor has already forgotten them, so a bad answer is a bug of the cache, never
        a refusal; the caller releases them.

        Raises:
            PlanMismatchError: ``"{what}: ..."``: another number of bands, or a band's ids
                fail a check (the caller has checked that an evictor is attached).
        """
        assert self._evictor is not None
        freed = self._evictor.evict(units)
        if len(freed) != self.num_bands:
            raise PlanMismatchError(f"{what}: the evictor returned {len(freed)} bands")
        out = []
        for i, raw in enumerate(freed):
            try:
                v = page_ids(i, raw)
            except UnknownPageError as exc:
                raise PlanMismatchError(f"{what}: the evictor's {exc}") from None
            if v.size != expected[i]:
                raise PlanMismatchError(f"{what}: band {i} freed {v.size} pages, the order "
                                        f"said {expected[i]}")
            if v.size and not self._holds(i, v):
                raise PlanMismatchError(f"{what}: band {i} freed ids that are not held pages")
            out.append(v)
        return out
