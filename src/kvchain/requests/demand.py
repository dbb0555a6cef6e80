"""The one demand function: what a request must add to compute its next tokens, band by
band through the geometry's policies (:mod:`kvchain.bands.policies`).

:func:`request_demand` turns a request description into a
:class:`~kvchain.alloc.snapshot.Demand`; admission, reservation, allocation and the decode
check all call it (the decode batch calls the same policy formulas over arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvchain.alloc.snapshot import Demand
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import InvalidDemandError
from kvchain.field_types import is_whole

Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class HeldPages:
    """What a request holds, as counts (no page ids): the input of :func:`request_demand`.

    Attributes:
        spans: per band (low -> high), the page indices ``(first, end)`` held: full bands
            ``(0, pages)`` covering tokens ``[0, pages * P)``, window and local bands from
            their first live page (pages before it were released), state bands
            ``(0, slots)``. Bands past the tuple's end hold nothing (so
            :data:`NOTHING_HELD` fits every chain).
    """

    spans: Spans = ()

    def span(self, band: int) -> tuple[int, int]:
        """``(first, end)`` held in ``band`` (``(0, 0)``: nothing)."""
        spans = self.spans
        return spans[band] if band < len(spans) else (0, 0)

    @staticmethod
    def counts(geom: RequestGeometry, full: int = 0, windows: Sequence[tuple[int, int]] = (),
               slots: int = 0) -> HeldPages:
        """Held pages from kind counts: ``full`` pages of the full band, ``(first, end)``
        per window/local band of ``geom.windows`` in order (missing ones: nothing),
        ``slots`` state slots.

        Raises:
            InvalidDemandError: more window spans than window bands.
        """
        if len(windows) > len(geom.windows):
            raise InvalidDemandError(f"{len(windows)} window spans for "
                                     f"{len(geom.windows)} window bands")
        spans = [(0, 0)] * geom.num_bands
        for pol in geom.policies:
            if pol.per_request:
                spans[pol.band] = (0, slots)
            elif not pol.windowed:
                spans[pol.band] = (0, full)
        for pol, span in zip(geom.windows, windows, strict=False):
            spans[pol.band] = span
        return HeldPages(tuple(spans))


NOTHING_HELD = HeldPages()


def _token_counts(*counts: object) -> tuple[int, ...]:
    """Token counts as Python ints (numpy integers converted).

    Raises:
        InvalidDemandError: a count that is not an integer (a bool, float, string, ...).
    """
    out = []
    for v in counts:
        if not is_whole(v):
            raise InvalidDemandError(f"token counts must be integers, got {v!r} "
                                     f"({type(v).__name__})")
        out.append(int(v))
    return tuple(out)


def request_demand(geom: RequestGeometry, held: HeldPages, start: int, extend: int,
                   headroom: int = 0, headroom_chunk: int = 1,
                   points: Sequence[int] = (), horizon: int = 0,
                   recompute: int = 0) -> Demand:
    """Pages a request must add to compute ``extend`` tokens from position ``start``, plus
    the pages of ``headroom`` later tokens (the one pure demand function).

    Args:
        geom: the chain's request geometry.
        held: what the request holds now.
        start: tokens already in its cache (``s``).
        extend: tokens to compute now (a prefill chunk ``c``, or 1 for a decode).
        headroom: later tokens to reserve beyond ``start + extend`` (rest of the prompt,
            expected decode tokens); admission and reservation only.
        headroom_chunk: the largest chunk those later tokens come in (1 for decode).
        points: the request's prefix-cache resume points still to come (page counts,
            sorted; :func:`kvchain.cache.radix.resume_points`): one state checkpoint slot
            for each point reached by ``(start, start + extend + headroom]``. The window
            tails kept for them add nothing: each lies inside the live span of the step
            that reaches its point and goes to the cache at that step's commit
            (``resume_pages`` of the window policy).
        horizon: later tokens the request is expected to compute, when more than
            ``headroom`` (0: ``headroom``): the window bands' later peak is taken over
            ``max(headroom, horizon)`` tokens, the full band's pages over ``headroom`` (a
            window's pages do not grow with tokens, so a request that will decode past its
            reserved share of a batch's growth needs its window's whole later peak).
        recompute: tokens ``[start - recompute, start)`` this extend computes again before
            its own (a partial prefix-cache hit's gap: their pages are held, so they add
            none; the state passes them, so a resume point among them is reached).

    Returns:
        Demand per band: its policy's ``pages`` (full: pages to cover ``[0, s + c +
        headroom)``; window: its peak from now on less what it holds; state: its slots if
        none are held) plus its ``resume_pages``.

    Raises:
        InvalidDemandError: negative or non-integer token counts (bools, floats and
            strings refused; numpy integers accepted) or ``headroom_chunk < 1``.

    Example (``P = 16``, ``W = 128``, nothing held, a 17-token extend at 0): full 2 pages,
    window 2 pages (field case F5).
    """
    start, extend, headroom, headroom_chunk, horizon = _checked(
        start, extend, headroom, headroom_chunk, horizon, recompute)
    return _pages(geom, held, start, extend, headroom, headroom_chunk, points, horizon,
                  recompute)


def request_demands(geom: RequestGeometry, held: HeldPages, start: int, extend: int,
                    headroom: int = 0, headroom_chunk: int = 1,
                    points: Sequence[int] = (), horizon: int = 0,
                    recompute: int = 0) -> tuple[Demand, Demand]:
    """:func:`request_demand` of the ``extend`` tokens alone and with the ``headroom``
    later tokens, from one check of the arguments: ``(take, reserved)``, where ``take``
    is ``request_demand(geom, held, start, extend, points=points, recompute=recompute)``
    (what the step takes) and ``reserved`` is ``request_demand`` with every argument (what
    admission reserves for it). Admission computes both once and the step plan reuses the
    first (issue 20, item 4).

    Raises:
        InvalidDemandError: as :func:`request_demand`.
    """
    start, extend, headroom, headroom_chunk, horizon = _checked(
        start, extend, headroom, headroom_chunk, horizon, recompute)
    take = _pages(geom, held, start, extend, 0, 1, points, 0, recompute)
    if not headroom and not horizon:
        return take, take
    return take, _pages(geom, held, start, extend, headroom, headroom_chunk, points,
                        horizon, recompute)


def _checked(start: int, extend: int, headroom: int, headroom_chunk: int, horizon: int,
             recompute: int) -> tuple[int, int, int, int, int]:
    """The token counts of :func:`request_demand` as ints, checked.

    Raises:
        InvalidDemandError: as :func:`request_demand`.
    """
    if not (type(start) is int and type(extend) is int and type(headroom) is int
            and type(headroom_chunk) is int and type(horizon) is int):
        start, extend, headroom, headroom_chunk, horizon = _token_counts(
            start, extend, headroom, headroom_chunk, horizon)
    if (start < 0 or extend < 0 or headroom < 0 or headroom_chunk < 1 or horizon < 0
            or not 0 <= recompute <= start):
        raise InvalidDemandError(f"bad token counts: start={start} extend={extend} "
                                 f"headroom={headroom} headroom_chunk={headroom_chunk} "
                                 f"horizon={horizon} recompute={recompute}")
    return start, extend, headroom, headroom_chunk, horizon


def _pages(geom: RequestGeometry, held: HeldPages, start: int, extend: int, headroom: int,
           headroom_chunk: int, points: Sequence[int], horizon: int, recompute: int,
           ) -> Demand:
    """The demand of checked counts: per band its policy's ``pages`` plus its
    ``resume_pages`` (see :func:`request_demand`)."""
    span, pages = held.span, []
    for pol in geom.policies:
        first, end = span(pol.band)
        got = pol.pages(first, end, start, extend, headroom, headroom_chunk, horizon)
        if points:
            got += pol.resume_pages(points, first, end, start, extend, headroom,
                                    headroom_chunk, horizon, recompute)
        pages.append(got)
    return Demand(tuple(pages))


def tail_spans(geom: RequestGeometry, points: Sequence[int], after: int = 0,
               ) -> tuple[Spans, ...]:
    """The window pages a request keeps for its resume points ``points`` (page counts),
    per band: for a window or local band the union of the points' tails
    ``[resume_start(q), q)``, from page ``after`` on, as disjoint sorted ranges; empty for
    other bands (and ``()`` when no band has a window)."""
    if not geom.windows:
        return ()
    out: list[Spans] = [()] * geom.num_bands
    for pol in geom.windows:
        spans: list[tuple[int, int]] = []
        for q in points:
            lo = max(pol.resume_start(q), after)
            if spans and lo <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], q))
            elif q > lo:
                spans.append((lo, q))
        out[pol.band] = tuple(spans)
    return tuple(out)


def context_drafts(drafts: int, length: int, context: int | None) -> int:
    """The drafts a speculative decode may compute at ``length`` tokens in the cache under
    a model context of ``context`` tokens: ``min(drafts, context - 1 - length)``, never
    below 0 (``None``: no context, ``drafts``). Positions past ``context - 1`` do not
    exist, so the step's ``1 + d`` tokens end at position ``context - 1`` at the latest
    and the request's KV never holds more than ``context`` tokens (vLLM's scheduler cuts a
    step's tokens, drafts included, at ``max_model_len - 1 - num_computed_tokens``).

    Example: ``k = 3``, ``C = 64``, ``L = 62``: ``min(3, 64 - 1 - 62) = 1`` draft.
    """
    if context is None:
        return drafts
    return max(0, min(drafts, context - 1 - length))


def lifetime_demand(geom: RequestGeometry, prompt: int, output: int,
                    points: Sequence[int] = (), context: int | None = None) -> Demand:
    """A lone request's whole life as one demand on an empty chain: all of its KV
    (``prompt + output - 1`` tokens; the last sampled token is never fed back), its state
    slots, and the window peak of chunks of one page (``ceil((W - 1 + P) / P) + 1``
    pages): the smallest footprint any chunking reaches, since the scheduler cuts each
    chunk to what fits. A request whose lifetime demand does not fit the empty chain can
    never finish; one that fits always can, alone (field cases F2, F3, F7) - also after a
    retraction, whose first one-page chunk demands no more than this. With speculative
    decoding (``geom.spec_tokens = k``) the last step's drafts are KV too (its ``1 + d``
    tokens are in the cache until the verify), so ``d`` more tokens of every band, where
    ``d`` is :func:`context_drafts` at that step's length ``prompt + output - 2``: at most
    ``k``, and never KV past the model's ``context`` tokens (``None``: no cap); the state
    slots and window slack come from the policies.

    Example (``P = 16``, one full band, ``k = 3``, ``C = 64``): prompt 60, output 4: the
    last step at 62 tokens drafts ``min(3, 64 - 1 - 62) = 1``, so 63 + 1 = 64 tokens, 4
    pages (without the context: 66 tokens, 5 pages).

    Raises:
        InvalidDemandError: a prompt or output below 1.
    """
    if prompt < 1 or output < 1:
        raise InvalidDemandError(f"prompt and output must be >= 1, got {prompt}, {output}")
    first = min(geom.page_size, prompt)
    kv = prompt + output - 1
    if context is not None:
        kv = max(first, min(kv, context))  # a limit past the context never runs past it
    rest = kv - first + context_drafts(geom.spec_tokens, kv - 1, context)
    # Later chunks of one page even for a one-page prompt: after a retraction the request
    # is recomputed from prompt + generated tokens, which may span more than a page.
    return request_demand(geom, NOTHING_HELD, 0, first, rest, geom.page_size, points)
