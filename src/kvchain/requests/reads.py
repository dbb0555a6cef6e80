"""Read views of a manager's request table: one
request's page table, a batch's block table (the kernels' input), and pages per band
held or owned by a set of requests (the simulator's band samples). Nothing here changes a
request or the chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import InvalidDemandError
from kvchain.field_types import is_whole
from kvchain.requests.batch import check_flag, request_ids
from kvchain.requests.rows import Rows


class Reads:
    """The read views of one manager's requests (``kv.reads``); with :attr:`chain` and
    :meth:`page_table` it is the host copy's
    :class:`~kvchain.cache.host_copy.PageTables`.

    Args:
        rows: the manager's requests and their table.
        geom: the chain's request geometry.
        chain: the allocator (its ``translate`` for physical block tables).
    """

    def __init__(self, rows: Rows, geom: RequestGeometry, chain: Allocator) -> None:
        self._rows, self._geom, self.chain = rows, geom, chain

    def _check_band(self, band: int) -> None:
        """Raises InvalidDemandError unless ``band`` is an int band index of this chain."""
        if not is_whole(band) or not 0 <= band < self._geom.num_bands:
            raise InvalidDemandError(f"no band {band} in this chain")

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """Virtual page ids of ``rid`` in ``band`` in token order (int64, shape ``[pages]``,
        a copy of its row).

        For a window band, entry ``j`` is the page of tokens ``[j * P, (j + 1) * P)``;
        released entries hold the band's null page. Translate with
        ``chain.translate(band, table)`` (one call per batch).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: no band ``band`` in this chain.
        """
        slot = self._rows.of(rid).slot
        self._check_band(band)
        table = self._rows.table
        return table.tables[band][slot, :table.rowlen[band, slot]].copy()

    def block_table(self, rids: Sequence[int], band: int, physical: bool = True) -> np.ndarray:
        """The block table of a batch in ``band``: the layout paged-attention kernels take
        (vLLM's and FlashInfer's ``block_tables``: one row per sequence, one page id per
        column, in token order).

        Args:
            rids: request ids, one row each, in this order.
            band: band index.
            physical: physical page indices on the band's grid (through the allocator's
                ``translate``, as kernels address pages); ``False``: virtual ids.

        Returns:
            int64 ``[len(rids), max_pages]``, ``max_pages`` the longest row among ``rids``.
            Row ``i`` is :meth:`page_table` of ``rids[i]`` (translated), then padding.
            Padding and released window pages hold the band's null page; in a band that
            reserves none (full and state bands: they release nothing before the request
            ends) padding is ``-1`` (a kernel reads a row only up to its request's length,
            ``ceil(L / P)`` pages). A gather of the request table's rows and one
            ``translate``.

        Raises:
            InvalidDemandError: no band ``band`` in this chain, ``physical`` not a bool, or
                ``rids`` not a sequence of int request ids
                (:func:`~kvchain.requests.batch.request_ids`).
            UnknownRequestError: a request that holds no pages.
        """
        self._check_band(band)
        check_flag(physical, "block_table's physical")
        slots = self._rows.index.known_slots(request_ids(rids, "block_table's rids"))
        table = self._rows.table
        width = int(table.rowlen[band][slots].max()) if slots.size else 0
        vids = table.tables[band][slots, :width]
        if not physical or not vids.size:
            return vids
        if table.pads[band] >= 0:
            return self.chain.translate(band, vids)
        out = np.full(vids.shape, -1, dtype=np.int64)
        valid = vids >= 0
        out[valid] = self.chain.translate(band, vids[valid])
        return out

    def held_per_band(self, rids: Iterable[int]) -> tuple[int, ...]:
        """Pages per band (state slots for a state band; low -> high) that requests ``rids``
        hold, read from the table in O(bands) numpy calls: every band's pages from its
        first live one to the last. Ids that hold nothing count 0; an id given twice
        counts twice (as a sum over the ids given).

        Without a prefix cache this is every page the requests own (what the band samples
        count each step); with one, a request's hit pages are the cache's and its saved
        checkpoints are not in its rows: :meth:`owned_per_band` counts those.

        Raises:
            InvalidDemandError: ``rids`` not a sequence of int request ids (a ``bool``
                would alias request 0 or 1).
        """
        ids = request_ids(rids, "held_per_band's rids")
        if not ids:
            return (0,) * self._geom.num_bands
        slots = self._rows.index.slots_of(ids)
        table = self._rows.table
        counts = (table.rowlen[:, slots] - table.first[:, slots]).sum(axis=1)
        return tuple(counts.tolist())

    def owned_per_band(self, rids: Iterable[int]) -> tuple[int, ...]:
        """Pages per band that requests ``rids`` hold as their own: :meth:`held_per_band`
        less the prefix cache's shared pages in their rows, plus the window pages they
        keep for the cache and their saved state checkpoints (ids that hold nothing are
        skipped). The split ``KVManager.audit`` checks page by page.

        Raises:
            InvalidDemandError: ``rids`` not a sequence of int request ids.
        """
        rows, geom = self._rows, self._geom
        ids = tuple(rid for rid in request_ids(rids, "owned_per_band's rids") if rid in rows)
        if not ids:
            return (0,) * geom.num_bands
        slots = rows.index.slots_of(ids)
        table = rows.table
        counts = list(self.held_per_band(ids))
        shared = table.shared[slots]
        facts = [rows.of(rid) for rid in ids]
        for pol in geom.policies:
            band = pol.band
            if pol.per_request:
                counts[band] += sum(len(f.ckpts) for f in facts)
                continue
            first, end = table.first[band][slots], table.rowlen[band][slots]
            counts[band] -= int((np.minimum(shared, end) - np.minimum(first, shared)).clip(0)
                                .sum())
            if pol.windowed:
                counts[band] += sum(len(f.kept.get(band, ())) for f in facts)
        return tuple(counts)
