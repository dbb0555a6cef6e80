"""A forward's commit of one request and the release of its pages: the tokens it computed
recorded, its window pages wholly before the next token's window released (window-tail
release: each window and chunked-local band by its own policy's ``first_page``), and at
its end every page it holds handed back (the prefix cache's pages unlocked, not released).

When the window tail goes is a strategy injected at construction (``keep_window_tail``):
at every commit (the default), or only when the scheduler's decode check reclaims it
(:meth:`Commits.reclaim_window_pages`), as engines that keep window pages until they need
the room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import ConfigError, InvalidDemandError
from kvchain.requests.batch import check_count, check_flag, check_rid, request_ids
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.rows import Rows


def check_tail_strategy(cached: bool, keep_window_tail: bool) -> None:
    """Refuse ``keep_window_tail`` on a manager with a prefix cache (``cached``).

    Raises:
        ConfigError: both (the cache's insert at a commit offers the pages of the next
            token's window only: the tail must be gone by then).
    """
    if keep_window_tail and cached:
        raise ConfigError("a manager that keeps window tails past the commit cannot run a "
                          "prefix cache (its insert needs the tail released)")


class Commits:
    """The commits and releases of one manager's requests (``kv.commits``).

    Args:
        rows: the manager's requests and their table.
        geom: the chain's request geometry.
        chain: the allocator the released pages go back to.
        glue: the prefix cache's part (the insert at a commit, its pages at a release).
        uncovered: ``uncovered(slot, tokens)``: whether a page band's row ``slot`` ends
            before ``tokens`` (the manager's check, truthy when it does).
        keep_window_tail: release the window tail only at :meth:`reclaim_window_pages`
            (and :meth:`free`), not at every commit.

    Attributes:
        keep_window_tail: as given (read by the batched commits: they commit one by one
            when it is set).

    Raises:
        ConfigError: ``keep_window_tail`` with a prefix cache (its insert at a commit
            offers the pages of the next token's window only: the tail must be gone).
    """

    def __init__(self, rows: Rows, geom: RequestGeometry, chain: Allocator, glue: CacheGlue,
                 uncovered: Callable[[int, int], Any], keep_window_tail: bool = False) -> None:
        check_tail_strategy(glue.cache is not None, keep_window_tail)
        self._rows, self._geom, self._chain, self._glue = rows, geom, chain, glue
        self._uncovered = uncovered
        self.keep_window_tail = keep_window_tail

    def commit(self, rid: int, tokens: int) -> int:
        """Record that a forward computed ``tokens`` more tokens of ``rid``, then release
        its window pages wholly before the next token's window (window-tail release; not
        with ``keep_window_tail``). With a prefix cache, a commit that completes whole
        prompt pages inserts the prompt's pages so far into the cache
        (:meth:`CacheGlue.maybe_insert`).

        Returns:
            Window pages released by the window-tail release (duplicates handed back at
            the insert are not counted).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: ``rid`` not an int (a bool would alias request 0 or 1),
                ``tokens`` not an int (a bool, a float) in ``[0, MAX_BATCH_TOKENS]``
                (:func:`~kvchain.requests.batch.check_count`: a numpy integer is read as
                a Python int, so ``np.int8(125)`` does not wrap), or the pages held do
                not cover the new tokens (nothing changes).
        """
        check_rid(rid)
        tokens = check_count(tokens, f"request {rid}: tokens")
        facts = self._rows.of(rid)
        table = self._rows.table
        slot = facts.slot
        now = int(table.tokens[slot])
        new_tokens = now + tokens
        if self._uncovered(slot, new_tokens):
            raise InvalidDemandError(f"request {rid}: {tokens} tokens not covered by its pages")
        self._glue.count_junction(facts, now, new_tokens)
        facts.gap = 0  # a partial hit's gap was run by this chunk
        table.tokens[slot] = new_tokens
        released = 0 if self.keep_window_tail else self.release_window_tail(rid)
        self._glue.maybe_insert(rid, facts, new_tokens)
        return released

    def release_window_tail(self, rid: int) -> int:
        """Release ``rid``'s pages wholly before its next token's window, in every window
        and chunked-local band (each by its own window's policy).

        Returns:
            Window pages taken out of its rows, all bands together (0 if none were out of
            a window).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: ``rid`` not an int (:func:`check_rid`).
        """
        check_rid(rid)
        facts = self._rows.of(rid)
        table = self._rows.table
        slot = facts.slot
        tokens = int(table.tokens[slot])
        released = 0
        for pol in self._geom.windows:
            band = pol.band
            first, end = table.span(band, slot)
            keep_from = pol.first_page(tokens)
            if end == first or keep_from <= first:
                continue
            vids = table.drop_front(band, slot, min(keep_from - first, end - first))
            self._glue.drop_window_pages(facts, band, first, vids)
            released += int(vids.size)
        if released:
            table.refresh_need(np.asarray([slot], dtype=np.int64))
        return released

    def reclaim_window_pages(self, rids: Iterable[int]) -> int:
        """Window-tail release for many requests (the decode check runs this before it
        retracts anyone; ids that hold nothing are skipped). Returns pages released.

        Raises:
            InvalidDemandError: ``rids`` not a sequence of int ids (checked before any
                release).
        """
        ids = request_ids(rids, "reclaim_window_pages' rids")
        return sum(self.release_window_tail(rid) for rid in ids if rid in self._rows)

    def free(self, rid: int, insert: bool = True) -> int:
        """Release every page of ``rid`` (finished or retracted). Returns pages released.

        With a prefix cache and page keys, the request never releases the cache's pages (its
        hit, and its whole prompt once its prefill completed: :meth:`commit` inserted it
        then): it unpins and unlocks them, and releases its own pages (output pages, a
        prefill cut short, its state slots and saved checkpoints). Nothing new is inserted
        here (policy: the prompt only, inserted by its prefill chunks' commits). ``insert``
        marks a finished request (rather than a retracted one): its prompt's path is
        touched, so the LRU order counts from when the last request using it ended (as
        vLLM's free-block queue).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: ``rid`` not an int (a bool would free request 0 or 1), or
                ``insert`` not a bool (nothing changes).
        """
        check_rid(rid)
        check_flag(insert, "free's insert")
        facts = self._rows.of(rid)
        table = self._rows.table
        slot = facts.slot
        out = [table.live(band, slot).tolist() for band in range(self._geom.num_bands)]
        shared = int(table.shared[slot])
        for pol in self._geom.policies:
            if shared and not pol.per_request:  # the cache's pages: not the request's
                first = int(table.first[pol.band, slot])
                out[pol.band] = out[pol.band][max(shared - first, 0):]
        self._glue.release_held(rid, facts, out, insert)
        self._rows.unregister(rid)
        released = 0
        for band, ids in enumerate(out):
            if ids:
                self._chain.release(band, ids)
                released += len(ids)
        return released
