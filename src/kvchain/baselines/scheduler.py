"""The unchanged scheduler over a baseline allocator.

:class:`~kvchain.sched.scheduler.Scheduler` decides which requests can never fit against
``Chain(layout).snapshot()``: a kvchain chain of the same layout, which is more generous
than fixed pools. A request that fits kvchain's empty chain but not the empty fixed pools
would wait forever. :class:`BaselineScheduler` only replaces that empty snapshot by the
allocator's own (:meth:`PoolAllocator.empty_snapshot`); every decision is the base
class's.
"""

from __future__ import annotations

from kvchain.admission import NewTokenRatio
from kvchain.alloc.pricing import fits
from kvchain.errors import BufferTooSmallError
from kvchain.kv_manager import KVManager
from kvchain.sched.scheduler import Scheduler, SchedulerConfig


class BaselineScheduler(Scheduler):
    """:class:`Scheduler` whose never-fits check uses the allocator's empty snapshot.

    Args:
        kv: a KV manager over a chain or a :class:`~kvchain.baselines.pools.PoolAllocator`.
        config, ratio: as :class:`Scheduler`.

    Raises:
        BufferTooSmallError: the allocator's empty pools cannot hold the smallest request
            (a 1-token prompt with 1 output token).
    """

    def __init__(self, kv: KVManager, config: SchedulerConfig | None = None,
                 ratio: NewTokenRatio | None = None) -> None:
        super().__init__(kv, config, ratio)
        empty_of = getattr(kv.chain, "empty_snapshot", None)
        if empty_of is None:
            return  # a real chain: the base class's check is the allocator's own
        self._empty = empty_of()
        smallest = self._lifetime_demand(1, 1)
        if not fits(self._empty, smallest):
            need = sum(d * b.page_bytes for d, b in zip(smallest.pages, self._empty.bands,
                                                           strict=True))
            raise BufferTooSmallError(
                f"the empty pools cannot hold the smallest request ({need:,} B of pages; "
                f"pools {[b.span * b.page_bytes for b in self._empty.bands]} B)",
                needed_bytes=need, available_bytes=self._empty.buffer_bytes)
