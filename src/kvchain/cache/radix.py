"""The prefix cache: a radix tree over the chain's pages of every lifetime class.

A node holds a run of consecutive pages of one prompt path (page ``j`` covers tokens
``[jP, (j + 1)P)``), keyed by their content keys (:mod:`kvchain.cache.keys`); children are
keyed by their first page's key. Per lifetime class a node holds (see
``docs/prefix-cache.md``):

* **full** pages, per full-attention band (any number of them: a target's and a
  speculative-decoding draft model's, say): one virtual id per page and band, owned by
  the cache and shared by reference with every running request whose hit covers them;
* **window** (or chunked-local) pages, per windowed band (any number of them, each by
  its own policy): only the pages ``[policy.resume_start(q), q)`` a hit after a *resume
  point* ``q`` reads (its *tail*); every other page of the band is absent (-1, a
  tombstone) and was released when the request that computed it finished;
* **state checkpoints**: one state slot per resume point, holding the recurrent state
  after that many tokens.

Resume points of a prompt of ``n`` whole pages (:func:`resume_points`): every
``interval`` tokens (a content-block boundary: 512 tokens in the Mooncake traces, where
later turns resume) and the prompt's last whole-page boundary ``nP``; for a block-aligned
prompt (``L = nP`` tokens) also its *resend point* ``n - 1`` (:func:`resend_point`: a hit
leaves one token to compute, so its own resend resumes at most there); plus, by default,
a *junction* where the prompt leaves a cached path past its hit (:func:`junction_point`,
found by the match: ``Hit.matched``). A hit ends at the
longest prefix every class can resume from: full pages present (always, on the path);
every windowed band's tail present; a checkpoint there (state). On a chain with no window or state
band, every page boundary is a resume point.

Locks: a running request locks the path root..X of its cached prefix (a count on every
node): its hit at admission (:meth:`PrefixCache.lock`: the path and its tails, as a prefix
in use by running requests keeps whatever lets later ones resume from it), and its
prompt's path so far once a prefill chunk's commit inserts it (:meth:`PrefixCache.adopt`:
a *prompt lock*, full pages only; each later chunk's insert locks the longer path and the
request layer drops the shorter one). A locked node is never a ``LEAF`` unit: its full pages
stay. On a node only prompt locks hold, the window pages and checkpoints are evictable (a
``TAILS`` unit) except those a running request still reads, which it *pins*: the window
pages inside its current window (a tail lock, dropped page by page as its window moves past
them) and the checkpoint its hit resumes from (until copied into the request's own slot).

Eviction (:class:`~kvchain.alloc.evictor.Evictor`). Two kinds of unit, walked in LRU
order of a logical clock (ties: leaf before tails, then node id):

* ``LEAF(X)``: an unlocked node with no children frees everything it still holds (full
  pages, window tail pages, checkpoints); its parent may become a leaf and joins the walk
  (the cascade) with its own time;
* ``TAILS(X)``: a node no hit lock holds frees its unpinned window pages and checkpoints
  only (the class-only eviction: window tombstoning + checkpoint drop) while its full
  pages stay. A node under a prompt lock is in use by a running request, so its tails
  count as used *now*: they come after every unlocked unit (among themselves, oldest
  ``tail_time`` first): supply the planner may take, but only as a last resort.
  Its time is the last time a hit *ended* in it (or it was inserted), which is older than
  its LRU time when later hits only pass through it. A prompt inserted chunk by chunk
  gives every node past its hit the latest chunk's time, and a hit ending below a run of
  nodes that share its last node's tail time refreshes the run (:meth:`PrefixCache.touch`):
  the order does not depend on where the chunks split the path.

On a chain with a state band an unlocked leaf with no checkpoint is *dead* (its window
pages, if any, go just before it): no hit can use its full pages, so its ``LEAF`` goes before every
unit that can still hit (key: its time; every other unlocked unit is keyed ``LIVE`` + its
time). The walk applies it as it goes: a leaf whose ``TAILS`` unit drops its checkpoints
turns dead and its ``LEAF`` follows at once; a parent left without children and without
checkpoints joins dead.

The published :class:`~kvchain.alloc.snapshot.EvictionOrder` is this simulated walk, so
``evict(k)`` frees exactly its first ``k`` units and the walk over what is left is the
suffix (the walk is a priority queue whose keys change only as the walk itself changes
the tree: a parent joins as its last child goes, a leaf turns dead as its tails go).

Modules (one responsibility each; each imports only those above it in this list):
:mod:`~kvchain.cache.points` (resume-point arithmetic), :mod:`~kvchain.cache.nodes` (the
tree's data), :mod:`~kvchain.cache.core` (the cache's state), :mod:`~kvchain.cache.order`
(the eviction order), :mod:`~kvchain.cache.tree` (match, lock, touch),
:mod:`~kvchain.cache.insert`, :mod:`~kvchain.cache.pins` (what running requests read),
:mod:`~kvchain.cache.audit` (rebuild-and-compare, counts), :mod:`~kvchain.cache.evict`
(``evict``); this module composes them into :class:`PrefixCache` (mixins over one state,
:class:`~kvchain.cache.core.CacheCore`) and re-exports the names callers import from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kvchain.cache.audit import _check_pins
from kvchain.cache.evict import EvictMixin
from kvchain.cache.insert import InsertMixin
from kvchain.cache.nodes import MISS, Adopted, Hit, Node, Share, _shared_run, _take_run
from kvchain.cache.order import IN_USE, LEAF, LIVE, TAILS
from kvchain.cache.points import (
    JUNCTION_SHARE,
    SPACED_BUFFER_SHARE,
    CacheGeometry,
    ResumePolicy,
    cache_refusal,
    junction_point,
    resend_point,
    resume_points,
    spaced_budget,
    tail_pages,
)
from kvchain.errors import AuditError, InvalidRequestError
from kvchain.field_types import is_whole

__all__ = [
    "IN_USE",
    "JUNCTION_SHARE",
    "LEAF",
    "LIVE",
    "MISS",
    "SPACED_BUFFER_SHARE",
    "TAILS",
    "Adopted",
    "CacheGeometry",
    "Hit",
    "Node",
    "PrefixCache",
    "ResumePolicy",
    "Share",
    "_check_pins",
    "_shared_run",
    "_take_run",
    "cache_refusal",
    "junction_point",
    "resend_point",
    "resume_points",
    "spaced_budget",
    "tail_pages",
]


class PrefixCache(InsertMixin, EvictMixin):
    """The radix tree and its eviction order (implements the chain's ``Evictor``).

    Args:
        geom: the chain's request geometry (band roles, page size, window).
        interval_tokens: tokens between resume points (a multiple of the page size;
            default 512, the Mooncake content block).
        policy: which resume points a prompt keeps (:class:`ResumePolicy`; ``AUTO`` is
            resolved for ``geom`` here, so ``self.policy`` is ``BLOCKS``, ``ENDS`` or
            ``SPACED``).
        junctions: whether a request also keeps a resume point where its prompt leaves a
            cached path past its hit (:func:`junction_point`; on by default; off gives the
            placement of ``policy`` alone).
        junction_min_tokens: least tokens of extra resumable prefix a junction must add
            (default: ``interval_tokens``, the granularity ``BLOCKS`` already keeps;
            docs/prefix-cache.md, "Junction checkpoints").
        audit: rebuild the eviction order by a whole-tree walk before every eviction and
            compare it with the incrementally kept one (O(nodes log nodes) each; ``None``:
            :func:`kvchain.audit.resolve_audit`'s default, on in the test suite).
            :meth:`audit` always does it.

    Attributes:
        full_walks: whole-tree walks that rebuilt the eviction order (audits only).

    Raises:
        InvalidRequestError: an interval that is not a positive multiple of the page size,
            or a ``junction_min_tokens`` below 1.
        ConfigError: a bad ``audit`` flag; a chain the cache cannot key
            (:func:`cache_refusal`: several state bands).
    """

    # --- Resume points ---------------------------------------------------------------------

    def resume_points(self, whole_pages: int, hit: int = 0, matched: int = 0,
                      prompt_tokens: int | None = None) -> tuple[tuple[int, ...], int]:
        """The resume points a prompt of ``whole_pages`` whole pages saves in this cache,
        and its junction point: ``(points, junction)``, in pages.

        ``points`` is :func:`resume_points` under this cache's geometry, interval and
        policy (sorted; empty on a chain that resumes at every page), with the prompt's
        :func:`resend_point` when its length ``prompt_tokens`` is given (the request layer
        always gives it: without it a block-aligned prompt's own resend cannot resume
        deeper than its last interval point); ``junction`` is
        :func:`junction_point` of a request resuming from ``hit`` pages whose keys share
        ``matched`` pages with a cached path (0: none, junctions off, or ``matched <=
        hit``, the default). Pure: nothing changes.

        Raises:
            InvalidRequestError: ``whole_pages``, ``hit`` or ``matched`` not an int >= 0;
                a ``prompt_tokens`` refused by :func:`resend_point`.
        """
        for name, v in (("whole_pages", whole_pages), ("hit", hit), ("matched", matched)):
            if not is_whole(v) or v < 0:
                raise InvalidRequestError(f"resume_points: {name} must be an int >= 0, "
                                          f"got {v!r}")
        # Python ints from here (NumPy's fixed-width arithmetic would wrap)
        whole_pages, hit, matched = int(whole_pages), int(hit), int(matched)
        pts = resume_points(self.geom, whole_pages, self.interval_pages, self.policy,
                            prompt_tokens)
        if not self.junctions:
            return pts, 0
        return pts, junction_point(self.geom, hit, matched, whole_pages, pts,
                                   self.junction_min_pages)

    def acquire(self, hit: Hit) -> Node | None:
        """Lock ``hit`` (a hit lock, :meth:`lock`) and reference what the request reads of
        the cache: in every window band its tail pages ``[window_first, pages)`` (the
        window a resumed request reads), and the checkpoint its state resumes from
        (``hit.checkpoint``, after ``pages - gap`` pages) until that is copied into the
        request's own slot. Referenced pages are never evicted; drop the references with
        :meth:`unpin_pages` (by id) and the lock with :meth:`unlock`. Returns the handle
        (``None`` for a miss: nothing locked).

        Raises:
            AuditError: a tail page or the checkpoint is not on the path (a hit that is
                not this cache's current match); nothing is locked or referenced then.
        """
        handle = self.lock(hit)
        if handle is None:
            return None
        reads: list[tuple[int, list[int], list[Node]]] = []
        try:
            for pol in self.geom.windows:
                k = self._wbands.index(pol.band)
                reads.append((k, *self._tail_ids(handle, k, range(hit.window_first[pol.band],
                                                                    hit.pages))))
            if hit.checkpoint >= 0:
                point = hit.pages - hit.gap
                node = self._node_of(handle, point - 1)
                if node.ckpts.get(point, -1) != hit.checkpoint:
                    raise AuditError(f"checkpoint {hit.checkpoint} after {point} pages: "
                                     f"absent from node {node.nid}")
                reads.append((len(self._wbands), [hit.checkpoint], [node]))
        except AuditError:
            self.unlock(handle)  # as before (a split at the hit's end stays: same pages)
            raise
        for k, vids, nodes in reads:
            self._ref(k, vids, nodes)
        return handle

    def adopt(self, keys: Sequence[int], shared: int,
              full: Sequence[int] | Mapping[int, Sequence[int]],
              window: Mapping[int, Mapping[int, int]], ckpts: Mapping[int, int],
              reading: Mapping[int, Iterable[int]], own_from: int | None = None,
              ) -> Adopted:
        """Insert a *running* request's prompt pages so far (at the commit of a prefill
        chunk that completed whole pages; the whole prompt at its last) and hand them over:
        the request locks their path (a prompt lock: full pages), the window
        pages it still reads are pinned (its tail lock), and everything else it offered (the
        window tails and checkpoints of its resume points) is at once evictable cache. (vLLM
        likewise caches a block as soon as it is computed, SGLang inserts an unfinished
        request's prefix and points the request at the tree's copy: vLLM "Automatic Prefix
        Caching" design page; SGLang ``cache_unfinished_req``.)

        Args:
            keys, shared, full, window, ckpts: as :meth:`insert` (``keys`` has ``n`` pages:
                the prompt's first ``n``).
            reading: per window band (by band index), the page indices ``< n`` the
                request still reads there (its current window); they are pinned on the
                new path.
            own_from: where the request's own prompt starts (its hit's pages at
                admission, ``<= shared``; ``None``: ``shared``). The tails and
                checkpoints on the path past it take this insert's time (``tail_time``),
                as if the prompt so far were inserted whole now: an earlier chunk's
                nodes keep no older tail time than the chunk that extends them, so their
                ``TAILS`` units do not come before the prompt's ``LEAF`` in the LRU walk
                (they did: the window-only and full-only evictions that split them cost
                the default run 53x the page copies, docs/benchmarks.md "Page copies of
                incremental insertion (round 8)").

        Returns:
            The new prompt lock (release with ``unlock(handle, tails=False)``; the
            request's hit lock, if any, stays as it is), the cache's ids of pages
            ``[0, n)`` (full and window: where a page was cached already the request must
            use the cache's copy) and the request's duplicates to release.
        """
        dups = self.insert(keys, shared, full, window, ckpts)
        own = shared if own_from is None else own_from
        new, full_ids, win_ids = self._prompt_lock(keys, own)
        if new is not None:
            for band, pages in reading.items():
                self.pin_window(new, band, pages)
        return Adopted(new, {band: tuple(ids)
                             for band, ids in zip(self._fbands, full_ids, strict=True)},
                       {band: tuple(ids) for band, ids in zip(self._wbands, win_ids, strict=True)},
                       dups)

