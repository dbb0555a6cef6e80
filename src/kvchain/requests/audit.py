"""The request layer's audits: every bound page held by exactly one owner (a request, the
prefix cache, or a null page), and what a speculative rollback leaves (no rejected draft's
page kept, no window slack, exactly the geometry's state slots).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvchain.alloc.allocator import Allocator
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import AuditError
from kvchain.requests.batch import request_ids
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.rows import Rows


class Audit:
    """The audits of one manager's requests (``kv.audits``).

    Args:
        rows: the manager's requests and their table.
        geom: the chain's request geometry.
        chain: the allocator whose bound pages are counted.
        glue: the prefix cache's part (its pages and its own audit).
    """

    def __init__(self, rows: Rows, geom: RequestGeometry, chain: Allocator,
                 glue: CacheGlue) -> None:
        self._rows, self._geom, self._chain, self._glue = rows, geom, chain, glue

    def pages(self) -> None:
        """Every bound page of the chain is held by exactly one request or the prefix cache,
        or is a null page; every shared page a request reads is the cache's.

        Raises:
            AuditError: a leaked page (bound, held by nobody) or a page held twice.
        """
        table, geom, glue = self._rows.table, self._geom, self._glue
        held: list[list[int]] = [[] for _ in range(geom.num_bands)]
        shared: list[list[int]] = [[] for _ in range(geom.num_bands)]
        for facts in self._rows.facts.values():
            slot = facts.slot
            h = int(table.shared[slot])
            for pol in geom.policies:
                first = int(table.first[pol.band, slot])
                for i, v in enumerate(table.live(pol.band, slot).tolist(), first):
                    (shared if i < h and not pol.per_request else held)[pol.band].append(v)
            glue.kept_pages(facts, held)
        cached = glue.held_pages()
        for band in range(geom.num_bands):
            self._band(band, held[band], shared[band],
                       cached[band] if cached is not None else [])
        glue.audit(self._rows.facts)

    def _band(self, band: int, held: list[int], shared: list[int],
              in_cache: list[int]) -> None:
        """One band of :meth:`pages`: requests' own pages, the cache's, the null pages."""
        if len(set(held)) != len(held):
            raise AuditError(f"band {band}: a page is held by two requests")
        owned = set(in_cache)
        if len(owned) != len(in_cache) or owned & set(held):
            raise AuditError(f"band {band}: a page held twice by the cache or by the cache "
                             "and a request")
        if not owned.issuperset(shared):
            raise AuditError(f"band {band}: a request uses a shared page the cache does not "
                             "hold")
        chain = self._chain
        reserved = chain.layout.bands[band].reserved_pages
        total = len(held) + len(in_cache)
        bound = chain.bound_pages(band)
        if bound != total + reserved:
            raise AuditError(f"band {band}: {bound} pages bound, {len(held)} held by "
                             f"requests + {len(in_cache)} by the cache + {reserved} null: "
                             f"{bound - total - reserved} leaked")

    def settled(self, rids: Iterable[int]) -> None:
        """What ``KVManager.verify`` leaves, checked for requests ``rids`` (run it after a
        rollback): no page of a full, window or chunked-local band at or past
        ``ceil(L / P)`` (``L`` its tokens: no rejected draft's page kept), no window page
        before its window (``first_page(L)``: the window slack released), and its state
        slots exactly the geometry's ``state_slots`` (its checkpoints, none leaked or
        lost).

        Raises:
            AuditError: the first request that holds more or less.
            UnknownRequestError: a request that holds no pages.
            InvalidDemandError: ``rids`` not a sequence of int request ids.
        """
        table, geom = self._rows.table, self._geom
        for rid in request_ids(rids, "audit_settled's rids"):
            slot = self._rows.of(rid).slot
            tokens = int(table.tokens[slot])
            for pol in geom.policies:
                first, end = table.span(pol.band, slot)
                if pol.per_request:
                    if end and end != geom.state_slots:
                        raise AuditError(f"request {rid}: {end} state slots, "
                                         f"{geom.state_slots} claimed")
                    continue
                if end > -(-tokens // pol.page_size):
                    raise AuditError(f"request {rid}: band {pol.band} holds {end} pages for "
                                     f"{tokens} tokens (a rolled-back page kept)")
                if pol.windowed and end > first and first < pol.first_page(tokens):
                    raise AuditError(f"request {rid}: band {pol.band} keeps page {first} "
                                     f"behind its window (slack not released)")
