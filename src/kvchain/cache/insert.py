"""Inserting a prompt's pages into the radix tree (:meth:`InsertMixin.insert`): the full
pages of every full band, the window tails and checkpoints it offers at its resume points,
and the duplicates the request must release (the cache keeps one copy of each page).

Walks and splits the path (:mod:`kvchain.cache.tree`), keeps the held page counters, and
leaves the eviction order's recount of the changed nodes to :meth:`InsertMixin.insert`
(or to the facade's ``adopt``, which locks the path first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvchain.cache.nodes import Node, _take_run
from kvchain.cache.tree import TreeMixin
from kvchain.errors import InvalidRequestError


class InsertMixin(TreeMixin):
    """Insert over the cache's tree."""

    # --- insert ------------------------------------------------------------------------

    def _full_lists(self, full: Sequence[int] | Mapping[int, Sequence[int]],
                    n: int) -> list[Sequence[int]]:
        """The offered full pages as one id list per full band (``Node.full``'s order).

        ``full`` is either a mapping full band -> ids of pages ``[0, n)`` naming every full
        band, or (a chain with at most one full band) that band's ids as a plain sequence.

        Raises:
            InvalidRequestError: a plain sequence on a chain with several full bands, a
                mapping that does not name exactly the full bands, or (with a full band)
                a list whose length is not ``n`` (nothing changes).
        """
        fb = self._fbands
        if isinstance(full, Mapping):
            if set(full) != set(fb):
                raise InvalidRequestError(f"full pages offered for bands {sorted(full)}; the "
                                          f"full-attention bands are {list(fb)}")
            lists = [full[band] for band in fb]
        elif len(fb) > 1:
            raise InvalidRequestError(f"one full page list offered on a chain with "
                                      f"{len(fb)} full-attention bands {list(fb)}: pass "
                                      f"one per band (band -> ids)")
        else:
            lists = [full] if fb else []
        for band, ids in zip(fb, lists, strict=True):
            if len(ids) != n:
                raise InvalidRequestError(f"full band {band}: {len(ids)} page ids for "
                                          f"{n} pages")
        return lists

    def insert(self, keys: Sequence[int], shared: int,
               full: Sequence[int] | Mapping[int, Sequence[int]],
               window: Mapping[int, Mapping[int, int]],
               ckpts: Mapping[int, int]) -> list[list[int]]:
        """Insert a finished prompt's pages; return, per band, the request's duplicates the
        caller must release (the cache keeps one copy of each page).

        Args:
            keys: the prompt's page keys, pages ``[0, n)``.
            shared: pages ``[0, shared)`` are already the cache's (the request's hit).
            full: per full-attention band (band index -> ids), the ids of pages
                ``[0, n)`` (entries below ``shared`` are the cache's own); on a chain with
                at most one full band, that band's ids alone may be passed (a sequence;
                ignored without a full band).
            window: per window or chunked-local band (by band index; a band left out
                offers none), the pages the request offers there, page index -> id
                (indices >= shared).
            ckpts: state checkpoints the request offers, page count -> slot id.

        Raises:
            InvalidRequestError: ``window`` names a band that is not a window band, or
                ``full`` does not fit the full bands (:meth:`_full_lists`; nothing
                changes).
        """
        dups, changed = self._insert(keys, shared, full, window, ckpts)
        for c in changed:  # the path and the new node (its parent is the path's last)
            self._refresh(c)
        self._bump()
        return dups

    def _insert(self, keys: Sequence[int], shared: int,
                full: Sequence[int] | Mapping[int, Sequence[int]],
                window: Mapping[int, Mapping[int, int]],
                ckpts: Mapping[int, int]) -> tuple[list[list[int]], list[Node]]:
        """:meth:`insert` without recounting the eviction order: the duplicates per band
        and the nodes whose share of the order the caller must recount
        (:meth:`_refresh`) before anything reads it.

        Raises:
            InvalidRequestError: as :meth:`insert` (nothing changes).
        """
        g = self.geom
        n = len(keys)
        if not set(window) <= set(self._wbands):
            raise InvalidRequestError(f"window pages offered for bands {sorted(window)}; "
                                      f"the window bands are {list(self._wbands)}")
        fulls = self._full_lists(full, n)
        dups: list[list[int]] = [[] for _ in range(g.num_bands)]
        kept = [0] * g.num_bands  # pages the cache takes, per band (held_counts)
        now = self._tick()
        offered = [dict(window.get(band, {})) for band in self._wbands]
        ckpts = dict(ckpts)
        node, pos = self.root, 0
        changed: list[Node] = []
        for child, j in self._path(keys)[0]:  # pure: the ids and splits follow in order
            if j < len(child.keys):  # the last node of the path, matched in part
                child = self._split(child, pos + j)
            changed.append(child)
            child.time = now
            for band, ids in zip(self._fbands, fulls, strict=True):
                dups[band].extend(ids[max(pos, shared):pos + j])
            self._fill(child, pos + j, offered, ckpts, now, dups, kept)
            node, pos = child, pos + j
        if pos < n:
            changed.append(self._new_child(node, keys, fulls, offered, ckpts, now, kept))
        for b, k in enumerate(kept):
            self._held[b] += k
        for band, pages in zip(self._wbands, offered, strict=True):
            dups[band].extend(pages.values())
        if g.state is not None:
            dups[g.state].extend(ckpts.values())
        return dups, changed


    def _fill(self, child: Node, end: int, offered: list[dict[int, int]],
              ckpts: dict[int, int], now: int, dups: list[list[int]],
              kept: list[int]) -> None:
        """Take into the existing node ``child`` (its pages ``[child.start, end)`` on the
        inserted path) the offered window pages and checkpoints it lacks, popping each
        offer it sees out of ``offered`` / ``ckpts``: a page or checkpoint it already holds
        goes to ``dups`` (per band), one it takes counts in ``kept`` and gives ``child``
        the insert's time ``now`` as its tail time."""
        g = self.geom
        pos = child.start
        for k, (band, pages) in enumerate(zip(self._wbands, offered, strict=True)):
            if not pages:
                continue
            win = child.win[k]
            # only the offered pages in this node, ascending (not every page of it:
            # a later chunk's insert passes the whole path before it)
            for i in sorted(i for i in pages if pos <= i < end):
                v = pages.pop(i)
                if v < 0:
                    continue
                if win[i - pos] < 0:
                    win[i - pos] = v
                    child.win_live[k] += 1
                    child.tail_time = now
                    kept[band] += 1
                else:
                    dups[band].append(v)
        if g.state is not None:
            for p in [p for p in ckpts if pos < p <= end]:
                v = ckpts.pop(p)
                if p in child.ckpts:
                    dups[g.state].append(v)
                else:
                    child.ckpts[p] = v
                    child.tail_time = now
                    kept[g.state] += 1

    def _new_child(self, node: Node, keys: Sequence[int], fulls: list[Sequence[int]],
                   offered: list[dict[int, int]], ckpts: dict[int, int], now: int,
                   kept: list[int]) -> Node:
        """A new child of ``node`` (the path's last) for pages ``[node.end, len(keys))``:
        its full pages from ``fulls``, the offered window pages and checkpoints in its
        range (popped out of ``offered`` / ``ckpts``), time ``now``; counts what it holds
        in ``kept`` (per band) and returns it."""
        g = self.geom
        pos, n = node.end, len(keys)
        runs = [_take_run(pages, pos, n) for pages in offered]
        new = Node(self._new_id(), node, pos, list(keys[pos:n]),
                   [list(ids[pos:n]) for ids in fulls], [ids for ids, _ in runs],
                   {p: ckpts.pop(p) for p in [p for p in ckpts if pos < p <= n]}, now,
                   [live for _, live in runs])
        node.children[keys[pos]] = new
        for band, ids in zip(self._fbands, new.full, strict=True):
            kept[band] += len(ids)
        for band, live in zip(self._wbands, new.win_live, strict=True):
            kept[band] += live
        if g.state is not None:
            kept[g.state] += len(new.ckpts)
        return new

    def _prompt_lock(self, keys: Sequence[int], own: int,
                     ) -> tuple[Node | None, list[list[int]], list[list[int]]]:
        """Right after :meth:`insert` of ``keys`` (``n`` pages): take a prompt lock (full
        pages only) on the path of pages ``[0, n)``, give the nodes past the request's own
        start ``own`` the insert's time as their tail time, and recount each node of the
        path once. Returns the path's last node (``None`` for ``n = 0``: nothing locked)
        and, per full band and per window band, the cache's ids of pages ``[0, n)`` (-1
        where a window page is absent)."""
        n = len(keys)
        full_ids: list[list[int]] = [[] for _ in self._fbands]
        win_ids: list[list[int]] = [[] for _ in self._wbands]
        if not n:
            return None, full_ids, win_ids
        path, m = self._path(keys)
        assert m == n and path[-1][0].end == n  # insert split the path at n
        now = self._clock  # the insert's tick: every node of the path has it as time
        for node, _ in path:
            if node.end > own:
                node.tail_time = now
            for ids, full in zip(full_ids, node.full, strict=True):
                ids.extend(full)
            for ids, win in zip(win_ids, node.win, strict=True):
                ids.extend(win)
            node.lock += 1  # the prompt lock (:meth:`lock` without tails)
        for node, _ in path:  # its new tail time and lock recounted once
            self._refresh(node)
        return path[-1][0], full_ids, win_ids
