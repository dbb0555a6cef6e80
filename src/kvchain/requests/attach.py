"""A waiting request's prefix-cache hit, seen by request id: the attach that matches its
prompt and locks the hit into a new table row, the detach of one not admitted, the LRU
touch once admitted, and what the scheduler reads of the hit (its lock's holds, its
junction cut, a partial hit's gap, the pages other requests share). The cache's side of
each is :class:`~kvchain.requests.cache_glue.CacheGlue`'s; this module turns a request id
into its row and facts (:class:`~kvchain.requests.rows.Rows`) and registers or unregisters
the row. Without a cache every query answers 0 (or zeros).
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidRequestError
from kvchain.requests.batch import check_rid
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.prompt_keys import check_page_keys
from kvchain.requests.rows import Rows


class Attach:
    """The hits of one manager's requests (``kv.attachments``).

    Args:
        rows: the manager's requests and their table.
        glue: the prefix cache's part.
        suspended: ids of the requests suspended to host (they hold no row but may not
            attach again).
    """

    def __init__(self, rows: Rows, glue: CacheGlue, suspended: Container[int]) -> None:
        self._rows, self._glue, self._suspended = rows, glue, suspended

    def attach(self, rid: int, keys: Sequence[int], prompt_tokens: int,
               save_points: bool = True, max_gap: int = 0) -> int:
        """Match a waiting request's prompt against the cache and lock its hit: from now
        on ``rid`` holds the hit's pages by reference (tokens = hit) and its demands price
        only the rest. Undo with :meth:`detach` if it is not admitted. With
        ``save_points`` it keeps window tails and state checkpoints at its resume points
        for the cache, and a junction point where its prompt leaves the cached path
        (:meth:`CacheGlue.attach`). With ``max_gap`` pages (> 0) the hit may be partial:
        the returned tokens are the pages it shares, and :meth:`recompute_tokens` of
        them must be recomputed by its first chunk (its state resumes before them).

        Returns:
            Hit tokens (0 for a miss or without a cache).

        Raises:
            InvalidDemandError: ``rid`` not an int (:func:`check_rid`).
            InvalidRequestError: ``rid`` already holds pages (or is suspended to host),
                keys other than one int per whole page of the prompt
                (:func:`check_page_keys`), ``save_points`` not a bool or ``max_gap`` not
                an int >= 0 (nothing changes).
        """
        check_rid(rid)
        keys = check_page_keys(rid, keys, prompt_tokens, self._glue.geom.page_size)
        if type(save_points) is not bool:
            raise InvalidRequestError(f"request {rid}: save_points must be a bool, got "
                                      f"{save_points!r}")
        if type(max_gap) is not int or max_gap < 0:
            raise InvalidRequestError(f"request {rid}: max_gap must be an int >= 0 (pages), "
                                      f"got {max_gap!r}")
        if rid in self._rows or rid in self._suspended:
            raise InvalidRequestError(f"request {rid} already holds pages")
        facts = self._rows.register(rid)
        return self._glue.attach(rid, facts, keys, prompt_tokens, save_points, max_gap)

    def detach(self, rid: int) -> None:
        """Undo :meth:`attach` of a request that was not admitted (it took nothing yet).

        Raises:
            UnknownRequestError: ``rid`` is not attached.
            InvalidDemandError: ``rid`` not an int (:func:`check_rid`).
            InvalidRequestError: it took pages of its own since (nothing changes).
        """
        check_rid(rid)
        self._glue.detach(rid, self._rows.of(rid))
        self._rows.unregister(rid)

    def touch(self, rid: int) -> None:
        """LRU touch of ``rid``'s hit once it is admitted (no-op without a hit or when
        not attached)."""
        facts = self._rows.get(rid)
        if facts is not None:
            self._glue.touch(facts)

    def hit_holds(self, rid: int) -> Demand:
        """What ``rid``'s hit lock keeps locked beyond its full pages, pages per band (its
        path's window pages and checkpoints, :meth:`PrefixCache.lock_holds`): zeros
        without a cache, a hit, or when not attached."""
        facts = self._rows.get(rid)
        return Demand(self._glue.lock_holds(facts.handle if facts is not None else None))

    def chunk_cut(self, rid: int) -> int:
        """Token position a prefill chunk of ``rid`` must not run past: its junction
        checkpoint (saved at a chunk's end), or 0 for none (or not attached)."""
        facts = self._rows.get(rid)
        return facts.cut if facts is not None else 0

    def recompute_tokens(self, rid: int) -> int:
        """Tokens of ``rid``'s partial hit its next chunk must recompute before its own
        (their pages are the cache's: computed, never allocated), 0 once that chunk is
        committed, for an ordinary hit, or when not attached."""
        facts = self._rows.get(rid)
        return facts.gap if facts is not None else 0

    def shared_by_others(self, rid: int) -> int:
        """Full pages of ``rid``'s prefix-cache pages that another running request also
        reads (locks): what a suspension to host would copy and its resume hold as a
        second, private copy (:mod:`kvchain.requests.suspend`). 0 if it holds nothing or
        no lock."""
        facts = self._rows.get(rid)
        return self._glue.shared_by_others(rid, facts) if facts is not None else 0
