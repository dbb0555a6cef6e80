"""The radix tree's data: a node (:class:`Node`, a run of pages of one prompt path and what
it holds per lifetime class), a match (:class:`Hit`, :data:`MISS`), what an adopt hands
back (:class:`Adopted`), a node's share of the eviction order (:data:`Share`), and the two
run helpers the match and the insert share (:func:`_shared_run`, :func:`_take_run`).

Plain data and O(run) helpers: no cache state, no eviction order (that is
:mod:`kvchain.cache.order`'s), no tree operation (:mod:`kvchain.cache.tree`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: A node's share of the eviction order (:meth:`PrefixCache._refresh`): its LEAF key,
#: TAILS key, time when unlocked, units, full pages per full band, window pages per window
#: band and state checkpoints.
Share = tuple[int, int, int, int, tuple[int, ...], tuple[int, ...], int]


class Node:
    """One radix node: a run of pages ``[start, start + len(keys))`` of a path.

    Attributes:
        nid: unique id (tie-break of the LRU walk).
        parent: the parent node (``None`` for the root).
        children: child nodes by the key of their first page.
        start: page index of the first page (tokens ``start * P``).
        keys: the pages' content keys.
        full: per full-attention band (in the order of ``geom.fulls``), its virtual ids,
            one per page (no list without a full band).
        win: per window or chunked-local band (in the order of ``geom.windows``), its
            virtual ids, one per page, -1 where absent (empty without such bands).
        win_live: per window band, its pages present.
        ckpts: state checkpoints: end page index -> state-band virtual id.
        lock: running requests whose hit path or prompt path includes this node.
        tlock: of which hits (their path keeps its tails: no ``TAILS`` unit).
        time: logical time of the last hit through or insert into this node.
        tail_time: logical time of the last hit that ended here (or insert).
        pins: per window band (``geom.windows``' order), then for the state band (the
            last entry; 0 without one), its pages (checkpoints) of this node that running
            requests reference (:class:`~kvchain.cache.page_refs.PageRefs`, one per band):
            never evicted while referenced.
        sig: the node's share of the eviction order as last counted (``None``: none):
            its LEAF key, TAILS key, time when unlocked, units, full, window and state
            pages (:meth:`PrefixCache._refresh`).
        lser, tser: serials of its live entries in the cache's ready heap (0: none).
    """

    __slots__ = (
        "children",
        "ckpts",
        "full",
        "keys",
        "lock",
        "lser",
        "nid",
        "parent",
        "pins",
        "sig",
        "start",
        "tail_time",
        "time",
        "tlock",
        "tser",
        "win",
        "win_live",
    )

    def __init__(self, nid: int, parent: Node | None, start: int, keys: list[int],
                 full: list[list[int]], win: list[list[int]], ckpts: dict[int, int],
                 time: int, win_live: list[int] | None = None) -> None:
        self.nid = nid
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.start = start
        self.keys = keys
        self.full = full
        self.win = win
        # present pages per window band (``win_live``: given by a caller that counted them)
        self.win_live = ([sum(1 for v in w if v >= 0) for w in win] if win_live is None
                         else win_live)
        self.ckpts = ckpts
        self.lock = 0
        self.tlock = 0
        self.time = time
        self.tail_time = time
        self.pins = [0] * (len(win) + 1)  # window bands, then the state band
        self.sig: Share | None = None  # its share of the order
        self.lser = 0  # serial of its live LEAF entry in the ready heap (0: none)
        self.tser = 0  # serial of its live TAILS entry (0: none)

    @property
    def end(self) -> int:
        """One past the last page index."""
        return self.start + len(self.keys)

    def has_tails(self) -> bool:
        """Whether a ``TAILS`` unit would free anything (an unpinned window page or
        checkpoint)."""
        return (len(self.ckpts) > self.pins[-1]
                or any(a > b for a, b in zip(self.win_live, self.pins, strict=False)))

    def tail_windows(self) -> tuple[int, ...]:
        """Per window band, the pages a ``TAILS`` unit would free (present, unpinned)."""
        return tuple(a - b for a, b in zip(self.win_live, self.pins, strict=False))


@dataclass(frozen=True, slots=True)
class Hit:
    """A match: the longest prefix every class can resume from.

    Attributes:
        pages: hit length in pages (tokens ``pages * P``); 0 for a miss.
        node: the node whose end is the hit's end after :meth:`PrefixCache.lock` (before
            locking, the node that contains the hit's last page).
        full: per full-attention band (by band index), the ids of pages ``[0, pages)``
            (empty for a miss).
        window: per window or chunked-local band (by band index), the ids of its tail
            pages ``[window_first[band], pages)``.
        window_first: per window band, the first page index the request needs to resume
            (``policy.resume_start(pages)``).
        checkpoint: the state slot to copy into the request's own slot (-1: none).
        matched: pages the prompt's keys share with a cached path (full attention), at
            least ``pages``: where the prompt leaves the cached path, or where the path
            ends; the *junction* a request saves a checkpoint at when it lies past the
            hit (:func:`junction_point`).
        gap: pages of a *partial hit* recomputed before the request's own prefill (0 for
            an ordinary hit): the full and window pages ``[0, pages)`` are the cache's,
            but the state resumes after ``pages - gap`` pages (``checkpoint`` is the one
            there, -1 at 0: a fresh state), so tokens ``[(pages - gap) P, pages P)`` are
            run through the model again, writing no KV (:meth:`PrefixCache.match` with
            ``max_gap``).
    """

    pages: int
    node: Node | None
    full: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    window: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    window_first: Mapping[int, int] = field(default_factory=dict)
    checkpoint: int = -1
    matched: int = 0
    gap: int = 0


MISS = Hit(0, None)


@dataclass(frozen=True, slots=True)
class Adopted:
    """What :meth:`PrefixCache.adopt` hands back to the request layer.

    Attributes:
        handle: the request's new lock (the node ending at its prompt's last whole page),
            ``None`` for a prompt of no whole page.
        full: per full-attention band (by band index), the cache's ids of pages ``[0, n)``.
        window: per window band (by band index), the cache's ids of pages ``[0, n)``, -1
            where absent.
        dups: per band, the request's pages the cache did not take (it held a copy).
    """

    handle: Node | None
    full: Mapping[int, tuple[int, ...]]
    window: Mapping[int, tuple[int, ...]]
    dups: list[list[int]]


def _shared_run(run: Sequence[int], keys: Sequence[int], pos: int) -> int:
    """How many leading keys of a node's ``run`` equal ``keys[pos:]`` (at least 1: the
    caller found the child by ``keys[pos]``); one slice comparison in the common case of
    a whole run matching, else a walk to the first difference."""
    m = min(len(run), len(keys) - pos)
    if run[:m] == list(keys[pos:pos + m]):  # the common case, compared in C
        return m
    j = 1
    while j < m and run[j] == keys[pos + j]:
        j += 1
    return j


def _take_run(pages: dict[int, int], lo: int, hi: int) -> tuple[list[int], int]:
    """Take the entries of page indices ``[lo, hi)`` out of ``pages`` (page index -> id)
    as one id list over the run, -1 where none is offered, and count the ids ``>= 0``
    in it (a new node's window list and its present pages, counted at C speed);
    ``pages`` keeps the entries outside the run."""
    pop = pages.pop
    ids = [pop(i, -1) for i in range(lo, hi)] if pages else [-1] * (hi - lo)
    if not ids or min(ids) >= -1:  # the usual case: every absent page is -1
        return ids, len(ids) - ids.count(-1)
    return ids, sum(1 for v in ids if v >= 0)

