"""A chain-like allocator whose snapshot encodes a baseline's capacity rule.

The scheduler and admission decide with ``kvchain.alloc.pricing.fits(snapshot, demand)``;
the KV manager allocates with ``take``/``release``. :class:`PoolAllocator` offers the same
methods as :class:`~kvchain.alloc.chain.Chain` but keeps counts only (no bytes move), and
builds a :class:`~kvchain.alloc.snapshot.ChainSnapshot` on which the unchanged planner
gives exactly the baseline's rule:

``FIXED`` (one pool per class)::

    | state pool (span = cap) | window pool (span = cap) | full pool (span = cap) |
      holes = free slots        holes = free pages          holes = free pages

  every band spans its whole pool, its free pages are holes, its index cap equals its
  span and moves are blocked, so the planner fits a demand iff ``d_i <= free_i`` for
  every pool (the AND over pools; no byte ever crosses from one pool to another).

``SHARED`` (one pool of bytes; pages never move)::

    | state live ->|  window live  |        free bytes         |<- full live |

  every band packed, no holes, all free bytes in the gap(s). With two bands the planner
  is byte-additive (docs/pricing.md §1): a demand fits iff
  ``sum_i (live_i + d_i) x page_bytes_i <= B``. With three bands the float's page grid
  may cost up to one window page of slack (docs/pricing.md §2); the same snapshot
  decides admission and ``take``, so they never diverge.

A ``SHARED`` pool with equal page bytes is the equal-page pool of vLLM's hybrid
allocator; with one-token pages and no null pages it is the exact-bytes ideal
(:mod:`kvchain.baselines.managers` builds both).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from types import TracebackType

import numpy as np

from kvchain.alloc.chain import ChainStats, Grant
from kvchain.alloc.pricing import price, validate_demand
from kvchain.alloc.quotes import QuoteRegistry
from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot, Demand, Quote
from kvchain.errors import (
    AuditError,
    CapacityError,
    ConfigError,
    DoubleReleaseError,
    InvalidDemandError,
    ReservedPageError,
    UnknownPageError,
)
from kvchain.layout import Anchor, ChainLayout


class CapacityRule(StrEnum):
    """How a :class:`PoolAllocator` admits pages: ``fixed`` pools or one ``shared`` pool."""

    FIXED = "fixed"
    SHARED = "shared"


class NoMovePin:
    """The move pin of an allocator that never moves pages: holding it changes nothing
    (the scheduler pins moves when the planner's plan relocates the synthesized float)."""

    def __init__(self) -> None:
        self._held = True

    @property
    def held(self) -> bool:
        """True until released."""
        return self._held

    def release(self) -> None:
        """Drop the pin (a no-op beyond the flag; releasing twice is fine)."""
        self._held = False

    def __enter__(self) -> NoMovePin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class PoolAllocator:
    """Count-level pages per band under a baseline's capacity rule (see the module doc).

    Args:
        layout: the band geometry the KV manager reads (page tokens, page bytes, null
            pages, band order).
        rule: ``FIXED`` or ``SHARED``.
        pool_pages: ``FIXED`` only: each band's pool in its own pages (null page
            included), low -> high.

    Virtual ids of band ``i`` are ``0 .. cap_i - 1``; freed ids are reused lowest first.
    The layout's null pages are bound at construction (as the chain does).

    Raises:
        ConfigError: ``pool_pages`` missing for ``FIXED`` or given for ``SHARED``, of the
            wrong length, below a band's null pages, or whose bytes exceed the buffer.
    """

    def __init__(self, layout: ChainLayout, rule: CapacityRule,
                 pool_pages: Sequence[int] | None = None) -> None:
        self.layout = layout
        self.rule = rule
        n = len(layout.bands)
        if rule is CapacityRule.FIXED:
            if pool_pages is None or len(pool_pages) != n:
                raise ConfigError(f"fixed pools need one pool size per band ({n}), "
                                  f"got {pool_pages!r}")
            pools = tuple(int(p) for p in pool_pages)
            for b, p in zip(layout.bands, pools, strict=True):
                if p < max(1, b.reserved_pages):
                    raise ConfigError(f"{b.label} pool of {p} pages holds no request")
            if sum(p * b.page_bytes for p, b in zip(pools, layout.bands, strict=True)) \
                    > layout.buffer_bytes:
                raise ConfigError(f"pools {pools} exceed the buffer of "
                                  f"{layout.buffer_bytes:,} B")
            self._caps = pools
        elif pool_pages is not None:
            raise ConfigError("a shared pool takes no per-band pool sizes")
        else:
            self._caps = tuple(b.cap for b in layout.bands)
        self._bound: list[set[int]] = [set() for _ in range(n)]
        self._free: list[list[int]] = [[] for _ in range(n)]  # released ids, reused first
        self._next = [0] * n  # lowest id never handed out
        self._epoch = 0
        self._quotes = QuoteRegistry("pool allocator")
        self._snap: ChainSnapshot | None = None
        self._takes = self._releases = 0
        reserved = Demand(tuple(b.reserved_pages for b in layout.bands))
        self._null: tuple[int | None, ...] = (None,) * n
        if not reserved.is_empty:
            grant = self.take(reserved)
            self._null = tuple(v[0] if v else None for v in grant.pages)

    # --- reading --------------------------------------------------------------------------

    @property
    def num_bands(self) -> int:
        """Bands (pools) of the allocator."""
        return len(self.layout.bands)

    @property
    def epoch(self) -> int:
        """Bumped by every take and release."""
        return self._epoch

    @property
    def pool_pages(self) -> tuple[int, ...]:
        """Each band's most pages: its fixed pool (``FIXED``) or its index cap (``SHARED``)."""
        return self._caps

    @property
    def stats(self) -> ChainStats:
        """Takes and releases; nothing is ever copied."""
        return ChainStats(self._takes, self._releases, 0, 0, 0, 0, 0)

    def snapshot(self) -> ChainSnapshot:
        """The synthesized snapshot that encodes the rule (cached per epoch)."""
        if self._snap is None:
            self._snap = self._build_snapshot()
        return self._snap

    def empty_snapshot(self) -> ChainSnapshot:
        """The snapshot of this allocator with only its null pages bound (what a lone
        request can ever use)."""
        live = [b.reserved_pages for b in self.layout.bands]
        return self._snapshot_of(live)

    def price(self, demand: Demand) -> Quote:
        """The planner's quote for ``demand`` on :meth:`snapshot` (nothing changes); the
        only kind of quote :meth:`take` accepts (until the next take or release).

        Raises:
            InvalidDemandError: wrong length or negative pages.
        """
        validate_demand(self.snapshot(), demand)
        return self._quotes.issue(price(self.snapshot(), demand))

    def bound_pages(self, band: int) -> int:
        """Ids bound in ``band`` (null page included)."""
        return len(self._bound[self._band_index(band)])

    def null_page(self, band: int) -> int:
        """The null page's id of ``band``.

        Raises:
            ReservedPageError: the band reserves none.
        """
        vid = self._null[self._band_index(band)]
        if vid is None:
            raise ReservedPageError(f"band {band} reserves no null page")
        return vid

    def translate(self, band: int, vids: np.ndarray) -> np.ndarray:
        """Physical index = virtual id (pages never move), int64, same shape."""
        self._band_index(band)
        return np.asarray(vids, dtype=np.int64).copy()

    # --- changing -------------------------------------------------------------------------

    def take(self, demand: Demand, quote: Quote | None = None) -> Grant:
        """Bind ``demand.pages[i]`` new ids in every band ``i`` if the rule admits them.

        Args:
            demand: pages per band.
            quote: a quote :meth:`price` issued for ``demand`` since the last change, or
                ``None`` (priced now).

        Raises:
            InvalidDemandError: wrong length or negative pages.
            ForgedQuoteError / StaleQuoteError: ``quote`` is not a live quote of this
                allocator for ``demand``.
            CapacityError: the rule refuses (shortfall in bytes).

            Nothing changes on any error.
        """
        snap = self.snapshot()
        validate_demand(snap, demand)
        if quote is None:
            quote = price(snap, demand)
        else:
            self._quotes.check(quote, demand, self._epoch)
        if not quote.fits:
            reason = quote.reason.value if quote.reason is not None else "bytes"
            raise CapacityError(
                f"{self.rule.value} pools refuse {demand.pages}: short {quote.shortfall_bytes:,} B",
                shortfall_bytes=quote.shortfall_bytes, demand=demand, reason=reason)
        pages = []
        for i, k in enumerate(demand.pages):
            free, bound = self._free[i], self._bound[i]
            got: list[int] = []
            while free and len(got) < k:
                got.append(free.pop())
            while len(got) < k:
                got.append(self._next[i])
                self._next[i] += 1
            bound.update(got)
            pages.append(tuple(got))
        self._takes += 1
        self._changed()
        return Grant(quote, tuple(pages))

    def release(self, band: int, vids: Sequence[int] | np.ndarray) -> None:
        """Return ids of ``band`` to its pool.

        Raises:
            ReservedPageError: the band's null page is among them.
            DoubleReleaseError: an id twice in ``vids``.
            UnknownPageError: an id not bound. Nothing changes on any error.
        """
        i = self._band_index(band)
        ids = [int(v) for v in vids]
        if len(set(ids)) != len(ids):
            raise DoubleReleaseError(f"band {band}: an id appears twice in one release")
        null = self._null[i]
        bound = self._bound[i]
        for v in ids:
            if v == null:
                raise ReservedPageError(f"band {band}: the null page {v} is held for good")
            if v not in bound:
                raise UnknownPageError(f"band {band}: page {v} is not bound")
        bound.difference_update(ids)
        # Lowest ids first out of the stack: push in descending order.
        self._free[i].extend(sorted(ids, reverse=True))
        self._free[i].sort(reverse=True)
        self._releases += 1
        self._changed()

    def pin_moves(self) -> NoMovePin:
        """A pin on a gate that never closes (nothing moves here)."""
        return NoMovePin()

    def audit(self) -> None:
        """Counts within pools, ids unique, cached snapshot equal to a fresh one.

        Raises:
            AuditError: any of these fails.
        """
        for i, (bound, cap) in enumerate(zip(self._bound, self._caps, strict=True)):
            if len(bound) > cap:
                raise AuditError(f"band {i}: {len(bound)} pages bound over its pool of {cap}")
            if set(self._free[i]) & bound:
                raise AuditError(f"band {i}: an id is both free and bound")
        if self._snap is not None and self._snap != self._build_snapshot():
            raise AuditError("cached snapshot differs from a fresh one")
        if self.live_bytes() > self.layout.buffer_bytes:
            raise AuditError("live pages exceed the buffer")

    def live_bytes(self) -> int:
        """Bytes of bound pages (null pages included)."""
        return sum(len(b) * bl.page_bytes for b, bl in zip(self._bound, self.layout.bands,
                                                           strict=True))

    # --- internals ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._epoch += 1
        self._snap = None
        self._quotes.clear()

    def _band_index(self, band: int) -> int:
        if type(band) is not int or not 0 <= band < len(self.layout.bands):
            raise InvalidDemandError(f"no band {band!r} (bands 0..{len(self.layout.bands) - 1})")
        return band

    def _build_snapshot(self) -> ChainSnapshot:
        return self._snapshot_of([len(b) for b in self._bound])

    def _snapshot_of(self, live: Sequence[int]) -> ChainSnapshot:
        spans = self._caps if self.rule is CapacityRule.FIXED else tuple(live)
        movable = self.rule is CapacityRule.SHARED
        bands = self.layout.bands
        total = self.layout.buffer_bytes
        out: list[BandSnapshot] = []
        cursor = 0
        for i, (bl, span, n_live) in enumerate(zip(bands, spans, live, strict=True)):
            pb = bl.page_bytes
            if bl.anchor is Anchor.HIGH:
                lo, hi = total - span * pb, total
            else:
                if bl.anchor is Anchor.FLOAT:
                    cursor = -(-cursor // pb) * pb
                lo, hi = cursor, cursor + span * pb
            cursor = hi
            cap = span if self.rule is CapacityRule.FIXED else self._caps[i]
            out.append(BandSnapshot(bl.label, bl.anchor, pb, lo, hi, n_live, span - n_live,
                                    cap, movable=movable))
        return ChainSnapshot(total, tuple(out), self._epoch)
