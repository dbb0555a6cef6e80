"""Exhaustive oracle: can a demand be held, by any sequence of primitive page moves?

It works on explicit page **positions**, not on :mod:`kvchain.alloc.pricing`'s formulas:
each band is a span ``[lo, hi)`` of physical indices on its own grid plus a bitmap of live
positions (bit ``j`` set: physical page ``j`` holds a live page). From a chain's real
positions it searches (depth-first, memoized on the bitmaps, bounded) every state
reachable by the primitive moves:

=================  ======================================================================
use hole           a band with demand left binds one of its holes (the one nearest its
                   anchor; any other is one move away, so this loses nothing)
extend             a band with demand left grows by one page at a frontier into free
                   bytes (an END at its frontier; the FLOAT at either side)
compact one page   (gate open) at a frontier: a hole there is trimmed (the span shrinks);
                   else the frontier's live page moves into the hole nearest the anchor
relocate float     (gate open, or the float holds no live page) shift the whole float
                   span by one grid page into free bytes; or pack its live pages against
                   its low or its high edge (holes dropped)
=================  ======================================================================

The demand is held when every band has ``live + demand`` live pages. The byte bound
(``sum((live + demand) x P) > B``) is the only shortcut: a proof no arrangement exists.
A closed gate leaves only hole use, extension and moving an empty float (docs/design.md contract 6:
"Gates closed => oracle without moves"). A pending fence changes no feasibility (a plan
just waits for it first), so the oracle ignores it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvchain.alloc import Chain, Demand
from kvchain.errors import KVChainError
from kvchain.layout import Anchor


class OracleBudgetError(KVChainError):
    """The search visited more states than its budget without deciding."""


@dataclass(frozen=True, slots=True)
class OracleBand:
    """Static geometry of one band for the oracle (pages on the band's own grid).

    Attributes:
        anchor: LOW, HIGH or FLOAT.
        page_bytes: ``P`` bytes.
        grid_base: byte of physical page 0.
        n_phys: physical pages of the grid (the index-space cap).
    """

    anchor: Anchor
    page_bytes: int
    grid_base: int
    n_phys: int


@dataclass(frozen=True, slots=True)
class BandPositions:
    """One band's span and live positions: ``mask`` bit ``j`` = physical ``j`` is live."""

    lo: int
    hi: int
    mask: int


@dataclass(frozen=True, slots=True)
class OracleProblem:
    """A chain's positions and gate, ready for :func:`oracle_fits`.

    Attributes:
        buffer_bytes: ``B``.
        bands: static geometry per band, low -> high.
        start: positions per band now.
        movable: the move gate is open.
    """

    buffer_bytes: int
    bands: tuple[OracleBand, ...]
    start: tuple[BandPositions, ...]
    movable: bool

    @staticmethod
    def from_chain(chain: Chain,
                   released: Sequence[Sequence[int]] | None = None) -> OracleProblem:
        """Read the chain's real positions (``Band.p2v``) and gate.

        Args:
            chain: the chain (read only).
            released: per band, virtual ids to treat as released (holes at their real
                positions): what an eviction prefix would free.
        """
        bands, start = [], []
        for i in range(chain.num_bands):
            b = chain.band(i)
            bands.append(OracleBand(b.anchor, b.page_bytes, b.grid_base, b.n_phys))
            gone = {int(b.v2p[v]) for v in released[i]} if released else set()
            mask = 0
            for j in range(b.lo_idx, b.hi_idx):
                if b.p2v[j] >= 0 and j not in gone:
                    mask |= 1 << j
            start.append(BandPositions(b.lo_idx, b.hi_idx, mask))
        return OracleProblem(chain.layout.buffer_bytes, tuple(bands), tuple(start),
                             chain.gate.open)


@dataclass(frozen=True, slots=True)
class OracleVerdict:
    """The oracle's answer.

    Attributes:
        fits: some sequence of primitive moves holds the demand.
        states: states visited (search effort).
        byte_bound: refused by the byte bound alone (no search).
    """

    fits: bool
    states: int
    byte_bound: bool = False


_State = tuple[tuple[int, int, int], ...]


def _span_mask(lo: int, hi: int) -> int:
    return ((1 << hi) - 1) ^ ((1 << lo) - 1)


def _lowest_bit(x: int) -> int:
    return (x & -x).bit_length() - 1


def oracle_fits(problem: OracleProblem, demand: Demand, *,
                max_states: int = 2_000_000) -> OracleVerdict:
    """Search all primitive-move sequences for an arrangement holding ``demand``.

    Args:
        problem: positions and gate (:meth:`OracleProblem.from_chain`).
        demand: pages per band (state slots for a state band), low -> high.
        max_states: search budget (states visited).

    Returns:
        An :class:`OracleVerdict`.

    Raises:
        OracleBudgetError: more than ``max_states`` states without a decision.
    """
    bands = problem.bands
    n = len(bands)
    targets = tuple(s.mask.bit_count() + d for s, d in zip(problem.start, demand.pages,
                                                           strict=True))
    if sum(t * b.page_bytes for t, b in zip(targets, bands, strict=True)) > problem.buffer_bytes:
        return OracleVerdict(False, 0, byte_bound=True)
    moves = _Moves(problem, targets)
    start: _State = tuple((s.lo, s.hi, s.mask) for s in problem.start)
    seen = {start}
    stack = [start]
    while stack:
        st = stack.pop()
        if all(st[i][2].bit_count() == targets[i] for i in range(n)):
            return OracleVerdict(True, len(seen))
        for nxt in reversed(moves.successors(st)):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
        if len(seen) > max_states:
            raise OracleBudgetError(f"oracle visited {len(seen):,} states for demand "
                                    f"{demand.pages} without a decision")
    return OracleVerdict(False, len(seen))


class _Moves:
    """The primitive moves of :func:`oracle_fits` over ``problem``'s bands, toward
    ``targets`` live pages per band: one state per arrangement ``(lo, hi, live mask)`` per
    band; :meth:`successors` lists every state one move away, in a fixed order (the
    search's order, hence its visited-state counts)."""

    def __init__(self, problem: OracleProblem, targets: tuple[int, ...]) -> None:
        self.bands = problem.bands
        self.n = len(self.bands)
        self.targets = targets
        self.big = problem.buffer_bytes
        self.movable = problem.movable

    def byte_lo(self, i: int, st: _State) -> int:
        return self.bands[i].grid_base + st[i][0] * self.bands[i].page_bytes

    def byte_hi(self, i: int, st: _State) -> int:
        return self.bands[i].grid_base + st[i][1] * self.bands[i].page_bytes

    def floor_of(self, i: int, st: _State) -> int:
        """The byte band ``i`` may grow down to (its lower neighbour's top)."""
        return self.byte_hi(i - 1, st) if i > 0 else 0

    def ceil_of(self, i: int, st: _State) -> int:
        """The byte band ``i`` may grow up to (its upper neighbour's bottom)."""
        return self.byte_lo(i + 1, st) if i + 1 < self.n else self.big

    def successors(self, st: _State) -> list[_State]:
        """Every state one move from ``st``: per band, its takes (a hole, or a new page at
        either free end), its compactions and its shifts (a floating band)."""
        out: list[_State] = []
        for i in range(self.n):
            def put(lo2: int, hi2: int, mask2: int, i: int = i) -> None:
                out.append((*st[:i], (lo2, hi2, mask2), *st[i + 1:]))

            self._takes(i, st, put)
            self._compactions(i, st, put)
            self._shifts(i, st, put)
        return out

    def _takes(self, i: int, st: _State, put: Callable[[int, int, int], None]) -> None:
        """A page more for band ``i`` below its target: the hole nearest its anchor, or a
        new page past its high or low end where the neighbour leaves room."""
        band = self.bands[i]
        lo, hi, mask = st[i]
        if mask.bit_count() >= self.targets[i]:
            return
        p = band.page_bytes
        holes = _span_mask(lo, hi) & ~mask
        if holes:  # use the hole nearest the anchor
            j = holes.bit_length() - 1 if band.anchor is Anchor.HIGH else _lowest_bit(holes)
            put(lo, hi, mask | (1 << j))
        if (band.anchor is not Anchor.HIGH and hi < band.n_phys
                and self.byte_hi(i, st) + p <= self.ceil_of(i, st)):
            put(lo, hi + 1, mask | (1 << hi))
        if (band.anchor is not Anchor.LOW and lo > 0
                and self.byte_lo(i, st) - p >= self.floor_of(i, st)):
            put(lo - 1, hi, mask | (1 << (lo - 1)))

    def _compactions(self, i: int, st: _State, put: Callable[[int, int, int], None]) -> None:
        """Band ``i`` (gate open, pages held) gives back its frontier page: an empty one is
        dropped, a live one moves into the hole farthest from that frontier."""
        band = self.bands[i]
        lo, hi, mask = st[i]
        if not (self.movable and hi > lo):
            return
        holes = _span_mask(lo, hi) & ~mask
        if band.anchor is not Anchor.HIGH:  # compact at the high frontier
            top = hi - 1
            if not mask >> top & 1:
                put(lo, hi - 1, mask)
            elif holes:
                j = _lowest_bit(holes)
                put(lo, hi, (mask & ~(1 << top)) | (1 << j))
        if band.anchor is not Anchor.LOW:  # compact at the low frontier
            if not mask >> lo & 1:
                put(lo + 1, hi, mask)
            elif holes:
                j = holes.bit_length() - 1
                put(lo, hi, (mask & ~(1 << lo)) | (1 << j))

    def _shifts(self, i: int, st: _State, put: Callable[[int, int, int], None]) -> None:
        """A floating band ``i`` (gate open, or empty) shifts one page up or down, or packs
        its live pages at either end of its span."""
        band = self.bands[i]
        lo, hi, mask = st[i]
        live = mask.bit_count()
        if band.anchor is not Anchor.FLOAT or not (self.movable or live == 0):
            return
        p = band.page_bytes
        if self.byte_hi(i, st) + p <= self.ceil_of(i, st) and hi < band.n_phys:
            put(lo + 1, hi + 1, mask << 1)
        if lo > 0 and self.byte_lo(i, st) - p >= self.floor_of(i, st):
            put(lo - 1, hi - 1, mask >> 1)
        if _span_mask(lo, hi) & ~mask:
            put(lo, lo + live, _span_mask(lo, lo + live))
            put(hi - live, hi, _span_mask(hi - live, hi))


def oracle_least_eviction(chain: Chain, demand: Demand,
                          unit_pages: Callable[[int], Sequence[Sequence[int]]], units: int,
                          *, max_states: int = 2_000_000) -> int | None:
    """The fewest eviction units after which the oracle holds ``demand`` (0: as is), by a
    linear scan over every prefix, each searched on the real positions with the evicted
    pages released; ``None`` if even all ``units`` do not suffice.

    Args:
        chain: the chain (read only).
        demand: pages per band.
        unit_pages: ``k -> per-band virtual ids`` freed by the first ``k`` units (the
            cache's truth, e.g. :meth:`~kvchain.testing.evictor.ReferenceEvictor.unit_pages`).
        units: units offered.

    Raises:
        OracleBudgetError: a search over its budget.
    """
    for k in range(units + 1):
        problem = OracleProblem.from_chain(chain, unit_pages(k) if k else None)
        if oracle_fits(problem, demand, max_states=max_states).fits:
            return k
    return None
