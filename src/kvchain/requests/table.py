"""The request table: the only copy of every request's pages, as arrays indexed by a dense
slot per request, with a block table per band (the input layout of paged-attention
kernels). One request (scalar reads of a row) and a decode batch (gathers of many rows)
read the same arrays, so a decode step is a handful of numpy operations over the batch
(docs/architecture.md, layer table):

* ``tokens[slot]``: tokens whose KV is in the cache (``L``).
* ``rowlen[band, slot]``: meaningful columns of the request's row in ``band``: full pages
  held (full band), state slots held (state band), one past the last window page held
  (window and chunked-local bands: the row is indexed by token page ``j`` covering tokens
  ``[j * P, (j + 1) * P)``, entries before ``first[band, slot]`` are released).
* ``first[band, slot]``: first page held in ``band`` (token page index; 0 for bands that
  release nothing before the request ends).
* ``shared[slot]``: pages ``[0, shared)`` of the full and window bands belong to the
  prefix cache (the request's hit, later its inserted prompt): it reads them, never
  releases them.
* ``need_at[slot]``: a token count below which a decode needs no new page with the pages
  held now (0: work it out every step), so a decode step runs the demand formulas only
  for the requests at or past it; set again whenever the request's pages change
  (:meth:`refresh_need`), kept when a window-tail release only drops pages behind the
  window (the pages a decode needs are unchanged).
* ``tables[band]``: int64 ``[capacity, width]`` virtual page ids, row ``slot``; entries at
  or past ``rowlen`` and released window entries hold the band's pad (its null page, or
  ``-1`` in a band that reserves none: full and state bands never release a page before
  the request ends, so a kernel's sequence length ends a row before any pad).

Slot 0 is never handed out: it stays empty (nothing held, 0 tokens), which is exactly a
request that holds nothing, so an unregistered request id maps to it. Rows and columns
grow by doubling; a slot's row is cleared (set to the pad) when its request leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from kvchain.bands.policies import BandPolicy, ceil_div, grown_pages, plain_rows, smaller
from kvchain.requests.demand import HeldPages

#: Most rows :meth:`RequestTable.decode_rows` and :meth:`RequestTable.refresh_need` run
#: the band formulas over as Python ints (measured on the decode-step benchmark: a window
#: band's formula costs about 6 us over a numpy array of any small length and 0.7 us over
#: ints, so ints win below about 8 rows; docs/benchmarks.md, "Decode step speed").
SCALAR_ROWS = 8
_NO_NEED = int(np.iinfo(np.int64).max)  # ``need_at`` of a request no band bounds


class RequestTable:
    """Per-slot counts and per-band virtual block tables (see the module docstring).

    Args:
        policies: the chain's band policies, one per band (low -> high).
        pads: per band, the value of an empty table entry: the band's null page (virtual
            id), or ``-1`` where it reserves none.
        capacity: initial slots (grown by doubling).
        width: initial columns per table (grown by doubling).

    Attributes:
        version: bumped whenever a slot is bound or unbound (a request id -> slot map
            computed at one version holds until the next).
        slot_of: request id -> slot of every registered request.
    """

    def __init__(self, policies: Sequence[BandPolicy], pads: Sequence[int],
                 capacity: int = 64, width: int = 16) -> None:
        num_bands = len(policies)
        self.num_bands = num_bands
        self.policies = tuple(policies)
        # ``P``, one for every band (``RequestGeometry`` checks its policies share it)
        self.page_size = policies[0].page_size if policies else 1
        self.pads = tuple(int(p) for p in pads)
        self.tokens = np.zeros(capacity, dtype=np.int64)
        self.rowlen = np.zeros((num_bands, capacity), dtype=np.int64)
        self.first = np.zeros((num_bands, capacity), dtype=np.int64)
        self.need_at = np.zeros(capacity, dtype=np.int64)
        self.shared = np.zeros(capacity, dtype=np.int64)
        self.tables = [np.full((capacity, width), pad, dtype=np.int64) for pad in self.pads]
        self._free = list(range(capacity - 1, 0, -1))  # slot 0: the permanent empty slot
        self.version = 0
        self.slot_of: dict[int, int] = {}

    @property
    def capacity(self) -> int:
        """Slots the arrays hold now (slot 0 included)."""
        return int(self.tokens.shape[0])

    # --- slots --------------------------------------------------------------------------

    def bind(self, rid: int) -> int:
        """A free slot for a new request ``rid`` (nothing held, 0 tokens). Returns it."""
        if not self._free:
            self._grow_slots()
        slot = self._free.pop()
        self.slot_of[rid] = slot
        self.version += 1
        return slot

    def unbind(self, rid: int) -> None:
        """Free ``rid``'s slot (its rows back to the pad, counts to 0)."""
        slot = self.slot_of.pop(rid)
        for band in range(self.num_bands):
            n = int(self.rowlen[band, slot])
            if n:
                self.tables[band][slot, :n] = self.pads[band]
        self.rowlen[:, slot] = 0
        self.first[:, slot] = 0
        self.need_at[slot] = 0
        self.tokens[slot] = 0
        self.shared[slot] = 0
        self._free.append(slot)
        self.version += 1

    def _grow_slots(self) -> None:
        old = self.capacity
        new = 2 * old

        def grow(a: np.ndarray, fill: int = 0) -> np.ndarray:
            out = np.full((*a.shape[:-1], new), fill, dtype=a.dtype)
            out[..., :old] = a
            return out

        self.tokens = grow(self.tokens)
        self.rowlen = grow(self.rowlen)
        self.first = grow(self.first)
        self.need_at = grow(self.need_at)
        self.shared = grow(self.shared)
        tables = []
        for t, pad in zip(self.tables, self.pads, strict=True):
            out = np.full((new, t.shape[1]), pad, dtype=np.int64)
            out[:old] = t
            tables.append(out)
        self.tables = tables
        self._free.extend(range(new - 1, old - 1, -1))

    def fit(self, band: int, width: int) -> None:
        """Make ``band``'s table at least ``width`` columns wide (doubling)."""
        t = self.tables[band]
        if width <= t.shape[1]:
            return
        new = max(width, 2 * t.shape[1])
        out = np.full((t.shape[0], new), self.pads[band], dtype=np.int64)
        out[:, :t.shape[1]] = t
        self.tables[band] = out

    # --- rows ---------------------------------------------------------------------------

    def live(self, band: int, slot: int) -> np.ndarray:
        """The page ids ``slot`` holds in ``band``, first to last (a view of its row:
        columns ``[first, rowlen)``)."""
        return self.tables[band][slot, self.first[band, slot]:self.rowlen[band, slot]]

    def span(self, band: int, slot: int) -> tuple[int, int]:
        """``(first, end)`` page indices ``slot`` holds in ``band``."""
        return int(self.first[band, slot]), int(self.rowlen[band, slot])

    def held(self, slot: int) -> HeldPages:
        """The ``(first, end)`` spans ``slot`` holds, per band."""
        return HeldPages(tuple(zip(self.first[:, slot].tolist(), self.rowlen[:, slot].tolist(),
                                   strict=True)))

    def slots_of(self, ids: Sequence[int]) -> np.ndarray:
        """Slots of request ids, int64 (0, the empty slot, for one that holds nothing)."""
        return np.fromiter(map(self.slot_of.get, ids, repeat(0)), dtype=np.int64,
                           count=len(ids))

    def set_row(self, band: int, slot: int, first: int, vids: Sequence[int]) -> None:
        """Set ``slot``'s row in ``band`` to ``vids`` at columns ``first ..`` (pads before
        and after), the band's first live page to ``first``."""
        end = first + len(vids)
        old = int(self.rowlen[band, slot])
        self.fit(band, end)
        row = self.tables[band][slot]
        pad = self.pads[band]
        row[:first] = pad
        row[first:end] = vids
        if old > end:
            row[end:old] = pad
        self.rowlen[band, slot] = end
        self.first[band, slot] = first

    def drop_front(self, band: int, slot: int, n: int) -> np.ndarray:
        """Take the first ``n`` live pages of ``slot`` in ``band`` out of its row (pads in
        their place, the first live page moves by ``n``). Returns their ids (a copy)."""
        first = int(self.first[band, slot])
        row = self.tables[band][slot]
        out = row[first:first + n].copy()
        row[first:first + n] = self.pads[band]
        self.first[band, slot] = first + n
        return out

    def put_row(self, band: int, slot: int, start: int, vids: Sequence[int]) -> None:
        """Write ``vids`` into ``slot``'s row of ``band`` at columns ``start ..``; the
        row's length becomes ``start + len(vids)`` (:meth:`append` for one row)."""
        end = start + len(vids)
        self.fit(band, end)
        self.tables[band][slot, start:end] = vids
        self.rowlen[band, slot] = end

    def start_columns(self, pol: BandPolicy, slots: np.ndarray) -> np.ndarray:
        """Where band ``pol``'s new pages of rows ``slots`` go (int64 ``[n]``): each row's
        end, except a window or local row that holds nothing (``first == end``): its
        next token's window's first page, which becomes its first live page
        (:meth:`start_column` for one row)."""
        band = pol.band
        starts = self.rowlen[band][slots]
        if pol.windowed:
            first = self.first[band][slots]
            empty = starts == first
            if empty.any():  # a request's first window pages: from its window start
                first = np.where(empty, pol.first_page(self.tokens[slots]), first)
                self.first[band][slots] = first
                starts = np.where(empty, first, starts)
        return starts

    def start_column(self, pol: BandPolicy, slot: int) -> int:
        """:meth:`start_columns` of one row (Python ints: a small batch's hand-out)."""
        band = pol.band
        start = int(self.rowlen[band, slot])
        if pol.windowed and start == int(self.first[band, slot]):
            start = pol.first_page(int(self.tokens[slot]))
            self.first[band, slot] = start
        return start

    def append(self, band: int, slots: Sequence[int] | np.ndarray,
               starts: Sequence[int] | np.ndarray, counts: Sequence[int] | np.ndarray,
               vids: Sequence[int] | np.ndarray) -> None:
        """Write ``vids`` (in order) into rows ``slots`` of ``band``: ``counts[i]`` of them
        at columns ``starts[i] ..``; each row's length becomes ``starts[i] + counts[i]``."""
        s = np.asarray(slots, dtype=np.int64)
        a = np.asarray(starts, dtype=np.int64)
        c = np.asarray(counts, dtype=np.int64)
        end = a + c
        self.fit(band, int(end.max()))
        if int(c.sum()) == s.size:  # one page each (a decode step)
            rows, cols = s, a
        else:
            rows = np.repeat(s, c)
            cols = np.repeat(a - (np.cumsum(c) - c), c) + np.arange(rows.size)
        self.tables[band][rows, cols] = np.asarray(vids, dtype=np.int64)
        self.rowlen[band][s] = end

    # --- the decode step ----------------------------------------------------------------

    def decode_rows(self, slots: np.ndarray, extend: int = 1
                    ) -> tuple[list[int], list[tuple[int, ...]], np.ndarray]:
        """The requests at ``slots`` that must add pages to compute ``extend`` more tokens
        (1: a decode; ``1 + k``: a speculative decode with ``k`` drafts), and those pages:
        ``(at, rows, matrix)``, ``at`` their positions in ``slots`` (ascending),
        ``rows[j]`` the pages per band of ``slots[at[j]]`` (a non-empty row of the batch's
        ``[rows, bands]`` demand matrix) and ``matrix`` those rows as int64
        ``[len(at), bands]``, each band policy's
        :meth:`~kvchain.bands.policies.BandPolicy.pages` over the held spans
        ``[first, rowlen)`` (the formula ``request_demand`` runs for one request).

        The policies' formulas are written over integer arithmetic that serves Python
        ints and int64 arrays alike; a numpy call costs about 0.5-1 us whatever its
        length, so up to :data:`SCALAR_ROWS` rows (a small batch's decode step: about one
        request in ``P`` crosses a page) run them over the rows' ints (``item`` reads,
        then a fraction of a microsecond per row and band), more rows over the gathered
        ``[bands, n]`` rows at once: the full band's formula ``grown_pages`` for every
        band, which is a window band's too for its plain rows
        (:func:`~kvchain.bands.policies.plain_rows`), then the window bands' other rows
        by their policy's formula and the state band's slots; the empty rows dropped by
        numpy (measured: 18 -> 12 us at 17 rows of two bands, docs/benchmarks.md,
        "Decode step cost (round 9)")."""
        pols = self.policies
        if slots.size <= SCALAR_ROWS:  # ``item`` reads of the rows (no gather)
            tokens_of, first_of, end_of = self.tokens.item, self.first.item, self.rowlen.item
            at, rows = [], []
            for j, slot in enumerate(slots.tolist()):
                ti = tokens_of(slot)
                row = tuple([self._decode_pages(pol, first_of(pol.band, slot),
                                                end_of(pol.band, slot), ti, extend)
                             for pol in pols])
                if any(row):
                    at.append(j)
                    rows.append(row)
            return at, rows, np.array(rows, dtype=np.int64).reshape(len(rows), len(pols))
        t = self.tokens[slots]
        # every band at once: ``grown_pages`` (the full band's formula, and a window
        # band's for its plain rows, :func:`plain_rows`), then the window bands' other
        # rows by their policy's formula and the state band's slots
        # ``take`` along the slots: ``a[:, slots]`` costs 6-12 us at 256-512 rows, a
        # ``take`` about 1 us (docs/benchmarks-history.md, "Decode step and the step path
        # (round 10)")
        rowlen = self.rowlen.take(slots, axis=1)  # [bands, n]
        grown = ceil_div(t + extend, self.page_size) - rowlen
        for pol in pols:
            band = pol.band
            if pol.per_request:
                grown[band] = (rowlen[band] == 0) * pol.pages(0, 0, 0, extend)
            elif pol.windowed:
                first = self.first[band][slots]
                odd = ~plain_rows(pol, first, rowlen[band], t)
                if odd.any():
                    grown[band, odd] = pol.pages(first[odd], rowlen[band][odd], t[odd],
                                                 extend)
        np.maximum(grown, 0, out=grown)
        needs = grown.any(axis=0).nonzero()[0]
        matrix: np.ndarray = grown.take(needs, axis=1).T
        return needs.tolist(), list(map(tuple, matrix.tolist())), matrix

    def _decode_pages(self, pol: BandPolicy, first: int, end: int, start: int,
                      extend: int) -> int:
        """``pol.pages(first, end, start, extend)`` of one row over ints, by the full
        band's formula where it holds (every band that keeps its tokens; a window band's
        plain rows, :func:`~kvchain.bands.policies.plain_rows`)."""
        if pol.per_request or (pol.windowed and not plain_rows(pol, first, end, start)):
            return int(pol.pages(first, end, start, extend))
        grown = -(-(start + extend) // self.page_size) - end
        return grown if grown > 0 else 0

    def truncate(self, band: int, slots: np.ndarray, keep_end: np.ndarray) -> np.ndarray:
        """Take the pages of rows ``slots`` in ``band`` at columns ``keep_end`` and past
        out of their rows (pads in their place; each row's length becomes
        ``min(rowlen, keep_end)``, never below its first live page): the rollback of a
        speculative step's rejected pages. Returns their ids, int64, row by row."""
        end = self.rowlen[band][slots]
        keep = np.maximum(np.minimum(keep_end, end), self.first[band][slots])
        drop = end - keep
        at = (drop > 0).nonzero()[0]
        if not at.size:
            return np.zeros(0, dtype=np.int64)
        s, k, c = slots[at], keep[at], drop[at]
        rows = np.repeat(s, c)
        cols = np.repeat(k - (np.cumsum(c) - c), c) + np.arange(rows.size)
        vids = self.tables[band][rows, cols].copy()
        self.tables[band][rows, cols] = self.pads[band]
        self.rowlen[band][s] = k
        return vids

    def refresh_need(self, slots: np.ndarray) -> None:
        """Set ``need_at`` of ``slots`` from the pages they hold now: the smallest
        ``held * P`` over the full band and the window bands' last held page (a decode
        at ``L`` needs page ``L // P`` there first), or 0 (work it out every step) for a
        request with no state slot, an empty window band, or a window band whose held
        pages start after the token's window (pages missing on the left). Over the rows'
        ints up to :data:`SCALAR_ROWS` rows (:meth:`refresh_rows`), over the gathered
        columns above (one formula, :meth:`_need`)."""
        if not slots.size:
            return
        if slots.size <= SCALAR_ROWS:
            self.refresh_rows(slots.tolist())
            return
        t = self.tokens[slots]
        # one band's row gathered at a time (a 2-D gather along the slots costs more)
        cols = {pol.band: self.rowlen[pol.band][slots] for pol in self.policies}
        firsts = {pol.band: self.first[pol.band][slots] for pol in self.policies
                  if pol.windowed}
        need, zero = self._need(t, firsts, cols)
        self.need_at[slots] = np.where(zero, 0, need)

    def refresh_rows(self, slots: list[int]) -> None:
        """:meth:`refresh_need` of a few rows, over Python ints (``item`` reads: a numpy
        gather costs about 1 us whatever its length, a scalar read a tenth of that)."""
        tokens, first, rowlen = self.tokens.item, self.first.item, self.rowlen.item
        bands = range(self.num_bands)
        for slot in slots:
            f = [first(b, slot) for b in bands]
            r = [rowlen(b, slot) for b in bands]
            need, zero = self._need(tokens(slot), f, r)
            self.need_at[slot] = 0 if zero else need

    def _need(self, t: Any, first: Any, rowlen: Any) -> tuple[Any, Any]:
        """:meth:`refresh_need`'s formula for requests at ``t`` tokens holding
        ``[first[band], rowlen[band])`` per band (ints of one request, or int64 columns
        of many): ``(need, zero)``, the token count ``need`` below which a decode needs no
        page, and whether it must be 0 instead (work it out every step)."""
        need: Any = _NO_NEED
        zero: Any = False  # ``False | array`` is the array's mask
        for pol in self.policies:
            end = rowlen[pol.band]
            if pol.per_request:
                zero = zero | (end == 0)
                continue
            need = smaller(need, end * pol.page_size)
            if pol.windowed:
                f = first[pol.band]
                zero = zero | (end == f) | (f > pol.first_page(t))
        return need, zero

    # --- a run of decode steps (the simulator's fast-forward) ---------------------------

    def run_columns(self, slots: np.ndarray, steps: int
                    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages each request at ``slots`` adds in each of the next ``steps`` decode
        steps, and which steps release window pages, if every one of them decodes in all
        of them: what :meth:`decode_columns` and the commit's window-tail release would
        give step after step, in closed form.

        A request is *plain* when every window band holds a contiguous run of pages
        ``[first, end)`` with ``first <= f <= end`` for the first page ``f`` of its next
        token's window (and ``first == f`` if the run is empty), and it holds its state
        slots. For a plain request at ``L`` tokens, step ``j`` computes position
        ``t = L + j``; it stays plain (window pages are appended at ``end``, released from
        ``first``), so (``P`` tokens per page, ``last(t) = t // P + 1``):

        * full band: pages held after step ``j`` are ``max(held, last(t))``, so step ``j``
          adds ``max(0, last(t) - held) - max(0, last(t - 1) - held)``;
        * window band: the same with ``end`` for ``held`` (``have`` of
          :meth:`decode_columns` is ``min(end, last) - f`` for a plain request);
        * the commit after step ``j`` releases pages ``[first, f(t + 1))`` not released
          before (``f(t + 1) <= last(t)``, so never past what is held): step ``j``
          releases iff ``f(t + 1) > max(first, f(t))``;
        * state band: nothing (its slots are held).

        Returns:
            ``(demand, released)``: ``demand`` int64 ``[steps, len(slots), num_bands]``
            (pages per band per request per step; bands of other kinds 0), ``released``
            bool ``[steps]`` (some window page leaves some request's window in that step's
            commit); ``None`` when a request is not plain (a step of the run would take
            the general formulas: the caller runs the steps one by one).
        """
        n = int(slots.size)
        t0 = self.tokens[slots]
        t = t0[None, :] + np.arange(steps, dtype=np.int64)[:, None]  # [steps, n]
        demand = np.zeros((steps, n, self.num_bands), dtype=np.int64)
        released = np.zeros(steps, dtype=bool)
        rowlen = self.rowlen
        for pol in self.policies:
            band = pol.band
            end = rowlen[band][slots]
            if pol.per_request:
                if not end.all():
                    return None
                continue
            first = self.first[band][slots]
            if pol.windowed:
                f0 = pol.first_page(t0)
                if not ((first <= f0) & (f0 <= end) & ((end > first) | (first == f0))).all():
                    return None
                gone = np.maximum(pol.first_page(t + 1) - first[None, :], 0)
                released |= (np.diff(gone, axis=0, prepend=0) > 0).any(axis=1)
            cum = grown_pages(end[None, :], t + 1, pol.page_size)
            demand[:, :, band] = np.diff(cum, axis=0, prepend=0)
        return demand, released
