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
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from kvchain.alloc.snapshot import EvictionOrder


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
