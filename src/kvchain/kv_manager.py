"""Requests on the chain: each request's virtual pages per band, and its demands.

The page formulas of each band kind (which pages a chunk needs, which the window-tail
release drops after a forward, where a prefix-cache hit resumes) are the band policies'
(:mod:`kvchain.requests.policies`); :func:`kvchain.requests.demand.request_demand` is the
one pure function that turns a request description into a
:class:`~kvchain.alloc.snapshot.Demand`. After the forward that computed tokens up to
``L``, window pages wholly before the next token's window (the policy's ``first_page(L)``)
are released (window-tail release); page tables keep the band's null page in their place.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, SupportsIndex

import numpy as np

from kvchain.alloc.allocator import Allocator, EvictingAllocator
from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.cache.radix import Hit, Node, PrefixCache, junction_point, resume_points
from kvchain.decode_state import DecodeState
from kvchain.errors import (
    ConfigError,
    ForgedQuoteError,
    InvalidDemandError,
    InvalidRequestError,
    ReservedPageError,
    UnknownRequestError,
)
from kvchain.requests.demand import (
    NOTHING_HELD,
    HeldPages,
    request_demand,
    tail_spans,
)
from kvchain.requests.geometry import RequestGeometry


def sum_demands(demands: Iterable[Demand], num_bands: int) -> Demand:
    """Element-wise sum of demands of a chain with ``num_bands`` bands (O(1) for an
    unchanged :class:`DecodeDemands`, which carries its sum)."""
    if type(demands) is DecodeDemands and demands.total is not None \
            and len(demands.total.pages) == num_bands:
        return demands.total
    zero = (0,) * num_bands
    total = [0] * num_bands
    for d in demands:
        pages = d.pages
        if pages == zero:  # most decode steps: skip cheaply
            continue
        for i, n in enumerate(pages):
            total[i] += n
    return Demand(tuple(total))


@dataclass(slots=True)
class RequestPages:
    """The pages one request holds (mutable; owned by :class:`KVManager`).

    Attributes:
        tokens: tokens whose KV is in the cache (``L``).
        full: full-band virtual ids, page ``j`` covers tokens ``[j * P, (j + 1) * P)``.
        window: window-band virtual ids of pages ``window_first ..``, in page order.
        window_first: token-page index of ``window[0]``; pages before it were released.
        slots: state-band virtual ids (working slot first).
        more_window: for window bands ``windows[1:]`` of the geometry, their ids in page
            order (as ``window``); ``more_first``: their first token-page indices.
        keys: the prompt's page keys (prefix cache), or ``None``.
        shared: pages ``[0, shared)`` (full and window) belong to the prefix cache: the
            request's hit; it never releases them.
        handle: the cache node whose path the request locked (``None``: no hit).
        points: resume points still to come (page counts > ``shared``): a state checkpoint
            is saved at each, and the window pages of their tails are kept.
        retain: window page indices kept for the cache instead of being released.
        kept: window pages moved out of the window but kept (page index -> id).
        ckpts: state checkpoint slots saved (point -> id).
        cow_src: the cache's checkpoint to copy into the working slot once it is taken.
        cut: the junction checkpoint's token position (0: none): a prefill chunk that
            would pass it ends there instead (:meth:`KVManager.chunk_cut`), so the state
            after it is a chunk's end state.
    """

    _tokens: int = 0  # while unregistered; a registered request's count is in the arrays
    full: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    window_first: int = 0
    slots: list[int] = field(default_factory=list)
    more_window: list[list[int]] = field(default_factory=list)
    more_first: list[int] = field(default_factory=list)
    _held_cache: HeldPages | None = None  # see ``_held``
    keys: tuple[int, ...] | None = None
    shared: int = 0
    handle: Node | None = None
    points: tuple[int, ...] = ()
    retain: frozenset[int] = frozenset()
    tails: tuple[tuple[tuple[int, int], ...], ...] = ()
    kept: dict[int, int] = field(default_factory=dict)
    ckpts: dict[int, int] = field(default_factory=dict)
    cow_src: int = -1
    cut: int = 0
    _state: DecodeState | None = field(default=None, repr=False, compare=False)
    _slot: int = field(default=0, repr=False, compare=False)

    @property
    def tokens(self) -> int:
        """Tokens whose KV is in the cache (``L``); kept in the manager's decode arrays
        while the request is registered."""
        st = self._state
        return st.tokens.item(self._slot) if st is not None else self._tokens

    @tokens.setter
    def tokens(self, n: int) -> None:
        st = self._state
        if st is None:
            self._tokens = n
        else:
            st.tokens[self._slot] = n

    @property
    def _held(self) -> HeldPages | None:
        """The cached :meth:`held` counts. Every path that changes a page list (or a window
        first index) sets this to ``None``; that also marks the request's decode arrays and
        block-table rows to be read again from the lists before their next use."""
        return self._held_cache

    @_held.setter
    def _held(self, value: HeldPages | None) -> None:
        self._held_cache = value
        if value is None and self._state is not None:
            self._state.dirty.add(self._slot)

    def win(self, k: int) -> list[int]:
        """Ids held in window band ``k`` of the geometry (the list itself)."""
        return self.window if k == 0 else self.more_window[k - 1]

    def first(self, k: int) -> int:
        """Token-page index of ``win(k)[0]``."""
        return self.window_first if k == 0 else self.more_first[k - 1]

    def set_first(self, k: int, first: int) -> None:
        """Set the token-page index of ``win(k)[0]``."""
        if k == 0:
            self.window_first = first
        else:
            self.more_first[k - 1] = first

    def held(self) -> HeldPages:
        """Counts for :func:`request_demand` (cached until the pages change)."""
        held = self._held_cache
        if held is None:
            st = self._state
            assert st is not None, "an unregistered request's counts are not kept"
            spans = []
            k = 0
            for pol in st.policies:
                if pol.windowed:
                    first = self.first(k)
                    spans.append((first, first + len(self.win(k))))
                    k += 1
                else:
                    spans.append((0, len(self.slots if pol.per_request else self.full)))
            held = self._held_cache = HeldPages(tuple(spans))
        return held


_PAGES = operator.attrgetter("pages")


def _batch_ids(batch: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Request ids and token counts of an allocation batch, checked: C-speed set checks
    for the common all-``(int, int)`` batch, an entry-by-entry walk otherwise.

    Raises:
        InvalidDemandError: an entry that is not a pair of ints, or a negative or
            non-integer token count.
    """
    try:
        if set(map(type, batch)) <= {tuple}:
            if not batch:
                return (), ()
            ids, extends = zip(*batch, strict=True)  # all of one length, and that is 2
            if (set(map(type, ids)) == {int} and set(map(type, extends)) == {int}
                    and min(extends) >= 0):
                return ids, extends
    except (TypeError, ValueError):
        pass
    for entry in batch:
        if (not isinstance(entry, tuple | list) or len(entry) != 2
                or isinstance(entry[0], bool) or not isinstance(entry[0], int | np.integer)):
            raise InvalidDemandError(f"a batch entry is a (request id, tokens) pair of "
                                     f"ints, got {entry!r}")
        rid, extend = entry
        if isinstance(extend, bool) or not isinstance(extend, int | np.integer) or extend < 0:
            raise InvalidDemandError(f"request {rid}: {extend!r} tokens")
    return tuple(e[0] for e in batch), tuple(e[1] for e in batch)


def _check_demands(ids: Sequence[int], extends: Sequence[int], demands: Sequence[Demand],
                   num_bands: int) -> None:
    """Every demand a :class:`Demand` of ``num_bands`` bands.

    Raises:
        InvalidDemandError: one that is not.
    """
    if (set(map(type, demands)) <= {Demand}
            and set(map(len, map(_PAGES, demands))) <= {num_bands}):
        return
    for rid, extend, d in zip(ids, extends, demands, strict=True):
        if not isinstance(d, Demand) or len(d.pages) != num_bands:
            raise InvalidDemandError(f"request {rid}: {extend} tokens, demand {d!r}")


class DecodeDemands(list[Demand]):
    """The list :meth:`KVManager.decode_demands` returns: one :class:`Demand` per request
    (a plain list to every reader) that also carries their sum, so
    :func:`sum_demands` and :meth:`KVManager.allocate` need not walk it.

    Attributes:
        total: the element-wise sum, or ``None`` once the list was changed in place
            (every mutating list method drops it).
        rids: the request ids it was computed for, in order.
        nonzero: positions whose demand is not empty, ascending.
        matrix: int64 ``[len(nonzero), bands]``, their demands.
    """

    __slots__ = ("matrix", "nonzero", "rids", "total")

    def __init__(self, demands: list[Demand], total: Demand, rids: tuple[int, ...],
                 nonzero: list[int], matrix: np.ndarray) -> None:
        super().__init__(demands)
        self.total: Demand | None = total
        self.rids = rids
        self.nonzero = nonzero
        self.matrix = matrix  # int64 [len(nonzero), bands]: their pages

    def _changed(self) -> None:
        self.total = None

    def __setitem__(self, i: Any, v: Any) -> None:
        self._changed()
        super().__setitem__(i, v)

    def __delitem__(self, i: Any) -> None:
        self._changed()
        super().__delitem__(i)

    def __iadd__(self, other: Iterable[Demand]) -> Self:  # type: ignore[misc,override]  # as list
        self._changed()
        return super().__iadd__(other)

    def __imul__(self, n: SupportsIndex) -> Self:
        self._changed()
        return super().__imul__(n)

    def append(self, v: Demand) -> None:
        self._changed()
        super().append(v)

    def extend(self, vs: Iterable[Demand]) -> None:
        self._changed()
        super().extend(vs)

    def insert(self, i: SupportsIndex, v: Demand) -> None:
        self._changed()
        super().insert(i, v)

    def pop(self, i: SupportsIndex = -1) -> Demand:
        self._changed()
        return super().pop(i)

    def remove(self, v: Demand) -> None:
        self._changed()
        super().remove(v)

    def clear(self) -> None:
        self._changed()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed()
        super().reverse()


_MISSING: Any = object()


class _Requests(dict[int, RequestPages]):
    """The manager's requests by id. Registering one (``[rid] = pages``) binds it to a
    slot of the decode arrays; removing it (``del``, ``pop``) frees the slot. ``slot_of``
    maps request id -> slot, ``owner`` slot -> pages."""

    __slots__ = ("owner", "slot_of", "state")

    def __init__(self, state: DecodeState) -> None:
        super().__init__()
        self.state = state
        self.slot_of: dict[int, int] = {}
        self.owner: dict[int, RequestPages] = {}

    def __setitem__(self, rid: int, req: RequestPages) -> None:
        old = self.get(rid)
        if old is req:
            return
        if req._state is not None:
            raise InvalidRequestError(f"request {rid}: its pages are registered already")
        if old is not None:
            self._unbind(rid, old)
        slot = self.state.bind(req._tokens)
        req._state, req._slot = self.state, slot
        self.slot_of[rid] = slot
        self.owner[slot] = req
        super().__setitem__(rid, req)

    def _unbind(self, rid: int, req: RequestPages) -> None:
        req._tokens = self.state.unbind(req._slot)
        del self.owner[req._slot]
        req._state, req._slot = None, 0
        del self.slot_of[rid]

    def __delitem__(self, rid: int) -> None:
        req = self[rid]
        super().__delitem__(rid)
        self._unbind(rid, req)

    def pop(self, rid: int, default: Any = _MISSING) -> Any:
        if rid not in self:
            if default is _MISSING:
                raise KeyError(rid)
            return default
        req = self[rid]
        del self[rid]
        return req

    def popitem(self) -> tuple[int, RequestPages]:
        rid = next(reversed(self))
        return rid, self.pop(rid)

    def clear(self) -> None:
        for rid in list(self):
            del self[rid]

    def setdefault(self, rid: int, default: Any = None) -> RequestPages:
        if rid not in self:
            self[rid] = default
        return self[rid]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for rid, req in dict(*args, **kwargs).items():
            self[rid] = req


class KVManager:
    """The engine's KV cache manager: requests' virtual pages per band on one chain.

    Every allocation is one ``chain.take`` of the summed demand of a batch (prefill chunks
    and decode tokens together), so what admission priced as one demand is realized as one
    plan. The manager never moves frontiers itself.

    Args:
        chain: the chain.
        cache: a prefix cache over the same chain (attached to it as its evictor), or
            ``None``. With a cache, requests that carry page keys are matched by
            :meth:`attach`, point at the cache's pages for their hit, and insert their
            prompt's pages when they finish (:meth:`free`).
    """

    def __init__(self, chain: Allocator, cache: PrefixCache | None = None) -> None:
        self.chain = chain
        self.geom = RequestGeometry.of(chain.layout)
        self._win_index = {w.band: k for k, w in enumerate(self.geom.windows)}
        pads = []
        for band in range(self.geom.num_bands):
            try:
                pads.append(chain.null_page(band))
            except ReservedPageError:
                pads.append(-1)
        self._state = DecodeState(self.geom.policies, pads)
        self._requests = _Requests(self._state)
        self._slots_memo: tuple[int, tuple[int, ...], np.ndarray] | None = None
        self._slots_unique: bool | None = None
        self._slots_known: bool | None = None
        self._demand_memo: dict[tuple[int, ...], Demand] = {}
        self.cache = cache
        self.cow_state_copies = 0
        self.cow_bytes = 0
        self.checkpoints_saved = 0
        self.junctions_saved = 0  # prefills that computed their junction point (``cut``)
        self.prompts_inserted = 0
        self._hits: dict[int, int] = {}  # rid -> hit pages at attach (the cache's before it)
        self._pointed: set[int] = set()  # requests with resume points still to come
        # rid -> its hit lock, for requests whose prompt is inserted (``handle`` is then
        # their prompt lock).
        self._hit_locks: dict[int, Node | None] = {}
        if cache is not None:
            if len(self.geom.windows) > 1:
                raise ConfigError(f"the prefix cache supports chains with at most one window "
                                  f"or chunked-local band; this one has "
                                  f"{len(self.geom.windows)}")
            if not isinstance(chain, EvictingAllocator):
                raise ConfigError("the prefix cache needs an allocator with an evictor hook "
                                  "(a Chain or a baseline's PoolAllocator)")
            chain.set_evictor(cache)

    # --- queries ---------------------------------------------------------------------------

    def __contains__(self, rid: int) -> bool:
        return rid in self._requests

    def pages(self, rid: int) -> RequestPages:
        """The pages request ``rid`` holds (raises :class:`UnknownRequestError`)."""
        try:
            return self._requests[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid} holds no pages") from None

    def held(self, rid: int) -> HeldPages:
        """Counts held by ``rid`` (:data:`NOTHING_HELD` if it holds nothing)."""
        req = self._requests.get(rid)
        return req.held() if req is not None else NOTHING_HELD

    def tokens(self, rid: int) -> int:
        """Tokens of ``rid`` in the cache (0 if it holds nothing)."""
        req = self._requests.get(rid)
        return req.tokens if req is not None else 0

    def demand(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
               horizon: int = 0) -> Demand:
        """:func:`request_demand` for ``rid`` at its current position."""
        req = self._requests.get(rid)
        if req is None:
            return request_demand(self.geom, NOTHING_HELD, 0, extend, headroom, headroom_chunk,
                                  horizon=horizon)
        return request_demand(self.geom, req.held(), req.tokens, extend, headroom,
                              headroom_chunk, req.points, req.tails, horizon)

    # --- prefix cache ----------------------------------------------------------------------

    def points_for(self, keys: Sequence[int] | None, after: int = 0,
                   junction: int = 0) -> tuple[int, ...]:
        """Resume points (page counts > ``after``, sorted) a request with these page keys
        saves for the cache, with its ``junction`` point (0: none) among them; empty
        without a cache or keys."""
        if self.cache is None or not keys:
            return ()
        pts = resume_points(self.cache.geom, len(keys), self.cache.interval_pages,
                            self.cache.policy)
        if junction and junction not in pts:
            pts = tuple(sorted((*pts, junction)))
        return tuple(q for q in pts if q > after)

    def cached_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """Tokens a prompt with these page keys would hit now (a pure match: nothing is
        locked; 0 without a cache). What the cache-aware waiting order ranks by."""
        if self.cache is None or not keys:
            return 0
        return self.cache.match(keys, prompt_tokens).pages * self.geom.page_size

    def chunk_cut(self, rid: int) -> int:
        """Token position a prefill chunk of ``rid`` must not run past: its junction
        checkpoint (saved at a chunk's end), or 0 for none (or not attached)."""
        req = self._requests.get(rid)
        return req.cut if req is not None else 0

    def attach(self, rid: int, keys: Sequence[int], prompt_tokens: int,
               save_points: bool = True) -> int:
        """Match a waiting request's prompt against the cache and lock its hit: from now
        on ``rid`` holds the hit's pages by reference (tokens = hit) and its demands price
        only the rest. Undo with :meth:`detach` if it is not admitted. With
        ``save_points`` it keeps window tails and state checkpoints at its resume points
        for the cache (the scheduler turns it off for a request whose lifetime would not
        fit the empty chain with them), and a *junction* point where its prompt leaves the
        cached path past its hit (:func:`kvchain.cache.radix.junction_point`; its chunks
        are cut there, :meth:`chunk_cut`).

        Returns:
            Hit tokens (0 for a miss or without a cache).

        Raises:
            InvalidRequestError: ``rid`` already holds pages, or more keys than whole
                pages of the prompt.
        """
        if rid in self._requests:
            raise InvalidRequestError(f"request {rid} already holds pages")
        if len(keys) > prompt_tokens // self.geom.page_size:
            raise InvalidRequestError(f"request {rid}: {len(keys)} page keys for a prompt of "
                                      f"{prompt_tokens} tokens")
        keys = tuple(keys)
        req = self._requests[rid] = RequestPages(keys=keys)
        if self.cache is None:
            return 0
        hit: Hit = self.cache.match(keys, prompt_tokens)
        handle = self.cache.lock(hit)
        g, h = self.geom, hit.pages
        req.handle, req.shared, req.tokens = handle, h, h * g.page_size
        if g.full is not None:
            req.full = list(hit.full)
        if g.window is not None and h:
            req.window, req.window_first = list(hit.window), hit.window_first
        req.cow_src = hit.checkpoint
        self._hits[rid] = h
        if handle is not None:
            # Pin what the request reads of the cache: its window tail, its checkpoint
            # (until copied); the rest of the locked path's tails stays evictable.
            if g.window is not None:
                self.cache.pin_window(handle, range(hit.window_first, h))
            if hit.checkpoint >= 0:
                self.cache.pin_checkpoint(handle, h)
        if save_points:
            cache = self.cache
            junction = 0
            if cache.junctions:
                junction = junction_point(cache.geom, h, hit.matched, len(keys),
                                          self.points_for(keys), cache.junction_min_pages)
            req.points = self.points_for(keys, h, junction)
            req.cut = junction * g.page_size
        if req.points:
            self._pointed.add(rid)
        req.tails = tail_spans(g, req.points, h)
        if g.window is not None and req.tails:
            req.retain = frozenset(i for lo, hi in req.tails[g.window] for i in range(lo, hi))
        return req.tokens

    def detach(self, rid: int) -> None:
        """Undo :meth:`attach` of a request that was not admitted (it took nothing yet).

        Raises:
            UnknownRequestError: ``rid`` is not attached.
            InvalidRequestError: it took pages of its own since.
        """
        req = self.pages(rid)
        if req.slots or req.kept or req.ckpts or len(req.full) > req.shared or (
                req.window and req.window_first + len(req.window) > req.shared):
            raise InvalidRequestError(f"request {rid} took pages since it was attached")
        del self._requests[rid]
        self._hits.pop(rid, None)
        self._pointed.discard(rid)
        if self.cache is not None:
            self._unpin_all(req)
            self.cache.unlock(req.handle)

    def _unpin_all_checkpoint(self, req: RequestPages) -> None:
        """Drop ``req``'s pin of the checkpoint its hit resumes from (copied or given up)."""
        if req.cow_src >= 0 and self.cache is not None and req.handle is not None:
            # Not copied before: no slot taken, so no prefill ran and ``shared`` is the hit.
            self.cache.unpin_checkpoint(req.handle, req.shared)
        req.cow_src = -1

    def _unpin_all(self, req: RequestPages) -> None:
        """Drop every pin ``req`` holds: the cache's window pages in its window and the
        checkpoint it has not copied yet."""
        cache, handle = self.cache, req.handle
        if cache is None or handle is None:
            return
        if req.window and req.window_first < req.shared:
            cache.unpin_window(handle, range(req.window_first,
                                             min(req.shared, req.window_first + len(req.window))))
        self._unpin_all_checkpoint(req)

    def touch(self, rid: int) -> None:
        """LRU touch of ``rid``'s hit once it is admitted (no-op without a hit)."""
        req = self._requests.get(rid)
        if self.cache is not None and req is not None and req.handle is not None:
            self.cache.touch(req.handle, req.window_first)

    def hit_tokens(self, rid: int) -> int:
        """Tokens of ``rid`` served by the cache at :meth:`attach` (0 if none or not
        attached; unchanged when its prompt is inserted at the end of its prefill)."""
        return self._hits.get(rid, 0) * self.geom.page_size

    def decode_demands(self, rids: Sequence[int]) -> list[Demand]:
        """``[self.demand(rid, 1) for rid in rids]`` (equal values), for a decode batch.

        Vectorized over the batch (:meth:`DecodeState.decode_columns`): one gather of the
        requests' token counts and held pages, the page-boundary arithmetic as array
        operations, one sum per band; a :class:`Demand` is built only for the requests
        that need a page (about one in ``P`` per band per step; the rest share one empty
        demand). A request that holds nothing gets the demand of its first token. With a
        prefix cache the same: kept window tails count only with headroom, and a request
        whose next token reaches one of its resume points (a checkpoint slot more: a
        request still in its prefill, never a plain decode) sends the batch through
        :meth:`demand` request by request.

        Returns:
            A :class:`DecodeDemands` (a list, aligned with ``rids``) carrying the sum.
        """
        g = self.geom
        ids = tuple(rids)
        if self._pointed and self._reaches_point(ids):
            return [self.demand(rid, 1) for rid in ids]
        slots = self._slots_of(ids)
        zero = self._zero()
        empty = np.zeros((0, g.num_bands), dtype=np.int64)
        if not ids:
            return DecodeDemands([], zero, ids, [], empty)
        st = self._state
        out = [zero] * len(ids)
        check = (st.tokens[slots] >= st.need_at[slots]).nonzero()[0]  # at a page boundary
        if not check.size:
            return DecodeDemands(out, zero, ids, [], empty)
        columns = st.decode_columns(slots[check])
        needs = functools.reduce(np.bitwise_or, columns).nonzero()[0]
        if not needs.size:
            return DecodeDemands(out, zero, ids, [], empty)
        nonzero = check[needs]
        columns = [c[needs] for c in columns]
        memo = self._demand_memo
        if len(memo) > 4_096:
            memo.clear()
        at = nonzero.tolist()
        matrix = np.stack(columns, axis=1)
        for i, row in zip(at, matrix.tolist(), strict=True):
            key = tuple(row)
            d = memo.get(key)
            if d is None:
                d = memo[key] = Demand(key)
            out[i] = d
        return DecodeDemands(out, Demand(tuple(matrix.sum(axis=0).tolist())), ids, at, matrix)

    def _reaches_point(self, ids: tuple[int, ...]) -> bool:
        """Whether the next token of one of ``ids`` reaches one of its resume points."""
        p = self.geom.page_size
        for rid in self._pointed.intersection(ids):
            req = self._requests[rid]
            if req.tokens + 1 in {q * p for q in req.points}:
                return True
        return False

    def _zero(self) -> Demand:
        zero = self._demand_memo.get(())
        if zero is None:
            zero = self._demand_memo[()] = Demand((0,) * self.geom.num_bands)
        return zero

    def _slots_of(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of request ids (0, the empty slot, for one that holds nothing), int64,
        after the dirty rows were read again; memoized for the same ids at the same slot
        version (a decode step asks for one batch three times).

        Raises:
            InvalidDemandError: a ``bool`` id while request 0 or 1 holds pages (it would
                alias that request).
        """
        slot_of = self._requests.slot_of
        if (0 in slot_of or 1 in slot_of) and bool in map(type, ids):  # C-level scan
            # False == 0 and True == 1 (as dict keys and in the memo's tuple comparison): a
            # bool would read request 0's or 1's row
            raise InvalidDemandError(f"request ids are ints, got {ids!r}")
        self._sync()
        st = self._state
        memo = self._slots_memo
        if memo is not None and memo[0] == st.version and memo[1] == ids:
            return memo[2]
        slots = np.fromiter(map(slot_of.get, ids, itertools.repeat(0)),
                            dtype=np.int64, count=len(ids))
        self._slots_memo = (st.version, ids, slots)
        self._slots_unique = self._slots_known = None
        return slots

    def _slots_memo_known(self) -> bool:
        """Whether every id of the last :meth:`_slots_of` holds pages (memoized)."""
        known = self._slots_known
        if known is None:
            assert self._slots_memo is not None
            known = self._slots_known = bool(self._slots_memo[2].all())
        return known

    def _slots_memo_unique(self) -> bool:
        """Whether the ids of the last :meth:`_slots_of` are all different (memoized)."""
        unique = self._slots_unique
        if unique is None:
            assert self._slots_memo is not None
            ids = self._slots_memo[1]
            unique = self._slots_unique = len(set(ids)) == len(ids)
        return unique

    def _sync(self) -> None:
        """Read the rows and counts of dirty slots again from their requests' lists."""
        st = self._state
        if not st.dirty:
            return
        g = self.geom
        owner = self._requests.owner
        for slot in st.dirty:
            req = owner[slot]
            if g.full is not None:
                st.write_row(g.full, slot, 0, req.full)
            if g.state is not None:
                st.write_row(g.state, slot, 0, req.slots)
            for k, w in enumerate(g.windows):
                first = req.first(k)
                st.write_row(w.band, slot, first, req.win(k))
                st.first[w.band, slot] = first
        st.refresh_need(np.fromiter(st.dirty, dtype=np.int64, count=len(st.dirty)))
        st.dirty.clear()

    @property
    def num_requests(self) -> int:
        """Requests holding pages."""
        return len(self._requests)

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, batch: Sequence[tuple[int, int]],
                 demands: Sequence[Demand] | None = None, quote: Quote | None = None) -> Demand:
        """Take the pages a batch needs to compute its tokens, in one chain take (none when
        the batch needs no page: an empty take binds nothing).

        Args:
            batch: ``(request id, tokens to compute)`` pairs (a prefill chunk, or 1 for a
                decode); each request at most once.
            demands: the batch's demands if the caller just computed them with
                :meth:`demand` (same order, no change in between); computed here otherwise.
            quote: the allocator's quote (from its ``price``) of the summed demand, if the
                caller has it; a quote priced before the chain's epoch moved is dropped and
                the demand priced again.

        Returns:
            The summed demand that was taken.

        Raises:
            InvalidDemandError: a request listed twice, an entry that is not a pair of
                ints, a negative or non-integer token count, or demands that do not match
                the batch.
            ForgedQuoteError: ``quote`` is not a Quote, or was not issued by the allocator
                for this demand.
            CapacityError: the batch does not fit.

            On every error the chain and every request are as before.
        """
        ids, extends = _batch_ids(batch)
        if quote is not None and not isinstance(quote, Quote):
            raise ForgedQuoteError(f"expected a Quote from the allocator's price, got "
                                   f"{type(quote).__name__}")
        g = self.geom
        nb = g.num_bands
        decode = (type(demands) is DecodeDemands and demands.total is not None
                  and demands.rids == ids)  # built by decode_demands for this very batch
        slots = self._slots_of(ids)
        if not self._slots_memo_unique():
            raise InvalidDemandError("a request appears twice in one allocation batch")
        if demands is None:
            demands = [self.demand(rid, extend) for rid, extend in zip(ids, extends,
                                                                      strict=True)]
        elif len(demands) != len(batch):
            raise InvalidDemandError(f"{len(demands)} demands for a batch of {len(batch)}")
        if decode:
            assert isinstance(demands, DecodeDemands) and demands.total is not None
            total, nonzero, matrix = demands.total, demands.nonzero, demands.matrix
        else:
            _check_demands(ids, extends, demands, nb)
            zero = (0,) * nb
            nonzero = [i for i, d in enumerate(demands) if d.pages != zero]
            matrix = np.array([demands[i].pages for i in nonzero], dtype=np.int64)
            total = (Demand(tuple(matrix.sum(axis=0).tolist())) if nonzero else self._zero())
        requests = self._requests
        missing = ([] if self._slots_memo_known()
                   else [ids[i] for i in (slots == 0).nonzero()[0].tolist()])
        if total.is_empty:  # every token on pages already held (most decode steps)
            for rid in missing:
                requests[rid] = self._new_pages()
            return total
        if quote is not None and quote.before.epoch != self.chain.epoch:
            quote = None  # priced before the chain changed: the take prices it again
        grant = self.chain.take(total, quote)
        if missing:
            for rid in missing:
                requests[rid] = self._new_pages()
            slots = self._slots_of(ids)  # the new requests' slots (and rows, empty)
        self._distribute(grant.pages, ids, extends, slots, nonzero, matrix)
        return total

    #: Requests given pages by one take up to which :meth:`_distribute` writes them one by
    #: one (a prefill chunk, the few decodes crossing a page boundary in a small batch)
    #: instead of by numpy array operations, whose fixed cost (a few us a call, dozens of
    #: calls) only pays off over a large batch. The same pages land in the same places
    #: either way (seeded streams check both paths).
    FEW = 4

    def _distribute(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                    extends: tuple[int, ...], slots: np.ndarray, nonzero: list[int],
                    matrix: np.ndarray) -> None:
        """Hand a take's pages to the requests at ``nonzero`` (batch positions, ascending;
        ``matrix`` their demands, one row each), band by band in batch order (the order
        the take's pages are cut in), to their lists and to the decode arrays."""
        if len(nonzero) <= self.FEW:
            self._distribute_few(pages, ids, extends, slots, nonzero, matrix)
            return
        g = self.geom
        st = self._state
        owner = self._requests.owner
        at = np.asarray(nonzero, dtype=np.int64)
        for band in range(g.num_bands):
            vids = pages[band]
            if not vids:
                continue
            col = matrix[:, band]
            sel = col.nonzero()[0]
            counts = col[sel]
            rows = slots[at[sel]]
            one_each = len(vids) == sel.size
            reqs = [owner[slot] for slot in rows.tolist()]
            if band == g.full:
                starts = st.rowlen[band][rows]
                if one_each:
                    for req, v in zip(reqs, vids, strict=True):
                        req.full.append(v)
                        req._held_cache = None
                else:
                    cut = 0
                    for req, n in zip(reqs, counts.tolist(), strict=True):
                        req.full.extend(vids[cut:cut + n])
                        req._held_cache = None
                        cut += n
            elif band == g.state:
                cut = 0
                for req, i, n in zip(reqs, at[sel].tolist(), counts.tolist(), strict=True):
                    claimed = not req.slots
                    self._take_slots(req, ids[i], list(vids[cut:cut + n]), extends[i])
                    req._held_cache = None
                    cut += n
                    if claimed:
                        st.write_row(band, req._slot, 0, req.slots)
                continue
            else:
                k = self._win_index[band]
                first = st.first[band][rows]
                end = st.rowlen[band][rows]
                empty = end == first
                if empty.any():  # a request's first window pages: from its window start
                    new_first = g.policies[band].first_page(st.tokens[rows])
                    first = np.where(empty, new_first, first)
                    st.first[band][rows] = first
                    for j in empty.nonzero()[0].tolist():
                        reqs[j].set_first(k, int(first[j]))
                starts = np.where(empty, first, end)
                cut = 0
                for req, n in zip(reqs, counts.tolist(), strict=True):
                    req.win(k).extend(vids[cut:cut + n])
                    req._held_cache = None
                    cut += n
            st.append(band, rows, starts, counts, vids)
        st.refresh_need(slots[at])

    def _distribute_few(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                        extends: tuple[int, ...], slots: np.ndarray, nonzero: list[int],
                        matrix: np.ndarray) -> None:
        """:meth:`_distribute` one request at a time, in Python ints: the same cut of each
        band's pages in batch order, the same lists, rows, window starts and ``need_at``."""
        g = self.geom
        st = self._state
        owner = self._requests.owner
        demands = matrix.tolist()
        slot_list = [int(slots[i]) for i in nonzero]
        for band in range(g.num_bands):
            vids = pages[band]
            if not vids:
                continue
            cut = 0
            k = self._win_index.get(band)
            for j, i in enumerate(nonzero):
                n = demands[j][band]
                if not n:
                    continue
                slot = slot_list[j]
                req = owner[slot]
                got = vids[cut:cut + n]
                cut += n
                req._held_cache = None
                if band == g.full:
                    start = int(st.rowlen[band, slot])
                    req.full.extend(got)
                elif band == g.state:
                    claimed = not req.slots
                    self._take_slots(req, ids[i], list(got), extends[i])
                    if claimed:
                        st.write_row(band, slot, 0, req.slots)
                    continue
                else:
                    assert k is not None
                    first, start = int(st.first[band, slot]), int(st.rowlen[band, slot])
                    if start == first:  # its first window pages: from its window start
                        start = g.policies[band].first_page(int(st.tokens[slot]))
                        st.first[band, slot] = start
                        req.set_first(k, start)
                    req.win(k).extend(got)
                st.put_row(band, slot, start, got)
        st.refresh_need(np.asarray(slot_list, dtype=np.int64))

    def _new_pages(self) -> RequestPages:
        extra = len(self.geom.windows) - 1
        if extra <= 0:
            return RequestPages()
        return RequestPages(more_window=[[] for _ in range(extra)], more_first=[0] * extra)

    def _take_slots(self, req: RequestPages, rid: int, vids: list[int], extend: int) -> None:
        """State slots granted to ``req``: its working slot(s) first (then the copy of the
        cache's checkpoint it resumes from), then one checkpoint slot per resume point the
        chunk reaches (the forward writes the state there)."""
        g = self.geom
        if not req.slots:
            req.slots, vids = vids[:g.state_slots], vids[g.state_slots:]
            if req.cow_src >= 0:
                band = g.state
                assert band is not None
                layout = self.chain.layout.bands[band]
                chain = self.chain
                if isinstance(chain, Chain):  # a baseline's pools keep counts only
                    src = chain.translate(band, np.asarray([req.cow_src], dtype=np.int64))
                    dst = chain.translate(band, np.asarray(req.slots[:1], dtype=np.int64))
                    chain.buffer.copy_pages(layout, src, dst)
                self.cow_state_copies += 1
                self.cow_bytes += layout.page_bytes
                self._unpin_all_checkpoint(req)
        p = g.page_size
        reached = [q for q in req.points if req.tokens < q * p <= req.tokens + extend]
        if len(reached) != len(vids):
            raise InvalidDemandError(f"request {rid}: {len(vids)} checkpoint slots for "
                                     f"{len(reached)} resume points")
        for q, v in zip(reached, vids, strict=True):
            req.ckpts[q] = v
        self.checkpoints_saved += len(vids)

    def commit(self, rid: int, tokens: int) -> int:
        """Record that a forward computed ``tokens`` more tokens of ``rid``, then release
        its window pages wholly before the next token's window (window-tail release).
        With a prefix cache, the commit that completes the prompt's whole pages inserts
        them into the cache (:meth:`_insert_prompt`).

        Returns:
            Window pages released by the window-tail release (duplicates handed back at
            the insert are not counted).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: the pages held do not cover the new tokens.
        """
        req = self.pages(rid)
        new_tokens = req.tokens + tokens
        covered = len(req.full) * self.geom.page_size if self.geom.full is not None else new_tokens
        if tokens < 0 or covered < new_tokens:
            raise InvalidDemandError(f"request {rid}: {tokens} tokens not covered by its pages")
        if req.cut and req.tokens < req.cut <= new_tokens:
            self.junctions_saved += 1  # its tail and checkpoint are computed now
        req.tokens = new_tokens
        released = self.release_window_tail(rid)
        keys = req.keys
        if (keys and self.cache is not None and req.shared < len(keys)
                and new_tokens >= len(keys) * self.geom.page_size):
            self._insert_prompt(rid, req)
        return released

    def _insert_prompt(self, rid: int, req: RequestPages) -> None:
        """The commit that completes ``req``'s prompt pages: insert them into the cache now
        (policy: the prompt only, once), and hand over what the request only kept for the
        cache. Afterwards the request holds pages ``[0, n)`` by reference (``shared = n``)
        under a prompt lock of the whole path (its hit lock stays: the hit path keeps its
        tails while it runs); its window pages below ``n`` are the
        cache's, pinned while its window covers them (released from the pin, not from the
        chain, as the window moves: then they are evictable); the window tails and the
        checkpoints of its resume points are evictable cache units at once. It runs after
        the commit's window-tail release, so the window pages offered are exactly the kept
        tails and the next token's window below ``n``. Where the cache
        already held a page (another request inserted the same prefix meanwhile), the
        request switches to the cache's copy and its own is released.
        """
        cache = self.cache
        keys = req.keys
        assert cache is not None and keys is not None
        g, n, h = self.geom, len(keys), req.shared
        window: dict[int, int] = {}
        reading: list[int] = []
        if g.window is not None:
            for i, v in enumerate(req.window, req.window_first):
                if h <= i < n:
                    window[i] = v
                    reading.append(i)
            window.update(req.kept)
        ad = cache.adopt(keys, h, req.full[:n], window, req.ckpts, reading)
        self._hit_locks[rid] = req.handle
        if g.full is not None:
            req.full[:n] = ad.full
        if reading:
            first = req.window_first
            for i in reading:
                req.window[i - first] = ad.window[i]
        req.handle, req.shared = ad.handle, n
        req.kept, req.ckpts = {}, {}
        req.points, req.tails, req.retain = (), (), frozenset()
        self._pointed.discard(rid)
        req._held = None
        self.prompts_inserted += 1
        for band, ids in enumerate(ad.dups):
            if ids:
                self.chain.release(band, ids)

    def commit_decodes(self, rids: Sequence[int]) -> int:
        """:meth:`commit` of one token for each of ``rids`` (a decode batch), with their
        window-tail pages released in one ``chain.release`` call per window band for the
        whole batch.

        Vectorized over the batch: the token counts move in the decode arrays, the pages
        whose window start crossed a page boundary are found by array arithmetic and
        gathered from the block tables; only the requests that release a page (about one
        in ``P`` per window band per step) touch their lists. A subclass that overrides
        :meth:`commit` (e.g. an engine that keeps window pages until the request ends), a
        manager with a prefix cache (shared and kept window pages) and a batch that names
        a request twice get :meth:`commit` once per request instead.

        Returns:
            Window pages released.

        Raises:
            UnknownRequestError / InvalidDemandError: as :meth:`commit`, checked for every
                request before any changes.
        """
        ids = tuple(rids)
        slots = self._slots_of(ids)
        g = self.geom
        p = g.page_size
        st = self._state
        if not self._slots_memo_known():
            rid = ids[int((slots == 0).nonzero()[0][0])]
            raise UnknownRequestError(f"request {rid} holds no pages")
        unique = self._slots_memo_unique()
        if unique:
            n = st.tokens[slots] + 1
        else:  # a request named c times commits c tokens: check its last one
            _, inverse, counts = np.unique(slots, return_inverse=True, return_counts=True)
            n = st.tokens[slots] + counts[inverse]
        if g.full is not None:
            short = st.rowlen[g.full][slots] * p < n
            if short.any():
                rid = ids[int(short.nonzero()[0][0])]
                raise InvalidDemandError(f"request {rid}: 1 token not covered by its pages")
        # every request checked: the one-by-one paths below cannot fail half-way
        if type(self).commit is not KVManager.commit or self.cache is not None:
            return sum(self.commit(rid, 1) for rid in ids)  # kept / shared window pages
        if not unique:  # the same request twice: commits one by one
            return sum(self.commit(rid, 1) for rid in ids)
        st.tokens[slots] = n
        released = 0
        owner = self._requests.owner
        for k, w in enumerate(g.windows):
            first, end = st.first[w.band][slots], st.rowlen[w.band][slots]
            drop = np.minimum(w.first_page(n) - first, end - first)
            at = (drop > 0).nonzero()[0]
            if not at.size:
                continue
            s, f, c = slots[at], first[at], drop[at]
            if int(c.sum()) == at.size:  # one page each (a decode step)
                rows, cols = s, f
            else:
                rows = np.repeat(s, c)
                cols = np.repeat(f - (np.cumsum(c) - c), c) + np.arange(rows.size)
            table = st.tables[w.band]
            vids = table[rows, cols]
            if k == 0:
                for slot, d in zip(s.tolist(), c.tolist(), strict=True):
                    req = owner[slot]
                    del req.window[:d]
                    req.window_first += d
                    req._held_cache = None  # the arrays are updated here, not read again
            else:
                for slot, d in zip(s.tolist(), c.tolist(), strict=True):
                    req = owner[slot]
                    del req.more_window[k - 1][:d]
                    req.more_first[k - 1] += d
                    req._held_cache = None
            table[rows, cols] = st.pads[w.band]
            st.first[w.band][s] = f + c
            self.chain.release(w.band, vids)
            released += int(vids.size)
        return released

    def release_window_tail(self, rid: int) -> int:
        """Release ``rid``'s pages wholly before its next token's window, in every window
        and chunked-local band (each by its own window).

        Returns:
            Window pages released, all bands together (0 if none were out of a window).
        """
        g = self.geom
        req = self.pages(rid)
        released = 0
        for k, w in enumerate(g.windows):
            held = req.win(k)
            if not held:
                continue
            first = req.first(k)
            keep_from = w.first_page(req.tokens)
            if keep_from <= first:
                continue
            drop = min(keep_from - first, len(held))
            if k == 0 and (req.shared or req.retain):
                out = []
                for i, v in enumerate(held[:drop], first):
                    if i < req.shared:
                        continue  # the cache's page: the request stops reading it (unpin)
                    if i in req.retain:
                        req.kept[i] = v
                    else:
                        out.append(v)
                if first < req.shared and self.cache is not None and req.handle is not None:
                    self.cache.unpin_window(req.handle,
                                            range(first, min(first + drop, req.shared)))
                self.chain.release(w.band, out)
            else:
                self.chain.release(w.band, held[:drop])
            del held[:drop]
            req.set_first(k, first + drop)
            req._held = None
            released += drop
        return released

    def reclaim_window_pages(self, rids: Iterable[int]) -> int:
        """Window-tail release for many requests (the decode check runs this before it
        retracts anyone). Returns pages released."""
        return sum(self.release_window_tail(rid) for rid in rids if rid in self._requests)

    # --- runs of decode steps (the simulator's fast-forward) -------------------------------

    def decode_run(self, rids: Sequence[int], steps: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages each of ``rids`` adds in each of the next ``steps`` decode steps if all
        of them decode in every one, and which steps' commits release window pages
        (:meth:`DecodeState.run_columns`: the values :meth:`decode_demands` and
        :meth:`commit_decodes` would give step after step).

        ``None`` when the run cannot be priced in closed form: a request that is not plain
        (see ``run_columns``), or, with a prefix cache, one whose prompt is not in the cache
        yet or whose resume points are still ahead of it (its commits and demands take the
        cache's paths).

        Returns:
            ``(demand, released)``: int64 ``[steps, len(rids), num_bands]`` pages and bool
            ``[steps]``.

        Raises:
            UnknownRequestError: a request that holds no pages; InvalidDemandError: a
                request named twice or ``steps < 1``.
        """
        ids = tuple(rids)
        if type(steps) is not int or steps < 1:
            raise InvalidDemandError(f"a decode run needs steps >= 1, got {steps!r}")
        slots = self._checked_slots(ids)
        if self.cache is not None:
            p = self.geom.page_size
            for rid in ids:
                req = self._requests[rid]
                keys = req.keys
                if (keys and req.shared < len(keys)) or (
                        req.points and req.points[-1] * p > req.tokens):
                    return None
        return self._state.run_columns(slots, steps)

    def skip_decodes(self, rids: Sequence[int], steps: int) -> None:
        """Commit ``steps`` decode tokens for each of ``rids`` in steps that need no page and
        release none (the quiet steps of a decode run): only the token counts move.

        Raises:
            UnknownRequestError: a request that holds no pages.
            InvalidDemandError: a request named twice, ``steps < 0``, or a request whose
                pages do not cover its next ``steps`` tokens in the full or a window band,
                or whose window would release a page on the way (those steps are not
                quiet: commit them with :meth:`commit_decodes`). Nothing changes then.
        """
        if type(steps) is not int or steps < 0:
            raise InvalidDemandError(f"steps must be an int >= 0, got {steps!r}")
        ids = tuple(rids)
        slots = self._checked_slots(ids)
        if not steps or not ids:
            return
        g = self.geom
        p = g.page_size
        st = self._state
        n = st.tokens[slots] + steps
        bad = np.zeros(slots.size, dtype=bool)
        for pol in g.policies:
            if pol.per_request:
                continue
            end = st.rowlen[pol.band][slots]
            bad |= end * p < n  # the last token's page is not held
            if pol.windowed:
                first = st.first[pol.band][slots]
                bad |= (pol.first_page(n) > first) & (end > first)  # a release due
        if bad.any():
            rid = ids[int(bad.nonzero()[0][0])]
            raise InvalidDemandError(f"request {rid}: {steps} decode steps are not quiet (a "
                                     f"page is needed or released on the way)")
        st.tokens[slots] = n

    def _checked_slots(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of ``ids``, every one registered and named once (else the typed error)."""
        slots = self._slots_of(ids)
        if not self._slots_memo_known():
            rid = ids[int((slots == 0).nonzero()[0][0])]
            raise UnknownRequestError(f"request {rid} holds no pages")
        if not self._slots_memo_unique():
            raise InvalidDemandError("a request appears twice in one decode run")
        return slots

    def free(self, rid: int, insert: bool = True) -> int:
        """Release every page of ``rid`` (finished or retracted). Returns pages released.

        With a prefix cache and page keys, the request never releases the cache's pages (its
        hit, and its whole prompt once its prefill completed: :meth:`commit` inserted it
        then): it unpins and unlocks them, and releases its own pages (output pages, a
        prefill cut short, its state slots). Nothing new is inserted here (policy: the
        prompt only, inserted once at the end of its prefill). ``insert`` marks a finished
        request (rather than a retracted one): its prompt's path is touched, so the LRU
        order counts from when the last request using it ended (as vLLM's free-block queue).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
        """
        req = self._requests.pop(rid, None)
        if req is None:
            raise UnknownRequestError(f"request {rid} holds no pages")
        self._hits.pop(rid, None)
        self._pointed.discard(rid)
        g = self.geom
        if req.keys is None or self.cache is None:
            released = 0
            lists = [(g.full, req.full), (g.state, req.slots)]
            lists += [(w.band, req.win(k)) for k, w in enumerate(g.windows)]
            for band, vids in lists:
                if band is not None and vids:
                    self.chain.release(band, vids)
                    released += len(vids)
            return released
        h = req.shared
        out: list[list[int]] = [[] for _ in range(g.num_bands)]
        if g.full is not None:
            out[g.full].extend(req.full[h:])
        if g.window is not None:
            out[g.window].extend(v for i, v in enumerate(req.window, req.window_first)
                                 if i >= h)
            out[g.window].extend(req.kept.values())
        if g.state is not None:
            out[g.state].extend(req.ckpts.values())
            out[g.state].extend(req.slots)
        self._unpin_all(req)
        if insert and req.handle is not None:
            self.cache.touch(req.handle, req.window_first)
        if rid in self._hit_locks:
            self.cache.unlock(req.handle, tails=False)
            self.cache.unlock(self._hit_locks.pop(rid))
        else:
            self.cache.unlock(req.handle)
        released = 0
        for band, ids in enumerate(out):
            if ids:
                self.chain.release(band, ids)
                released += len(ids)
        return released

    # --- kernels ---------------------------------------------------------------------------

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """Virtual page ids of ``rid`` in ``band`` in token order (int64, shape ``[pages]``).

        For the window band, entry ``j`` is the page of tokens ``[j * P, (j + 1) * P)``;
        released entries hold the band's null page. Translate with
        ``chain.translate(band, table)`` (one call per batch).
        """
        req = self.pages(rid)
        g = self.geom
        if band == g.full:
            return np.asarray(req.full, dtype=np.int64)
        if band == g.state:
            return np.asarray(req.slots, dtype=np.int64)
        k = self._win_index.get(band)
        if k is not None:
            held, first = req.win(k), req.first(k)
            if not first:  # nothing released: no null page needed
                return np.asarray(held, dtype=np.int64)
            null = self.chain.null_page(band)
            return np.asarray([null] * first + held, dtype=np.int64)
        raise InvalidDemandError(f"no band {band} in this chain")

    def held_per_band(self, rids: Iterable[int]) -> tuple[int, ...]:
        """Pages per band (state slots for a state band; low -> high) that requests ``rids``
        hold, read from the decode arrays in O(bands) numpy calls: full pages held, window
        pages from the first live one to the last, state slots. Ids that hold nothing count
        0; an id given twice counts twice (as a sum over the ids given).

        Without a prefix cache this is every page the requests own (what the band samples
        count each step); with one, a request's hit pages are the cache's and its saved
        checkpoints are not in the arrays, so :func:`kvchain.sim.metrics.request_owned_pages`
        counts from the lists instead.

        Raises:
            InvalidDemandError: a ``bool`` request id (it would alias request 0 or 1).
        """
        ids = tuple(rids)
        if not ids:
            return (0,) * self.geom.num_bands
        slots = self._slots_of(ids)
        st = self._state
        counts = (st.rowlen[:, slots] - st.first[:, slots]).sum(axis=1)
        return tuple(counts.tolist())

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
            ``ceil(L / P)`` pages). Kept up to date incrementally by every allocation,
            commit and release (rows by slot, grown by doubling): a call costs one gather
            and one ``translate``, not a rebuild.

        Raises:
            InvalidDemandError: no band ``band`` in this chain, or a ``bool`` request id.
            UnknownRequestError: a request that holds no pages.
        """
        if isinstance(band, bool) or not isinstance(band, int | np.integer) \
                or not 0 <= band < self.geom.num_bands:
            raise InvalidDemandError(f"no band {band} in this chain")
        ids = tuple(rids)
        slots = self._slots_of(ids)
        if not self._slots_memo_known():
            rid = ids[int((slots == 0).nonzero()[0][0])]
            raise UnknownRequestError(f"request {rid} holds no pages")
        st = self._state
        width = int(st.rowlen[band][slots].max()) if slots.size else 0
        vids = st.tables[band][slots, :width]
        if not physical or not vids.size:
            return vids
        if st.pads[band] >= 0:
            return self.chain.translate(band, vids)
        out = np.full(vids.shape, -1, dtype=np.int64)
        valid = vids >= 0
        out[valid] = self.chain.translate(band, vids[valid])
        return out

    # --- integrity -------------------------------------------------------------------------

    def audit(self) -> None:
        """Every bound page of the chain is held by exactly one request or is a null page.

        Raises:
            AuditError: a leaked page (bound, held by nobody) or a page held twice.
        """
        from kvchain.errors import AuditError

        g = self.geom
        cached = self.cache.held_pages() if self.cache is not None else None
        for band in range(g.num_bands):
            held: list[int] = []
            shared: list[int] = []
            k = self._win_index.get(band)
            for req in self._requests.values():
                h = req.shared
                if band == g.full:
                    held.extend(req.full[h:])
                    shared.extend(req.full[:h])
                elif k == 0:
                    for i, v in enumerate(req.window, req.window_first):
                        (held if i >= h else shared).append(v)
                    held.extend(req.kept.values())
                elif k is not None:
                    held.extend(req.win(k))
                elif band == g.state:
                    held.extend(req.slots)
                    held.extend(req.ckpts.values())
            reserved = self.chain.layout.bands[band].reserved_pages
            if len(set(held)) != len(held):
                raise AuditError(f"band {band}: a page is held by two requests")
            in_cache = cached[band] if cached is not None else []
            owned = set(in_cache)
            if len(owned) != len(in_cache) or owned & set(held):
                raise AuditError(f"band {band}: a page held twice by the cache or by the cache "
                                 "and a request")
            if not owned.issuperset(shared):
                raise AuditError(f"band {band}: a request uses a shared page the cache does not "
                                 "hold")
            total = len(held) + len(in_cache)
            bound = self.chain.bound_pages(band)
            if bound != total + reserved:
                raise AuditError(f"band {band}: {bound} pages bound, {len(held)} held by "
                                 f"requests + {len(in_cache)} by the cache + {reserved} null: "
                                 f"{bound - total - reserved} leaked")
        if self.cache is not None:
            wpins: list[int] = []
            cpins: list[int] = []
            hit_locks: list[Node] = []
            prompt_locks: list[Node] = []
            for rid, r in self._requests.items():
                if rid in self._hit_locks:
                    hl = self._hit_locks[rid]
                    if hl is not None:
                        hit_locks.append(hl)
                    if r.handle is not None:
                        prompt_locks.append(r.handle)
                elif r.handle is not None:
                    hit_locks.append(r.handle)
                if r.handle is None:
                    continue
                wpins.extend(v for i, v in enumerate(r.window, r.window_first) if i < r.shared)
                if r.cow_src >= 0:
                    cpins.append(r.cow_src)
            self.cache.audit(hit_locks, (wpins, cpins), prompt_locks)
