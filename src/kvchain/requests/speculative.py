"""A speculative decode step's settlement: the rollback of rejected drafts, then the
commit of the accepted tokens (the request layer's part of speculative decoding; the
step itself is ``KVManager.decode_demands(rids, drafts=k)`` and ``allocate`` of
``(rid, 1 + k)``, the acceptance is the engine's, :mod:`kvchain.hf.speculative`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import InvalidDemandError
from kvchain.requests.batch import check_count, not_a_sequence, request_ids
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.rows import Rows

#: ``commit(rid, tokens) -> window pages released``: one request's commit
Commit = Callable[[int, int], int]
#: ``release_fronts(band, slots, keep_from) -> pages``: the batched window-tail release of
#: rows ``slots`` in ``band`` before page ``keep_from`` (per row)
ReleaseFronts = Callable[[int, np.ndarray, np.ndarray], int]


class Speculation:
    """The verify of a manager's speculative steps, and what its rollbacks released. The
    manager owns one (``kv.speculation``).

    Args:
        rows: the manager's requests and their table.
        geom: the chain's request geometry.
        chain: the allocator the rolled-back pages go back to.
        glue: the prefix cache's part (whether a commit may insert a prompt).
        commit: the manager's commit of one request (the one-by-one path).
        release_fronts: the manager's batched window-tail release (the array path).
        batched: whether a batch's commit may run in arrays (the window-tail release at
            every commit, ``release_fronts``); ``False`` (a manager that keeps window
            tails until its decode check reclaims them) commits one by one.

    Attributes:
        rolled_back_pages: pages per band (low -> high) released by rollbacks so far (the
            rejected drafts' pages; the simulator charges them as transient bytes).
    """

    def __init__(self, rows: Rows, geom: RequestGeometry, chain: Allocator, glue: CacheGlue,
                 commit: Commit, release_fronts: ReleaseFronts, batched: bool = True) -> None:
        self._rows, self._geom, self._chain, self._glue = rows, geom, chain, glue
        self._commit_one, self._release_fronts, self._batched = commit, release_fronts, batched
        self.rolled_back_pages = [0] * geom.num_bands

    def verify(self, rids: Sequence[int], accepted: Sequence[int] | np.ndarray,
               drafts: int) -> int:
        """Settle a speculative step: request ``rids[i]`` computed ``1 + k`` tokens (its
        ``allocate`` of ``(rid, 1 + k)``) and keeps ``1 + accepted[i]`` of them.

        Rollback first, for the whole batch in array operations: in every full, window and
        chunked-local band the pages at or past ``ceil((L + 1 + a) / P)`` (``L`` the
        tokens before the step) are taken out of the rows and released in one
        ``chain.release`` per band (a page holding an accepted token stays). Then the
        commit of ``1 + a`` tokens as ``KVManager.commit_decodes`` (window-tail release:
        the window slack behind the new window goes too; the prefix cache's prompt insert,
        if due, through ``KVManager.commit``). State slots are not released: a request
        holds its ``k`` checkpoint slots for its whole life (the state after the last
        accepted token is one of them and becomes the working state; nothing is
        recomputed), or under ``REPLAY`` its one checkpoint (the engine copies it back and
        recomputes the ``1 + a`` accepted tokens after a rejection: compute, no pages).
        The rejected drafts were never committed, so the prefix cache never sees them.
        ``accepted`` all 0 with ``k = 0`` is ``commit_decodes``.

        Args:
            rids: the step's decoding requests, each once.
            accepted: drafts accepted per request (``0 <= a <= k``), aligned with ``rids``.
            drafts: ``k``, the drafts each request computed in the step.

        Returns:
            Pages released (rollback and window-tail release, all bands).

        Raises:
            UnknownRequestError: a request that holds no pages.
            InvalidDemandError: a request named twice, ``drafts`` not an int in ``[0, k]``
                (``k`` the manager's ``spec_tokens``), ``accepted`` not a sequence of
                integers in ``[0, drafts]`` of the batch's length, or ``1 + drafts`` tokens not
                covered by a request's pages in a band that keeps every token or a window
                band. Checked for the whole batch before anything changes.
        """
        drafts = check_count(drafts, "drafts", 0, self._geom.spec_tokens)
        ids = request_ids(rids, "verify's rids")
        slots = self._rows.index.checked_slots(ids, "verify")
        acc = _accepted(accepted, len(ids), drafts)
        table = self._rows.table
        self._check_covered(ids, slots, 1 + drafts)
        # every request checked: nothing below fails half-way
        n = table.tokens[slots] + 1 + acc
        released = self._roll_back(slots, n)
        released += self._commit(ids, slots, acc, n)
        table.refresh_need(slots)
        return released

    def _check_covered(self, ids: tuple[int, ...], slots: np.ndarray, step: int) -> None:
        """That every token band's pages of rows ``slots`` cover the ``step`` tokens the
        step computed (an empty window band holds none). Raises InvalidDemandError."""
        table = self._rows.table
        computed = table.tokens[slots] + step
        for pol in self._geom.policies:
            if pol.per_request:
                continue
            band = pol.band
            end = table.rowlen[band][slots]
            short = end * pol.page_size < computed
            if pol.windowed:
                short &= end > table.first[band][slots]  # an empty window band: no pages
            if short.any():
                at = int(short.nonzero()[0][0])
                raise InvalidDemandError(f"request {ids[at]}: {step} tokens not covered by "
                                         f"its pages")

    def _roll_back(self, slots: np.ndarray, n: np.ndarray) -> int:
        """Release the pages of rows ``slots`` at or past ``ceil(n / P)`` in every token
        band (one ``chain.release`` per band). Returns the pages released."""
        released = 0
        for pol in self._geom.policies:
            if pol.per_request:
                continue
            vids = self._rows.table.truncate(pol.band, slots, -(-n // pol.page_size))
            if vids.size:
                self._chain.release(pol.band, vids)
                released += int(vids.size)
                self.rolled_back_pages[pol.band] += int(vids.size)
        return released

    def _commit(self, ids: tuple[int, ...], slots: np.ndarray, acc: np.ndarray,
                n: np.ndarray) -> int:
        """Commit ``1 + acc`` tokens of each request (``n`` its new counts): in arrays, or
        through the injected ``commit`` one by one where the batch may not commit in
        arrays (``batched`` off) or a prompt insert may be due. Returns the window pages
        released."""
        if not self._batched or self._glue.may_insert(ids):
            return sum(self._commit_one(rid, 1 + int(a))
                       for rid, a in zip(ids, acc.tolist(), strict=True))
        self._rows.table.tokens[slots] = n
        return sum(self._release_fronts(pol.band, slots, pol.first_page(n))
                   for pol in self._geom.windows)


def _accepted(accepted: Sequence[int] | np.ndarray, rows: int, drafts: int) -> np.ndarray:
    """``accepted`` as int64 ``[rows]``, each in ``[0, drafts]``.

    Raises:
        InvalidDemandError: ``accepted`` not a sequence (``None``, a number), of another
            length, not integers (a ``bool`` included), or out of range.
    """
    if not_a_sequence(accepted):
        raise InvalidDemandError(f"accepted drafts must be a sequence of {rows} ints, got "
                                 f"{type(accepted).__name__} {accepted!r}")
    acc = np.asarray(accepted)
    if not isinstance(accepted, np.ndarray) and bool in set(map(type, accepted)):
        acc = np.asarray(accepted, dtype=object)  # True would read as 1: refused below
    if (acc.shape != (rows,) or (acc.size and acc.dtype.kind not in "iu")
            or (acc.size and not 0 <= int(acc.min()) <= int(acc.max()) <= drafts)):
        raise InvalidDemandError(f"accepted drafts must be {rows} integers in "
                                 f"[0, {drafts}], got {accepted!r}")
    return acc.astype(np.int64)
