"""The chain allocator's executor: one byte buffer, its bands, and the one take path.

The chain holds one :class:`~kvchain.alloc.band.Band` per band of a
:class:`~kvchain.layout.ChainLayout` and realizes plans priced by the pure planner
(``kvchain.alloc.pricing.price``, docs/design.md §3)::

    take(demand, quote?) --> quote issued by this chain's price() now?  (QuoteRegistry)
                               else ForgedQuoteError / StaleQuoteError, nothing changed
                             (no quote: the one issued for demand on this snapshot,
                              else planner.price(snapshot, demand) now)
        refused: CapacityError, nothing changed
        fits:    phase 1: for step in plan: _PRECHECK[kind](action)   (nothing changes)
                 phase 2: for step in plan: _APPLY[kind](action)
                                            check snapshot == step.after
                 --> Grant (new virtual ids per band)

Every mutation - ``UseHoles``, ``Extend``, ``Compact``, ``Relocate``, ``WaitFence``, a
release, a gate or fence change - goes through the single private ``_apply`` path, which
bumps the capacity epoch and drops the cached snapshot. The executor never re-prices in the
middle of a plan; a snapshot that differs from the prediction is a bug
(:class:`~kvchain.errors.PlanMismatchError`), never a shortfall.

Moves are gated (docs/design.md §2, contract 6): pages are copied only while the move gate
is open and after the in-flight forward's fence completed. Admission that relies on a
plan with moves holds a :class:`MovePin`; closing the gate while a pin is held is
deferred until the last pin is released (field case F13).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import numpy as np

from kvchain.alloc.band import Band, PageMoves
from kvchain.alloc.evictor import Evictor, EvictorHost, page_ids
from kvchain.alloc.pricing import GENERAL_PLANNER, Planner, check_demand, with_copies
from kvchain.alloc.pricing import apply_action as plan_apply_action
from kvchain.alloc.quotes import QuoteRegistry
from kvchain.alloc.snapshot import (
    Action,
    ChainSnapshot,
    Compact,
    CopyPages,
    Demand,
    Evict,
    Extend,
    Quote,
    Relocate,
    Side,
    SnapshotParts,
    UseHoles,
    WaitFence,
)
from kvchain.audit import resolve_audit
from kvchain.buffer import BufferBackend, Fence, NullBuffer
from kvchain.errors import (
    AuditError,
    CapacityError,
    ConfigError,
    DoubleReleaseError,
    InvalidDemandError,
    LayoutError,
    MovesBlockedError,
    PlanMismatchError,
    ReservedPageError,
    UnknownPageError,
)
from kvchain.field_types import is_whole
from kvchain.layout import Anchor, ChainLayout

# --- value objects --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """The result of a successful :meth:`Chain.take`.

    Attributes:
        quote: the quote that was realized (its ``after`` equals the chain's snapshot
            right after the take).
        pages: per band (low -> high), the virtual ids newly bound, in the order taken
            (holes first, then extensions); ``len(pages[i]) == quote.demand.pages[i]``.
    """

    quote: Quote
    pages: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class GateState:
    """The move gate as seen after a gate request.

    Attributes:
        open: pages may be copied now.
        close_pending: a close was asked while pins were held; it applies when the last
            pin is released.
        pins: move pins held now.
    """

    open: bool
    close_pending: bool
    pins: int


@dataclass(frozen=True, slots=True)
class ChainStats:
    """Cumulative counters of a chain (pages, bytes, counts of actions).

    ``pages_copied`` / ``bytes_copied`` count the moves (Compact, Relocate);
    ``copies`` / ``copy_bytes`` the pages and bytes of ``CopyPages`` actions (the prefix
    cache's checkpoint copies on a hit), through the same buffer copy path."""

    takes: int
    releases: int
    pages_copied: int
    bytes_copied: int
    compactions: int
    relocations: int
    fence_waits: int
    pages_evicted: int = 0
    copies: int = 0
    copy_bytes: int = 0


class MovePin:
    """A hold on the move gate: while held, closing the gate is deferred.

    Use as a context manager or call :meth:`release`; releasing twice is a no-op. A pin
    does not open a closed gate (check :attr:`Chain.gate`).
    """

    def __init__(self, chain: Chain) -> None:
        self._chain = chain
        self._held = True

    @property
    def held(self) -> bool:
        """True until released."""
        return self._held

    def release(self) -> None:
        """Drop the pin; the last pin dropped applies a deferred gate close."""
        if self._held:
            self._held = False
            self._chain._unpin()

    def __enter__(self) -> MovePin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


# --- internal (non-plan) actions, applied through the same path -------------------------


@dataclass(frozen=True, slots=True)
class _Release:
    band: int
    vids: np.ndarray


@dataclass(frozen=True, slots=True)
class _Copy:
    """A ``CopyPages`` step with its destinations resolved to the take's new ids."""

    band: int
    src: np.ndarray
    dst: np.ndarray


@dataclass(frozen=True, slots=True)
class _SetGate:
    open: bool


@dataclass(frozen=True, slots=True)
class _BeginForward:
    fence: Fence


@dataclass(frozen=True, slots=True)
class _FenceDone:
    pass


_Mutation = Action | _Copy | _Release | _SetGate | _BeginForward | _FenceDone


def float_starts(layout: ChainLayout) -> list[int]:
    """Physical start page of every band of an empty chain: 0 for the LOW END,
    ``n_phys`` for the HIGH END, and for float ``j`` of ``k`` (1-based) the grid page
    nearest byte ``j x B / (k + 1)``, raised to no lower than the float below ends (so the
    order holds on mixed page sizes). With one float that is ``round(B / 2P)``, the middle.

    Evenly spread floats each start with a gap on both sides to grow into in place; the
    ENDs reach the outer floats first, and the planner relocates (or compacts) a float an
    END runs into, at the price it quotes.
    """
    big = layout.buffer_bytes
    k = sum(1 for bl in layout.bands if bl.anchor is Anchor.FLOAT)
    out: list[int] = []
    floor = 0
    j = 0
    for bl in layout.bands:
        if bl.anchor is Anchor.LOW:
            out.append(0)
        elif bl.anchor is Anchor.HIGH:
            out.append(bl.cap)
        else:
            j += 1
            p = bl.page_bytes
            start = (2 * j * big + (k + 1) * p) // (2 * (k + 1) * p)
            start = min(bl.cap, max(start, -(-floor // p)))
            floor = start * p
            out.append(start)
    return out


@dataclass(slots=True)
class _DryRun:
    """What phase 1 of a take tracks while it checks a plan: the predicted snapshot before
    the next action, whether a forward's fence is still pending, pages bound per band."""

    snap: ChainSnapshot
    fence_pending: bool
    bound: list[int]
    order_checked: bool = False


class Chain(EvictorHost):
    """A chain of bands over one byte buffer: the allocator's state and executor (its
    evictor side, :meth:`set_evictor` and the checks of an ``Evict``, is
    :class:`~kvchain.alloc.evictor.EvictorHost`).

    Args:
        layout: the validated chain layout.
        buffer: the bytes (``kvchain.buffer`` backend: ``NumpyBuffer``, ``TorchBuffer``);
            default a ``NullBuffer`` of ``layout.buffer_bytes`` (bookkeeping only).
        debug_audit: run :meth:`audit` after every public mutating call.
        audit: after every action of a take, rebuild the snapshot and compare it with the
            prediction (eviction order included, row by row), instead of comparing the
            bands' counters and the evictable supply's unit count and total (O(bands));
            ``None``: the default of :func:`kvchain.audit.resolve_audit` (on in the test
            suite and in ``kvchain replay``).
        planner: the pricing strategy (:class:`~kvchain.alloc.pricing.Planner`); default
            :data:`~kvchain.alloc.pricing.GENERAL_PLANNER`. Tests plant planner defects by
            passing another here.

    Quotes this chain's :meth:`price` issued are kept for the current snapshot (the price
    memo: a repeated query on an unchanged chain is a lookup) and dropped with its epoch.

    ENDs start empty at their anchors; the floats start empty where
    :func:`float_starts` puts them (one float: the grid page nearest the middle of the
    buffer, ``round(B / 2P)``). The layout's null pages are then taken
    through :meth:`take` (so they pass the same planner) and zeroed; the chain holds them
    for good (:meth:`null_page`).

    Raises:
        CapacityError: the layout's null pages do not fit (a validated layout always fits).
        ConfigError: a bad ``audit`` flag, or ``planner`` not a ``Planner``.
    """

    _holder = "chain"

    def __init__(self, layout: ChainLayout, buffer: BufferBackend | None = None, *,
                 debug_audit: bool = False, audit: bool | None = None,
                 planner: Planner = GENERAL_PLANNER) -> None:
        if not isinstance(planner, Planner):
            raise ConfigError(f"planner must be a Planner, got {type(planner).__name__}")
        if buffer is None:
            buffer = NullBuffer(layout.buffer_bytes)
        elif buffer.nbytes < layout.buffer_bytes:
            raise LayoutError(f"the buffer backend holds {buffer.nbytes:,} B but the layout "
                              f"spans {layout.buffer_bytes:,} B")
        self.layout = layout
        self.buffer = buffer
        self.debug_audit = debug_audit
        self.audit_takes = resolve_audit(audit)
        self.planner = planner
        self._bands = [Band(bl, start) for bl, start in zip(layout.bands,
                                                           float_starts(layout), strict=True)]
        self._epoch = 0
        self._quotes = QuoteRegistry("chain")
        self._snap: ChainSnapshot | None = None
        self._parts = SnapshotParts(len(self._bands))  # band snapshots, order: kept
        self._empty_snapshot: ChainSnapshot | None = None
        self._gate_open = True
        self._close_pending = False
        self._close_realizes = True
        self._pins = 0
        self._fence: Fence | None = None
        self._takes = self._releases = 0
        self._pages_copied = self._bytes_copied = 0
        self._compactions = self._relocations = self._fence_waits = 0
        self._copies = self._copy_bytes = 0
        self._null: tuple[int | None, ...] = (None,) * len(self._bands)
        self._evictor = None
        self._evictor_version = -1  # the evictor version the cached snapshot saw
        self._evicted_pages = 0
        reserved = Demand(tuple(bl.reserved_pages for bl in layout.bands))
        if not reserved.is_empty:
            grant = self.take(reserved)
            for i, vids in enumerate(grant.pages):
                if vids:
                    bl = layout.bands[i]
                    self.buffer.zero_pages(bl, self._bands[i].v2p[np.asarray(vids)])
            self._null = tuple(v[0] if v else None for v in grant.pages)
        self._after_public_call()

    # --- reading ------------------------------------------------------------------------

    @property
    def num_bands(self) -> int:
        """Bands of the chain (1 or more)."""
        return len(self._bands)

    @property
    def epoch(self) -> int:
        """Capacity epoch: bumped by every change of counts, frontiers or movability."""
        return self._epoch

    @property
    def gate(self) -> GateState:
        """The move gate now."""
        return GateState(self._gate_open, self._close_pending, self._pins)

    @property
    def stats(self) -> ChainStats:
        """Cumulative counters (pages and bytes copied by compactions and relocations)."""
        return ChainStats(self._takes, self._releases, self._pages_copied,
                          self._bytes_copied, self._compactions, self._relocations,
                          self._fence_waits, self._evicted_pages, self._copies,
                          self._copy_bytes)

    def band(self, band: int) -> Band:
        """The band object (tables and holes) of band index ``band``; read it, do not
        mutate it.

        Raises:
            InvalidDemandError: band index out of range.
        """
        return self._bands[self._band_index(band)]

    def snapshot(self) -> ChainSnapshot:
        """The chain's counts and frontiers (cached per epoch; ``O(bands)``).

        Polls the in-flight fence first: if it completed, ``fence_pending`` clears (an
        epoch bump).

        Built incrementally: only the bands a change touched since the last build get a
        new band snapshot (:class:`~kvchain.alloc.snapshot.SnapshotParts`), and the
        evictor's order is asked again only when its version moved (an
        :class:`~kvchain.alloc.evictor.Evictor` returns the same order for the same
        version). Under the audit flag (``audit``) every build is compared with one made
        from scratch.

        Raises:
            AuditError: (audit flag on) the incremental snapshot differs from a fresh one.
        """
        if self._fence is not None and self._fence.query():
            self._apply(_FenceDone())
        evictor = self._evictor
        if evictor is not None and evictor.version != self._evictor_version:
            self._new_epoch()  # the evictable supply changed: a new capacity epoch
        if self._snap is None:
            parts = self._parts
            bands = parts.bands(self._bands, self._gate_open, self._fence is not None)
            if evictor is None:
                snap = ChainSnapshot(self.layout.buffer_bytes, bands, self._epoch)
            else:
                version = evictor.version
                kept = parts.order
                if kept is None or kept[0] != version:
                    kept = parts.order = (version, self._checked_order())
                snap = ChainSnapshot(self.layout.buffer_bytes, bands, self._epoch, kept[1])
                self._evictor_version = version
            if self.audit_takes:
                fresh = self._build_snapshot()
                if fresh != snap:
                    raise AuditError(f"incremental snapshot {snap} != fresh {fresh}")
            self._snap = snap
        return self._snap

    def set_evictor(self, evictor: Evictor | None) -> None:
        """:meth:`EvictorHost.set_evictor`, and the kept eviction order is forgotten (a new
        evictor may report the version the old one had).

        Raises:
            InvalidDemandError: ``evictor`` does not implement :class:`Evictor`.
        """
        super().set_evictor(evictor)
        self._parts.order = None

    def empty_snapshot(self) -> ChainSnapshot:
        """The snapshot of this chain's layout with nothing held but its null pages (what
        a request that can never fit is judged against). Cached."""
        if self._empty_snapshot is None:
            self._empty_snapshot = Chain(self.layout).snapshot()
        return self._empty_snapshot

    def price(self, demand: Demand, copies: Sequence[CopyPages] = ()) -> Quote:
        """The planner's quote for ``demand`` on the current snapshot (nothing changes),
        with the copy actions ``copies`` appended to its plan when it fits
        (:func:`~kvchain.alloc.pricing.with_copies`: their bytes are the quote's
        ``copy_bytes``; such a quote is a token for :meth:`take` but never a memo answer).

        The quote is registered as issued by this chain until its epoch moves: only such a
        quote may be passed to :meth:`take`. A repeat (the same demand on the same epoch)
        returns the quote already issued, without running the planner.

        The repeat is answered first, in O(1) (the scheduler asks every step, on a chain
        that mostly did not change): while the snapshot of this epoch is built, no fence
        is pending (its poll could move the epoch) and the evictor's version is the one
        the snapshot read, the registry's :meth:`QuoteRegistry.repeat` serves the quote
        issued for equal pages on that snapshot, with the demand's validation folded into
        the lookup (and the very query answered last, the same pages object on the same
        snapshot, is served from the registry's ``last`` entry by two identity tests).
        Anything else (a first price on the epoch, a pending fence, a moved
        evictor, a demand not seen or not valid) takes the full path below.

        Raises:
            InvalidDemandError: not a Demand, wrong length or negative pages; a bad copy
                (:func:`~kvchain.alloc.pricing.with_copies`).
        """
        if copies:
            base = self.price(demand)
            copying = with_copies(base, copies)
            return copying if copying is base else self._quotes.issue(copying, memo=False)
        snap = self._snap
        if snap is not None and self._fence is None and type(demand) is Demand:
            evictor = self._evictor
            if evictor is None or evictor.version == self._evictor_version:
                priced, pages, quote = self._quotes.last
                if priced is snap and demand.pages is pages and quote is not None:
                    return quote  # the last query again
                quote = self._quotes.repeat(snap, demand.pages)
                if quote is not None:
                    return quote
        self._check_demand(demand)
        snap = self.snapshot()
        quote = self._quotes.issued_for(snap, demand)
        if quote is None:
            quote = self._quotes.issue(self.planner.quote(snap, demand))
        return quote

    def price_pages(self, pages: tuple[int, ...]) -> Quote:
        """:meth:`price` of ``Demand(pages)``, without building the :class:`Demand` when
        this epoch's memo already holds a quote for equal pages: the same pages tuple as
        the last query (an identity test) or an equal tuple of exact ints (the memo's
        lookup by value, :meth:`QuoteRegistry.repeat`). The quote served is the one
        issued, whose ``demand`` is the :class:`Demand` built when it was first priced in
        this epoch (the memo is the chain's own and is emptied with its epoch; nothing is
        kept elsewhere). Any miss builds the demand and takes :meth:`price`'s path, so
        the answer, its validation and its errors are :meth:`price`'s.

        Meant for a caller that holds or rebuilds its demand's pages each time it asks
        (a step total, ``tuple(totals[j].tolist())``): on a hit the ``Demand`` object
        would cost more than the memo's answer.

        Raises:
            InvalidDemandError: ``pages`` not a tuple of non-negative ints, one per band.
        """
        snap = self._snap
        if snap is not None and self._fence is None:  # price's fast path, on pages
            evictor = self._evictor
            if evictor is None or evictor.version == self._evictor_version:
                priced, last, quote = self._quotes.last
                if priced is snap and pages is last and quote is not None:
                    return quote
                quote = self._quotes.repeat(snap, pages)
                if quote is not None:
                    return quote
        return self.price(Demand(pages))

    def bound_pages(self, band: int) -> int:
        """Virtual ids bound in band ``band`` (live pages, null pages included).

        Raises:
            InvalidDemandError: band index out of range.
        """
        return self._bands[self._band_index(band)].live

    def null_page(self, band: int) -> int:
        """Virtual id of band ``band``'s null page (zeros; held by the chain for good).

        Raises:
            InvalidDemandError: band index out of range.
            ReservedPageError: the band reserves no null page.
        """
        vid = self._null[self._band_index(band)]
        if vid is None:
            raise ReservedPageError(f"band {band} ({self.layout.bands[band].label}) "
                                    f"reserves no null page")
        return vid

    def translate(self, band: int, vids: np.ndarray) -> np.ndarray:
        """Physical page indices (int64, same shape as ``vids``) on band ``band``'s grid.

        One vectorized lookup per batch; page ``j`` lies at bytes
        ``[grid_base + j * P, grid_base + (j + 1) * P)``.

        Raises:
            InvalidDemandError: band index out of range.
            UnknownPageError: a non-integer, out-of-range or unbound virtual id.
        """
        b = self._bands[self._band_index(band)]
        v = np.asarray(vids)
        if v.size == 0:
            return np.empty(v.shape, dtype=np.int64)
        if v.dtype.kind not in "iu":
            raise UnknownPageError(f"virtual ids must be integers, got dtype {v.dtype}")
        if int(v.min()) < 0 or int(v.max()) >= b.n_phys:
            raise UnknownPageError(f"band {band}: virtual id outside [0, {b.n_phys})")
        phys = b.v2p[v]
        if (phys < 0).any():
            bad = v[phys < 0].ravel()[:8].tolist()
            raise UnknownPageError(f"band {band}: unbound virtual ids {bad}")
        return phys

    # --- the take path ------------------------------------------------------------------

    def take(self, demand: Demand, quote: Quote | None = None,
             copies: Sequence[CopyPages] = ()) -> Grant:
        """Bind ``demand.pages[i]`` new virtual pages in every band ``i``, all or nothing.

        Args:
            demand: pages per band (state slots for a state band), low -> high.
            quote: a quote that this chain's :meth:`price` returned for ``demand`` on the
                current snapshot (same epoch), realized as priced; ``None`` prices now.
                Quotes are tokens (docs/architecture.md): a quote built by hand, issued by
                another allocator, altered after pricing or priced before the chain
                changed is refused.
            copies: copy actions appended to the plan (:meth:`price` with ``copies``):
                held pages copied into pages this take binds, after they are bound; the
                quote realized (``Grant.quote``) carries them. Pass them here or in the
                quote, not both.

        Returns:
            A :class:`Grant`; afterwards ``snapshot() == grant.quote.after``.

        Raises:
            InvalidDemandError: wrong length, negative or non-integer pages; a bad copy
                (:func:`~kvchain.alloc.pricing.with_copies`), or copies given twice.
            ForgedQuoteError: ``quote`` was not issued by this chain for ``demand``, or
                was altered.
            StaleQuoteError: ``quote`` was priced at an earlier epoch.
            CapacityError: the demand does not fit (shortfall in bytes, reason).
            MovesBlockedError: (hand-written plans only) a copy with the gate closed.
            PlanMismatchError: the plan is impossible on the chain (a bug).

            On every error above the chain is exactly as before (snapshot, epoch, tables,
            bytes, stats): each action of the plan is checked before the first is applied.
        """
        self._check_demand(demand)
        snap = self.snapshot()
        if quote is None:
            quote = self._quotes.issued_for(snap, demand)
            if quote is None:
                quote = with_copies(self.planner.quote(snap, demand), copies)
                return self._realize(demand, quote, verify_predictions=False)
        self._quotes.check(quote, demand, self._epoch)  # a memo hit is checked as well
        return self._realize(demand, with_copies(quote, copies), verify_predictions=False)

    def _realize(self, demand: Demand, quote: Quote, *, verify_predictions: bool) -> Grant:
        """Check every step of ``quote`` against the chain, then apply them (the one take
        path; ``kvchain.testing.unsafe_take_plan`` enters here with hand-written plans and
        ``verify_predictions=True``, which recomputes every predicted snapshot)."""
        snap = self.snapshot()
        if quote.demand != demand or quote.before != snap:
            raise PlanMismatchError(f"quote for {quote.demand.pages} on {quote.before} "
                                    f"realized for {demand.pages} on {snap}")
        if not quote.fits:
            reason = quote.reason.value if quote.reason is not None else "unknown"
            raise CapacityError(
                f"demand {demand.pages} does not fit: short by {quote.shortfall_bytes:,} B "
                f"({reason})", shortfall_bytes=quote.shortfall_bytes, demand=demand,
                reason=reason)
        steps = tuple(quote.steps)
        # Phase 1: every action that can fail is checked on the predicted state before it.
        dry = _DryRun(snap, self._fence is not None, [0] * len(self._bands))
        for n, step in enumerate(steps):
            action = step.action
            check = self._PRECHECK.get(type(action))
            if check is None:
                raise PlanMismatchError(f"step {n}: unknown action {action!r}")
            check(self, action, dry)
            if verify_predictions:
                predicted = plan_apply_action(dry.snap, action)
                if predicted != step.after:
                    raise PlanMismatchError(f"step {n} {action}: the action gives {predicted}, "
                                            f"the plan predicts {step.after}")
            dry.snap = step.after
        if tuple(dry.bound) != demand.pages:
            raise PlanMismatchError(f"plan binds {dry.bound} pages for demand {demand.pages}")
        # Phase 2: apply; a chain off the prediction now is a bug of the executor.
        taken: list[list[np.ndarray]] = [[] for _ in self._bands]
        audit = self.audit_takes
        for n, step in enumerate(steps):
            action = step.action
            if audit and isinstance(action, Evict) and self._evictor is not None:
                self._evictor.eviction_order().materialize()  # comparable after it moves
            if isinstance(action, CopyPages):  # its destinations: this take's new ids
                got = taken[action.band]
                new = np.concatenate(got) if got else np.empty(0, dtype=np.int64)
                vids = self._apply(_Copy(action.band, np.asarray(action.src, dtype=np.int64),
                                         new[list(action.dst)]))
            else:
                vids = self._apply(action)
            if vids is not None and isinstance(action, UseHoles | Extend):
                taken[action.band].append(vids)
            if audit:
                fresh = self._build_snapshot()
                if fresh != step.after:
                    raise PlanMismatchError(f"step {n} {action}: chain {fresh} != predicted "
                                            f"{step.after}")
            else:
                self._check_counters(n, action, step.after)
        pages = tuple(tuple(np.concatenate(parts).tolist()) if parts else ()
                      for parts in taken)
        self._takes += 1
        self._after_public_call()
        return Grant(quote, pages)

    def _check_counters(self, n: int, action: Action, after: ChainSnapshot) -> None:
        """The O(bands) check after action ``n`` of a take: every band's frontiers, counts,
        gate and fence flags equal the predicted ones, and the evictable supply's unit
        count and total pages per band equal the predicted order's (the full rebuild and
        row-by-row comparison runs under the audit flag).

        Raises:
            PlanMismatchError: naming the first field off the prediction.
        """
        movable, pending = self._gate_open, self._fence is not None
        for i, (b, want) in enumerate(zip(self._bands, after.bands, strict=True)):
            if (b.lo != want.lo or b.hi != want.hi or b.live != want.live
                    or b.holes != want.holes or want.movable is not movable
                    or want.fence_pending is not pending):
                have = b.snapshot(movable, pending)
                raise PlanMismatchError(f"step {n} {action}: band {i} is {have}, predicted "
                                        f"{want}")
        evictor = self._evictor
        predicted = after.evictable
        if evictor is None:
            if predicted.units:
                raise PlanMismatchError(f"step {n} {action}: no evictor, predicted "
                                        f"{predicted}")
            return
        if evictor.version == self._evictor_version and not isinstance(action, Evict):
            return  # the evictor did not move: its order is the snapshot's, as predicted
        order = self._checked_order()
        units = order.units
        if units != predicted.units or (units and order.freed(units)
                                        != predicted.freed(predicted.units)):
            raise PlanMismatchError(f"step {n} {action}: the evictor offers {order}, "
                                    f"predicted {predicted}")

    # --- per-action pre-checks (phase 1 of a take; nothing changes) --------------------

    def _pre_band(self, action: UseHoles | Extend | Compact | Relocate) -> Band:
        band = action.band
        if isinstance(band, bool) or not isinstance(band, int) or not (
                0 <= band < len(self._bands)):
            raise PlanMismatchError(f"{action}: no band {band!r}")
        return self._bands[band]

    def _pre_use_holes(self, action: UseHoles, dry: _DryRun) -> None:
        self._pre_band(action)
        if not 0 < action.pages <= dry.snap.bands[action.band].holes:
            raise PlanMismatchError(f"{action}: the band has "
                                    f"{dry.snap.bands[action.band].holes} holes")
        dry.bound[action.band] += action.pages

    def _pre_extend(self, action: Extend, dry: _DryRun) -> None:
        self._pre_band(action)
        plan_apply_action(dry.snap, action)  # cap, side and neighbours' bytes
        dry.bound[action.band] += action.pages

    def _pre_compact(self, action: Compact, dry: _DryRun) -> None:
        self._pre_band(action)
        self._pre_may_move(action, dry)
        plan_apply_action(dry.snap, action)  # side and holes

    def _pre_relocate(self, action: Relocate, dry: _DryRun) -> None:
        b = self._pre_band(action)
        if b.anchor is not Anchor.FLOAT:
            raise PlanMismatchError(f"{action}: only the FLOAT relocates")
        if dry.snap.bands[action.band].live:  # an empty float copies nothing
            self._pre_may_move(action, dry)
        if (action.lo - b.grid_base) % b.page_bytes:
            raise PlanMismatchError(f"Relocate to byte {action.lo}: off the "
                                    f"{b.page_bytes}-byte grid")
        plan_apply_action(dry.snap, action)  # packed span inside the gaps

    def _pre_evict(self, action: Evict, dry: _DryRun) -> None:
        if self._evictor is None:
            raise PlanMismatchError(f"{action}: no evictor is attached")
        if not dry.order_checked:
            # Nothing is evicted in phase 1, so the cache's live order must still be the
            # one this take's snapshot carries (the prediction before the first step).
            start = self._snap if self._snap is not None else self.snapshot()
            if self._checked_order() != start.evictable:
                # The order moved without a version bump (a broken Evictor): evicting now
                # would free other pages than priced. Refused before anything changes.
                raise PlanMismatchError(f"{action}: the evictor's order changed since the "
                                        f"snapshot without a version bump")
            dry.order_checked = True
        plan_apply_action(dry.snap, action)  # units within the order, pages live

    def _pre_wait_fence(self, action: WaitFence, dry: _DryRun) -> None:
        dry.fence_pending = False

    def _pre_copy(self, action: CopyPages, dry: _DryRun) -> None:
        """A copy's sources are pages held now (bound, not a null page) and its
        destinations positions among the pages the plan binds in the band before it.
        No gate or fence check: it moves no held page and writes only a page this take
        binds (:class:`~kvchain.alloc.snapshot.CopyPages`)."""
        band = action.band
        if isinstance(band, bool) or not isinstance(band, int) or not (
                0 <= band < len(self._bands)):
            raise PlanMismatchError(f"{action}: no band {band!r}")
        b = self._bands[band]
        src = np.asarray(action.src, dtype=np.int64)
        if (not src.size or src.size != len(action.dst) or int(src.min()) < 0
                or int(src.max()) >= b.n_phys or (b.v2p[src] < 0).any()
                or (self._null[band] is not None and (src == self._null[band]).any())):
            raise PlanMismatchError(f"{action}: its sources are not held pages of band {band}")
        if any(not 0 <= d < dry.bound[band] for d in action.dst) or \
                len(set(action.dst)) != len(action.dst):
            raise PlanMismatchError(f"{action}: destinations outside the {dry.bound[band]} "
                                    f"pages the plan binds in band {band} before it")
        plan_apply_action(dry.snap, action)

    def _pre_may_move(self, action: Compact | Relocate, dry: _DryRun) -> None:
        if not self._gate_open:
            raise MovesBlockedError(f"{action}: the move gate is closed")
        if dry.fence_pending:
            raise PlanMismatchError(f"{action}: copy planned while a forward's fence is "
                                    f"pending and no WaitFence came first")

    _PRECHECK: ClassVar[dict[type, Callable[[Chain, Any, _DryRun], None]]] = {
        UseHoles: _pre_use_holes,
        Extend: _pre_extend,
        Compact: _pre_compact,
        Relocate: _pre_relocate,
        WaitFence: _pre_wait_fence,
        Evict: _pre_evict,
        CopyPages: _pre_copy,
    }

    def release(self, band: int, vids: Sequence[int] | np.ndarray) -> None:
        """Return virtual pages of band ``band``; their physical pages become holes.

        The span never shrinks on release (compaction is lazy). All ids are validated
        first; on error nothing changes. One epoch bump per call (none for no ids).

        Raises:
            InvalidDemandError: band index out of range.
            UnknownPageError: ``vids`` not a flat sequence of integer ids (:func:`page_ids`:
                a nested, 2-D or ragged one is refused, never flattened), an out-of-range
                id, or one never taken.
            DoubleReleaseError: an id given twice in the call, or already released.
            ReservedPageError: a null page of the chain.
        """
        i = self._band_index(band)
        b = self._bands[i]
        v = page_ids(band, vids)
        if v.size == 0:
            return
        null = self._null[i]
        small = v.size <= 64  # most releases: a few pages; Python sets beat numpy calls here
        ids = v.tolist() if small else None
        if ids is not None:
            out_of_range = min(ids) < 0 or max(ids) >= b.n_phys
            twice = len(set(ids)) != len(ids)
        else:
            out_of_range = int(v.min()) < 0 or int(v.max()) >= b.n_phys
            twice = np.unique(v).size != v.size
        if out_of_range:
            raise UnknownPageError(f"band {band}: virtual id outside [0, {b.n_phys})")
        if twice:
            raise DoubleReleaseError(f"band {band}: an id appears twice in one release")
        unbound = b.v2p[v] < 0
        if unbound.any():
            never = unbound & ~b.was_bound[v]
            if never.any():
                raise UnknownPageError(f"band {band}: ids never taken {v[never][:8].tolist()}")
            raise DoubleReleaseError(f"band {band}: ids already released "
                                     f"{v[unbound][:8].tolist()}")
        if null is not None and (null in ids if ids is not None else bool((v == null).any())):
            raise ReservedPageError(f"band {band}: the null page {null} is held by the chain")
        self._apply(_Release(i, v.copy()))
        self._releases += 1
        self._after_public_call()

    # --- gate, pins, fences -------------------------------------------------------------

    def set_move_gate(self, open: bool, *, realize_moves: bool = True) -> GateState:
        """Open or close the move gate (e.g. closed while a KV transfer reads pages).

        Closing while :class:`MovePin` s are held is deferred: the request is recorded
        (``close_pending``) and applied when the last pin is released, so a plan with moves
        that admission relied on stays realizable (contract 6, field case F13). Opening
        cancels a pending close.

        Before it closes, the gate realizes what moves can do now (``realize_moves``, the
        default): :meth:`flush_idle` compacts the ENDs and the float, so the holes that
        admission's reservations could reach by compaction become gap that in-place plans
        reach with the gate closed (on a two-END chain, in-place room then equals room with
        moves). Pass ``realize_moves=False`` to close as is.

        Returns:
            The gate after the request (``open`` stays True while a close is pending).
        """
        if open:
            self._close_pending = False
            if not self._gate_open:
                self._apply(_SetGate(True))
        elif self._gate_open:
            if self._pins > 0:
                self._close_pending = True
                self._close_realizes = realize_moves
            else:
                self._close_gate(realize_moves)
        self._after_public_call()
        return self.gate

    def pin_moves(self) -> MovePin:
        """Hold the move gate open against closing (deferred while any pin is held).

        Admission pins moves when it admits work priced with a plan that needs moves; the
        allocation releases the pin right after its :meth:`take`. A pin does not reopen a
        gate that is already closed.
        """
        self._pins += 1
        return MovePin(self)

    def _unpin(self) -> None:
        self._pins -= 1
        if self._pins == 0 and self._close_pending:
            self._close_pending = False
            self._close_gate(self._close_realizes)
            self._after_public_call()

    def _close_gate(self, realize_moves: bool) -> None:
        if realize_moves:
            self.flush_idle()
        self._apply(_SetGate(False))

    def begin_forward(self, fence: Fence) -> None:
        """Register the fence of a forward pass just launched (it may write pages of its
        batch until the fence completes).

        While it is pending every band reports ``fence_pending`` and a plan that copies
        starts with ``WaitFence``. A later fence supersedes an earlier one (forwards run in
        stream order). A fence already complete changes nothing but clearing an older one.
        """
        if fence.query():
            if self._fence is not None:
                self._apply(_FenceDone())
        elif self._fence is None:
            self._apply(_BeginForward(fence))
        else:
            self._fence = fence  # still pending: the snapshot does not change
        self._after_public_call()

    def flush_idle(self) -> int:
        """Opportunistic compaction when the engine is idle; returns pages copied.

        Only while the gate is open: waits for a pending fence, compacts every END's holes
        fully (frontier toward its anchor), and the FLOAT's holes by moving its pages down
        (its ``hi`` retreats, freeing the high gap for the END above). Nothing happens
        with the gate closed.
        """
        if not self._gate_open:
            return 0
        before = self._pages_copied
        if self._fence is not None:
            self._apply(WaitFence())
        for i, b in enumerate(self._bands):
            if b.holes == 0:
                continue
            side = Side.LOW if b.anchor is Anchor.HIGH else Side.HIGH
            self._apply(Compact(i, side, b.holes))
        self._after_public_call()
        return self._pages_copied - before

    # --- the one mutation path ----------------------------------------------------------

    def _apply(self, action: _Mutation) -> np.ndarray | None:
        """Perform one action and bump the epoch; returns new virtual ids for UseHoles and
        Extend. Raises before changing anything when the action is impossible.

        Dispatches on the action's type to one apply function per kind (``_APPLY``); a
        new plan action adds its apply function here and its check to ``_PRECHECK``."""
        apply = self._APPLY.get(type(action))
        if apply is None:
            raise PlanMismatchError(f"unknown action {action!r}")
        result = apply(self, action)
        # a band's own action touched that band only; the others (Evict, the gate, the
        # fence) every band
        self._parts.touch(getattr(action, "band", None))
        self._new_epoch()
        return result

    def _apply_evict(self, action: Evict) -> None:
        """Have the evictor give up its first ``units`` units and release their pages.

        The freed ids are validated (bound, distinct, not a null page, as many per band as
        the order said) before any is released; the evictor has already forgotten them, so
        a bad answer is a bug of the cache (:class:`PlanMismatchError`), never a refusal.
        """
        if self._evictor is None:
            raise PlanMismatchError(f"{action}: no evictor is attached")
        expected = self._evictor.eviction_order().freed(action.units)
        ids = self._evicted_ids(str(action), action.units, expected)
        for b, v in zip(self._bands, ids, strict=True):
            if v.size:
                b.release(v)
                self._evicted_pages += int(v.size)

    def _holds(self, band: int, ids: np.ndarray) -> bool:
        b, null = self._bands[band], self._null[band]
        return not (int(ids.min()) < 0 or int(ids.max()) >= b.n_phys
                    or (b.v2p[ids] < 0).any() or np.unique(ids).size != ids.size
                    or (null is not None and (ids == null).any()))

    def _apply_use_holes(self, action: UseHoles) -> np.ndarray:
        return self._bands[action.band].use_holes(action.pages)

    def _apply_compact(self, action: Compact) -> None:
        b = self._bands[action.band]
        self._check_may_move(action)
        self._move(b, b.compact_moves(action.side, action.pages))
        self._compactions += 1

    def _apply_wait_fence(self, action: WaitFence) -> None:
        if self._fence is not None:
            self._fence.wait()
            self._fence = None
        self._fence_waits += 1

    def _apply_copy(self, action: _Copy) -> None:
        """Copy the resolved sources into the resolved destinations through the buffer's
        one copy path (as a move copies), counted in ``copies`` / ``copy_bytes``.

        Raises:
            PlanMismatchError: a source no longer held (the plan's ``Evict`` freed it: an
                evictor that gave up a page a running request references), before any
                byte is copied.
        """
        b = self._bands[action.band]
        src = b.v2p[action.src]
        if (src < 0).any():
            raise PlanMismatchError(f"copy of band {action.band} ids "
                                    f"{action.src[src < 0][:8].tolist()}: freed before the "
                                    f"copy ran (evicted while referenced)")
        n = int(src.size)
        self.buffer.copy_pages(b.layout, src, b.v2p[action.dst])
        self._copies += n
        self._copy_bytes += n * b.page_bytes

    def _apply_release(self, action: _Release) -> None:
        self._bands[action.band].release(action.vids)

    def _apply_set_gate(self, action: _SetGate) -> None:
        self._gate_open = action.open

    def _apply_begin_forward(self, action: _BeginForward) -> None:
        self._fence = action.fence

    def _apply_fence_done(self, action: _FenceDone) -> None:
        self._fence = None

    def _extend(self, action: Extend) -> np.ndarray:
        i = action.band
        b = self._bands[i]
        a, z = b.extend_range(action.side, action.pages)
        lo, hi = b.grid_base + a * b.page_bytes, b.grid_base + z * b.page_bytes
        floor, ceiling = self._free_limits(i)
        if lo < floor or hi > ceiling:
            raise PlanMismatchError(f"Extend {action} needs bytes [{lo}, {hi}) outside the "
                                    f"free range [{floor}, {ceiling})")
        return b.extend(action.side, action.pages)

    def _relocate(self, action: Relocate) -> None:
        i = action.band
        b = self._bands[i]
        if b.anchor is not Anchor.FLOAT:
            raise PlanMismatchError(f"{action}: only the FLOAT relocates")
        if b.live:  # an empty float copies nothing: no gate, no fence
            self._check_may_move(action)
        if (action.lo - b.grid_base) % b.page_bytes:
            raise PlanMismatchError(f"Relocate to byte {action.lo}: off the "
                                    f"{b.page_bytes}-byte grid")
        lo_idx = (action.lo - b.grid_base) // b.page_bytes
        floor, ceiling = self._free_limits(i)
        if action.lo < floor or action.lo + b.live * b.page_bytes > ceiling:
            raise PlanMismatchError(f"Relocate {action}: packed span outside "
                                    f"[{floor}, {ceiling})")
        self._move(b, b.relocate_moves(lo_idx))
        self._relocations += 1

    _APPLY: ClassVar[dict[type, Callable[[Chain, Any], np.ndarray | None]]] = {
        UseHoles: _apply_use_holes,
        Extend: _extend,
        Compact: _apply_compact,
        Relocate: _relocate,
        WaitFence: _apply_wait_fence,
        Evict: _apply_evict,
        _Copy: _apply_copy,
        _Release: _apply_release,
        _SetGate: _apply_set_gate,
        _BeginForward: _apply_begin_forward,
        _FenceDone: _apply_fence_done,
    }

    def _free_limits(self, i: int) -> tuple[int, int]:
        """Bytes band ``i`` may occupy: from its lower neighbour's ``hi`` (or 0) to its
        upper neighbour's ``lo`` (or B)."""
        floor = self._bands[i - 1].hi if i > 0 else 0
        ceiling = self._bands[i + 1].lo if i + 1 < len(self._bands) else self.layout.buffer_bytes
        return floor, ceiling

    def _check_may_move(self, action: Compact | Relocate) -> None:
        if not self._gate_open:
            raise MovesBlockedError(f"{action}: the move gate is closed")
        if self._fence is not None:
            raise PlanMismatchError(f"{action}: copy planned while a forward's fence is "
                                    f"pending and no WaitFence came first")

    def _move(self, b: Band, moves: PageMoves) -> None:
        n = int(moves.src.size)
        if n:
            self.buffer.copy_pages(b.layout, moves.src, moves.dst)
        b.apply_moves(moves)
        self._pages_copied += n
        self._bytes_copied += n * b.page_bytes

    # --- helpers ------------------------------------------------------------------------

    def _new_epoch(self) -> None:
        """Bump the capacity epoch: the cached snapshot and every quote issued on it (the
        price memo included) are dropped."""
        self._epoch += 1
        self._snap = None
        self._quotes.clear()

    def _build_snapshot(self) -> ChainSnapshot:
        movable, pending = self._gate_open, self._fence is not None
        bands = tuple(b.snapshot(movable, pending) for b in self._bands)
        if self._evictor is None:
            return ChainSnapshot(self.layout.buffer_bytes, bands, self._epoch)
        return ChainSnapshot(self.layout.buffer_bytes, bands, self._epoch,
                             self._checked_order())

    def _band_index(self, band: int) -> int:
        if not is_whole(band) or not 0 <= band < len(self._bands):
            raise InvalidDemandError(f"band index {band!r} not in [0, {len(self._bands)})")
        return int(band)

    def _check_demand(self, demand: Demand) -> None:
        check_demand(demand, len(self._bands))

    def _after_public_call(self) -> None:
        if self.debug_audit:
            self.audit()

    # --- integrity ----------------------------------------------------------------------

    def audit(self) -> None:
        """Check the chain's integrity (idle time; tests after every operation).

        Checks: bands ordered and disjoint inside ``[0, B]``; ENDs at their anchors;
        ``span == live + holes``; live == pages with ``p2v >= 0`` in the span and none
        outside; the hole map == free slots of the span (and its block summary);
        ``v2p``/``p2v`` a bijection on bound pages; the free-id stack == unbound ids; null
        pages bound; the cached snapshot equals a freshly built one, and so does every
        band snapshot kept for the next incremental build.

        Raises:
            AuditError: naming the first thing found wrong.
        """
        big = self.layout.buffer_bytes
        prev_hi = 0
        for i, b in enumerate(self._bands):
            name = f"band {i} ({b.layout.label})"
            if not 0 <= b.lo_idx <= b.hi_idx <= b.n_phys:
                raise AuditError(f"{name}: span [{b.lo_idx}, {b.hi_idx}) outside the grid")
            if b.lo < prev_hi:
                raise AuditError(f"{name}: lo {b.lo} overlaps the band below (hi {prev_hi})")
            if b.hi > big:
                raise AuditError(f"{name}: hi {b.hi} beyond the buffer {big}")
            prev_hi = b.hi
            if b.anchor is Anchor.LOW and b.lo != 0:
                raise AuditError(f"{name}: LOW END lo {b.lo} != 0")
            if b.anchor is Anchor.HIGH and b.hi != big:
                raise AuditError(f"{name}: HIGH END hi {b.hi} != B {big}")
            if (b.lo - b.grid_base) % b.page_bytes or (b.hi - b.grid_base) % b.page_bytes:
                raise AuditError(f"{name}: frontiers off the grid")
            if b.live < 0 or b.holes < 0 or b.span != b.live + b.holes:
                raise AuditError(f"{name}: span {b.span} != live {b.live} + holes {b.holes}")
            live_mask = b.p2v >= 0
            in_span = int(live_mask[b.lo_idx:b.hi_idx].sum())
            if in_span != b.live:
                raise AuditError(f"{name}: {in_span} live slots in span, counter {b.live}")
            if int(live_mask.sum()) != in_span:
                raise AuditError(f"{name}: a live page lies outside the span")
            expected_holes = np.zeros(b.n_phys, dtype=bool)
            expected_holes[b.lo_idx:b.hi_idx] = ~live_mask[b.lo_idx:b.hi_idx]
            if not np.array_equal(expected_holes, b.is_hole):
                raise AuditError(f"{name}: hole map differs from the free slots of the span")
            if not np.array_equal(b.block_holes, b._hole_blocks.sum(axis=1)):
                raise AuditError(f"{name}: hole block summary is stale")
            bound = np.flatnonzero(b.v2p >= 0)
            if bound.size != b.live:
                raise AuditError(f"{name}: {bound.size} bound ids, {b.live} live pages")
            if not np.array_equal(b.p2v[b.v2p[bound]], bound):
                raise AuditError(f"{name}: v2p/p2v not inverse on bound ids")
            live_phys = np.flatnonzero(live_mask)
            if not np.array_equal(b.v2p[b.p2v[live_phys]], live_phys):
                raise AuditError(f"{name}: p2v/v2p not inverse on live pages")
            free = np.sort(b.free_vids())
            if not np.array_equal(free, np.flatnonzero(b.v2p < 0)):
                raise AuditError(f"{name}: free-id stack differs from the unbound ids")
            null = self._null[i]
            if null is not None and b.v2p[null] < 0:
                raise AuditError(f"{name}: null page {null} unbound")
        evictor_moved = (self._evictor is not None
                         and self._evictor.version != self._evictor_version)
        if self._snap is not None and not evictor_moved:  # else stale by design, rebuilt lazily
            fresh = self._build_snapshot()
            if self._snap != fresh or self._snap.epoch != self._epoch:
                raise AuditError(f"cached snapshot {self._snap} != fresh {fresh}")
        stale = self._parts.stale(self._bands, self._gate_open, self._fence is not None)
        if stale:
            raise AuditError(f"kept band snapshots of bands {stale} are stale (a change "
                             f"that did not touch them)")
