"""The two halves of a running request's prompt insert (incremental insertion, at the
commit of every prefill chunk that completes whole pages): what its row offers the prefix
cache for pages ``[h, n)`` (:func:`prompt_offer`), and its row and facts once the cache
adopted them (:func:`take_adopted`). The glue
(:meth:`~kvchain.requests.cache_glue.CacheGlue.maybe_insert`) calls
:meth:`PrefixCache.adopt <kvchain.cache.radix.PrefixCache.adopt>` between them and keeps
the locks; nothing here calls the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.radix import Adopted
from kvchain.requests.demand import Spans, tail_spans
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts


@dataclass(frozen=True, slots=True)
class PromptOffer:
    """What a request's row hands the cache at an insert of pages ``[0, n)``.

    Attributes:
        full: per full band (by band index), its page ids ``[0, n)``.
        windows: per window band, page index -> id of the pages ``[h, n)`` it holds (its
            live window below ``n`` and the tails it kept for resume points ``<= n``).
        reading: per window band, the page indices ``[h, n)`` of its live window (it
            still reads them: the cache pins them).
        ckpts: state checkpoints of its resume points ``<= n`` (point -> slot id).
    """

    full: dict[int, list[int]]
    windows: dict[int, dict[int, int]]
    reading: dict[int, list[int]]
    ckpts: dict[int, int]


def prompt_offer(geom: RequestGeometry, table: RequestTable, facts: CacheFacts, n: int,
                 ) -> PromptOffer:
    """The pages the request of ``facts`` offers at an insert of its prompt's pages
    ``[0, n)`` (``shared < n``: pages ``[0, shared)`` are the cache's already)."""
    slot = facts.slot
    h = int(table.shared[slot])
    windows: dict[int, dict[int, int]] = {}
    reading: dict[int, list[int]] = {}
    for pol in geom.windows:
        band = pol.band
        offer: dict[int, int] = {}
        read: list[int] = []
        windows[band], reading[band] = offer, read
        first = int(table.first[band, slot])
        live = table.live(band, slot)  # page index first + j is live[j]
        lo, hi = max(h, first), min(n, first + len(live))
        if lo < hi:
            read.extend(range(lo, hi))
            offer.update(zip(read, live[lo - first:hi - first].tolist(), strict=True))
        kept = facts.kept.get(band)
        if kept and max(kept) < n:  # every kept tail below n (the last insert): all of it
            offer.update(kept)
        elif kept:
            offer.update((i, v) for i, v in kept.items() if i < n)
    return PromptOffer({band: table.live(band, slot)[:n].tolist() for band in geom.fulls},
                       windows, reading, {q: v for q, v in facts.ckpts.items() if q <= n})


def take_adopted(geom: RequestGeometry, table: RequestTable, facts: CacheFacts, n: int,
                 offer: PromptOffer, ad: Adopted) -> None:
    """Point the request's row at the cache's copies of pages ``[0, n)`` (``shared = n``,
    its lock ``ad.handle``) and drop from its facts what it only kept for the cache up to
    there: the kept tails and checkpoints of points ``<= n``, those points themselves."""
    slot = facts.slot
    for band in geom.fulls:
        table.tables[band][slot, :n] = ad.full[band]
    for band, read in offer.reading.items():
        cached = ad.window[band]
        if read and read[-1] + 1 - read[0] == len(read):  # one run (prompt_offer's)
            table.tables[band][slot, read[0]:read[-1] + 1] = cached[read[0]:read[-1] + 1]
        elif read:
            table.tables[band][slot, read] = [cached[i] for i in read]
    facts.handle = ad.handle
    table.shared[slot] = n
    facts.kept = {band: rest for band, kept in facts.kept.items()
                  if (rest := _from(kept, n))}
    facts.ckpts = {q: v for q, v in facts.ckpts.items() if q > n}
    facts.points = tuple(q for q in facts.points if q > n)
    facts.tails = tail_spans(geom, facts.points, n) if facts.points else ()
    facts.retain = retained(geom, facts.tails)


def _from(kept: dict[int, int], n: int) -> dict[int, int]:
    """The entries of ``kept`` (page index -> id) at indices ``>= n`` (a new dict; one
    C-level min/max scan decides the common all-or-none cases)."""
    if not kept or max(kept) < n:
        return {}
    if min(kept) >= n:
        return dict(kept)
    return {i: v for i, v in kept.items() if i >= n}


def retained(geom: RequestGeometry, tails: tuple[Spans, ...]) -> dict[int, frozenset[int]]:
    """Per window band, the page indices of the kept ``tails`` (``(lo, hi)`` ranges per
    band): what its window-tail release keeps for the cache (``{}`` for no tails)."""
    if not tails:
        return {}
    return {pol.band: frozenset(i for lo, hi in tails[pol.band] for i in range(lo, hi))
            for pol in geom.windows}
