"""The radix tree's operations: finding a prompt's path (:meth:`TreeMixin._path`) and its
longest resumable prefix (:meth:`TreeMixin.match`), splitting a node, locking and
unlocking a path (:meth:`TreeMixin.lock`, :meth:`TreeMixin.unlock`), the LRU touch
(:meth:`TreeMixin.touch`) and what a hit lock holds (:meth:`TreeMixin.lock_holds`).

Every change recounts the changed nodes' shares of the eviction order
(:meth:`~kvchain.cache.order.OrderMixin._refresh`). Inserting is
:mod:`kvchain.cache.insert`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvchain.cache.nodes import MISS, Hit, Node, _shared_run
from kvchain.cache.order import OrderMixin
from kvchain.errors import AuditError, InvalidRequestError, PlanMismatchError


def _last_absent(win: list[int]) -> list[int]:
    """Per page index ``i`` of a window band's ids ``win``, the largest index ``<= i`` whose
    page is absent (-1 in ``win``), or -1 when none is: ``[2, -1, 5, 7]`` -> ``[-1, 1, 1,
    1]``."""
    out: list[int] = []
    la = -1
    for i, v in enumerate(win):
        if v < 0:
            la = i
        out.append(la)
    return out


class TreeMixin(OrderMixin):
    """Match, split, lock, unlock and touch over the cache's state and order."""

    def _split(self, node: Node, at: int) -> Node:
        """Split ``node`` at page index ``at`` (``start < at < end``); return the new upper
        node (``node`` keeps the lower part, so handles to it stay valid)."""
        k = at - node.start
        parent = node.parent
        assert parent is not None and 0 < k < len(node.keys)
        upper = Node(self._new_id(), parent, node.start, node.keys[:k],
                     [f[:k] for f in node.full],
                     [w[:k] for w in node.win],
                     {p: v for p, v in node.ckpts.items() if p <= at}, node.time)
        upper.tail_time, upper.lock, upper.tlock = node.tail_time, node.lock, node.tlock
        held = [*upper.win, list(upper.ckpts.values())]  # per PageRefs, the upper ids
        for j, refs in enumerate(self._refs):
            if node.pins[j]:
                read = [v for v in held[j] if v >= 0 and refs.of(v)]
                upper.pins[j] = len(read)
                node.pins[j] -= upper.pins[j]
                if read:  # these pages are held by the upper node now
                    refs.node[read] = upper
        parent.children[node.keys[0]] = upper
        node.keys, node.full = node.keys[k:], [f[k:] for f in node.full]
        node.win = [w[k:] for w in node.win]
        node.win_live = [a - b for a, b in zip(node.win_live, upper.win_live, strict=True)]
        node.ckpts = {p: v for p, v in node.ckpts.items() if p > at}
        node.start = at
        node.parent = upper
        upper.children[node.keys[0]] = node
        self._refresh(upper)
        self._refresh(node)
        self._bump()
        return upper

    def _path(self, keys: Sequence[int]) -> tuple[list[tuple[Node, int]], int]:
        """Matched ``(node, pages matched in it)`` pairs from the root, and pages matched."""
        node, pos, n = self.root, 0, len(keys)
        path: list[tuple[Node, int]] = []
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                break
            run = child.keys
            j = _shared_run(run, keys, pos)
            path.append((child, j))
            pos += j
            if j < len(run):
                break
            node = child
        return path, pos

    # --- match, lock, unlock -------------------------------------------------------------

    def match(self, keys: Sequence[int], prompt_tokens: int, max_gap: int = 0) -> Hit:
        """The longest resumable prefix of a prompt (pure: nothing is locked or touched).

        Args:
            keys: the prompt's page keys (``floor(L / P)`` of them).
            prompt_tokens: ``L``; at least one token is always computed, so a hit covers
                at most ``(L - 1) // P`` pages.
            max_gap: most pages a *partial hit* may recompute (0: none, the default). On
                a chain with a state band the ordinary hit ``C`` ends at the deepest
                checkpoint where every window band holds its tail; with ``max_gap > 0``
                the hit's pages end instead at ``H``, the deepest page count ``<= C +
                max_gap`` (and ``<=`` the cap) where every window band holds its tail (no
                checkpoint needed), and the state resumes at ``C`` (``Hit.gap = H - C``;
                the window tails at ``C`` are on the locked path, which a hit lock keeps:
                the gap's window layers read them). Without a state band every tail point
                resumes, so the hit is the same as without ``max_gap``.

        Raises:
            InvalidRequestError: ``max_gap < 0``.
        """
        if max_gap < 0:
            raise InvalidRequestError(f"max_gap must be >= 0 pages, got {max_gap}")
        g = self.geom
        path, m = self._path(keys)
        cap = min(m, (prompt_tokens - 1) // g.page_size)
        if cap <= 0:
            return Hit(0, None, matched=m) if m else MISS
        fulls, wins, ckpt_at = self._path_ids(path)
        if g.state is not None:
            candidates: Iterator[int] | list[int] = sorted(
                (p for p in ckpt_at if p <= cap), reverse=True)
        else:
            candidates = iter(range(cap, 0, -1))
        # The hit is the deepest candidate at which every band holds its whole tail.
        absent = [_last_absent(win) for win in wins]
        pols = g.windows

        def tails_at(t: int) -> bool:  # every window band holds its whole tail at t
            return not any(t > first and last_absent[t - 1] >= first
                           for first, last_absent in zip(
                               (pol.resume_start(t) for pol in pols), absent, strict=True))

        c = next((t for t in candidates if tails_at(t)), 0)
        t = c
        if max_gap and g.state is not None:
            # A partial hit: the deepest tail point in (C, C + max_gap], if any.
            t = next((u for u in range(min(cap, c + max_gap), c, -1) if tails_at(u)), c)
        if not t:
            return Hit(0, None, matched=m)
        firsts = [pol.resume_start(t) for pol in pols]
        node = self._node_at(path, t)
        return Hit(t, node,
                   {band: tuple(full[:t]) for band, full in zip(self._fbands, fulls,
                                                                 strict=True)},
                   {pol.band: tuple(win[first:t])
                    for pol, first, win in zip(pols, firsts, wins, strict=True)},
                   {pol.band: first for pol, first in zip(pols, firsts, strict=True)},
                   ckpt_at.get(c, -1), m, t - c)

    def _path_ids(self, path: list[tuple[Node, int]],
                  ) -> tuple[list[list[int]], list[list[int]], dict[int, int]]:
        """The ids along a matched ``path`` (:meth:`_path`'s pairs): per full band and per
        window band (``Node.full`` / ``Node.win`` order) the ids of its matched pages in
        page order (-1 where a window page is absent), and the state checkpoints on it
        (page count -> slot id; empty without a state band)."""
        fulls: list[list[int]] = [[] for _ in self._fbands]
        wins: list[list[int]] = [[] for _ in self._wbands]
        ckpt_at: dict[int, int] = {}
        state = self.geom.state is not None
        for node, j in path:
            for full, ids in zip(fulls, node.full, strict=True):
                full.extend(ids[:j])
            for win, ids in zip(wins, node.win, strict=True):
                win.extend(ids[:j])
            if state:
                for p, v in node.ckpts.items():
                    if p <= node.start + j:
                        ckpt_at[p] = v
        return fulls, wins, ckpt_at

    @staticmethod
    def _node_at(path: list[tuple[Node, int]], t: int) -> Node:
        for node, j in path:
            if node.start < t <= node.start + j:
                return node
        raise PlanMismatchError(f"no node holds page {t - 1}")  # pragma: no cover

    def lock(self, hit: Hit, tails: bool = True) -> Node | None:
        """Lock the hit's path (splitting the last node at the hit's end if needed) and
        return the handle to pass to :meth:`unlock`; ``None`` for a miss. With ``tails``
        (a hit lock) the path's window pages and checkpoints stay too; without (a prompt
        lock, :meth:`adopt`) only its full pages do."""
        if hit.node is None:
            return None
        node = hit.node
        if node.end != hit.pages:
            node = self._split(node, hit.pages)
        n: Node | None = node
        t = int(tails)
        while n is not None and n.nid:
            n.lock += 1
            n.tlock += t
            self._refresh(n)
            n = n.parent
        return node

    def unlock(self, handle: Node | None, tails: bool = True) -> None:
        """Undo one :meth:`lock` with the same ``tails`` (no-op for ``None``).

        Raises:
            AuditError: a node of the path is not locked that way.
        """
        if handle is None:
            return
        n: Node | None = handle
        t = int(tails)
        while n is not None and n.nid:
            if n.lock <= 0 or n.tlock < t:
                raise AuditError(f"unlock of node {n.nid} that is not locked")
            n = n.parent
        n = handle
        while n is not None and n.nid:
            n.lock -= 1
            n.tlock -= t
            self._refresh(n)
            n = n.parent

    def touch(self, handle: Node | None, window_first: int) -> None:
        """LRU touch of a used hit: every node of the path (``time``), and the nodes whose
        tails it resumed from (``tail_time``: the hit's last node, those holding window
        pages at or after ``window_first``, and the run of nodes right above the last one
        that share its tail time, i.e. were inserted or last used together with it).

        The run makes the order independent of where the path is split: a prompt
        inserted chunk by chunk (:meth:`adopt` gives its nodes one tail time) keeps its
        tails as one unit of recency, as the same prompt inserted whole in one node did.
        Without it a later turn's hit refreshed only the last chunk's node; the earlier
        chunks' ``TAILS`` units (window pages only) went before the prompt's ``LEAF``
        (full pages only), so each eviction freed one band and the other band's demand
        was met by compaction (docs/benchmarks.md "Page copies of incremental insertion
        (round 8)")."""
        if handle is None:
            return
        now = self._tick()
        old = handle.tail_time
        together = True
        n: Node | None = handle
        while n is not None and n.nid:
            n.time = now
            together = together and n.tail_time == old
            if together or n.end > window_first:
                n.tail_time = now
            self._refresh(n)
            n = n.parent

    def lock_holds(self, handle: Node | None) -> tuple[int, ...]:
        """Per band, what a hit lock on ``handle``'s path keeps beyond its full pages: the
        window (and chunked-local) pages present on the path, and its state checkpoints
        (a hit lock keeps every tail and checkpoint of the path, not only those the hit
        resumes from: :meth:`lock`); 0 for the full bands (a request's own KV counts
        them) and all 0 for ``None``. ``O(path)``.

        Example: a hit of 36 pages on a state | local | window | full chain whose path
        keeps resume points every 4 pages holds 9 checkpoints, not the one it copies."""
        g = self.geom
        out = [0] * g.num_bands
        n: Node | None = handle
        while n is not None and n.nid:
            for band, live in zip(self._wbands, n.win_live, strict=True):
                out[band] += live
            if g.state is not None:
                out[g.state] += len(n.ckpts)
            n = n.parent
        return tuple(out)

