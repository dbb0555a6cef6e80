"""A speculative decode step's settlement: the rollback of rejected drafts, then the
commit of the accepted tokens (the request layer's part of speculative decoding; the
step itself is ``KVManager.decode_demands(rids, drafts=k)`` and ``allocate`` of
``(rid, 1 + k)``, the acceptance is the engine's, :mod:`kvchain.hf.speculative`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvchain.errors import InvalidDemandError

if TYPE_CHECKING:
    from kvchain.requests.manager import KVManager


class Speculation:
    """The verify of a :class:`~kvchain.requests.manager.KVManager`'s speculative steps,
    and what its rollbacks released. The manager owns one (``kv.speculation``).

    Args:
        kv: the manager whose requests it settles.

    Attributes:
        rolled_back_pages: pages per band (low -> high) released by rollbacks so far (the
            rejected drafts' pages; the simulator charges them as transient bytes).
    """

    def __init__(self, kv: KVManager) -> None:
        self._kv = kv
        self.rolled_back_pages = [0] * kv.geom.num_bands

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
            InvalidDemandError: a request named twice, ``accepted`` not integers in
                ``[0, drafts]`` of the batch's length, or ``1 + drafts`` tokens not
                covered by a request's pages in a band that keeps every token or a window
                band. Checked for the whole batch before anything changes.
        """
        kv = self._kv
        ids = tuple(rids)
        slots = kv._checked_slots(ids, "verify")
        acc = _accepted(accepted, len(ids), drafts)
        table = kv._table
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
        table = self._kv._table
        computed = table.tokens[slots] + step
        for pol in self._kv.geom.policies:
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
        kv = self._kv
        released = 0
        for pol in kv.geom.policies:
            if pol.per_request:
                continue
            vids = kv._table.truncate(pol.band, slots, -(-n // pol.page_size))
            if vids.size:
                kv.chain.release(pol.band, vids)
                released += int(vids.size)
                self.rolled_back_pages[pol.band] += int(vids.size)
        return released

    def _commit(self, ids: tuple[int, ...], slots: np.ndarray, acc: np.ndarray,
                n: np.ndarray) -> int:
        """Commit ``1 + acc`` tokens of each request (``n`` its new counts): in arrays, or
        through ``KVManager.commit`` one by one where it is overridden or a prompt insert
        may be due. Returns the window pages released."""
        from kvchain.requests.manager import KVManager  # the class whose commit is plain

        kv = self._kv
        if type(kv).commit is not KVManager.commit or kv._glue.may_insert(ids):
            return sum(kv.commit(rid, 1 + int(a))
                       for rid, a in zip(ids, acc.tolist(), strict=True))
        kv._table.tokens[slots] = n
        return sum(kv._release_fronts(pol.band, slots, pol.first_page(n))
                   for pol in kv.geom.windows)


def _accepted(accepted: Sequence[int] | np.ndarray, rows: int, drafts: int) -> np.ndarray:
    """``accepted`` as int64 ``[rows]``, each in ``[0, drafts]``.

    Raises:
        InvalidDemandError: ``drafts`` not an int >= 0; ``accepted`` of another length,
            not integers (a ``bool`` included), or out of range.
    """
    acc = np.asarray(accepted)
    if not isinstance(accepted, np.ndarray) and bool in set(map(type, accepted)):
        acc = np.asarray(accepted, dtype=object)  # True would read as 1: refused below
    if type(drafts) is not int or drafts < 0:
        raise InvalidDemandError(f"drafts must be an int >= 0, got {drafts!r}")
    if (acc.shape != (rows,) or (acc.size and acc.dtype.kind not in "iu")
            or (acc.size and not 0 <= int(acc.min()) <= int(acc.max()) <= drafts)):
        raise InvalidDemandError(f"accepted drafts must be {rows} integers in "
                                 f"[0, {drafts}], got {accepted!r}")
    return acc.astype(np.int64)
