"""One policy per band kind: the page formulas of full, window(W), chunked-local(C) and
state(slots) bands, each written once (docs/design.md §4).

Token positions -> pages (``P`` tokens per page)::

    full    pages covering [0, L)
    window  pages covering [max(0, s - W + 1), s + c)   for a chunk of c tokens at s
    local   pages covering [floor(s / C) * C, s + c)     (chunked local attention)
    state   the request's slots (1 working + checkpoints), claimed by the first chunk

Every band holds a span of page indices ``[first, end)`` per request: full and state bands
from 0 (``end`` pages or slots held), window and local bands from their first live page
(pages before it were released by the window-tail release). The formulas take and return
integers over plain arithmetic (``//``, ``-(-a // b)`` for a ceiling and the helpers
below), so the same line serves one request (Python ints) and a decode batch (numpy int64
arrays of request positions and held spans, with scalar token counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from kvchain.layout import min_window_pages

IntLike = TypeVar("IntLike", int, np.ndarray)


def ceil_div(a: IntLike, b: int) -> IntLike:
    """``ceil(a / b)`` for ``b > 0`` (ints or int arrays)."""
    return -(-a // b)


def grown_pages(end: IntLike, stop: IntLike, page_size: int) -> IntLike:
    """Pages a band that keeps every token must add to pages ``[0, end)`` so that they
    cover tokens ``[0, stop)``: ``max(0, ceil(stop / P) - end)``."""
    return at_least_0(ceil_div(stop, page_size) - end)


def at_least_0(a: IntLike) -> IntLike:
    """``max(a, 0)``, elementwise for an array."""
    if isinstance(a, np.ndarray):
        return np.maximum(a, 0)
    return a if a > 0 else 0


def smaller(a: IntLike, b: IntLike | int) -> IntLike:
    """``min(a, b)``, elementwise when either is an array."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a < b else b


def larger(a: IntLike, b: IntLike | int) -> IntLike:
    """``max(a, b)``, elementwise when either is an array."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a > b else b


def plain_rows(pol: BandPolicy, first: IntLike, end: IntLike, start: IntLike) -> Any:
    """Rows of a window or local band whose held pages ``[first, end)`` reach the first
    page of the window of the token at ``start`` from its left and right:
    ``first <= f <= end``, ``f = pol.first_page(start)`` (bool ``[n]`` for int64 arrays of
    page indices and token positions, a bool for one row's ints).

    For such a row a chunk of ``extend`` tokens from ``start`` with no headroom needs
    ``pol.pages(first, end, start, extend) == grown_pages(end, start + extend, P)``: its
    held pages inside the span are ``min(end, e) - f`` (``e = ceil((start + extend) / P)
    >= f``), so ``(e - f) - (min(end, e) - f) = max(0, e - end)``: the full band's
    formula. Example (``W = 128``, ``P = 16``): ``start = 1,008``, ``[55, 63)`` held:
    ``f = 55``, ``e = 64``: 1 page, as the full band holding 63 pages."""
    f = pol.first_page(start)
    return (first <= f) & (f <= end)


@dataclass(frozen=True, slots=True)
class BandPolicy:
    """The formulas of one band kind (subclassed per kind; never instantiated alone).

    Attributes:
        band: the band's index in its chain (low -> high).
        page_size: ``P`` tokens per page.
        kind: ``"full"``, ``"window"``, ``"local"`` or ``"state"``.
        windowed: True for the window and chunked-local kinds (their pages behind the
            window are released and the prefix cache keeps their tails).
        per_request: True for the state kind (a fixed count of slots per request,
            independent of tokens).
    """

    band: int
    page_size: int

    kind: ClassVar[str] = ""
    windowed: ClassVar[bool] = False
    per_request: ClassVar[bool] = False

    def first_token(self, position: IntLike) -> IntLike:
        """First token the band must hold to compute the token at ``position`` (0 for
        bands that keep every token)."""
        return position * 0

    def first_page(self, position: IntLike) -> IntLike:
        """First page the band must hold to compute the token at ``position``: the
        window-tail release drops every page before it after the forward that computed
        tokens up to ``position``."""
        return self.first_token(position) // self.page_size

    def pages(self, first: IntLike, end: IntLike, start: IntLike, extend: int,
              headroom: int = 0, chunk: int = 1, horizon: int = 0) -> IntLike:
        """Pages a request holding ``[first, end)`` must add to compute ``extend`` tokens
        from position ``start``, plus ``headroom`` later tokens in chunks of at most
        ``chunk`` (``horizon``: the later tokens it is expected to compute, when more than
        ``headroom``). Arguments are checked by the caller
        (:func:`kvchain.requests.demand.request_demand`)."""
        raise NotImplementedError

    def resume_start(self, point: int) -> int:
        """First page a prefix-cache hit that resumes after ``point`` pages must hold in
        this band (its tail ``[resume_start, point)``; ``point`` for a band that needs
        none)."""
        return point

    def peak_pages(self, chunk: int) -> int:
        """Most pages of the band a chunk of ``chunk`` tokens needs at any start."""
        raise NotImplementedError

    def resume_pages(self, points: Sequence[int], first: int, end: int, start: int,
                     extend: int, headroom: int, chunk: int = 1, horizon: int = 0,
                     recompute: int = 0) -> int:
        """Pages the band adds to :meth:`pages` (same arguments: a request holding
        ``[first, end)`` computes ``extend`` tokens from ``start``, then ``headroom`` later
        tokens in chunks of at most ``chunk``, ``horizon`` expected) for the prefix cache's
        resume points ``points`` (page counts) reached by the tokens ``(start - recompute,
        start + extend + headroom]``: 0 for a band that takes no page of its own there.
        ``recompute``: tokens before ``start`` the extend computes again (a partial hit's
        gap: held pages, but the state passes them).

        Window and chunked-local bands add 0: the tail ``[resume_start(q), q)`` kept for a
        point ``q`` reached by a step lies inside that step's live span
        (``resume_start(q) = first_page(qP) >= first_page(s)`` and ``q <= ceil((s + c) /
        P)``), and the commit that computes it hands it to the prefix cache
        (incremental insertion, :meth:`kvchain.requests.cache_glue.CacheGlue.maybe_insert`),
        so no step holds a tail beside its live span (it is then evictable cache, which the
        planner counts as supply)."""
        return 0


@dataclass(frozen=True, slots=True)
class FullPolicy(BandPolicy):
    """Full attention: every token's KV stays; pages cover ``[0, L)``."""

    kind: ClassVar[str] = "full"

    def pages(self, first: IntLike, end: IntLike, start: IntLike, extend: int,
              headroom: int = 0, chunk: int = 1, horizon: int = 0) -> IntLike:
        """``max(0, ceil((s + c + headroom) / P) - end)`` (pages grow with tokens; the
        horizon does not add to them)."""
        return grown_pages(end, start + extend + headroom, self.page_size)

    def resume_start(self, point: int) -> int:
        """A hit after ``point`` pages holds all of them: 0."""
        return 0

    def peak_pages(self, chunk: int) -> int:
        """``ceil(c / P) + 1`` (a chunk starting inside a page)."""
        return ceil_div(chunk, self.page_size) + 1


@dataclass(frozen=True, slots=True)
class _WindowedPolicy(BandPolicy):
    """What window and chunked-local bands share: pages covering
    ``[first_token(s), s + c)`` at the chunk's peak, released behind the window.

    Attributes:
        tokens: ``W`` (window) or ``C`` (chunk) tokens.
        spec: draft tokens ``k`` of a speculative decode step (0: none): a later decode
            computes ``1 + k`` tokens, so its window holds ``W + k`` tokens until the
            verify commits the accepted ones (the window slack, :meth:`later_peak_pages`).
    """

    tokens: int = 0
    spec: int = 0
    windowed: ClassVar[bool] = True

    def pages(self, first: IntLike, end: IntLike, start: IntLike, extend: int,
              headroom: int = 0, chunk: int = 1, horizon: int = 0) -> IntLike:
        """The band's *peak* from now on minus what it holds: the pages covering
        ``[first_page(s), ceil((s + c) / P))`` now, or with later tokens
        (``ahead = max(headroom, horizon)``) up to :meth:`later_peak_pages` of a later
        page-aligned chunk of ``min(chunk, ahead)`` tokens (window-tail release runs in
        between, so the two do not add up); 0 when nothing is computed now or later."""
        if not (extend or headroom or horizon):
            return start * 0
        now, later, have = self._spans(first, end, start, extend, headroom, chunk, horizon)
        return at_least_0(larger(now, later) - have)

    def _spans(self, first: IntLike, end: IntLike, start: IntLike, extend: int,
               headroom: int, chunk: int, horizon: int) -> tuple[IntLike, IntLike, IntLike]:
        """``(now, later, have)`` of :meth:`pages`: the pages covering
        ``[first_page(s), ceil((s + c) / P))`` (the chunk's live span), the most a later
        step's live span holds (0 without later tokens: at most
        :meth:`later_peak_pages`, and at most the pages from the window of
        ``s + c - min(k, c)`` - where a step of ``1 + k`` tokens whose drafts are all
        rejected leaves the request - to ``ceil((s + c + ahead) / P)``) and the held pages
        inside the chunk's span."""
        p = self.page_size
        stop = start + extend
        need_first = self.first_page(start)
        end_page = ceil_div(stop, p)
        have = at_least_0(smaller(end, end_page) - larger(first, need_first))
        now = end_page - need_first
        later = now * 0
        ahead = max(headroom, horizon)
        if ahead:
            # A speculative decode's last k tokens are drafts: when the verify rejects
            # them the next step starts k tokens earlier, so the later span starts at the
            # window of ``stop - k`` (extend = 1 + k), not of ``stop``.
            settled = stop - min(self.spec, extend)
            later = at_least_0(smaller(ceil_div(stop + ahead, p) - self.first_page(settled),
                                       self.later_peak_pages(min(chunk, ahead))))
        return now, later, have

    def resume_start(self, point: int) -> int:
        """``first_page(point * P)``: the window tail a hit after ``point`` pages reads."""
        return self.first_page(point * self.page_size)

    def peak_pages(self, chunk: int) -> int:
        """``ceil((W - 1 + c) / P) + 1`` (``C`` for a local chunk: also a bound): the
        window before the chunk's first token plus the chunk, starting anywhere in a page
        (field cases F2, F6). The layout's fewest window pages at ``W + c`` tokens
        (:func:`kvchain.layout.min_window_pages`, the formula's one copy; ``c = 0``: the
        smallest request's window pages)."""
        return min_window_pages(self.tokens + chunk, self.page_size)

    def later_peak_pages(self, chunk: int) -> int:
        """Most pages a *later* step needs: a prefill chunk of ``chunk`` tokens that starts
        on a page boundary (the scheduler cuts every chunk but a prompt's tail to whole
        pages, so later chunks always do), or a decode (``chunk = 1``, any position):
        ``ceil(c / P) + ceil((W - 1) / P)``. E.g. ``W = 32``, ``P = 16``: 3 pages for a
        one-page chunk and for a decode, where the any-start :meth:`peak_pages` says 4
        for the chunk.

        With speculative decoding (``spec = k > 0``) a later decode computes ``1 + k``
        tokens at any position: ``W + k`` tokens ``[s - W + 1, s + k]``, at most
        ``ceil((W + k - 1) / P) + 1`` pages (the window slack; ``k = 0`` gives the decode
        term above), and the result is the larger of the two. E.g. ``W = 32``,
        ``P = 16``, ``k = 3``: 4 pages."""
        p = self.page_size
        plain = ceil_div(chunk, p) + ceil_div(self.tokens - 1, p)
        if not self.spec:
            return plain
        return max(plain, ceil_div(self.tokens + self.spec - 1, p) + 1)


@dataclass(frozen=True, slots=True)
class WindowPolicy(_WindowedPolicy):
    """Sliding window of ``W = tokens`` tokens: the token at ``s`` reads
    ``[max(0, s - W + 1), s]``."""

    kind: ClassVar[str] = "window"

    def first_token(self, position: IntLike) -> IntLike:
        """``max(0, position - W + 1)``."""
        return at_least_0(position - (self.tokens - 1))


@dataclass(frozen=True, slots=True)
class LocalPolicy(_WindowedPolicy):
    """Chunked local attention of ``C = tokens`` tokens: the token at ``s`` reads its own
    chunk ``[floor(s / C) * C, s]``."""

    kind: ClassVar[str] = "local"

    def first_token(self, position: IntLike) -> IntLike:
        """``floor(position / C) * C``."""
        return (position // self.tokens) * self.tokens


@dataclass(frozen=True, slots=True)
class StatePolicy(BandPolicy):
    """Recurrent state: ``slots`` slots per request (1 working + checkpoint copies),
    claimed all at once by its first chunk; one more per prefix-cache resume point
    reached (a checkpoint of the state there)."""

    slots: int = 1
    kind: ClassVar[str] = "state"
    per_request: ClassVar[bool] = True

    def pages(self, first: IntLike, end: IntLike, start: IntLike, extend: int,
              headroom: int = 0, chunk: int = 1, horizon: int = 0) -> IntLike:
        """``slots`` if it holds none (``end == 0``) and computes anything now or later,
        else 0."""
        if not (extend or headroom or horizon):
            return end * 0
        if isinstance(end, np.ndarray):
            return np.where(end == 0, self.slots, 0)
        return self.slots if end == 0 else 0

    def resume_pages(self, points: Sequence[int], first: int, end: int, start: int,
                     extend: int, headroom: int, chunk: int = 1, horizon: int = 0,
                     recompute: int = 0) -> int:
        """Checkpoint slots for the resume points ``points`` (page counts) the state
        passes, the tokens ``(start - recompute, stop]``, ``stop = start + extend +
        headroom``: one per point ``q`` with ``start - recompute < q * P <= stop``."""
        p = self.page_size
        lo, stop = start - recompute, start + extend + headroom
        return sum(1 for q in points if lo < q * p <= stop)

    def peak_pages(self, chunk: int) -> int:
        """``slots``: a chunk never needs more."""
        return self.slots
