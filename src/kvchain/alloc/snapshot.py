"""Snapshots, demands, plan actions and quotes: the value objects of pricing.

A :class:`ChainSnapshot` holds counts and byte frontiers only, never hole positions, so
every capacity decision is a pure function of ``O(bands)`` numbers.

Band geometry in a snapshot (bytes, half-open span ``[lo, hi)``)::

    LOW END   lo = 0,  hi = span * P           grows up at hi
    FLOAT     lo, hi multiples of P            grows at either side
    HIGH END  hi = B,  lo = B - span * P       grows down at lo

    span = live + holes  (pages);  the null pages are live pages held by the chain.

Plan actions (all page counts > 0), each paired with the predicted snapshot after it:

================  =========================================================================
``UseHoles``      band takes ``pages`` of its holes in place: live += k, holes -= k.
``Extend``        band grows by ``pages`` new pages at ``side`` (an END only at its
                  frontier side: LOW END -> HIGH, HIGH END -> LOW): live += k, span += k.
``Compact``       band moves live pages into holes so that the frontier at ``side``
                  retreats by ``pages``: holes -= k, span -= k. Copies at most k pages
                  (fewer when holes already lie at that frontier). LOW END side HIGH,
                  HIGH END side LOW; a FLOAT either side (HIGH: ``hi`` retreats).
``Relocate``      FLOAT only: live pages move to the packed span ``[lo, lo + live * P)``
                  (``lo`` a multiple of P): holes = 0. Copies at most ``live`` pages.
``WaitFence``     wait for the in-flight forward's fence before any copy; clears
                  ``fence_pending`` on every band.
``Evict``         the prefix cache gives up its first ``units`` eviction units (see
                  :class:`EvictionOrder`): on every band ``i``, ``freed[i]`` live pages
                  become holes (live -= freed, holes += freed; frontiers stay). No copy.
``CopyPages``     copy held pages ``src`` of a band into pages this take binds (positions
                  ``dst`` in the band's grant): the prefix cache's state checkpoint copied
                  into a request's new working slot on a hit. No count or frontier
                  changes (the predicted snapshot is the one before it); copies
                  ``len(src)`` pages.
================  =========================================================================

Execution order inside a plan is always: ``Evict``; ``WaitFence``; ``Compact`` of ENDs;
``Compact``/``Relocate`` of the float; ``UseHoles``; ``Extend``; ``CopyPages`` - so every
move happens before any new page is handed out, every extension lands on free bytes, and
a copy's destinations are bound before it runs.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final, Protocol, overload

from kvchain.errors import InvalidDemandError, PlanMismatchError
from kvchain.layout import Anchor


class Side(StrEnum):
    """A side of a band: ``LOW`` (toward byte 0) or ``HIGH`` (toward byte B)."""

    LOW = "low"
    HIGH = "high"


@dataclass(frozen=True, slots=True, init=False)
class BandSnapshot:
    """Counts and frontiers of one band.

    Attributes:
        label: lifetime label (``"state"``, ``"window"``, ``"local"``, ``"full"``).
        anchor: LOW, HIGH or FLOAT.
        page_bytes: ``P_X`` bytes per page.
        lo: low frontier, bytes (inclusive).
        hi: high frontier, bytes (exclusive).
        live: pages bound to virtual ids (null pages included).
        holes: free pages inside ``[lo, hi)``.
        cap: index-space cap, pages (the span may not exceed it).
        movable: the move gate is open (pages may be copied at all).
        fence_pending: an in-flight forward may still write pages; a copy must first wait
            for its fence (an action ``WaitFence``).
    """

    label: str
    anchor: Anchor
    page_bytes: int
    lo: int
    hi: int
    live: int
    holes: int
    cap: int
    movable: bool = True
    fence_pending: bool = False

    def __init__(self, label: str, anchor: Anchor, page_bytes: int, lo: int, hi: int,
                 live: int, holes: int, cap: int, movable: bool = True,
                 fence_pending: bool = False) -> None:
        """Store the fields (no validation: a chain's bands are consistent by
        construction, :meth:`~kvchain.alloc.chain.Chain.audit` checks them). The slots'
        own setters replace the frozen dataclass's ``object.__setattr__`` call per field,
        about half the cost (a chain builds one per touched band per capacity epoch, the
        planner one per band an action changes)."""
        _b_label(self, label)
        _b_anchor(self, anchor)
        _b_page_bytes(self, page_bytes)
        _b_lo(self, lo)
        _b_hi(self, hi)
        _b_live(self, live)
        _b_holes(self, holes)
        _b_cap(self, cap)
        _b_movable(self, movable)
        _b_fence(self, fence_pending)

    @property
    def span(self) -> int:
        """Pages in ``[lo, hi)``: ``live + holes``."""
        return (self.hi - self.lo) // self.page_bytes

    @property
    def free_index_room(self) -> int:
        """Pages the span may still grow by under the index-space cap."""
        return self.cap - self.span


(_b_label, _b_anchor, _b_page_bytes, _b_lo, _b_hi, _b_live, _b_holes, _b_cap, _b_movable,
 _b_fence) = (BandSnapshot.__dict__[f].__set__ for f in (
    "label", "anchor", "page_bytes", "lo", "hi", "live", "holes", "cap", "movable",
    "fence_pending"))  # the slots' own setters, for BandSnapshot.__init__


class BandSource(Protocol):
    """What :class:`SnapshotParts` reads a band's snapshot from (a chain's
    :class:`~kvchain.alloc.band.Band`)."""

    def snapshot(self, movable: bool, fence_pending: bool) -> BandSnapshot:
        """The band's counts and frontiers now."""
        ...


class SnapshotParts:
    """The parts of a chain's snapshot kept between its capacity epochs: its band
    snapshots and the evictor's order (with the version it was read at), the incremental
    part of a snapshot's build.

    A chain's epoch moves on every change a snapshot can see, but most changes touch one
    band (a take's ``UseHoles`` / ``Extend`` / ``Compact`` / ``Relocate`` of band ``i``, a
    release of band ``i``); the gate, the fence and an eviction touch every band. The
    chain calls :meth:`touch` with what each change touched, and :meth:`bands` rebuilds
    only those bands' snapshots (each band's own ``snapshot(movable, fence_pending)``),
    reusing the others': O(touched bands) snapshot builds, O(bands) in all.

    A change the chain forgets to :meth:`touch` leaves a stale band snapshot; the chain's
    audit flag compares every built snapshot with one built from scratch
    (:meth:`~kvchain.alloc.chain.Chain.snapshot`), and :meth:`stale` lists the clean
    bands whose kept snapshot differs from the band now (:meth:`Chain.audit`).

    The order is kept as :attr:`order`, ``(evictor version, its order)`` or ``None``: an
    :class:`~kvchain.alloc.evictor.Evictor` returns the same order for the same version,
    so the chain asks again only when the version moved (and forgets it with its
    evictor).

    Args:
        num_bands: bands of the chain (every band starts touched: nothing is kept yet).
    """

    __slots__ = ("_dirty", "_kept", "order")

    def __init__(self, num_bands: int) -> None:
        self._kept: list[BandSnapshot | None] = [None] * num_bands
        self._dirty: set[int] = set(range(num_bands))
        self.order: tuple[int, EvictionOrder] | None = None

    def touch(self, band: int | None) -> None:
        """Mark band ``band`` changed (``None``: every band), so the next :meth:`bands`
        rebuilds its snapshot. O(1); an index outside the chain marks nothing (the
        chain validates its band indices before it changes a band)."""
        if band is None:
            self._dirty.update(range(len(self._kept)))
        else:
            self._dirty.add(band)

    def bands(self, sources: Sequence[BandSource], movable: bool,
              fence_pending: bool) -> tuple[BandSnapshot, ...]:
        """The band snapshots now, low -> high: the touched bands' rebuilt from
        ``sources`` (one per band, same order), the others' reused; nothing is touched
        afterwards."""
        kept = self._kept
        dirty = self._dirty
        if dirty:
            for i in dirty:
                if i < len(kept):
                    kept[i] = sources[i].snapshot(movable, fence_pending)
            dirty.clear()
        return tuple(kept)  # type: ignore[arg-type]  # every band built once at least

    def stale(self, sources: Sequence[BandSource], movable: bool,
              fence_pending: bool) -> list[int]:
        """The untouched bands whose kept snapshot differs from their snapshot now
        (should be none: a change that was not touched). Pure; O(bands)."""
        kept = self._kept
        return [i for i, src in enumerate(sources)
                if i not in self._dirty and kept[i] is not None
                and kept[i] != src.snapshot(movable, fence_pending)]


class _OrderRows:
    """The rows of one published eviction order, shared by the order and its suffix views:
    the rows known so far, the unit count and the last row (known from the start), and
    the source of the rest (``None`` once every row is known).

    ``grow(rows)`` appends the next cumulative row to ``rows`` or raises
    :class:`~kvchain.errors.PlanMismatchError` (a source whose state moved on since it
    published the order: a stale order's unknown rows are gone for good).
    """

    __slots__ = ("grow", "rows", "total", "units", "weights")

    def __init__(self, rows: list[tuple[int, ...]], units: int, total: tuple[int, ...],
                 grow: Callable[[list[tuple[int, ...]]], None] | None) -> None:
        self.rows = rows
        self.units = units
        self.total = total
        self.grow = grow
        self.weights: dict[tuple[int, ...], list[int]] = {}

    def row(self, j: int) -> tuple[int, ...]:
        """Cumulative row ``j`` (``0 <= j <= units``), growing the known rows to it.

        Raises:
            PlanMismatchError: the source cannot produce it (stale), or it produced a row
                that decreases, has another width, or ends off the published last row.
        """
        rows = self.rows
        if j < len(rows):
            return rows[j]
        if j == self.units:
            return self.total
        return self._grow_to(j)

    def fill(self) -> None:
        """Grow every row (O(units) once; nothing for a complete order)."""
        if self.grow is not None:
            self._grow_to(self.units)

    def _grow_to(self, j: int) -> tuple[int, ...]:
        rows = self.rows
        grow = self.grow
        if grow is None:  # pragma: no cover - a complete order knows every row
            raise PlanMismatchError(f"row {j} of an order of {self.units} units")
        while len(rows) <= j:
            prev = rows[-1]
            grow(rows)
            new = rows[-1]
            if len(rows) > self.units + 1 or len(new) != len(prev) or any(
                    b < a for a, b in zip(prev, new, strict=True)):
                raise PlanMismatchError(f"the evictor's order grew a bad row {new} after "
                                        f"{prev} (row {len(rows) - 1} of {self.units})")
        if len(rows) == self.units + 1:
            self.grow = None
            if rows[-1] != self.total:
                raise PlanMismatchError(f"the evictor's walk frees {rows[-1]} in "
                                        f"{self.units} units, its counters said {self.total}")
        return rows[j]

    def known(self, j: int) -> tuple[int, ...] | None:
        """Row ``j`` if it is known or can still be grown, else ``None`` (stale)."""
        try:
            return self.row(j)
        except PlanMismatchError:
            return None


class EvictionOrder:
    """What a prefix cache can free, in the order it would free it: the evictable supply.

    The cache (above the chain) publishes its eviction units - an unlocked leaf with all
    the pages and state slot it still holds, a window tombstoning, a checkpoint drop - in
    the exact order it would evict them (its LRU walk simulated, a parent that becomes a
    leaf included), as cumulative page counts per band.

    Attributes:
        cumulative: ``units + 1`` rows of one int per band (low -> high);
            ``cumulative[k][i]`` = pages (state slots for a state band) of band ``i``
            freed by the first ``k`` units. Row 0 is all zeros; rows never decrease.

    Evicting the first ``k`` units leaves the suffix order (:meth:`after`): the cache's
    walk goes on where it stopped, which is what makes the planner's prediction exact.
    Internally an order is a view (shared rows and a start row), so :meth:`after`,
    :attr:`units` and ``freed(units)`` cost O(bands), not O(units).

    An order is either given whole (the constructor, :meth:`from_units`) or *lazy*
    (:meth:`lazy`): the source publishes its unit count and last row (counters it keeps)
    and produces the rows one by one as they are asked for, so the planner's question
    "the least prefix that frees ``n`` bytes" (:meth:`least_units_freeing`) walks only
    that prefix. A lazy order is valid while its source has not changed; rows asked for
    after that raise :class:`~kvchain.errors.PlanMismatchError`.

    Equality: equal unit counts and equal rows. Two views of the same published rows and
    start are equal at once; otherwise units and last rows are compared first (O(bands))
    and then the rows one by one. A comparison that needs a row a stale lazy order can no
    longer produce answers *unequal* (a dictionary keyed on snapshots then misses: never
    a wrong hit). Hash: the unit count and the last row (O(bands)).

    Raises:
        InvalidDemandError: rows of different lengths, a first row that is not zero, a
            negative or decreasing count, or a non-int entry.
    """

    __slots__ = ("_core", "_rebased", "_start")

    def __init__(self, cumulative: tuple[tuple[int, ...], ...] = ((),)) -> None:
        rows = cumulative
        if type(rows) is not tuple or not rows or any(type(r) is not tuple for r in rows):
            raise InvalidDemandError("an eviction order is a non-empty tuple of tuples")
        width = len(rows[0])
        if any(v != 0 for v in rows[0]):
            raise InvalidDemandError(f"an eviction order starts at zero, got {rows[0]}")
        prev = rows[0]
        for row in rows[1:]:
            if len(row) != width:
                raise InvalidDemandError("eviction order rows differ in length")
            for a, b in zip(prev, row, strict=True):
                if type(b) is not int or b < a:
                    raise InvalidDemandError(
                        f"eviction order counts must be non-decreasing ints, got {row}")
            prev = row
        self._core = _OrderRows(list(rows), len(rows) - 1, rows[-1], None)
        self._start = 0
        self._rebased: tuple[tuple[int, ...], ...] | None = rows

    @classmethod
    def lazy(cls, units: int, total: tuple[int, ...],
             grow: Callable[[list[tuple[int, ...]]], None]) -> EvictionOrder:
        """An order of ``units`` units freeing ``total`` pages per band in all, whose rows
        ``grow(rows)`` appends one at a time (row 0 is zeros) when they are first asked
        for; no units gives the canonical empty order.

        Raises:
            InvalidDemandError: a negative unit count, or a total that is not
                non-negative ints (zeros for no units).
        """
        if type(units) is not int or units < 0 or type(total) is not tuple or any(
                type(v) is not int or v < 0 for v in total):
            raise InvalidDemandError(f"a lazy order needs units >= 0 and a total of "
                                     f"non-negative ints, got {units!r}, {total!r}")
        if not units:
            if any(total):
                raise InvalidDemandError(f"no eviction units cannot free {total}")
            return _NO_EVICTION
        view = cls.__new__(cls)
        view._core = _OrderRows([(0,) * len(total)], units, total, grow)
        view._start, view._rebased = 0, None
        return view

    @classmethod
    def _view(cls, core: _OrderRows, start: int) -> EvictionOrder:
        view = cls.__new__(cls)
        view._core, view._start, view._rebased = core, start, None
        return view

    @property
    def width(self) -> int:
        """Bands of the order's rows (0 for the canonical empty order ``((),)``)."""
        return len(self._core.total)

    @property
    def complete(self) -> bool:
        """Whether every row is known (a lazy order that walked to its end, or a whole
        one): then the order stays comparable after its source changes."""
        return self._core.grow is None

    @property
    def cumulative(self) -> tuple[tuple[int, ...], ...]:
        """The rebased rows (row 0 all zeros), materialized on first use (a lazy order
        walks to its end: O(units))."""
        rebased = self._rebased
        if rebased is None:
            core = self._core
            core.fill()
            base = core.rows[self._start]
            rebased = tuple(tuple(v - b for v, b in zip(row, base, strict=True))
                            for row in core.rows[self._start:])
            self._rebased = rebased
        return rebased

    def walk_to(self, k: int) -> None:
        """Make rows ``0..k`` known (``0 <= k <= units``): a lazy order's source walks its
        first ``k`` units now (the cache calls this before it evicts them).

        Raises:
            IndexError: ``k`` outside ``[0, units]``.
            PlanMismatchError: a stale lazy order.
        """
        if not 0 <= k <= self.units:
            raise IndexError(f"walk_to({k}) of an order of {self.units} units")
        core = self._core
        j = self._start + k
        if j >= len(core.rows) and core.grow is not None:
            core._grow_to(j)

    def materialize(self) -> EvictionOrder:
        """Grow every row now (so the order stays comparable after its source changes);
        returns ``self``. O(units) for a lazy order, O(1) for a complete one."""
        self._core.fill()
        return self

    @staticmethod
    def from_units(units: Sequence[Sequence[int]], num_bands: int) -> EvictionOrder:
        """Build the cumulative order from per-unit page vectors (each ``num_bands`` long);
        no units gives the canonical empty order (equal to a cache-less chain's)."""
        if not units:
            return _NO_EVICTION
        rows = [(0,) * num_bands]
        for u in units:
            rows.append(tuple(a + int(b) for a, b in zip(rows[-1], u, strict=True)))
        return EvictionOrder(tuple(rows))

    @property
    def units(self) -> int:
        """Eviction units available (0: nothing evictable)."""
        return self._core.units - self._start

    def freed(self, k: int) -> tuple[int, ...]:
        """Pages per band freed by the first ``k`` units (``0 <= k <= units``).

        Raises:
            IndexError: ``k`` outside ``[0, units]``.
            PlanMismatchError: a stale lazy order asked for a row it never grew.
        """
        if not 0 <= k <= self.units:
            raise IndexError(f"freed({k}) of an order of {self.units} units")
        core = self._core
        if not self._start:
            return core.row(k)
        base = core.rows[self._start]
        return tuple(v - b for v, b in zip(core.row(self._start + k), base, strict=True))

    def after(self, k: int) -> EvictionOrder:
        """The order left once the first ``k`` units are evicted (the suffix, rebased)."""
        if k == 0:
            return self
        if k >= self.units:
            return _NO_EVICTION
        self._core.row(self._start + k)  # the base row of the view is known from now on
        return EvictionOrder._view(self._core, self._start + k)

    def least_units_freeing(self, page_bytes: tuple[int, ...], nbytes: int) -> int:
        """The fewest units ``k >= 1`` whose freed pages weigh at least ``nbytes`` bytes
        (``sum_i freed(k)[i] * page_bytes[i]``), or ``units`` if none do (``units >= 1``).

        A lazy order walks only the rows up to the answer (none when even every unit
        frees too few bytes: the last row is known); the byte sums of the known rows are
        kept per ``page_bytes`` and shared by the order's suffixes, and a bisection
        answers over what is known.
        """
        core = self._core
        units = self.units
        start = self._start
        weights = core.weights.get(page_bytes)
        if weights is None:
            weights = []
            core.weights[page_bytes] = weights
        rows = core.rows
        while len(weights) < min(len(rows), start + 1):
            weights.append(sum(n * pb for n, pb in zip(rows[len(weights)], page_bytes,
                                                       strict=True)))
        target = weights[start] + nbytes
        total = sum(n * pb for n, pb in zip(core.total, page_bytes, strict=True))
        if total < target:
            return units
        k = bisect_left(weights, target, start + 1)
        while k == len(weights) and k < start + units:
            row = core.row(k)  # grow one row (or it was known already)
            weights.append(sum(n * pb for n, pb in zip(row, page_bytes, strict=True)))
            if weights[-1] >= target:
                break
            k += 1
        return min(max(k - start, 1), units)

    def _row_rebased(self, j: int) -> tuple[int, ...] | None:
        core = self._core
        row = core.known(self._start + j)
        if row is None or not self._start:
            return row
        base = core.rows[self._start]
        return tuple(v - b for v, b in zip(row, base, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EvictionOrder):
            return NotImplemented
        if self._core is other._core and self._start == other._start:
            return True
        units = self.units
        if units != other.units:
            return False
        if units == 0:
            return True  # every empty order is the canonical one, whatever its width
        if self.freed(units) != other.freed(units):
            return False
        for j in range(1, units):
            mine, theirs = self._row_rebased(j), other._row_rebased(j)
            if mine is None or theirs is None or mine != theirs:
                return False  # unequal, or undecidable (a stale lazy order): unequal
        return True

    def __hash__(self) -> int:
        # O(bands), not O(units): a snapshot used as a dictionary key is hashed often.
        # Equal orders have equal unit counts and equal last rows, hence equal hashes;
        # orders that differ only before the last row collide, and __eq__ decides.
        units = self.units
        if not units:
            return 0
        return hash((units, self.freed(units)))

    def __repr__(self) -> str:
        return f"EvictionOrder(units={self.units}, freed={self.freed(self.units)})"


_NO_EVICTION = EvictionOrder()


@dataclass(frozen=True, slots=True, init=False)
class ChainSnapshot:
    """The chain as pricing sees it: buffer bytes + band snapshots, low -> high.

    ``epoch`` is the chain's capacity epoch when the snapshot was taken; it does not take
    part in equality (price == outcome compares counts and frontiers only).
    ``evictable`` is the prefix cache's evictable supply (:class:`EvictionOrder`); a chain
    without a cache has none. It takes part in equality: after an ``Evict`` the cache's
    remaining order must be exactly the predicted suffix.
    """

    buffer_bytes: int
    bands: tuple[BandSnapshot, ...]
    epoch: int = field(default=0, compare=False)
    evictable: EvictionOrder = _NO_EVICTION

    def __init__(self, buffer_bytes: int, bands: tuple[BandSnapshot, ...], epoch: int = 0,
                 evictable: EvictionOrder = _NO_EVICTION) -> None:
        """Store the fields through the slots' own setters (as :class:`BandSnapshot`)."""
        _c_buffer(self, buffer_bytes)
        _c_bands(self, bands)
        _c_epoch(self, epoch)
        _c_evictable(self, evictable)

    @property
    def evictable_units(self) -> int:
        """Eviction units the prefix cache offers (0 without a cache)."""
        return self.evictable.units

    def gap_below(self, i: int) -> int:
        """Free bytes between band ``i - 1`` (or byte 0) and band ``i``."""
        low = self.bands[i - 1].hi if i > 0 else 0
        return self.bands[i].lo - low

    def gap_above(self, i: int) -> int:
        """Free bytes between band ``i`` and band ``i + 1`` (or byte B)."""
        high = self.bands[i + 1].lo if i + 1 < len(self.bands) else self.buffer_bytes
        return high - self.bands[i].hi

    @property
    def live_bytes(self) -> int:
        """Bytes of live pages of all bands (null pages included)."""
        return sum(b.live * b.page_bytes for b in self.bands)

    @property
    def free_bytes(self) -> int:
        """Bytes not held by a live page: holes plus gaps."""
        return self.buffer_bytes - self.live_bytes

    def with_band(self, i: int, band: BandSnapshot) -> ChainSnapshot:
        """A copy with band ``i`` replaced (same epoch)."""
        bands = list(self.bands)
        bands[i] = band
        return replace(self, bands=tuple(bands))


_c_buffer, _c_bands, _c_epoch, _c_evictable = (ChainSnapshot.__dict__[f].__set__ for f in (
    "buffer_bytes", "bands", "epoch", "evictable"))


@dataclass(frozen=True, slots=True, init=False)
class Demand:
    """Pages wanted per band, aligned with the chain's bands (low -> high).

    For a state band the pages are state slots. Build one with :meth:`zeros` and
    :meth:`plus`, or directly from a tuple.
    """

    pages: tuple[int, ...]

    def __init__(self, pages: tuple[int, ...]) -> None:
        """Store ``pages`` (pages per band; validated where priced, not here). The slot's
        own setter replaces the frozen dataclass's ``object.__setattr__`` call: the same
        object, built cheaper (the scheduler builds one per step)."""
        _set_demand_pages(self, pages)

    @staticmethod
    def zeros(num_bands: int) -> Demand:
        """The empty demand of a chain with ``num_bands`` bands."""
        return Demand((0,) * num_bands)

    def plus(self, other: Demand) -> Demand:
        """Element-wise sum (both must have the same length)."""
        return Demand(tuple(a + b for a, b in zip(self.pages, other.pages, strict=True)))

    def scaled(self, n: int) -> Demand:
        """Every band's pages times ``n``."""
        return Demand(tuple(a * n for a in self.pages))

    @property
    def is_empty(self) -> bool:
        """True when no band wants a page."""
        return not any(self.pages)


_set_demand_pages: Final = Demand.__dict__["pages"].__set__  # the slot's setter


# --- plan actions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UseHoles:
    """Take ``pages`` holes of band ``band`` in place."""

    band: int
    pages: int


@dataclass(frozen=True, slots=True)
class Extend:
    """Grow band ``band`` by ``pages`` new pages at ``side``."""

    band: int
    side: Side
    pages: int


@dataclass(frozen=True, slots=True)
class Compact:
    """Retreat band ``band``'s frontier at ``side`` by ``pages`` (that many holes removed)."""

    band: int
    side: Side
    pages: int


@dataclass(frozen=True, slots=True)
class Relocate:
    """Pack the float band ``band`` into ``[lo, lo + live * page_bytes)`` with no holes."""

    band: int
    lo: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict the first ``units`` units of the snapshot's :class:`EvictionOrder`."""

    units: int


@dataclass(frozen=True, slots=True)
class WaitFence:
    """Wait for the in-flight forward's fence before copying."""


@dataclass(frozen=True, slots=True)
class CopyPages:
    """Copy the held pages ``src`` of band ``band`` (virtual ids) into the pages the same
    take binds at positions ``dst`` of the band's grant (0-based, in grant order: holes
    first, then extensions), page ``src[i]`` into position ``dst[i]``.

    The prefix cache's checkpoint copy on a hit is one: the cached state slot (``src``)
    copied into the request's own working slot, taken by the step's take. It changes no
    count or frontier, so its predicted snapshot is the one before it; it moves no held
    page, so the move gate does not apply to it, and it needs no fence wait (its source
    was written by a forward whose commit inserted it, its destination is a page no
    forward has been given yet). Its bytes are ``len(src) * page_bytes`` of the band
    (:attr:`Quote.copy_bytes`).
    """

    band: int
    src: tuple[int, ...]
    dst: tuple[int, ...]


Action = UseHoles | Extend | Compact | Relocate | WaitFence | Evict | CopyPages


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One action of a plan and the snapshot predicted after it."""

    action: Action
    after: ChainSnapshot


class LazyPlan(Sequence[PlanStep]):
    """A plan's steps, with each predicted snapshot computed on first access.

    Pricing decides the actions cheaply; the predicted snapshot after each action costs a
    snapshot construction, which only the executor (and tests) need. Behaves as a read-only
    sequence of :class:`PlanStep`; equal to any sequence of the same steps.

    Args:
        before: the snapshot the plan starts from.
        actions: the ordered actions.
        apply: the pure function giving the snapshot after one action.
    """

    __slots__ = ("_actions", "_apply", "_before", "_steps")

    def __init__(self, before: ChainSnapshot, actions: tuple[Action, ...],
                 apply: Callable[[ChainSnapshot, Action], ChainSnapshot]) -> None:
        self._before = before
        self._actions = actions
        self._apply = apply
        self._steps: tuple[PlanStep, ...] | None = None

    @property
    def actions(self) -> tuple[Action, ...]:
        """The ordered actions (no snapshots computed)."""
        return self._actions

    def materialize(self) -> tuple[PlanStep, ...]:
        """The steps with their predicted snapshots (computed once)."""
        if self._steps is None:
            steps = []
            current = self._before
            for action in self._actions:
                current = self._apply(current, action)
                steps.append(PlanStep(action, current))
            self._steps = tuple(steps)
        return self._steps

    def __len__(self) -> int:
        return len(self._actions)

    @overload
    def __getitem__(self, index: int) -> PlanStep: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[PlanStep, ...]: ...

    def __getitem__(self, index: int | slice) -> PlanStep | tuple[PlanStep, ...]:
        return self.materialize()[index]

    def __iter__(self) -> Iterator[PlanStep]:
        return iter(self.materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyPlan):
            return self.materialize() == other.materialize()
        if isinstance(other, Sequence):
            return self.materialize() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __repr__(self) -> str:
        return f"LazyPlan({list(self._actions)!r})"


class RefusalReason(StrEnum):
    """Why a quote refuses."""

    BYTES = "bytes"  # demand + live bytes exceed the buffer: nothing can help
    GRID = "grid"  # bytes suffice, but no candidate places whole pages
    INDEX_CAP = "index_cap"  # a band's span would exceed its index-space cap
    MOVES_BLOCKED = "moves_blocked"  # only a plan with copies fits, and the gate is closed


@dataclass(frozen=True, slots=True, init=False)
class Quote:
    """The planner's answer for one demand on one snapshot.

    Attributes:
        demand: the priced demand.
        before: the snapshot priced.
        steps: the ordered plan (empty if the demand is empty or refused); from
            :func:`~kvchain.alloc.pricing.price` a :class:`LazyPlan` whose predicted
            snapshots are built on first access.
        fits: whether the plan realizes the demand.
        shortfall_bytes: on refusal, positive: extra free bytes the best candidate needs
            (0 when it fits).
        reason: on refusal, why; ``None`` when it fits.
        copied_bytes: upper bound of bytes the plan's moves copy (sum of ``pages x P`` of
            its Compact and Relocate actions; 0 for an in-place plan). The bytes of its
            ``CopyPages`` actions are :attr:`copy_bytes`.
    """

    demand: Demand
    before: ChainSnapshot
    steps: Sequence[PlanStep]
    fits: bool
    shortfall_bytes: int = 0
    reason: RefusalReason | None = None
    copied_bytes: int = 0

    def __init__(self, demand: Demand, before: ChainSnapshot, steps: Sequence[PlanStep],
                 fits: bool, shortfall_bytes: int = 0, reason: RefusalReason | None = None,
                 copied_bytes: int = 0) -> None:
        """Store the fields through the slots' own setters (as :class:`BandSnapshot`:
        the planner builds one per first query on an epoch)."""
        _q_demand(self, demand)
        _q_before(self, before)
        _q_steps(self, steps)
        _q_fits(self, fits)
        _q_shortfall(self, shortfall_bytes)
        _q_reason(self, reason)
        _q_copied(self, copied_bytes)

    @property
    def after(self) -> ChainSnapshot:
        """Predicted snapshot after the whole plan (``before`` if there are no steps)."""
        return self.steps[-1].after if self.steps else self.before

    @property
    def evicted_units(self) -> int:
        """Eviction units the plan evicts first (0: no eviction)."""
        steps = self.steps
        actions = steps.actions if isinstance(steps, LazyPlan) else [s.action for s in steps]
        return sum(a.units for a in actions if isinstance(a, Evict))

    @property
    def copy_bytes(self) -> int:
        """Bytes the plan's ``CopyPages`` actions copy: ``len(src) x P`` of their band
        each (0 without one), read off the actions so it always says what the plan
        does."""
        steps = self.steps
        actions = steps.actions if isinstance(steps, LazyPlan) else [s.action for s in steps]
        bands = self.before.bands
        return sum(len(a.src) * bands[a.band].page_bytes for a in actions
                   if isinstance(a, CopyPages))

    @property
    def needs_moves(self) -> bool:
        """True when the plan copies pages (Compact or Relocate)."""
        steps = self.steps
        actions = steps.actions if isinstance(steps, LazyPlan) else [s.action for s in steps]
        return any(isinstance(a, Compact | Relocate) for a in actions)


_q_demand, _q_before, _q_steps, _q_fits, _q_shortfall, _q_reason, _q_copied = (
    Quote.__dict__[f].__set__ for f in ("demand", "before", "steps", "fits",
                                        "shortfall_bytes", "reason", "copied_bytes"))
