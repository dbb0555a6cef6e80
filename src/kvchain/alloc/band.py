"""One band's page tables and hole bookkeeping, on the band's own page grid.

A band addresses ``n_phys = (B - grid_base) // P`` physical pages (its layout ``cap``);
physical page ``j`` lies at bytes ``[grid_base + j * P, grid_base + (j + 1) * P)``
(``kvchain.layout``). The span is the half-open physical range ``[lo_idx, hi_idx)``::

    LOW END    slot s = physical s             span [0, n)               grows up
    HIGH END   slot s = physical n_phys-1-s    span [n_phys - n, n_phys) grows down
    FLOAT      physical index itself           span [lo_idx, hi_idx)     either side

Holders see **virtual ids** ``0 .. cap - 1``; ``v2p[v]`` is the physical page of a bound id
(-1 unbound) and ``p2v[j]`` the id living at physical page ``j`` (-1: not live). A move
copies bytes (the chain does that) and rebinds both tables; virtual ids never change.

Holes (free pages inside the span) are kept as a boolean map plus a per-block hole count
(blocks of :data:`HOLE_BLOCK` pages), so "the k holes nearest one side" costs
``O(blocks in span + k)`` numpy work, never a Python loop over pages. Hole positions live
here only; snapshots carry counts.

Which holes are used first (so frontier regions empty out and later compaction is cheap):

- ``UseHoles``: nearest the anchor (LOW END and FLOAT: lowest physical first; HIGH END:
  highest first).
- ``Compact`` at side HIGH (LOW END, FLOAT): live pages of the vacated top slots move into
  the lowest holes; at side LOW (HIGH END, FLOAT): bottom pages move into the highest holes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchain.alloc.snapshot import BandSnapshot, Side
from kvchain.errors import LayoutError, PlanMismatchError
from kvchain.layout import Anchor, BandLayout

#: Pages per block of the hole summary (a power of two; a tuning constant, not a contract).
HOLE_BLOCK = 256


@dataclass(frozen=True, slots=True)
class PageMoves:
    """The copies and the new span of one move action, computed before anything changes.

    Attributes:
        src: physical pages copied from (int64, shape ``[m]``), on the band's grid.
        dst: physical pages copied to (int64, shape ``[m]``); ``src[i] -> dst[i]``.
        lo_idx: physical low end of the span after the move (inclusive).
        hi_idx: physical high end of the span after the move (exclusive).
        packed: a relocation (sources may lie inside the new span); ``False`` for a
            compaction (sources lie only in the vacated slots).
    """

    src: np.ndarray
    dst: np.ndarray
    lo_idx: int
    hi_idx: int
    packed: bool


class Band:
    """Page tables, span and holes of one band (counts in pages, frontiers in bytes).

    The band knows nothing of other bands or of the bytes: the chain checks neighbours,
    copies pages and calls these methods through its single apply path.

    Args:
        layout: the band's geometry.
        start_idx: physical index where an empty span starts (LOW END: 0; HIGH END:
            ``n_phys``; FLOAT: the chain's choice, e.g. the page nearest the middle).

    Raises:
        LayoutError: a start page off the anchor or outside ``[0, n_phys]``.
    """

    def __init__(self, layout: BandLayout, start_idx: int) -> None:
        self.layout = layout
        self.label = layout.label
        self.n_phys = layout.cap
        self.page_bytes = layout.page_bytes
        self.grid_base = layout.grid_base
        if layout.anchor is Anchor.LOW and start_idx != 0:
            raise LayoutError("a LOW END starts at physical page 0")
        if layout.anchor is Anchor.HIGH and start_idx != self.n_phys:
            raise LayoutError("a HIGH END starts at physical page n_phys")
        if not 0 <= start_idx <= self.n_phys:
            raise LayoutError(f"start page {start_idx} outside [0, {self.n_phys}]")
        self.lo_idx = start_idx
        self.hi_idx = start_idx
        self.live = 0
        self.holes = 0
        cap = self.n_phys
        self.v2p = np.full(cap, -1, dtype=np.int64)
        self.p2v = np.full(cap, -1, dtype=np.int64)
        # Free virtual ids as a stack whose top is the end: lowest ids are handed out first.
        self._free_vids = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self._free_top = cap
        # was_bound[v]: v has been handed out at least once (tells a double release from
        # an id that was never taken).
        self.was_bound = np.zeros(cap, dtype=bool)
        n_blocks = max(1, -(-cap // HOLE_BLOCK))
        self._is_hole_padded = np.zeros(n_blocks * HOLE_BLOCK, dtype=bool)
        self.is_hole = self._is_hole_padded[:cap]
        self._hole_blocks = self._is_hole_padded.reshape(n_blocks, HOLE_BLOCK)
        self.block_holes = np.zeros(n_blocks, dtype=np.int64)

    # --- geometry -------------------------------------------------------------------------

    @property
    def anchor(self) -> Anchor:
        """LOW, HIGH or FLOAT."""
        return self.layout.anchor

    @property
    def span(self) -> int:
        """Pages in the span: ``live + holes``."""
        return self.hi_idx - self.lo_idx

    @property
    def lo(self) -> int:
        """Low frontier, bytes (inclusive)."""
        return self.grid_base + self.lo_idx * self.page_bytes

    @property
    def hi(self) -> int:
        """High frontier, bytes (exclusive)."""
        return self.grid_base + self.hi_idx * self.page_bytes

    @property
    def free_vid_count(self) -> int:
        """Virtual ids not bound now."""
        return self._free_top

    def free_vids(self) -> np.ndarray:
        """A copy of the free virtual ids (int64, any order); for audits."""
        return self._free_vids[: self._free_top].copy()

    def snapshot(self, movable: bool, fence_pending: bool) -> BandSnapshot:
        """The band's counts and frontiers as a :class:`BandSnapshot`."""
        base, p = self.grid_base, self.page_bytes
        return BandSnapshot(self.label, self.layout.anchor, p, base + self.lo_idx * p,
                            base + self.hi_idx * p, self.live, self.holes, self.n_phys,
                            movable, fence_pending)

    # --- holes ----------------------------------------------------------------------------

    def _block_range(self) -> tuple[int, int]:
        """Blocks ``[b0, b1)`` that cover the span."""
        return self.lo_idx // HOLE_BLOCK, -(-self.hi_idx // HOLE_BLOCK)

    def lowest_holes(self, k: int) -> np.ndarray:
        """The ``k`` lowest holes, ascending (int64, shape ``[k]``); ``k <= holes``."""
        if k == 0:
            return np.empty(0, dtype=np.int64)
        b0, b1 = self._block_range()
        counts = self.block_holes[b0:b1]
        nonzero = np.flatnonzero(counts)
        if nonzero.size and counts[nonzero[0]] >= k:  # the common case: one block holds all
            first = b0 + int(nonzero[0])
            return np.flatnonzero(self._hole_blocks[first])[:k] + first * HOLE_BLOCK
        last = int(np.searchsorted(np.cumsum(counts), k))
        blocks = np.flatnonzero(counts[: last + 1]) + b0
        rows, cols = np.nonzero(self._hole_blocks[blocks])
        return (blocks[rows] * HOLE_BLOCK + cols)[:k]

    def highest_holes(self, k: int) -> np.ndarray:
        """The ``k`` highest holes, descending (int64, shape ``[k]``); ``k <= holes``."""
        if k == 0:
            return np.empty(0, dtype=np.int64)
        b0, b1 = self._block_range()
        nonzero = np.flatnonzero(self.block_holes[b0:b1])
        if nonzero.size and self.block_holes[b0 + int(nonzero[-1])] >= k:  # one block holds all
            top = b0 + int(nonzero[-1])
            return np.flatnonzero(self._hole_blocks[top])[::-1][:k] + top * HOLE_BLOCK
        counts = self.block_holes[b0:b1][::-1]
        last = int(np.searchsorted(np.cumsum(counts), k))
        blocks = (b1 - 1) - np.flatnonzero(counts[: last + 1])
        rows, cols = np.nonzero(self._hole_blocks[blocks][:, ::-1])
        return (blocks[rows] * HOLE_BLOCK + (HOLE_BLOCK - 1 - cols))[:k]

    def holes_nearest_anchor(self, k: int) -> np.ndarray:
        """The ``k`` holes UseHoles takes: nearest the anchor (FLOAT: lowest first)."""
        if self.anchor is Anchor.HIGH:
            return self.highest_holes(k)
        return self.lowest_holes(k)

    def _mark_holes(self, idx: np.ndarray, value: bool) -> None:
        self.is_hole[idx] = value
        delta = 1 if value else -1
        if idx.size <= 16:  # a few pages (most decode steps): cheaper than a ufunc.at
            counts = self.block_holes
            for b in (idx // HOLE_BLOCK).tolist():
                counts[b] += delta
        else:
            np.add.at(self.block_holes, idx // HOLE_BLOCK, delta)

    def _recount_blocks(self, lo_idx: int, hi_idx: int) -> None:
        """Recount the hole summary of the blocks covering ``[lo_idx, hi_idx)``."""
        if hi_idx <= lo_idx:
            return
        b0, b1 = lo_idx // HOLE_BLOCK, -(-hi_idx // HOLE_BLOCK)
        self.block_holes[b0:b1] = self._hole_blocks[b0:b1].sum(axis=1)

    # --- mutations (called by the chain's apply path only) ------------------------------

    def _bind(self, phys: np.ndarray) -> np.ndarray:
        k = phys.size
        top = self._free_top
        vids = self._free_vids[top - k:top][::-1].copy()
        self._free_top = top - k
        self.v2p[vids] = phys
        self.p2v[phys] = vids
        self.was_bound[vids] = True
        self.live += k
        return vids

    def use_holes(self, k: int) -> np.ndarray:
        """Bind ``k`` holes nearest the anchor to fresh virtual ids; returns the ids.

        Raises:
            PlanMismatchError: ``k`` exceeds the holes (nothing changes).
        """
        if k > self.holes:
            raise PlanMismatchError(f"{self.layout.label}: UseHoles {k} > {self.holes} holes")
        phys = self.holes_nearest_anchor(k)
        self._mark_holes(phys, False)
        self.holes -= k
        return self._bind(phys)

    def extend_range(self, side: Side, k: int) -> tuple[int, int]:
        """Physical range ``[a, b)`` an Extend of ``k`` pages at ``side`` would add.

        Raises:
            PlanMismatchError: an END extended away from its frontier, or past its grid
                (``0 .. n_phys``).
        """
        anchor = self.anchor
        if (anchor is Anchor.LOW and side is Side.LOW) or (anchor is Anchor.HIGH
                                                           and side is Side.HIGH):
            raise PlanMismatchError(f"{self.layout.label}: {anchor} END cannot extend {side}")
        if side is Side.HIGH:
            a, b = self.hi_idx, self.hi_idx + k
        else:
            a, b = self.lo_idx - k, self.lo_idx
        if a < 0 or b > self.n_phys:
            raise PlanMismatchError(
                f"{self.layout.label}: Extend {k} at {side} leaves the grid [0, {self.n_phys})")
        return a, b

    def extend(self, side: Side, k: int) -> np.ndarray:
        """Grow the span by ``k`` new live pages at ``side``; returns their virtual ids
        (ordered from the old frontier outward).

        Raises:
            PlanMismatchError: see :meth:`extend_range` (nothing changes).
        """
        a, b = self.extend_range(side, k)
        if side is Side.HIGH:
            phys = np.arange(a, b, dtype=np.int64)
            self.hi_idx = b
        else:
            phys = np.arange(b - 1, a - 1, -1, dtype=np.int64)
            self.lo_idx = a
        return self._bind(phys)

    def release(self, vids: np.ndarray) -> np.ndarray:
        """Unbind validated virtual ids; their pages become holes. Returns the physical
        pages (the span never shrinks here: compaction is lazy)."""
        phys = self.v2p[vids]
        self.v2p[vids] = -1
        self.p2v[phys] = -1
        self._mark_holes(phys, True)
        n = vids.size
        top = self._free_top
        self._free_vids[top:top + n] = vids[::-1]  # the next take reuses them in this order
        self._free_top = top + n
        self.live -= n
        self.holes += n
        return phys

    def compact_moves(self, side: Side, k: int) -> PageMoves:
        """The copies that retreat the frontier at ``side`` by ``k`` pages (no change yet).

        Live pages inside the ``k`` vacated slots move into holes outside them: at side
        HIGH into the lowest holes, at side LOW into the highest (sources and targets
        paired in ascending physical order, so pages keep their relative order).

        Raises:
            PlanMismatchError: ``k`` exceeds the holes, or an END compacted at its anchor.
        """
        anchor = self.anchor
        if (anchor is Anchor.LOW and side is Side.LOW) or (anchor is Anchor.HIGH
                                                           and side is Side.HIGH):
            raise PlanMismatchError(f"{self.layout.label}: {anchor} END cannot compact {side}")
        if k > self.holes:
            raise PlanMismatchError(f"{self.layout.label}: Compact {k} > {self.holes} holes")
        if side is Side.HIGH:
            lo_idx, hi_idx = self.lo_idx, self.hi_idx - k
            src = np.flatnonzero(self.p2v[hi_idx:self.hi_idx] >= 0) + hi_idx
            dst = self.lowest_holes(src.size)
        else:
            lo_idx, hi_idx = self.lo_idx + k, self.hi_idx
            src = np.flatnonzero(self.p2v[self.lo_idx:lo_idx] >= 0) + self.lo_idx
            dst = self.highest_holes(src.size)[::-1].copy()
        return PageMoves(src.astype(np.int64, copy=False), dst, lo_idx, hi_idx, False)

    def relocate_moves(self, lo_idx: int) -> PageMoves:
        """The copies that pack the FLOAT into ``[lo_idx, lo_idx + live)`` (no change yet):
        the live page of rank ``r`` (physical order) goes to ``lo_idx + r``; pages already
        in place are not copied.

        Raises:
            PlanMismatchError: not a FLOAT, or the packed span leaves the grid.
        """
        if self.anchor is not Anchor.FLOAT:
            raise PlanMismatchError(f"{self.layout.label}: only the FLOAT relocates")
        if lo_idx < 0 or lo_idx + self.live > self.n_phys:
            raise PlanMismatchError(f"{self.layout.label}: Relocate to page {lo_idx} leaves "
                                    f"the grid [0, {self.n_phys})")
        src = np.flatnonzero(self.p2v[self.lo_idx:self.hi_idx] >= 0) + self.lo_idx
        dst = np.arange(lo_idx, lo_idx + src.size, dtype=np.int64)
        moved = src != dst
        return PageMoves(src[moved].astype(np.int64, copy=False), dst[moved], lo_idx,
                         lo_idx + self.live, True)

    def apply_moves(self, moves: PageMoves) -> None:
        """Rebind the tables after the bytes of ``moves`` were copied, and set the new span.

        Gather-then-scatter: all sources are read before any target is written, so
        overlapping source and target ranges (a relocation) are fine.
        """
        src, dst = moves.src, moves.dst
        vids = self.p2v[src]
        self.p2v[src] = -1
        self.p2v[dst] = vids
        self.v2p[vids] = dst
        old_lo, old_hi = self.lo_idx, self.hi_idx
        self.lo_idx, self.hi_idx = moves.lo_idx, moves.hi_idx
        if moves.packed:
            # Relocation: rebuild the hole map over the old and new spans.
            self.is_hole[old_lo:old_hi] = False
            self.is_hole[self.lo_idx:self.hi_idx] = self.p2v[self.lo_idx:self.hi_idx] < 0
            self._recount_blocks(min(old_lo, self.lo_idx), max(old_hi, self.hi_idx))
        else:
            # Compaction: targets stop being holes; the vacated slots leave the span.
            self._mark_holes(dst, False)
            for a, b in ((old_lo, self.lo_idx), (self.hi_idx, old_hi)):
                if b > a:
                    self.is_hole[a:b] = False
                    self._recount_blocks(a, b)
        self.holes = self.span - self.live
