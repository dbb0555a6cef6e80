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

Prefix cache (:meth:`PoolAllocator.set_evictor`, as on the chain): every snapshot carries
the cache's :class:`~kvchain.alloc.snapshot.EvictionOrder` and the planner may start a plan
with ``Evict(k)``. Its prediction (the freed pages become holes of their band) is exact for
both rules: ``FIXED`` - a freed page returns to its own pool, which is what a hole of a
band spanning its pool is (the predicted snapshot equals the pool's own after the
eviction); ``SHARED`` - moves are allowed, so whether a demand fits depends on live pages
alone (docs/pricing.md), and the freed bytes are shared supply for every band.
:meth:`PoolAllocator.take` executes the ``Evict`` step exactly: the evictor must hand back
``order.freed(k)`` held pages per band and leave ``order.after(k)``, checked before any
page is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from types import TracebackType

import numpy as np

from kvchain.alloc.chain import ChainStats, Grant
from kvchain.alloc.evictor import EvictorHost, page_ids
from kvchain.alloc.pricing import GENERAL_PLANNER, validate_demand, with_copies
from kvchain.alloc.quotes import QuoteRegistry
from kvchain.alloc.snapshot import (
    BandSnapshot,
    ChainSnapshot,
    CopyPages,
    Demand,
    Evict,
    EvictionOrder,
    LazyPlan,
    Quote,
)
from kvchain.audit import resolve_audit
from kvchain.errors import (
    AuditError,
    CapacityError,
    ConfigError,
    DoubleReleaseError,
    InvalidDemandError,
    PlanMismatchError,
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


class PoolAllocator(EvictorHost):
    """Count-level pages per band under a baseline's capacity rule (see the module doc);
    its evictor side (:meth:`set_evictor`, the checks of an ``Evict``) is the chain's,
    :class:`~kvchain.alloc.evictor.EvictorHost`.

    Args:
        layout: the band geometry the KV manager reads (page tokens, page bytes, null
            pages, band order).
        rule: ``FIXED`` or ``SHARED``.
        pool_pages: ``FIXED`` only: each band's pool in its own pages (null page
            included), low -> high.
        audit: after an ``Evict``, compare the evictor's remaining order with the
            published one row by row (``None``: :func:`kvchain.audit.resolve_audit`'s
            default, on in the test suite); without it the check is O(bands): the rest's
            unit count and pages per band.

    Virtual ids of band ``i`` are ``0 .. cap_i - 1``; freed ids are reused lowest first.
    The layout's null pages are bound at construction (as the chain does).

    Raises:
        ConfigError: ``pool_pages`` missing for ``FIXED`` or given for ``SHARED``, of the
            wrong length, below a band's null pages, or whose bytes exceed the buffer; a
            bad ``audit`` flag.
    """

    def __init__(self, layout: ChainLayout, rule: CapacityRule,
                 pool_pages: Sequence[int] | None = None, *,
                 audit: bool | None = None) -> None:
        self.layout = layout
        self.audit_takes = resolve_audit(audit)
        self.rule = rule
        n = len(layout.bands)
        if rule is CapacityRule.FIXED:
            if pool_pages is None or len(pool_pages) != n:
                raise ConfigError(f"fixed pools need one pool size per band ({n}), "
                                  f"got {pool_pages!r}")
            pools = tuple(int(p) for p in pool_pages)
            for b, p in zip(layout.bands, pools, strict=True):
                if p < max(1, b.reserved_pages):
                    raise ConfigError(
                        f"fixed pools: the {b.label} pool of {p} pages (its share of the "
                        f"{layout.buffer_bytes:,} B buffer) holds no request; give the "
                        f"buffer more bytes or compare without fixed-pools")
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
        self.planner = GENERAL_PLANNER  # the rule is in the snapshot; the planner is general
        self._snap: ChainSnapshot | None = None
        self._takes = self._releases = 0
        self._evictor = None
        self._evictor_version = -1  # the evictor version the cached snapshot saw
        self._evicted = [0] * n  # pages (slots) evicted per band
        self._copies = self._copy_bytes = 0  # CopyPages realized (counted, no bytes move)
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
        """Takes, releases and pages evicted through the evictor; nothing is ever moved,
        and ``CopyPages`` actions are counted (pages, bytes they stand for) though the
        pools keep counts only."""
        return ChainStats(self._takes, self._releases, 0, 0, 0, 0, 0, sum(self._evicted),
                          self._copies, self._copy_bytes)

    @property
    def evicted_pages(self) -> tuple[int, ...]:
        """Pages (state slots for a state band) evicted through ``Evict`` steps, per band."""
        return tuple(self._evicted)

    def snapshot(self) -> ChainSnapshot:
        """The synthesized snapshot that encodes the rule, with the evictor's order
        (cached per epoch; a new evictor version is a new epoch and voids issued quotes).

        Raises:
            PlanMismatchError: the evictor's order is not an :class:`EvictionOrder` as wide
                as the allocator.
        """
        if self._evictor is not None and self._evictor.version != self._evictor_version:
            self._new_epoch()  # the evictable supply changed: a new capacity epoch
        if self._snap is None:
            self._snap = self._build_snapshot()
            if self._evictor is not None:
                self._evictor_version = self._evictor.version
        return self._snap

    def empty_snapshot(self) -> ChainSnapshot:
        """The snapshot of this allocator with only its null pages bound (what a lone
        request can ever use)."""
        live = [b.reserved_pages for b in self.layout.bands]
        return self._snapshot_of(live)

    def price(self, demand: Demand, copies: Sequence[CopyPages] = ()) -> Quote:
        """The planner's quote for ``demand`` on :meth:`snapshot` (nothing changes); the
        only kind of quote :meth:`take` accepts (until the next take or release). With
        ``copies``, as :meth:`kvchain.alloc.chain.Chain.price`: appended to the plan.

        Raises:
            InvalidDemandError: not a Demand, wrong length or negative pages; a bad copy.
        """
        if copies:
            base = self.price(demand)
            copying = with_copies(base, copies)
            return copying if copying is base else self._quotes.issue(copying, memo=False)
        snap = self.snapshot()
        validate_demand(snap, demand)
        quote = self._quotes.issued_for(snap, demand)  # a repeat: the quote issued before
        if quote is None:
            quote = self._quotes.issue(self.planner.quote(snap, demand))
        return quote

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
        """Physical index = virtual id (pages never move), int64, same shape.

        The same contract as :meth:`kvchain.alloc.chain.Chain.translate`: only bound ids
        translate, so a kernel's block table built from either allocator names live pages.

        Raises:
            InvalidDemandError: band index out of range.
            UnknownPageError: a non-integer (a float id is never rounded), negative or
                unbound virtual id.
        """
        i = self._band_index(band)
        v = np.asarray(vids)
        if v.size == 0:
            return np.empty(v.shape, dtype=np.int64)
        if v.dtype.kind not in "iu":
            raise UnknownPageError(f"virtual ids must be integers, got dtype {v.dtype}")
        bound = np.fromiter(self._bound[i], dtype=np.int64, count=len(self._bound[i]))
        missing = ~np.isin(v, bound)
        if missing.any():
            bad = v[missing].ravel()[:8].tolist()
            raise UnknownPageError(f"band {band}: unbound virtual ids {bad}")
        return v.astype(np.int64, copy=True)

    # --- changing -------------------------------------------------------------------------

    def take(self, demand: Demand, quote: Quote | None = None,
             copies: Sequence[CopyPages] = ()) -> Grant:
        """Bind ``demand.pages[i]`` new ids in every band ``i`` if the rule admits them.

        Args:
            demand: pages per band.
            quote: a quote :meth:`price` issued for ``demand`` since the last change, or
                ``None`` (priced now).
            copies: copy actions appended to the plan (as
                :meth:`kvchain.alloc.chain.Chain.take`); the pools keep no bytes, so a
                copy is checked (its sources held, before anything changes) and counted.

        A quote whose plan begins with ``Evict(k)`` first has the evictor give up its
        first ``k`` units; the freed ids are checked (``order.freed(k)`` per band, held,
        distinct, no null page; the evictor's order left is ``order.after(k)``) before any
        is released, then the demand is bound.

        Raises:
            InvalidDemandError: not a Demand, wrong length or negative pages; a bad copy.
            ForgedQuoteError / StaleQuoteError: ``quote`` is not a live quote of this
                allocator for ``demand``.
            CapacityError: the rule refuses (shortfall in bytes, measured after evicting
                every evictable unit).
            PlanMismatchError: an ``Evict`` step the evictor cannot honour: none attached,
                its order moved without a version bump, or it handed back other pages
                than its order said (the evictor has then already forgotten them: a bug
                of the cache; they stay bound here and show as leaked pages).

            Nothing changes in the allocator on any error.
        """
        snap = self.snapshot()
        validate_demand(snap, demand)
        if quote is None:
            quote = self._quotes.issued_for(snap, demand)
        if quote is None:
            quote = self.planner.quote(snap, demand)
        else:
            self._quotes.check(quote, demand, self._epoch)  # a memo hit is checked as well
        quote = with_copies(quote, copies)
        if not quote.fits:
            reason = quote.reason.value if quote.reason is not None else "bytes"
            raise CapacityError(
                f"{self.rule.value} pools refuse {demand.pages}: short {quote.shortfall_bytes:,} B",
                shortfall_bytes=quote.shortfall_bytes, demand=demand, reason=reason)
        steps = quote.steps
        actions = steps.actions if isinstance(steps, LazyPlan) else [s.action for s in steps]
        evict = actions[0] if actions and isinstance(actions[0], Evict) else None
        copy_acts = [a for a in actions if isinstance(a, CopyPages)]
        for c in copy_acts:
            if not set(c.src) <= self._bound[c.band] or (
                    self._null[c.band] is not None and self._null[c.band] in c.src):
                raise PlanMismatchError(f"{c}: its sources are not held pages of band "
                                        f"{c.band}")
        freed = self._evict(evict.units, snap, demand) if evict is not None else None
        if freed is not None:
            for i, ids in enumerate(freed):
                if ids:
                    self._bound[i].difference_update(ids)
                    self._free[i].extend(ids)
                    self._free[i].sort(reverse=True)
                    self._evicted[i] += len(ids)
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
        for c in copy_acts:
            if not set(c.src) <= self._bound[c.band]:
                raise PlanMismatchError(f"copy of band {c.band} ids {list(c.src)}: freed "
                                        f"before the copy ran (evicted while referenced)")
            self._copies += len(c.src)
            self._copy_bytes += len(c.src) * self.layout.bands[c.band].page_bytes
        self._takes += 1
        self._new_epoch()
        return Grant(quote, tuple(pages))

    def release(self, band: int, vids: Sequence[int] | np.ndarray) -> None:
        """Return ids of ``band`` to its pool.

        Raises:
            ReservedPageError: the band's null page is among them.
            DoubleReleaseError: an id twice in ``vids``.
            UnknownPageError: ``vids`` not a flat sequence of integer ids (the chain's
                check, :func:`~kvchain.alloc.chain.page_ids`: nested, 2-D, ragged, float
                or bool ids are refused, never flattened or truncated), or an id not
                bound. Nothing changes on any error.
        """
        i = self._band_index(band)
        ids = page_ids(band, vids).tolist()
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
        self._new_epoch()

    def _evict(self, units: int, snap: ChainSnapshot, demand: Demand) -> list[list[int]]:
        """Run the ``Evict(units)`` step's evictor side and return the freed ids per band,
        all checked; the caller releases them. Every check that needs no eviction runs
        before the evictor is asked (so a refusal there changes nothing anywhere).

        Raises:
            PlanMismatchError: see :meth:`take`.
        """
        evictor = self._evictor
        if evictor is None:
            raise PlanMismatchError(f"Evict({units}): no evictor is attached")
        order = snap.evictable
        if evictor.version != self._evictor_version or self._checked_order() != order:
            raise PlanMismatchError(f"Evict({units}): the evictor's order changed since the "
                                    f"snapshot without a version bump")
        if not 0 < units <= order.units:
            raise PlanMismatchError(f"Evict({units}) with {order.units} eviction units")
        expected = order.freed(units)
        total = order.freed(order.units)
        live = [len(b) - e for b, e in zip(self._bound, expected, strict=True)]
        self._check_rule(live, demand, units)
        if self.audit_takes:
            order.materialize()  # every row known: the suffix is comparable after it moves
        freed = [v.tolist() for v in self._evicted_ids(f"Evict({units})", units, expected)]
        left = self._checked_order()
        # O(bands): the rest's unit count and total pages per band (a lazy order that
        # moved cannot give its rows any more); row by row under the audit flag.
        rest = order.units - units
        rest_total = tuple(t - e for t, e in zip(total, expected, strict=True))
        if (left.units != rest or (rest and left.freed(rest) != rest_total)
                or (self.audit_takes and left != order.after(units))):
            raise PlanMismatchError(f"Evict({units}): the evictor's order after evicting is "
                                    f"not the rest of the order it published")
        return freed

    def _check_rule(self, live: Sequence[int], demand: Demand, units: int) -> None:
        """The rule itself on the counts after evicting (a check of the planner's answer):
        ``FIXED``: ``live_i + d_i <= pool_i`` per pool; ``SHARED``: the bytes fit ``B``.

        Raises:
            PlanMismatchError: the plan would break the rule (a planner bug).
        """
        need = [n + d for n, d in zip(live, demand.pages, strict=True)]
        if self.rule is CapacityRule.FIXED:
            ok = all(n <= cap for n, cap in zip(need, self._caps, strict=True))
        else:
            ok = sum(n * b.page_bytes for n, b in zip(need, self.layout.bands, strict=True)) \
                <= self.layout.buffer_bytes
        if not ok:
            raise PlanMismatchError(f"Evict({units}) then {demand.pages} breaks the "
                                    f"{self.rule.value} rule")

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
        evictor_moved = (self._evictor is not None
                         and self._evictor.version != self._evictor_version)
        if self._snap is not None and not evictor_moved and \
                self._snap != self._build_snapshot():  # else stale by design, rebuilt lazily
            raise AuditError("cached snapshot differs from a fresh one")
        if self.live_bytes() > self.layout.buffer_bytes:
            raise AuditError("live pages exceed the buffer")

    def live_bytes(self) -> int:
        """Bytes of bound pages (null pages included)."""
        return sum(len(b) * bl.page_bytes for b, bl in zip(self._bound, self.layout.bands,
                                                           strict=True))

    # --- internals ------------------------------------------------------------------------

    def _new_epoch(self) -> None:
        self._epoch += 1
        self._snap = None
        self._quotes.clear()

    def _holds(self, band: int, ids: np.ndarray) -> bool:
        held = ids.tolist()
        return (len(set(held)) == len(held) and self._bound[band].issuperset(held)
                and self._null[band] not in held)

    def _band_index(self, band: int) -> int:
        if type(band) is not int or not 0 <= band < len(self.layout.bands):
            raise InvalidDemandError(f"no band {band!r} (bands 0..{len(self.layout.bands) - 1})")
        return band

    def _build_snapshot(self) -> ChainSnapshot:
        order = self._checked_order() if self._evictor is not None else None
        return self._snapshot_of([len(b) for b in self._bound], order)

    def _snapshot_of(self, live: Sequence[int],
                     order: EvictionOrder | None = None) -> ChainSnapshot:
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
        if order is None:
            return ChainSnapshot(total, tuple(out), self._epoch)
        return ChainSnapshot(total, tuple(out), self._epoch, order)
