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
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import numpy as np

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.audit import resolve_audit
from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.page_refs import PageRefs
from kvchain.errors import AuditError, ConfigError, InvalidRequestError, PlanMismatchError

LEAF = 0
TAILS = 1
IN_USE = 1 << 62  # walk time offset of a locked node's tails: after every unlocked unit
LIVE = 1 << 61  # walk time offset of every unit that can still hit: after every dead leaf


class ResumePolicy(StrEnum):
    """Where a cached prompt keeps window tails and state checkpoints.

    ``BLOCKS``: every ``interval`` tokens and the prompt's last whole page (reaches the
    infinite-cache hit rate on the Mooncake trace when memory is unbounded; a running
    request keeps a window tail per block until it finishes). ``ENDS``: only the last
    interval boundary and the last whole page (where a conversation's next turn resumes;
    two tails per request, so little memory is held back when memory binds). ``SPACED``:
    every ``K`` interval boundaries counted back from the last one, ``K`` the least spacing
    that keeps a prompt within its checkpoint budget (:func:`spaced_budget`: the bytes a
    checkpoint costs against the buffer and against the prompt's own full pages);
    ``BLOCKS`` where the budget holds every boundary.
    ``AUTO`` (the default): ``SPACED`` on a chain with a state band, ``BLOCKS`` otherwise
    (:meth:`resolve`; why: docs/prefix-cache.md, "Where checkpoints go").
    """

    BLOCKS = "blocks"
    ENDS = "ends"
    SPACED = "spaced"
    AUTO = "auto"

    def resolve(self, geom: CacheGeometry) -> ResumePolicy:
        """The policy a cache on ``geom`` uses: ``AUTO`` -> ``SPACED`` with a state band
        (a checkpoint is a whole state slot, megabytes, so a prompt keeps as many as the
        budget allows), else ``BLOCKS``; others as they are."""
        if self is not ResumePolicy.AUTO:
            return self
        return ResumePolicy.SPACED if geom.state is not None else ResumePolicy.BLOCKS


# A prompt's checkpoints may cost at most 1/64 of the buffer (``spaced_budget``): tens of
# requests prefill at once in a buffer and each holds its checkpoints until its prompt is
# inserted, so one prompt's share stays a small part of the bytes (docs/prefix-cache.md).
SPACED_BUFFER_SHARE = 64


def spaced_budget(geom: CacheGeometry, whole_pages: int | None = None) -> int | None:
    """Resume points (state checkpoints) a prompt of ``whole_pages`` pages may keep under
    ``SPACED``: ``max(2, min(B // (64 * S), n * E // S))`` for a buffer of ``B`` bytes,
    state slots of ``S`` bytes and full-attention pages of ``E`` bytes: a prompt's
    checkpoints cost at most 1/64 of the buffer and at most what the ``n`` full pages they
    make resumable cost (no more memory to resume a prompt than to hold the KV a hit
    reuses), and never fewer than the two of ``ENDS``. A bound whose bytes the geometry
    does not know (``buffer_bytes`` or ``page_bytes`` 0; ``whole_pages`` ``None``) is
    left out; ``None``
    (no bound) without a state band, without ``slot_bytes``, or when both are left out.

    Raises:
        InvalidRequestError: a negative ``whole_pages``.
    """
    if whole_pages is not None and whole_pages < 0:
        raise InvalidRequestError(f"whole_pages must be >= 0, got {whole_pages}")
    if geom.state is None or geom.slot_bytes <= 0:
        return None
    bounds = []
    if geom.buffer_bytes > 0:
        bounds.append(geom.buffer_bytes // (SPACED_BUFFER_SHARE * geom.slot_bytes))
    if geom.page_bytes > 0 and whole_pages is not None:
        bounds.append(whole_pages * geom.page_bytes // geom.slot_bytes)
    return max(2, min(bounds)) if bounds else None


#: The geometry the cache reads (band roles, page size, the bytes of the ``SPACED``
#: budget): the request layer's one geometry object, not a copy of its fields.
CacheGeometry = RequestGeometry


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


def resend_point(page_size: int, whole_pages: int, prompt_tokens: int) -> int:
    """The deepest page count a resend of the same prompt can hit, in pages:
    ``min(n, (L - 1) // P)`` for a prompt of ``L`` tokens whose keys cover ``n`` whole
    pages (``nP <= L``). A hit always leaves at least one token to compute (the logits of
    the next token; :meth:`PrefixCache.match` caps it at ``(L - 1) // P`` pages, as vLLM
    and SGLang cap a full-prompt hit at ``L - 1`` tokens), so this is ``n`` except for a
    block-aligned prompt (``L = nP``), where it is ``n - 1``.

    Example: ``P = 16``, ``L = 1,008`` (63 pages): 62 (992 tokens); ``L = 1,009``: 63.

    Raises:
        InvalidRequestError: ``prompt_tokens`` below ``whole_pages * page_size`` (keys for
            more pages than the prompt has), or a count that is not an int.
    """
    for name, v in (("whole_pages", whole_pages), ("prompt_tokens", prompt_tokens)):
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 0:
            raise InvalidRequestError(f"resend_point: {name} must be an int >= 0, got {v!r}")
    if prompt_tokens < whole_pages * page_size:
        raise InvalidRequestError(f"resend_point: {whole_pages} whole pages of {page_size} "
                                  f"tokens for a prompt of {prompt_tokens} tokens")
    return min(int(whole_pages), max(0, (int(prompt_tokens) - 1) // page_size))


def resume_points(geom: CacheGeometry, whole_pages: int, interval_pages: int,
                  policy: ResumePolicy = ResumePolicy.BLOCKS,
                  prompt_tokens: int | None = None) -> tuple[int, ...]:
    """Page counts where a cached prompt of ``whole_pages`` pages keeps window tails and
    state checkpoints, sorted: every ``interval_pages`` pages (``BLOCKS``; ``ENDS``: only
    the last of them; ``SPACED``: see below; ``AUTO``: as :meth:`ResumePolicy.resolve`),
    ``whole_pages`` itself and, given the prompt's length ``prompt_tokens``, its
    :func:`resend_point` (``whole_pages - 1`` for a block-aligned prompt, else
    ``whole_pages`` again: nothing added).

    Why the resend point as well as the last page, not instead of it (docs/prefix-cache.md,
    "A block-aligned prompt and its resend"): the point ``n`` serves every prompt that
    extends this one (a conversation's next turn, whose hit may reach past ``n``), the
    point ``n - 1`` the prompt's own resend, which can never resume at ``n``. Keeping
    ``n`` also keeps a cached prompt's last point at its node's end, which the dead-page
    rule (:meth:`PrefixCache.dead_full_page_ids`, the ``LEAF`` order) reads: every full
    page below a checkpoint can hit. The cost is one more checkpoint slot and one more
    window page per windowed band (the tails at ``n - 1`` and ``n`` overlap) per aligned
    prompt (no chunk cut: the forward writes the state at ``(n - 1) P`` inside the chunk
    that passes it, as at every other point). ``SPACED``'s budget places the interval
    points; the resend point is one slot beyond it.

    ``SPACED`` with a budget of ``C`` points (:func:`spaced_budget` of the prompt) with ``L``
    interval boundaries: all of them when ``L <= C - 1``; otherwise every ``K``-th counted
    back from the last, ``L, L - K, L - 2K, ... > 0`` with ``K = ceil(L / (C - 1))`` (at
    most ``C - 1`` boundaries, so at most ``C`` points with the last whole page). E.g. 500
    pages, interval 32 (``L = 15``), ``C = 6``: ``K = 3``, points 96, 192, 288, 384, 480,
    500.

    Empty on a chain without a window/local or state band (every page boundary resumes).

    Raises:
        InvalidRequestError: as :func:`resend_point`.
    """
    resend = (whole_pages if prompt_tokens is None
              else resend_point(geom.page_size, whole_pages, prompt_tokens))
    if not geom.windows and geom.state is None:
        return ()
    resolved = ResumePolicy(policy).resolve(geom)
    last = whole_pages // interval_pages
    if resolved is ResumePolicy.ENDS:
        pts = [last * interval_pages] if last else []
    elif resolved is ResumePolicy.SPACED:
        budget = spaced_budget(geom, whole_pages)
        step = 1 if budget is None or last <= budget - 1 else -(-last // (budget - 1))
        pts = [b * interval_pages for b in range(last, 0, -step)][::-1]
    else:
        pts = list(range(interval_pages, whole_pages + 1, interval_pages))
    if whole_pages and (not pts or pts[-1] != whole_pages):
        pts.append(whole_pages)
    if 0 < resend < whole_pages and resend not in pts:
        pts.insert(len(pts) - 1, resend)  # just below the last page: still sorted
    return tuple(pts)


# A junction adding more than 1/20 of its prefix is worth a checkpoint (junction_point).
JUNCTION_SHARE = 20


def junction_point(geom: CacheGeometry, hit: int, matched: int, whole_pages: int,
                   points: Sequence[int], min_gain_pages: int) -> int:
    """The junction checkpoint a request saves for the cache, in pages (0: none).

    A prompt whose full-attention keys share ``matched`` pages with a cached path but can
    resume only after ``hit`` pages (no checkpoint or window tail deeper on that path)
    recomputes pages ``[hit, matched)``; so would every later prompt sharing that prefix.
    The request therefore keeps a resume point (state checkpoint and window tail) at
    ``matched``, where its prompt leaves the cached path (or where the cached path ends),
    and later prompts that share the prefix resume there. (Marconi-style admission in vLLM
    PRs #37898 and #47782 saves the state at the shared-prefix junction the same way;
    SGLang's unified radix tree records a branch-checkpoint target, sglang #22935.)

    Not worth it, so 0, when the point adds fewer than ``min(min_gain_pages,
    ceil(matched / 20))`` pages of resumable prefix beyond the deepest point at or below it
    (the hit, or one of the request's own ``points``): a gain of a whole interval is always
    worth a checkpoint, and so is one of more than 1/20 of the shared prefix (without it a
    later hit would miss more than 5 % of that prefix, the 95 % of issue 22's target: a
    6,000-token prefix with a checkpoint at 5,632 gets its junction at 6,000); also 0 when
    it is the prompt's own last whole page (already a point), or when nothing matched past
    the hit.

    Args:
        geom: the chain's geometry (a chain without window or state band resumes at every
            page: no junction needed).
        hit: pages the request resumes from (its hit).
        matched: pages its keys share with a cached path (``Hit.matched``).
        whole_pages: ``n``, the prompt's whole pages.
        points: the request's own resume points (page counts, any order).
        min_gain_pages: least pages of extra resumable prefix worth a checkpoint (>= 1).
    """
    if not geom.windows and geom.state is None:
        return 0
    q = min(matched, whole_pages)
    if q >= whole_pages or q <= hit:
        return 0
    below = max((p for p in points if p <= q), default=0)
    if q - max(below, hit) < max(1, min(min_gain_pages, -(-q // JUNCTION_SHARE))):
        return 0
    return q


def tail_pages(geom: CacheGeometry, point: int) -> dict[int, range]:
    """Per window or chunked-local band (by band index), the page indices a request needs
    to resume after ``point`` pages: ``[policy.resume_start(point), point)`` (each band by
    its own policy; empty without such bands)."""
    return {pol.band: range(pol.resume_start(point), point) for pol in geom.windows}


_K = TypeVar("_K", int, tuple[int, int])


def _check_pins(name: str, want: Iterable[_K], have: Mapping[_K, int]) -> None:
    """Raise :class:`AuditError` unless the pin counts ``have`` equal the readers ``want``
    (one entry per reader) counted."""
    count: dict[_K, int] = {}
    for v in want:
        count[v] = count.get(v, 0) + 1
    if count != have:
        raise AuditError(f"{name} pins {sorted(have.items(), key=str)[:8]} differ from what "
                         f"running requests read {sorted(count.items(), key=str)[:8]}")


def cache_refusal(geom: CacheGeometry) -> str | None:
    """Why the prefix cache cannot serve a chain of ``geom``, in words, or ``None`` when it
    can: a radix node keeps one state checkpoint per resume point, and a request saves one
    checkpoint slot per point, so a chain with several state bands (a target's and a
    speculative-decoding draft model's, :func:`kvchain.model.with_draft`) is refused rather
    than cached in part (docs/design.md, "Draft model bands"). Any number of full-attention
    bands (each keeps its own page list per node) and of window and chunked-local bands
    (each keeps its own tails) is served."""
    if len(geom.states) <= 1:
        return None
    return (f"the chain has {len(geom.states)} state bands (e.g. a draft model's), and the "
            f"prefix cache keeps one state checkpoint per resume point")


class PrefixCache:
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

    def __init__(self, geom: CacheGeometry, interval_tokens: int = 512,
                 policy: ResumePolicy = ResumePolicy.BLOCKS, junctions: bool = True,
                 junction_min_tokens: int | None = None, *,
                 audit: bool | None = None) -> None:
        refused = cache_refusal(geom)
        if refused is not None:
            raise ConfigError(f"no prefix cache on this chain: {refused}; run without it "
                              f"(--no-prefix-cache)")
        p = geom.page_size
        if type(interval_tokens) is not int or interval_tokens < p or interval_tokens % p:
            raise InvalidRequestError(f"interval_tokens must be a positive multiple of the page "
                                      f"size {p}, got {interval_tokens!r}")
        if junction_min_tokens is None:
            junction_min_tokens = interval_tokens
        if type(junction_min_tokens) is not int or junction_min_tokens < 1:
            raise InvalidRequestError(f"junction_min_tokens must be an int >= 1, got "
                                      f"{junction_min_tokens!r}")
        self.geom = geom
        self.interval_pages = interval_tokens // p
        self.policy = ResumePolicy(policy).resolve(geom)
        self.junctions = bool(junctions)
        self.junction_min_pages = -(-junction_min_tokens // p)
        self._next_id = 1
        # The window and chunked-local bands, in the order of ``geom.windows``: every
        # node keeps one id list per band (``Node.win[k]`` is band ``self._wbands[k]``).
        self._wbands = tuple(pol.band for pol in geom.windows)
        # The full-attention bands: every node keeps one id list per band
        # (``Node.full[k]`` is band ``self._fbands[k]``), all as long as its keys.
        self._fbands = geom.fulls
        self.root = Node(0, None, 0, [], [[] for _ in self._fbands],
                         [[] for _ in self._wbands], {}, 0)
        self._clock = 0
        # The Evictor's version, a plain attribute (read on the chain memo's hot path):
        # bumped by every change that may change the eviction order: a change of the
        # tree, and a lock, unlock, touch or pin that changes some node's share of the
        # order (a touch of a path only running hits lock, say, changes none and bumps
        # nothing).
        self.version = 0
        self.audit_walks = resolve_audit(audit)
        self.full_walks = 0
        # The incremental eviction order (see "Eviction order, kept incrementally" below).
        self._ready: list[tuple[int, int, int, int, Node]] = []  # heap: (key, kind, nid, ser)
        self._serial = 0
        self._entries = 0  # live entries of the ready heap (the rest are stale)
        self._units = 0  # eviction units of the whole walk
        self._total = [0] * geom.num_bands  # pages per band the whole walk frees
        self._published: tuple[int, EvictionOrder, list[tuple[int, Node]]] | None = None
        self.evicted_pages = [0] * geom.num_bands
        self.evictions = 0
        self._held = [0] * geom.num_bands  # pages / slots held per band (held_counts)
        # Running readers per cached page id (reference counts), one PageRefs per window
        # band (``geom.windows``' order) and, last, the state band's (checkpoint slots a
        # hit resumes from, until copied): one mechanism for every tail a request reads.
        self._refs = [PageRefs() for _ in range(len(self._wbands) + 1)]

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
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 0:
                raise InvalidRequestError(f"resume_points: {name} must be an int >= 0, "
                                          f"got {v!r}")
        pts = resume_points(self.geom, whole_pages, self.interval_pages, self.policy,
                            prompt_tokens)
        if not self.junctions:
            return pts, 0
        return pts, junction_point(self.geom, hit, matched, whole_pages, pts,
                                   self.junction_min_pages)

    # --- Evictor -------------------------------------------------------------------------

    def eviction_order(self) -> EvictionOrder:
        """The simulated LRU walk as cumulative pages per band: a lazy
        :class:`EvictionOrder` (cached by version) whose unit count and last row are the
        kept counters and whose rows are walked from the ready units only as far as they
        are asked for (O(k log nodes) for the first ``k``)."""
        published = self._published
        if published is not None and published[0] == self.version:
            return published[1]
        version = self.version
        walk: list[tuple[int, Node]] = []
        units = self._walk_iter()

        def grow(rows: list[tuple[int, ...]]) -> None:
            if self.version != version:
                raise PlanMismatchError(f"eviction order of cache version {version} asked for "
                                        f"row {len(rows)} at version {self.version}")
            step = next(units, None)
            if step is None:
                raise PlanMismatchError(f"the ready units ran out after {len(walk)} units, "
                                        f"the counters say {self._units}")
            kind, node, row = step
            walk.append((kind, node))
            rows.append(tuple([a + b for a, b in zip(rows[-1], row, strict=True)]))

        if self._units < 0 or any(v < 0 for v in self._total):
            raise PlanMismatchError(f"eviction counters below zero: {self._units} units, "
                                    f"{self._total}")
        order = EvictionOrder.lazy(self._units, tuple(self._total), grow)
        self._published = (version, order, walk)
        return order

    def evict(self, units: int) -> tuple[np.ndarray, ...]:
        """Evict the first ``units`` units of the walk; return the freed ids per band.

        With the audit flag, the order is first rebuilt by a whole-tree walk and compared
        (:meth:`check_order`).

        Raises:
            PlanMismatchError: ``units`` outside ``[1, eviction_order().units]``.
            AuditError: (audit flag) the kept order differs from the rebuilt one.
        """
        order = self.eviction_order()
        if not 0 < units <= order.units:
            raise PlanMismatchError(f"evict({units}) with {order.units} eviction units")
        if self.audit_walks:
            self.check_order()
        order.walk_to(units)
        published = self._published
        assert published is not None and published[1] is order
        g = self.geom
        freed: list[list[int]] = [[] for _ in range(g.num_bands)]
        changed: list[Node] = []
        for kind, node in published[2][:units]:
            self._free_tails(node, freed)
            changed.append(node)
            if kind == LEAF:
                for band, ids in zip(self._fbands, node.full, strict=True):
                    freed[band].extend(ids)
                parent = node.parent
                assert parent is not None
                del parent.children[node.keys[0]]
                node.parent = None
                changed.append(parent)
        for node in changed:
            self._refresh(node)
        for b, ids in enumerate(freed):
            self.evicted_pages[b] += len(ids)
            self._held[b] -= len(ids)
        self.evictions += units
        self._bump()
        return tuple(np.asarray(ids, dtype=np.int64) for ids in freed)

    def _free_tails(self, node: Node, freed: list[list[int]]) -> None:
        """Free ``node``'s unpinned window pages and checkpoints into ``freed``."""
        g = self.geom
        for k, band in enumerate(self._wbands):
            if node.win_live[k] <= node.pins[k]:
                continue
            out, refs, win = freed[band], self._refs[k], node.win[k]
            for i, v in enumerate(win):
                if v >= 0 and not refs.of(v):
                    out.append(v)
                    win[i] = -1
            node.win_live[k] = node.pins[k]
        if len(node.ckpts) > node.pins[-1] and g.state is not None:
            if node.pins[-1]:
                crefs = self._refs[-1]
                keep = {p: v for p, v in node.ckpts.items() if crefs.of(v)}
                freed[g.state].extend(v for v in node.ckpts.values() if not crefs.of(v))
                node.ckpts = keep
            else:
                freed[g.state].extend(node.ckpts.values())
                node.ckpts = {}

    def _unit_pages(self, node: Node, kind: int, tails_gone: bool) -> list[int]:
        g = self.geom
        row = [0] * g.num_bands
        if not tails_gone:
            for k, band in enumerate(self._wbands):
                row[band] = node.win_live[k] - node.pins[k]
            if g.state is not None:
                row[g.state] = len(node.ckpts) - node.pins[-1]
        if kind == LEAF:
            for band, ids in zip(self._fbands, node.full, strict=True):
                row[band] = len(ids)
        return row

    def _walk_from_scratch(self) -> tuple[EvictionOrder, list[tuple[int, Node]]]:
        """The eviction order rebuilt by a whole-tree walk (the audit's reference: what
        the cache computed on every version change before the order was kept
        incrementally). O(nodes log nodes); counted in :attr:`full_walks`."""
        self.full_walks += 1
        heap: list[tuple[int, int, int, Node]] = []
        left: dict[int, int] = {}
        for node in self.nodes():
            if node.lock:  # its full pages stay
                if not node.tlock and node.has_tails():  # tails of a prompt lock: evictable
                    heap.append((IN_USE + node.tail_time, TAILS, node.nid, node))
                continue
            if node.children:
                left[node.nid] = len(node.children)
            else:
                heap.append((self._leaf_key(node, False), LEAF, node.nid, node))
            if node.has_tails():
                heap.append((self._tails_key(node, not node.children), TAILS, node.nid, node))
        heapq.heapify(heap)
        dropped: set[int] = set()
        gone: set[int] = set()
        leaves: set[int] = set()  # unlocked nodes that became leaves during the walk
        walk: list[tuple[int, Node]] = []
        rows: list[list[int]] = []
        while heap:
            _, kind, nid, node = heapq.heappop(heap)
            if nid in gone:  # a LEAF entry superseded by its dead one, or tails after it
                continue
            if kind == TAILS:
                if nid in dropped:
                    continue
                dropped.add(nid)
                walk.append((TAILS, node))
                rows.append(self._unit_pages(node, TAILS, False))
                if self._dies(node, nid in leaves):  # its pages can no longer hit
                    heapq.heappush(heap, (node.time, LEAF, nid, node))
                continue
            walk.append((LEAF, node))
            rows.append(self._unit_pages(node, LEAF, nid in dropped))
            gone.add(nid)
            parent = node.parent
            if parent is not None and parent.nid in left:
                n = left[parent.nid] - 1
                left[parent.nid] = n
                if n == 0:
                    leaves.add(parent.nid)
                    tails_gone = parent.nid in dropped
                    heapq.heappush(heap, (self._leaf_key(parent, tails_gone), LEAF,
                                          parent.nid, parent))
                    if not tails_gone and parent.has_tails():  # its tails' key as a leaf
                        heapq.heappush(heap, (self._tails_key(parent, True), TAILS,
                                              parent.nid, parent))
        if rows:
            cum = np.cumsum(np.asarray(rows, dtype=np.int64), axis=0)
            order = EvictionOrder(((0,) * self.geom.num_bands, *tuple(map(tuple, cum.tolist()))))
        else:
            order = EvictionOrder()
        return order, walk

    def check_order(self) -> None:
        """Rebuild the eviction order by a whole-tree walk and compare it with the kept one
        (unit count, pages freed in all, every row, and the units' nodes in order).

        Raises:
            AuditError: naming what differs.
        """
        ref, ref_walk = self._walk_from_scratch()
        order = self.eviction_order()
        if (order.units, order.freed(order.units)) != (ref.units, ref.freed(ref.units)):
            raise AuditError(f"eviction counters: {order.units} units freeing "
                             f"{order.freed(order.units)}, the tree walk gives {ref.units} "
                             f"freeing {ref.freed(ref.units)}")
        try:
            rows = order.cumulative
        except PlanMismatchError as exc:
            raise AuditError(f"the kept eviction order cannot be walked: {exc}") from exc
        if rows != ref.cumulative:
            first = next(j for j, (a, b) in enumerate(zip(rows, ref.cumulative, strict=True))
                         if a != b)
            raise AuditError(f"eviction order row {first}: kept {rows[first]}, the tree walk "
                             f"gives {ref.cumulative[first]}")
        published = self._published
        assert published is not None
        kept = [(kind, node.nid) for kind, node in published[2]]
        if kept != [(kind, node.nid) for kind, node in ref_walk]:
            raise AuditError("the kept eviction order walks other units than the tree walk")

    # --- eviction order, kept incrementally ------------------------------------------------
    #
    # A unit is *ready* when the whole-tree walk would put it in its heap at the start: a
    # LEAF of an unlocked node without children, keyed by its time; a TAILS unit of a
    # node with tails to free that is either locked by prompt locks only (keyed
    # IN_USE + tail time) or unlocked with a tail time older than its time (an unlocked
    # node whose tail time equals its time never frees its tails before its LEAF: every
    # node of its subtree is no newer and its LEAF sorts first at equal times; and the
    # tail time is never newer than the time: every update of it sets both). The ready
    # units live in one heap with lazy deletion (an entry is live while its serial is the
    # node's); a node's share of the order (its signature: keys, time when unlocked,
    # units and pages) is recounted by _refresh whenever its locks, times, pages, pins or
    # children change, which moves the kept totals and bumps the version only when the
    # share changed. The published order walks the heap in sorted order without changing
    # it (a second heap over its indices) and merges the parents that become leaves on
    # the way (the cascade), exactly as the whole-tree walk pops them.

    def _dead(self, node: Node, tails_gone: bool) -> bool:
        """Whether an unlocked leaf is *dead*: on a state chain, no checkpoint left (none,
        or its tails already dropped in the walk, ``tails_gone``), so no hit can resume in
        it and its full pages (and window pages) can never be used."""
        return self.geom.state is not None and (tails_gone or not node.ckpts)

    def _leaf_key(self, node: Node, tails_gone: bool) -> int:
        """The walk key of an unlocked leaf's ``LEAF`` unit: a dead leaf (:meth:`_dead`)
        goes before every unit that can hit (key = its time); every other one at ``LIVE``
        + its time."""
        return node.time if self._dead(node, tails_gone) else LIVE + node.time

    def _tails_key(self, node: Node, leaf: bool) -> int:
        """The walk key of an unlocked node's ``TAILS`` unit: its tail time, after ``LIVE``
        unless the node is a dead ``leaf`` (its window pages, with no checkpoint, cannot be
        resumed from either: they go with the dead units, just before its ``LEAF``)."""
        return node.tail_time if leaf and self._dead(node, False) else LIVE + node.tail_time

    def _dies(self, node: Node, joined: bool) -> bool:
        """Whether ``node``'s ``LEAF`` turns dead when the walk drops its tails: an unlocked
        node on a state chain that is a leaf (at the start, or ``joined`` as one in the
        walk), so its full pages, no checkpoint left at or below them, follow their
        checkpoint at once (its dead ``LEAF`` is entered; the live one is skipped)."""
        return (self.geom.state is not None and not node.lock
                and (joined or not node.children))

    def _refresh(self, node: Node) -> bool:
        """Recount ``node``'s share of the eviction order; returns whether it changed (then
        the totals and ready entries move and the version is bumped)."""
        if not node.nid:
            return False
        sig: Share | None
        if node.parent is None:  # evicted
            sig = None
        else:
            tw = node.tail_windows()
            tc = len(node.ckpts) - node.pins[-1]
            tails = tc > 0 or any(tw)
            if not node.lock:
                tk = (self._tails_key(node, not node.children)
                      if tails and node.tail_time < node.time else -1)
                sig = (-1 if node.children else self._leaf_key(node, False), tk, node.time,
                       2 if tk >= 0 else 1, tuple(map(len, node.full)), tw, tc)
            elif not node.tlock and tails:
                sig = (-1, IN_USE + node.tail_time, -1, 1, (0,) * len(self._fbands), tw, tc)
            else:
                sig = None
        old = node.sig
        if sig == old:
            return False
        node.sig = sig
        g = self.geom
        total = self._total
        for share, sign in ((old, -1), (sig, 1)):
            if share is None:
                continue
            self._units += sign * share[3]
            for band, pages in zip(self._fbands, share[4], strict=True):
                total[band] += sign * pages
            for band, pages in zip(self._wbands, share[5], strict=True):
                total[band] += sign * pages
            if g.state is not None:
                total[g.state] += sign * share[6]
        old_leaf = old[0] if old is not None else -1
        old_tails = old[1] if old is not None else -1
        new_leaf = sig[0] if sig is not None else -1
        new_tails = sig[1] if sig is not None else -1
        if new_leaf != old_leaf:
            node.lser = self._push(new_leaf, LEAF, node, old_leaf >= 0)
        if new_tails != old_tails:
            node.tser = self._push(new_tails, TAILS, node, old_tails >= 0)
        self.version += 1
        return True

    def _push(self, key: int, kind: int, node: Node, replaces: bool) -> int:
        """Enter a ready unit (``key >= 0``) or none (``key < 0``) for ``node``, replacing
        its live entry of that kind if ``replaces``; returns the new serial (0: none).
        Compacts the heap when stale entries outnumber the live ones."""
        ready = self._ready
        if replaces:
            self._entries -= 1
        serial = 0
        if key >= 0:
            self._serial += 1
            serial = self._serial
            heapq.heappush(ready, (key, kind, node.nid, serial, node))
            self._entries += 1
        if len(ready) > 2 * self._entries + 64:
            if kind == LEAF:
                node.lser = serial  # the compaction below reads the new serial
            else:
                node.tser = serial
            live = [e for e in ready
                    if (e[4].lser if e[1] == LEAF else e[4].tser) == e[3]]
            heapq.heapify(live)
            ready[:] = live
        return serial

    def _walk_iter(self) -> Iterator[tuple[int, Node, list[int]]]:
        """The walk of the published order: ``(kind, node, pages per band)`` unit by unit,
        the ready heap read in sorted order (not changed) merged with the parents that
        become leaves as their last child goes (their LEAF joins with their own time)."""
        ready = self._ready
        size = len(ready)
        heappush, heappop = heapq.heappush, heapq.heappop
        scan: list[tuple[tuple[int, int, int, int, Node], int]] = [(ready[0], 0)] if ready \
            else []
        joined: list[tuple[int, int, int, int, Node]] = []
        left: dict[int, int] = {}
        dropped: set[int] = set()
        gone: set[int] = set()
        leaves: set[int] = set()  # unlocked nodes that became leaves during the walk

        def pop_scan() -> tuple[int, int, int, int, Node]:
            """The least entry of the heap read in order; its heap children join the scan."""
            entry, i = heappop(scan)
            j = 2 * i + 1
            if j < size:
                heappush(scan, (ready[j], j))
                if j + 1 < size:
                    heappush(scan, (ready[j + 1], j + 1))
            return entry

        while True:
            while scan:  # skip stale entries, reading their children in the heap
                e = scan[0][0]
                if (e[4].lser if e[1] == LEAF else e[4].tser) == e[3]:
                    break
                pop_scan()
            if scan and (not joined or scan[0][0] < joined[0]):
                e = pop_scan()
            elif joined:
                e = heappop(joined)
            else:
                return
            kind, nid, node = e[1], e[2], e[4]
            if nid in gone:  # a LEAF entry superseded by its dead one
                continue
            if kind == TAILS:
                if nid in dropped:  # an entry superseded by its key as a leaf
                    continue
                dropped.add(nid)
                yield TAILS, node, self._unit_pages(node, TAILS, False)
                if self._dies(node, nid in leaves):  # its pages can no longer hit
                    heappush(joined, (node.time, LEAF, nid, -1, node))
                continue
            yield LEAF, node, self._unit_pages(node, LEAF, nid in dropped)
            gone.add(nid)
            parent = node.parent
            if parent is not None and parent.nid and not parent.lock:
                n = left.get(parent.nid, len(parent.children)) - 1
                left[parent.nid] = n
                if n == 0:
                    leaves.add(parent.nid)
                    tails_gone = parent.nid in dropped
                    heappush(joined, (self._leaf_key(parent, tails_gone), LEAF, parent.nid, -1,
                                      parent))
                    if (not tails_gone and parent.has_tails()
                            and parent.tail_time < parent.time):  # its tails' key as a leaf
                        heappush(joined, (self._tails_key(parent, True), TAILS, parent.nid,
                                          -1, parent))

    # --- tree walks ----------------------------------------------------------------------

    def nodes(self) -> Iterator[Node]:
        """Every node but the root (depth first)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _bump(self) -> None:
        self.version += 1

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

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

    def _new_id(self) -> int:
        nid = self._next_id
        self._next_id += 1
        return nid

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
        fulls: list[list[int]] = [[] for _ in self._fbands]
        wins: list[list[int]] = [[] for _ in self._wbands]
        ckpt_at: dict[int, int] = {}
        for node, j in path:
            for full, ids in zip(fulls, node.full, strict=True):
                full.extend(ids[:j])
            for win, ids in zip(wins, node.win, strict=True):
                win.extend(ids[:j])
            if g.state is not None:
                for p, v in node.ckpts.items():
                    if p <= node.start + j:
                        ckpt_at[p] = v
        if g.state is not None:
            candidates: Iterator[int] | list[int] = sorted(
                (p for p in ckpt_at if p <= cap), reverse=True)
        else:
            candidates = iter(range(cap, 0, -1))
        # Per window band, last_absent[i]: the largest index <= i whose page is absent, or
        # -1; the hit is the deepest candidate at which every band holds its whole tail.
        absent: list[list[int]] = []
        for win in wins:
            last_absent: list[int] = []
            la = -1
            for i, v in enumerate(win):
                if v < 0:
                    la = i
                last_absent.append(la)
            absent.append(last_absent)
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

    # --- pins (what a running request still reads) --------------------------------------

    @staticmethod
    def _node_of(handle: Node, page: int) -> Node:
        """The node of ``handle``'s path (root..handle) holding page index ``page``.

        Raises:
            AuditError: no node of the path holds it.
        """
        n: Node | None = handle
        while n is not None and n.nid:
            if n.start <= page < n.end:
                return n
            n = n.parent
        raise AuditError(f"page {page} is not on the locked path ending at node {handle.nid}")

    def _window_of(self, band: int) -> int:
        """The index of window band ``band`` in ``geom.windows`` (``Node.win``'s order).

        Raises:
            AuditError: ``band`` is not a window or chunked-local band of the chain.
        """
        try:
            return self._wbands.index(band)
        except ValueError:
            raise AuditError(f"band {band} is not a window band of the cache "
                             f"(window bands {list(self._wbands)})") from None

    def _tail_of(self, band: int) -> int:
        """The index of band ``band``'s reference counts (``self._refs``, ``Node.pins``):
        a window band's in ``geom.windows``, the state band's last.

        Raises:
            AuditError: ``band`` is neither a window or chunked-local band nor the state
                band of the chain.
        """
        if band in self._wbands:
            return self._wbands.index(band)
        if self.geom.state is not None and band == self.geom.state:
            return len(self._wbands)
        raise AuditError(f"band {band} is not a window band nor the state band of the cache "
                         f"(window bands {list(self._wbands)}, state band {self.geom.state})")

    def _ref(self, k: int, vids: Sequence[int], nodes: Sequence[Node]) -> None:
        """One more reader of each cached id ``vids`` of reference counts ``k``, held by
        ``nodes`` (aligned): a node's pinned count rises by its ids that had no reader,
        and each node's share of the eviction order is recounted once."""
        if not vids:
            return
        refs = self._refs[k]
        fresh = refs.add(vids, nodes)
        if fresh:  # each node's pinned count rises by its ids that had no reader (C-level)
            for node, c in Counter(refs.node[fresh].tolist()).items():
                node.pins[k] += c
        for node in dict.fromkeys(nodes):
            self._refresh(node)

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

    def _tail_ids(self, handle: Node, k: int, pages: Iterable[int],
                  ) -> tuple[list[int], list[Node]]:
        """The ids of window band ``k``'s pages at page indices ``pages`` of ``handle``'s
        path and the nodes holding them.

        A contiguous ascending run of pages on the path (the window a request reads, the
        usual case) is taken node by node, one list slice each; any other set of pages
        page by page.

        Raises:
            AuditError: a page not on the path, or absent (a tombstone).
        """
        seq: Sequence[int] = pages if isinstance(pages, range) else list(pages)
        if seq and seq[0] >= 0 and seq[-1] < handle.end and (
                len(seq) == seq[-1] - seq[0] + 1 and (
                    isinstance(seq, range) or seq == list(range(seq[0], seq[-1] + 1)))):
            return self._run_ids(handle, k, seq[0], seq[-1] + 1)
        vids: list[int] = []
        nodes: list[Node] = []
        for i in seq:
            node = self._node_of(handle, i)
            v = node.win[k][i - node.start] if node.win[k] else -1
            if v < 0:
                raise AuditError(f"pin of window page {i}: absent from node {node.nid}")
            vids.append(v)
            nodes.append(node)
        return vids, nodes

    @staticmethod
    def _run_ids(handle: Node, k: int, lo: int, hi: int) -> tuple[list[int], list[Node]]:
        """:meth:`_tail_ids` of the page indices ``[lo, hi)`` (``0 <= lo < hi <=
        handle.end``: on the path): one slice of window band ``k``'s ids per node of the
        path that overlaps them.

        Raises:
            AuditError: a page absent (a tombstone, or a node without band ``k``'s pages).
        """
        runs: list[tuple[int, list[int], Node]] = []
        n: Node | None = handle
        while n is not None and n.nid and n.end > lo:
            a, b = max(lo, n.start), min(hi, n.end)
            if a < b:
                win = n.win[k]
                runs.append((a, win[a - n.start:b - n.start] if win else [-1], n))
            n = n.parent
        vids: list[int] = []
        nodes: list[Node] = []
        for a, ids, node in reversed(runs):  # ascending page order
            if min(ids) < 0:
                i = a + ids.index(min(ids))
                raise AuditError(f"pin of window page {i}: absent from node {node.nid}")
            vids += ids
            nodes += [node] * len(ids)
        return vids, nodes

    def pin_window(self, handle: Node, band: int, pages: Iterable[int]) -> None:
        """Reference the cached pages of window band ``band`` at page indices ``pages`` of
        ``handle``'s locked path: a running request reads them (its window in that band
        covers them), so no ``TAILS`` unit frees them until the references are dropped
        (:meth:`unpin_pages`, :meth:`unpin_window`).

        Raises:
            AuditError: ``band`` not a window band, or a page not on the path or not
                present (a tombstone); every page is checked before any is pinned
                (nothing changes).
        """
        k = self._window_of(band)
        self._ref(k, *self._tail_ids(handle, k, pages))

    def unpin_window(self, handle: Node, band: int, pages: Iterable[int]) -> None:
        """Undo :meth:`pin_window` for page indices ``pages`` of window band ``band`` (the
        request's window moved past them, or it ended): once no request pins a page it is
        evictable.

        Raises:
            AuditError: ``band`` not a window band, or a page that is not pinned (or named
                more times than it is pinned); every page is checked before any is
                unpinned (nothing changes).
        """
        k = self._window_of(band)
        refs = self._refs[k]
        vids: list[int] = []
        asked: dict[int, int] = {}
        for i in pages:
            node = self._node_of(handle, i)
            v = node.win[k][i - node.start] if node.win[k] else -1
            asked[v] = asked.get(v, 0) + 1
            if v < 0 or refs.of(v) < asked[v]:
                raise AuditError(f"unpin of window page {i} of node {node.nid}: not pinned")
            vids.append(v)
        self._unread(k, refs.drop(vids))

    def unpin_pages(self, band: int, vids: np.ndarray | Sequence[int]) -> None:
        """Drop one reference of each cached page id ``vids`` of band ``band`` (int64
        ``[n]``; an id named twice drops two): a window band's pages a request stopped
        reading (a decode batch's window fronts, as the request layer reads them from its
        rows), or the state band's checkpoint a hit resumed from (copied into the
        request's own slot, or given up). One vectorised decrement of the band's
        reference counts, then one recount of the eviction order per node that lost its
        last reader on some page (not per request).

        Raises:
            AuditError: ``band`` neither a window band nor the state band, or an id read
                by fewer running requests than it is named (nothing changes).
        """
        k = self._tail_of(band)
        self._unread(k, self._refs[k].drop(vids))

    def _unread(self, k: int, nodes: list[object]) -> None:
        """Pages of reference counts ``k`` (a window band in ``geom.windows``' order, or
        the state band, last) lost their last reader, one entry of ``nodes`` (the node
        holding it) per page: their nodes' pinned counts fall, and each such node's share
        of the eviction order is recounted once: where its keys cannot move, by moving
        the totals (a node locked by a hit has no share either way; a prompt-locked
        node's ``TAILS`` unit keeps its key and only grows in pages), else by
        :meth:`_refresh`."""
        if not nodes:
            return
        lost: dict[Node, int] = {}
        for node in nodes:
            assert isinstance(node, Node)
            lost[node] = lost.get(node, 0) + 1
        state = k == len(self._wbands)
        band = self.geom.state if state else self._wbands[k]
        total = self._total
        for node, c in lost.items():
            node.pins[k] -= c
            sig = node.sig
            if node.lock and node.tlock and sig is None:
                continue  # a hit lock keeps the path's tails: no unit before or after
            if node.lock and not node.tlock and sig is not None and node.parent is not None:
                # a prompt-locked node's TAILS unit: the same unit and key (its tail time),
                # only its pages in this band grow (nothing else changed since its share
                # was counted): the total moves by as many
                assert band is not None
                tw = sig[5]
                if state:
                    now = len(node.ckpts) - node.pins[k]
                    total[band] += now - sig[6]
                    node.sig = (*sig[:6], now)
                else:
                    now = node.win_live[k] - node.pins[k]
                    total[band] += now - tw[k]
                    node.sig = (sig[0], sig[1], sig[2], sig[3], sig[4],
                                (*tw[:k], now, *tw[k + 1:]), sig[6])
                self.version += 1
                continue
            self._refresh(node)  # an unlocked node holds no pin; tails that were all pinned

    def checkpoint_at(self, handle: Node, point: int) -> int:
        """The state slot of the checkpoint after ``point`` pages on ``handle``'s locked
        path, or -1 when there is none (the audit of what a request resumes from).

        Raises:
            AuditError: page ``point - 1`` is not on the path.
        """
        return self._node_of(handle, point - 1).ckpts.get(point, -1)

    def pinned(self) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
        """Copies of the reference counts: ``(window band, page id)`` -> readers,
        checkpoint slot id -> readers."""
        return ({(band, v): c for band, refs in zip(self._wbands, self._refs, strict=False)
                 for v, c in refs.items().items()}, self._refs[-1].items())

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
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                break
            run = child.keys
            j = _shared_run(run, keys, pos)
            if j < len(run):
                child = self._split(child, pos + j)
            changed.append(child)
            child.time = now
            for band, ids in zip(self._fbands, fulls, strict=True):
                dups[band].extend(ids[max(pos, shared):pos + j])
            for k, (band, pages) in enumerate(zip(self._wbands, offered, strict=True)):
                if not pages:
                    continue
                win = child.win[k]
                # only the offered pages in this node, ascending (not every page of it:
                # a later chunk's insert passes the whole path before it)
                for i in sorted(i for i in pages if pos <= i < pos + j):
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
                for p in [p for p in ckpts if pos < p <= pos + j]:
                    v = ckpts.pop(p)
                    if p in child.ckpts:
                        dups[g.state].append(v)
                    else:
                        child.ckpts[p] = v
                        child.tail_time = now
                        kept[g.state] += 1
            node, pos = child, pos + j
        if pos < n:
            runs = [_take_run(pages, pos, n) for pages in offered]
            new = Node(self._new_id(), node, pos, list(keys[pos:n]),
                       [list(ids[pos:n]) for ids in fulls], [ids for ids, _ in runs],
                       {p: ckpts.pop(p) for p in [p for p in ckpts if pos < p <= n]}, now,
                       [live for _, live in runs])
            node.children[keys[pos]] = new
            changed.append(new)
            for band, ids in zip(self._fbands, new.full, strict=True):
                kept[band] += len(ids)
            for band, live in zip(self._wbands, new.win_live, strict=True):
                kept[band] += live
            if g.state is not None:
                kept[g.state] += len(new.ckpts)
        for b, k in enumerate(kept):
            self._held[b] += k
        for band, pages in zip(self._wbands, offered, strict=True):
            dups[band].extend(pages.values())
        if g.state is not None:
            dups[g.state].extend(ckpts.values())
        return dups, changed

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
        n = len(keys)
        own = shared if own_from is None else own_from
        new: Node | None = None
        full_ids: list[list[int]] = [[] for _ in self._fbands]
        win_ids: list[list[int]] = [[] for _ in self._wbands]
        if n:
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
            new = path[-1][0]
            for node, _ in path:  # its new tail time and lock recounted once
                self._refresh(node)
        if new is not None:
            for band, pages in reading.items():
                self.pin_window(new, band, pages)
        return Adopted(new, {band: tuple(ids)
                             for band, ids in zip(self._fbands, full_ids, strict=True)},
                       {band: tuple(ids) for band, ids in zip(self._wbands, win_ids, strict=True)},
                       dups)

    # --- integrity -----------------------------------------------------------------------

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

    @property
    def held_counts(self) -> tuple[int, ...]:
        """Pages (state slots for a state band) the cache holds per band, locked or not:
        counters kept by :meth:`insert` and :meth:`evict`, so O(bands) to read (the
        per-step band samples read them); :meth:`audit` checks them against
        :meth:`held_pages`."""
        return tuple(self._held)

    def held_pages(self) -> list[list[int]]:
        """Every virtual id the cache holds, per band."""
        g = self.geom
        out: list[list[int]] = [[] for _ in range(g.num_bands)]
        for node in self.nodes():
            for band, ids in zip(self._fbands, node.full, strict=True):
                out[band].extend(ids)
            for band, win in zip(self._wbands, node.win, strict=True):
                out[band].extend(v for v in win if v >= 0)
            if g.state is not None:
                out[g.state].extend(node.ckpts.values())
        return out

    def dead_full_pages(self, unlocked_only: bool = False) -> tuple[int, int]:
        """``(dead, cached)`` full-band pages: of the ``cached`` full pages the cache holds,
        the ``dead`` ones no hit can use on a state chain (:meth:`dead_full_page_ids`).
        With ``unlocked_only`` both count only nodes no running request locks (the pages
        eviction may take; locked ones are in use). O(nodes); a measurement
        (``benchmarks/bench_dead_pages.py``), not used by the cache itself."""
        dead, cached = self._dead_full(unlocked_only)
        return len(dead), cached

    def dead_full_page_ids(self, unlocked_only: bool = False) -> list[int]:
        """Lowest full band's ids (every full band keeps the same pages) of the cached
        pages no hit can use: on a state chain, page ``j``
        of a node is live iff a checkpoint after ``p > j`` pages exists in that node or in
        its subtree (a hit resumes only at a checkpoint, and uses pages ``[0, p)``); the
        others are dead. Empty without a state band (every page boundary, or every window
        tail, resumes there) or without a full band; ``unlocked_only`` as
        :meth:`dead_full_pages`."""
        return self._dead_full(unlocked_only)[0]

    def _dead_full(self, unlocked_only: bool) -> tuple[list[int], int]:
        g = self.geom
        dead: list[int] = []
        cached = 0
        if g.full is None:
            return dead, 0
        below: dict[int, bool] = {}  # nid -> a checkpoint in its subtree (itself included)
        order = list(self.nodes())  # depth first: every child after its parent
        for node in reversed(order):
            deeper = any(below[c.nid] for c in node.children.values())
            below[node.nid] = deeper or bool(node.ckpts)
            if unlocked_only and node.lock:
                continue
            cached += len(node.full[0])
            if g.state is not None and not deeper:
                last = max(node.ckpts, default=node.start)
                dead.extend(node.full[0][last - node.start:])
        return dead, cached

    def audit(self, handles: Sequence[Node],
              pins: tuple[Sequence[tuple[int, int]], Sequence[int]] | None = None,
              prompt_handles: Sequence[Node] = ()) -> None:
        """Tree invariants, lock counts equal to the paths of ``handles`` (the hit locks
        of running requests) and ``prompt_handles`` (their prompt locks), and pin counts
        equal to ``pins`` (the ``(window band, page id)`` pairs and the checkpoint ids
        running requests read; not checked when ``None``), and the kept eviction order
        equal to the one a whole-tree walk rebuilds (:meth:`check_order`).

        Raises:
            AuditError: naming the first thing found wrong.
        """
        held = [len(ids) for ids in self.held_pages()]
        if list(self.held_counts) != held:
            raise AuditError(f"held page counters {list(self.held_counts)} per band, the tree "
                             f"holds {held}")
        if pins is not None:
            _check_pins("window page", pins[0], self.pinned()[0])
            _check_pins("checkpoint", pins[1], self._refs[-1].items())
        wpins = cpins = 0
        expected: dict[int, int] = {}
        texpected: dict[int, int] = {}
        for h in [*handles, *prompt_handles]:
            n: Node | None = h
            while n is not None and n.nid:
                expected[n.nid] = expected.get(n.nid, 0) + 1
                n = n.parent
        for h in handles:
            n = h
            while n is not None and n.nid:
                texpected[n.nid] = texpected.get(n.nid, 0) + 1
                n = n.parent
        for node in self.nodes():
            parent = node.parent
            if parent is None or parent.children.get(node.keys[0]) is not node:
                raise AuditError(f"node {node.nid}: not its parent's child")
            if node.start != parent.end and parent.nid:
                raise AuditError(f"node {node.nid}: starts at {node.start}, parent ends at "
                                 f"{parent.end}")
            if not node.keys:
                raise AuditError(f"node {node.nid}: empty")
            if len(node.full) != len(self._fbands) or any(
                    len(ids) != len(node.keys) for ids in node.full):
                raise AuditError(f"node {node.nid}: full pages per band "
                                 f"{[len(ids) for ids in node.full]} for {len(node.keys)} "
                                 f"keys and {len(self._fbands)} full bands")
            if len(node.win) != len(self._wbands) or any(
                    len(win) != len(node.keys) or live != sum(1 for v in win if v >= 0)
                    for win, live in zip(node.win, node.win_live, strict=False)):
                raise AuditError(f"node {node.nid}: window pages miscounted")
            if any(not node.start < p <= node.end for p in node.ckpts):
                raise AuditError(f"node {node.nid}: a checkpoint outside its pages")
            if node.lock != expected.get(node.nid, 0) or node.tlock != texpected.get(node.nid, 0):
                raise AuditError(f"node {node.nid}: lock {node.lock} (hits {node.tlock}), "
                                 f"{expected.get(node.nid, 0)} running requests pass through it "
                                 f"({texpected.get(node.nid, 0)} hits)")
            if node.time < max((c.time for c in node.children.values()), default=0):
                raise AuditError(f"node {node.nid}: older than a child")
            if node.tail_time > node.time:
                raise AuditError(f"node {node.nid}: tail time {node.tail_time} after its time "
                                 f"{node.time}")
            wp = [sum(1 for v in win if v >= 0 and refs.of(v))
                  for win, refs in zip(node.win, self._refs, strict=False)]
            for win, refs in zip([*node.win, list(node.ckpts.values())], self._refs,
                                 strict=True):
                if any(refs.of(v) and refs.node[v] is not node for v in win if v >= 0):
                    raise AuditError(f"node {node.nid}: a read window page is recorded at "
                                     f"another node")
            cp = sum(1 for v in node.ckpts.values() if self._refs[-1].of(v))
            if [*wp, cp] != node.pins:
                raise AuditError(f"node {node.nid}: pins counted {node.pins}, "
                                 f"held ({wp}, {cp})")
            if (any(wp) or cp) and not node.lock:
                raise AuditError(f"node {node.nid}: pinned pages on an unlocked node")
            wpins += sum(wp)
            cpins += cp
        npins = sum(len(refs) for refs in self._refs[:-1])
        if (wpins, cpins) != (npins, len(self._refs[-1])):
            raise AuditError(f"{npins} window pages and {len(self._refs[-1])} checkpoints "
                             f"pinned, {wpins} and {cpins} found in the tree")
        self.check_order()
