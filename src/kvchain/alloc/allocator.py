"""The allocator interface: what the KV manager, the scheduler and the simulator need of a
memory manager.

:class:`~kvchain.alloc.chain.Chain` implements it, and so do the baselines'
:class:`~kvchain.baselines.pools.PoolAllocator` (fixed pools, equal-page pool, exact-bytes
ideal): the layers above are typed against :class:`Allocator` only, so every manager runs
through the same request layer, admission and event loop. Capacity is always decided by
the pure planner on the allocator's :meth:`Allocator.snapshot`; ``take`` realizes only
quotes the allocator's own ``price`` issued (docs/architecture.md, "Quotes are tokens").
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, runtime_checkable

import numpy as np

from kvchain.alloc.chain import ChainStats, Grant
from kvchain.alloc.evictor import Evictor
from kvchain.alloc.pricing import Planner
from kvchain.alloc.snapshot import ChainSnapshot, CopyPages, Demand, Quote
from kvchain.layout import ChainLayout


class MoveHold(Protocol):
    """A hold on an allocator's move gate (:class:`~kvchain.alloc.chain.MovePin`, or the
    baselines' no-op ``NoMovePin``): while held, closing the gate is deferred."""

    @property
    def held(self) -> bool:
        """True until released."""
        ...

    def release(self) -> None:
        """Drop the hold (releasing twice is a no-op)."""
        ...

    def __enter__(self) -> MoveHold: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


@runtime_checkable
class Allocator(Protocol):
    """A memory manager of pages per band over one KV buffer.

    Attributes:
        layout: the band geometry (page tokens and bytes per band, null pages).
        planner: the pricing strategy its ``price`` uses
            (:class:`~kvchain.alloc.pricing.Planner`); admission prices with the same one,
            so what admission fits the allocator's own quote fits.

    Every method below is documented on :class:`~kvchain.alloc.chain.Chain`; the errors
    are the same typed errors (``InvalidDemandError``, ``CapacityError``,
    ``QuoteError``, ``UnknownPageError``, ``DoubleReleaseError``, ``ReservedPageError``),
    and every refusal changes nothing.
    """

    layout: ChainLayout
    planner: Planner

    @property
    def num_bands(self) -> int:
        """Bands of the allocator."""
        ...

    @property
    def epoch(self) -> int:
        """Capacity epoch: bumped by every change a snapshot can see."""
        ...

    @property
    def stats(self) -> ChainStats:
        """Cumulative counters (takes, releases, pages and bytes copied)."""
        ...

    def snapshot(self) -> ChainSnapshot:
        """Counts and frontiers the planner prices (cached per epoch)."""
        ...

    def empty_snapshot(self) -> ChainSnapshot:
        """The snapshot with nothing held but the null pages."""
        ...

    def price(self, demand: Demand, copies: Sequence[CopyPages] = ()) -> Quote:
        """The planner's quote for ``demand`` now, with the copy actions ``copies``
        appended to its plan; the only quote ``take`` accepts."""
        ...

    def take(self, demand: Demand, quote: Quote | None = None,
             copies: Sequence[CopyPages] = ()) -> Grant:
        """Bind ``demand.pages[i]`` new virtual pages per band, all or nothing, then run
        the copies ``copies`` (held pages into pages just bound)."""
        ...

    def release(self, band: int, vids: Sequence[int] | np.ndarray) -> None:
        """Return virtual pages of band ``band``: one flat sequence of that band's int ids
        (:func:`~kvchain.alloc.chain.page_ids`; anything else is refused, never
        flattened)."""
        ...

    def bound_pages(self, band: int) -> int:
        """Virtual ids bound in band ``band`` (null pages included)."""
        ...

    def null_page(self, band: int) -> int:
        """Virtual id of band ``band``'s null page."""
        ...

    def translate(self, band: int, vids: np.ndarray) -> np.ndarray:
        """Physical page indices of virtual ids (int64, same shape)."""
        ...

    def pin_moves(self) -> MoveHold:
        """Hold the move gate open until the hold is released."""
        ...

    def audit(self) -> None:
        """Check integrity (raises ``AuditError``)."""
        ...


@runtime_checkable
class EvictingAllocator(Allocator, Protocol):
    """An :class:`Allocator` that a prefix cache can hold pages of: it takes an
    :class:`~kvchain.alloc.evictor.Evictor`, puts its eviction order in every snapshot
    (``ChainSnapshot.evictable``), and executes plans that begin with ``Evict(k)``.

    :class:`~kvchain.alloc.chain.Chain` and the baselines'
    :class:`~kvchain.baselines.pools.PoolAllocator` implement it, so every memory manager
    of ``kvchain compare`` can run with the same prefix cache.
    """

    @property
    def evictor(self) -> Evictor | None:
        """The attached prefix cache, or ``None``."""
        ...

    def set_evictor(self, evictor: Evictor | None) -> None:
        """Attach (or detach, with ``None``) the evictor (raises ``InvalidDemandError``
        for an object that is not an :class:`Evictor`)."""
        ...
