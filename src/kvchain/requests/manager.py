"""Requests on the chain: the KV manager over the request table.

Every request's pages live in one place, the :class:`~kvchain.requests.table.RequestTable`
(a row per request, a 2-D page-id array per band); one request and a decode batch read
and write the same arrays. The page formulas of each band kind (which pages a chunk needs,
which the window-tail release drops after a forward) are the band policies'
(:mod:`kvchain.bands.policies`); :func:`kvchain.requests.demand.request_demand` is the
one pure demand function. After the forward that computed tokens up to ``L``, window
pages wholly before the next token's window (the policy's ``first_page(L)``) are released
(window-tail release); the rows keep the band's null page in their place. The prefix
cache's part (hits, resume points, the prompt's insert) is
:class:`~kvchain.requests.cache_glue.CacheGlue`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.cache.host_copy import (
    RequestHostCopy,
    free_host_copy,
    load_back_request,
    offload_request,
)
from kvchain.cache.radix import PrefixCache
from kvchain.errors import (
    AuditError,
    BufferArgumentError,
    ForgedQuoteError,
    HostPoolFullError,
    InvalidDemandError,
    ReservedPageError,
    UnknownRequestError,
)
from kvchain.requests.batch import DecodeBatch, batch_ids, check_demands
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand
from kvchain.requests.suspend import HostSide, Suspended
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts, RequestView


class _SlotLookup:
    """The slots of one tuple of request ids at one slot version of the request table
    (int64, read-only; 0 for an id that holds nothing), with two facts about them that
    are computed on first ask from its own immutable ids and slots: every id holds pages
    (``known``), no id is named twice (``unique``)."""

    __slots__ = ("_known", "_unique", "ids", "slots", "version", "zero_one")

    def __init__(self, version: int, ids: tuple[int, ...], slots: np.ndarray,
                 zero_one: tuple[int, ...] | None) -> None:
        slots.setflags(write=False)
        self.version = version
        self.ids = ids
        self.slots = slots
        #: where an equal tuple of ids could hold a ``bool`` (``True == 1``, ``False ==
        #: 0``): the positions of ids 0 and 1 in ``ids`` (checked free of bools), ``()``
        #: when neither request was registered (a bool then reads no row), ``None`` when
        #: 0 or 1 is named more than once (an equal tuple is scanned whole)
        self.zero_one = zero_one
        self._known: bool | None = None
        self._unique: bool | None = None

    @property
    def known(self) -> bool:
        """Every id holds pages (no slot 0)."""
        if self._known is None:
            self._known = bool(self.slots.all())
        return self._known

    @property
    def unique(self) -> bool:
        """No id appears twice."""
        if self._unique is None:
            self._unique = len(set(self.ids)) == len(self.ids)
        return self._unique


def _positions_of_zero_one(ids: tuple[int, ...]) -> tuple[int, ...] | None:
    """The positions of the ids 0 and 1 in ``ids`` (bool-free), or ``None`` when one of
    them appears more than once (C-level scans: ``count`` and ``index``)."""
    out = []
    for v in (0, 1):
        n = ids.count(v)
        if n > 1:
            return None
        if n:
            out.append(ids.index(v))
    return tuple(out)


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
            prompt's pages as their prefill computes them, at the commit of every chunk
            that completes whole pages (:meth:`commit`).
        spec_tokens: drafts ``k`` of a speculative decode step (0: none). A request then
            claims ``k`` more state slots with its first chunk (the checkpoints a rollback
            picks from), and its demands count the window slack and ``k`` more tokens
            (:attr:`RequestGeometry.spec_tokens`). A speculative step is
            :meth:`decode_demands` with ``drafts = k``, :meth:`allocate` of
            ``(rid, 1 + k)``, then :meth:`verify` with the accepted drafts.
        rollback: how state bands roll back (:class:`StateRollback`: ``k`` checkpoint
            slots, or one plus a replay of the accepted tokens, which the engine runs).

    Raises:
        ConfigError: a prefix cache on an allocator without an evictor hook;
            ``spec_tokens`` not an int >= 0.
    """

    def __init__(self, chain: Allocator, cache: PrefixCache | None = None,
                 spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.CHECKPOINTS) -> None:
        self.chain = chain
        self.geom = RequestGeometry.of(chain.layout, spec_tokens, rollback)
        # pages per band released by verify's rollback (rejected drafts' pages)
        self.rolled_back_pages = [0] * self.geom.num_bands
        pads = []
        for band in range(self.geom.num_bands):
            try:
                pads.append(chain.null_page(band))
            except ReservedPageError:
                pads.append(-1)
        self._table = RequestTable(self.geom.policies, pads)
        self._requests: dict[int, CacheFacts] = {}
        self._slots_memo: _SlotLookup | None = None  # the last lookup (:meth:`_lookup`)
        self._zero_demand = Demand.zeros(self.geom.num_bands)
        # pages per band -> the one Demand of those pages, shared by the decode batches'
        # rows: interning of immutable values (a Demand is a frozen value compared by its
        # pages, so which instance a row gets never changes a result), bounded by
        # clearing it past 4,096 distinct rows
        self._demand_memo: dict[tuple[int, ...], Demand] = {}
        self._glue = CacheGlue(chain, cache, self.geom, self._table)
        self.cache = cache
        self._suspended: dict[int, Suspended] = {}  # requests suspended to host (rid ->)

    # --- the cache's counters (kept by the glue) -------------------------------------------

    @property
    def cow_state_copies(self) -> int:
        """Cache checkpoints copied into a working state slot (hits that resumed)."""
        return self._glue.cow_state_copies

    @property
    def cow_bytes(self) -> int:
        """Bytes of those copies."""
        return self._glue.cow_bytes

    @property
    def checkpoints_saved(self) -> int:
        """State checkpoint slots taken at resume points."""
        return self._glue.checkpoints_saved

    @property
    def junctions_saved(self) -> int:
        """Prefills that computed their junction point."""
        return self._glue.junctions_saved

    @property
    def prompts_inserted(self) -> int:
        """Prompts inserted into the cache whole (at the end of their prefill)."""
        return self._glue.prompts_inserted

    @property
    def chunk_inserts(self) -> int:
        """Inserts of a prompt's pages so far: one per prefill chunk that completed whole
        pages (incremental insertion; a prompt's last one inserts it whole)."""
        return self._glue.chunk_inserts

    # --- queries ---------------------------------------------------------------------------

    def __contains__(self, rid: int) -> bool:
        return rid in self._requests

    def _facts(self, rid: int) -> CacheFacts:
        try:
            return self._requests[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid} holds no pages") from None

    def pages(self, rid: int) -> RequestView:
        """A read-only view of what request ``rid`` holds.

        Raises:
            UnknownRequestError: it holds nothing.
        """
        return RequestView(self._table, self._facts(rid))

    def held(self, rid: int) -> HeldPages:
        """Counts held by ``rid`` (:data:`NOTHING_HELD` if it holds nothing)."""
        facts = self._requests.get(rid)
        return self._table.held(facts.slot) if facts is not None else NOTHING_HELD

    def tokens(self, rid: int) -> int:
        """Tokens of ``rid`` in the cache (0 if it holds nothing)."""
        facts = self._requests.get(rid)
        return int(self._table.tokens[facts.slot]) if facts is not None else 0

    def demand(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
               horizon: int = 0) -> Demand:
        """:func:`request_demand` for ``rid`` at its current position (a request suspended
        to host: at its position once resumed, beyond the pages its resume loads back)."""
        facts = self._requests.get(rid)
        if facts is None:
            sus = self._suspended.get(rid)
            if sus is not None:
                return request_demand(self.geom, sus.held, sus.tokens, extend, headroom,
                                      headroom_chunk, horizon=horizon)
            return request_demand(self.geom, NOTHING_HELD, 0, extend, headroom, headroom_chunk,
                                  horizon=horizon)
        slot = facts.slot
        return request_demand(self.geom, self._table.held(slot), int(self._table.tokens[slot]),
                              extend, headroom, headroom_chunk, facts.points,
                              horizon, facts.gap)

    @property
    def num_requests(self) -> int:
        """Requests holding pages."""
        return len(self._requests)

    # --- prefix cache (the glue's) -----------------------------------------------------------

    def points_for(self, keys: Sequence[int] | None, after: int = 0,
                   junction: int = 0) -> tuple[int, ...]:
        """Resume points (page counts > ``after``, sorted) a request with these page keys
        saves for the cache, with its ``junction`` point (0: none) among them; empty
        without a cache or keys."""
        return self._glue.points_for(keys, after, junction)

    def cached_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """Tokens a prompt with these page keys would hit now (a pure match: nothing is
        locked; 0 without a cache). What the cache-aware waiting order ranks by."""
        return self._glue.cached_tokens(keys, prompt_tokens)

    def chunk_cut(self, rid: int) -> int:
        """Token position a prefill chunk of ``rid`` must not run past: its junction
        checkpoint (saved at a chunk's end), or 0 for none (or not attached)."""
        facts = self._requests.get(rid)
        return facts.cut if facts is not None else 0

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
            InvalidRequestError: ``rid`` already holds pages, or more keys than whole
                pages of the prompt.
        """
        self._glue.check_attach(rid, rid in self._requests or rid in self._suspended, keys,
                                prompt_tokens)
        facts = self._register(rid)
        return self._glue.attach(rid, facts, tuple(keys), prompt_tokens, save_points,
                                 max_gap)

    def recompute_tokens(self, rid: int) -> int:
        """Tokens of ``rid``'s partial hit its next chunk must recompute before its own
        (their pages are the cache's: computed, never allocated), 0 once that chunk is
        committed, for an ordinary hit, or when not attached."""
        facts = self._requests.get(rid)
        return facts.gap if facts is not None else 0

    def partial_tokens(self, rid: int) -> int:
        """Tokens of ``rid``'s hit whose pages it shares but recomputes (a partial hit's
        gap, :meth:`CacheGlue.attach`; 0 for an ordinary hit or none)."""
        return self._glue.partial_tokens(rid)

    def detach(self, rid: int) -> None:
        """Undo :meth:`attach` of a request that was not admitted (it took nothing yet).

        Raises:
            UnknownRequestError: ``rid`` is not attached.
            InvalidRequestError: it took pages of its own since.
        """
        facts = self._facts(rid)
        self._glue.detach(rid, facts)
        self._unregister(rid)

    def touch(self, rid: int) -> None:
        """LRU touch of ``rid``'s hit once it is admitted (no-op without a hit)."""
        facts = self._requests.get(rid)
        if facts is not None:
            self._glue.touch(facts)

    def hit_holds(self, rid: int) -> Demand:
        """What ``rid``'s hit lock keeps locked beyond its full pages, per band (its path's
        window pages and checkpoints, :meth:`PrefixCache.lock_holds`): zeros without a
        cache, a hit, or when not attached."""
        facts = self._requests.get(rid)
        cache = self._glue.cache
        handle = facts.handle if facts is not None else None
        if cache is None or handle is None:
            return Demand.zeros(self.geom.num_bands)
        return Demand(cache.lock_holds(handle))

    def hit_tokens(self, rid: int) -> int:
        """Tokens of ``rid`` served by the cache at :meth:`attach` (0 if none or not
        attached; unchanged when its prompt's pages are inserted as it prefills): the
        compute saved, so a partial hit counts only where its state resumes (``C``)."""
        return self._glue.hit_tokens(rid)

    # --- rows ------------------------------------------------------------------------------

    def _register(self, rid: int) -> CacheFacts:
        facts = self._requests[rid] = CacheFacts(self._table.bind(rid))
        return facts

    def _unregister(self, rid: int) -> None:
        del self._requests[rid]
        self._table.unbind(rid)
        self._glue.forget(rid)

    def _lookup(self, ids: tuple[int, ...], ints: bool = False) -> _SlotLookup:
        """The slots of request ids at the table's slot version, as one immutable
        :class:`_SlotLookup`. The last one is kept and handed back for the same ids at the
        same version (a decode step asks for one batch three times): a pure memo, as a
        request's slot changes only in :meth:`RequestTable.bind` / ``unbind``, which bump
        the version, and ``ids`` is a tuple; its slots array is read-only.

        A hit costs one tuple comparison and a look at the (at most two) positions where
        the kept ids are 0 or 1, the only places an equal tuple can hold a bool; a miss
        scans ``ids`` for bools (skipped when the caller proved that no id is a bool:
        ``ints``, as :func:`batch_ids` does).

        Raises:
            InvalidDemandError: a ``bool`` id while request 0 or 1 holds pages (it would
                alias that request).
        """
        table = self._table
        memo = self._slots_memo
        if memo is not None and memo.version == table.version and memo.ids == ids:
            # ids[i] == memo.ids[i]: only where memo.ids holds 0 or 1 can ids hold a bool
            at: Sequence[int] = (memo.zero_one if memo.zero_one is not None
                                 else range(len(ids)))
            for i in at:
                if type(ids[i]) is bool:
                    raise InvalidDemandError(f"request ids are ints, got {ids!r}")
            return memo
        slot_of = table.slot_of
        zero_one: tuple[int, ...] | None = ()
        if 0 in slot_of or 1 in slot_of:
            if not ints and bool in map(type, ids):  # C-level scan
                # False == 0 and True == 1 (as dict keys and in the memo's tuple
                # comparison): a bool would read request 0's or 1's row
                raise InvalidDemandError(f"request ids are ints, got {ids!r}")
            zero_one = _positions_of_zero_one(ids)
        memo = self._slots_memo = _SlotLookup(table.version, ids, table.slots_of(ids),
                                              zero_one)
        return memo

    def _slots_of(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of request ids (0, the empty slot, for one that holds nothing), int64,
        read-only (:meth:`_lookup`)."""
        return self._lookup(ids).slots

    def _checked_slots(self, ids: tuple[int, ...], what: str = "decode run") -> np.ndarray:
        """Slots of ``ids``, every one registered and named once (else the typed error)."""
        lookup = self._known_lookup(ids)
        if not lookup.unique:
            raise InvalidDemandError(f"a request appears twice in one {what}")
        return lookup.slots

    def _known_slots(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of ``ids``, every one registered (else :class:`UnknownRequestError`)."""
        return self._known_lookup(ids).slots

    def _known_lookup(self, ids: tuple[int, ...]) -> _SlotLookup:
        """:meth:`_lookup` of ``ids``, every one registered (else
        :class:`UnknownRequestError`)."""
        lookup = self._lookup(ids)
        slots = lookup.slots
        if not lookup.known:
            rid = ids[int((slots == 0).nonzero()[0][0])]
            raise UnknownRequestError(f"request {rid} holds no pages")
        return lookup

    def _zero(self) -> Demand:
        """The empty demand of this chain's bands (one shared immutable value)."""
        return self._zero_demand

    # --- retraction by host copy (requests/suspend.py) --------------------------------------

    def suspend(self, rid: int, host: HostSide) -> Suspended:
        """Suspend running request ``rid`` to host: give every page and state slot it holds
        (row entries ``[first, end)`` per band, a prefix-cache hit's shared pages
        included) a host slot of its class, copy the bytes when ``host`` has a buffer,
        then release its device pages as a retraction does (:meth:`free` without insert:
        the cache's pages unlocked, its own released). It holds no device page afterwards
        and comes back with :meth:`resume` (or ``allocate(..., resumes=[rid])``).

        Returns:
            Its :class:`Suspended` record (also kept here: :meth:`suspended`).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            HostPoolFullError: a class's pool has fewer free slots than ``rid`` holds
                pages there (checked for every band first: nothing taken or released).
            BufferArgumentError: ``host`` has no pool for a band, or its slots are not the
                band's page bytes (nothing changed).
        """
        facts = self._facts(rid)
        table, slot = self._table, facts.slot
        held = table.held(slot)
        bands = self.chain.layout.bands
        counts = tuple(end - first for first, end in held.spans)
        for layout, n in zip(bands, counts, strict=True):
            pool = host.pool(layout.label)
            if host.page_bytes.get(layout.label) != layout.page_bytes:
                raise BufferArgumentError(
                    f"the {layout.label} band has pages of {layout.page_bytes:,} B but its "
                    f"host slots hold {host.page_bytes.get(layout.label)} B")
            if n > pool.free_count:
                raise HostPoolFullError(
                    f"request {rid} holds {n:,} {layout.label} pages but the host pool has "
                    f"{pool.free_count:,} free slots", label=layout.label, wanted=n,
                    free=pool.free_count)
        labels = tuple(b.label for b in bands)
        copy: RequestHostCopy | None = None
        if host.buffer is not None and host.device is not None:
            copy, fence = offload_request(self, host.device, host.buffer, rid)
            fence.wait()  # the device pages are released below: the copy must be done
            host_slots = tuple(part.slots for part in copy.bands)
        else:
            host_slots = tuple(host.pool(label).alloc(n)
                               for label, n in zip(labels, counts, strict=True))
        tokens = int(table.tokens[slot])
        self.free(rid, insert=False)
        sus = Suspended(rid, tokens, held, Demand(counts), host_slots, labels,
                        sum(n * b.page_bytes for n, b in zip(counts, bands, strict=True)),
                        host, copy)
        self._suspended[rid] = sus
        return sus

    def suspend_bytes(self, rid: int) -> int:
        """Bytes :meth:`suspend` of ``rid`` would copy to host now: ``sum((end - first) x
        page_bytes)`` over its bands (0 if it holds nothing)."""
        facts = self._requests.get(rid)
        if facts is None:
            return 0
        spans = self._table.held(facts.slot).spans
        return sum((end - first) * b.page_bytes
                   for (first, end), b in zip(spans, self.chain.layout.bands, strict=True))

    def shared_by_others(self, rid: int) -> int:
        """Full pages of ``rid``'s prefix-cache pages that another running request also
        reads (locks): what a suspension to host would copy and its resume hold as a second,
        private copy (:mod:`kvchain.requests.suspend`). 0 if it holds nothing or no lock."""
        facts = self._requests.get(rid)
        return self._glue.shared_by_others(rid, facts) if facts is not None else 0

    def is_suspended(self, rid: int) -> bool:
        """Whether ``rid`` is suspended to host."""
        return rid in self._suspended

    def suspended(self, rid: int) -> Suspended:
        """The record of suspended ``rid``.

        Raises:
            UnknownRequestError: it is not suspended.
        """
        try:
            return self._suspended[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid} is not suspended to host") from None

    @property
    def suspended_ids(self) -> tuple[int, ...]:
        """Requests suspended to host, in suspension order."""
        return tuple(self._suspended)

    def resume_demand(self, rid: int) -> Demand:
        """The load-back demand of suspended ``rid``: pages per band it held
        (:attr:`Suspended.demand`).

        Raises:
            UnknownRequestError: it is not suspended.
        """
        return self.suspended(rid).demand

    def resume(self, rid: int, quote: Quote | None = None) -> Demand:
        """Load suspended ``rid`` back on its own: ``allocate([], resumes=[rid])``, one take
        of :meth:`resume_demand` (``quote``: its price from ``chain.price``, if the caller
        has it).

        Raises:
            UnknownRequestError: ``rid`` is not suspended (nothing changed).
            CapacityError: the load-back does not fit (nothing changed: it stays
                suspended).
        """
        self.suspended(rid)
        return self.allocate([], None, quote, resumes=(rid,))

    def _check_resumes(self, resumes: Sequence[int], ids: tuple[int, ...]
                       ) -> tuple[Suspended, ...]:
        """The records of ``resumes``, each suspended, named once, not in ``ids``, with its
        host slots held (before any change).

        Raises:
            InvalidDemandError, BufferArgumentError: see :meth:`allocate`.
        """
        rids = tuple(resumes)
        if len(set(rids)) != len(rids) or not set(rids).isdisjoint(ids):
            raise InvalidDemandError("a resume is named twice or is also in the batch")
        out = []
        for rid in rids:
            if isinstance(rid, bool) or rid not in self._suspended:
                raise InvalidDemandError(f"request {rid!r} is not suspended to host")
            sus = self._suspended[rid]
            sus.check_held()
            out.append(sus)
        return tuple(out)

    def _restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        """Give resumed ``sus`` its new pages ``vids`` (per band, entry order) at the row
        entries it held, load its host bytes into them and free its host slots."""
        del self._suspended[sus.rid]
        facts = self._register(sus.rid)
        table, slot = self._table, facts.slot
        table.tokens[slot] = sus.tokens
        for band, ((first, _), got) in enumerate(zip(sus.held.spans, vids, strict=True)):
            table.set_row(band, slot, first, got)
        table.refresh_need(np.asarray([slot], dtype=np.int64))
        host, copy = sus.host, sus.copy
        if copy is not None and host.buffer is not None and host.device is not None:
            rebased = RequestHostCopy(copy.rid, tuple(
                replace(part, vids=np.asarray(got, dtype=np.int64),
                        table_pages=end)
                for part, got, (_, end) in zip(copy.bands, vids, sus.held.spans,
                                               strict=True)))
            fence = load_back_request(self, host.device, host.buffer, rebased)
            free_host_copy(host.buffer, rebased, after=fence)
        else:
            sus.free_slots()

    def audit_host(self, host: HostSide) -> None:
        """Every suspended request's pages are in exactly one place, on host: it holds no
        device page (no row), each of its pages has one held host slot of its class (none
        shared with another request), and every held host slot of ``host`` belongs to a
        suspended request (no leaked host slot); then each pool's own invariant.

        Raises:
            AuditError: a suspended request that also holds device pages, a record whose
                slots do not match its demand, a host slot held twice, freed, or leaked.
        """
        host.audit()
        per_label: dict[str, list[np.ndarray]] = {label: [] for label in host.pools}
        for rid, sus in self._suspended.items():
            if rid in self._requests:
                raise AuditError(f"request {rid} is suspended to host and holds device pages")
            if tuple(int(s.size) for s in sus.slots) != sus.demand.pages:
                raise AuditError(f"request {rid}: {[int(s.size) for s in sus.slots]} host "
                                 f"slots for a load-back of {sus.demand.pages}")
            if sus.host is not host:
                continue
            try:
                sus.check_held()
            except BufferArgumentError as exc:
                raise AuditError(f"suspended request {rid}: {exc}") from None
            for label, s in zip(sus.labels, sus.slots, strict=True):
                per_label[label].append(s)
        for label, parts in per_label.items():
            got = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            if np.unique(got).size != got.size:
                raise AuditError(f"host pool {label!r}: a slot is held by two suspended "
                                 f"requests")
            held = host.pools[label].held_count
            if held != got.size:
                raise AuditError(f"host pool {label!r}: {held} slots held, {got.size} by "
                                 f"suspended requests: {held - got.size} leaked")

    # --- decode demands ----------------------------------------------------------------------

    def decode_demands(self, rids: Sequence[int], drafts: int = 0) -> DecodeBatch:
        """``[self.demand(rid, 1 + drafts) for rid in rids]`` (equal values), for a decode
        batch (``drafts = k > 0``: a speculative step, ``1 + k`` tokens each: the token
        sampled last and ``k`` drafts; its window bands hold ``W + k`` tokens).

        Vectorized over the batch (:meth:`RequestTable.decode_rows`: the band policies'
        formulas over the gathered rows); a :class:`Demand` is built only for the requests
        that need a page (about one in ``P`` per band per step; the rest share one empty
        demand). A request that holds nothing gets the demand of its first token. With a
        prefix cache the same (no kept window tail is reserved: each goes to the cache at
        the commit of the chunk that reaches its point); a request
        whose next token reaches one of its resume points (a checkpoint slot more: one
        still in its prefill) sends the batch through :meth:`demand`.

        Returns:
            A :class:`DecodeBatch` (an immutable sequence of demands aligned with
            ``rids``, with their ``[rows, bands]`` matrix and total) that :meth:`allocate`
            of ``(rid, 1 + drafts)`` for the same ``rids`` takes as priced.

        Raises:
            InvalidDemandError: ``drafts`` not an int >= 0.
        """
        if type(drafts) is not int or drafts < 0:
            raise InvalidDemandError(f"drafts must be an int >= 0, got {drafts!r}")
        ids = tuple(rids)
        extend = 1 + drafts
        nb = self.geom.num_bands
        if self._glue.reaches_point(ids, self._requests):
            return DecodeBatch.of(self, ids, drafts, [self.demand(rid, extend) for rid in ids],
                                  nb)
        slots = self._slots_of(ids)
        zero = self._zero()
        out = [zero] * len(ids)
        table = self._table
        # page boundary within the step's tokens
        check = (table.tokens[slots] + drafts >= table.need_at[slots]).nonzero()[0]
        if not check.size:
            return DecodeBatch.of(self, ids, drafts, out, nb, ())
        needs, keys, matrix = table.decode_rows(slots[check], extend)
        if not needs:
            return DecodeBatch.of(self, ids, drafts, out, nb, ())
        where = check.tolist()
        at = [where[j] for j in needs]
        memo = self._demand_memo
        if len(memo) > 4_096:
            memo.clear()
        for i, key in zip(at, keys, strict=True):
            d = memo.get(key)
            if d is None:
                d = memo[key] = Demand(key)
            out[i] = d
        return DecodeBatch.of(self, ids, drafts, out, nb, at, matrix)

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, batch: Sequence[tuple[int, int]],
                 demands: Sequence[Demand] | None = None, quote: Quote | None = None,
                 resumes: Sequence[int] = ()) -> Demand:
        """Take the pages a batch needs to compute its tokens, in one chain take (none when
        the batch needs no page: an empty take binds nothing), together with the load-back
        of the suspended requests ``resumes`` (:meth:`suspend`): the take's demand is the
        batch's plus each resume's :attr:`Suspended.demand`, so one quote prices both.

        Args:
            batch: ``(request id, tokens to compute)`` pairs (a prefill chunk, or 1 for a
                decode); each request at most once.
            demands: the batch's demands if the caller just computed them (same order,
                no change in between): a :class:`DecodeBatch` from this manager's
                :meth:`decode_demands` for the same request ids, ``1 + drafts`` tokens
                each, is taken by its total as priced; any other sequence of
                :class:`Demand` (a list from :meth:`demand`, a value from another
                manager) is validated once here; ``None``: computed here.
            quote: the allocator's quote (from its ``price``) of the summed demand, if the
                caller has it; a quote priced before the chain's epoch moved is dropped and
                the demand priced again.
            resumes: suspended requests to load back in this take (none of them in
                ``batch``): each gets new pages at the row entries it held, its host bytes
                copied into them (when its suspension moved bytes), and its host slots
                freed; it holds its pages again from then on (it computes nothing in this
                take: its next tokens are a later batch's).

        Returns:
            The summed demand that was taken (the batch's plus the resumes').

        Raises:
            InvalidDemandError: a request listed twice, an entry that is not a pair of
                ints, a negative or non-integer token count, demands that do not match
                the batch, or a resume that is not suspended, is named twice or is also in
                the batch.
            BufferArgumentError: a resume whose host slots are no longer held (checked
                before the take).
            ForgedQuoteError: ``quote`` is not a Quote, or was not issued by the allocator
                for this demand.
            CapacityError: the batch does not fit.

            On every error the chain and every request are as before.
        """
        ids, extends = batch_ids(batch)
        if quote is not None and not isinstance(quote, Quote):
            raise ForgedQuoteError(f"expected a Quote from the allocator's price, got "
                                   f"{type(quote).__name__}")
        lookup = self._lookup(ids, ints=True)  # batch_ids: every id is an int
        slots = lookup.slots
        if not lookup.unique:
            raise InvalidDemandError("a request appears twice in one allocation batch")
        if self._suspended and not self._suspended.keys().isdisjoint(ids):
            raise InvalidDemandError("a request suspended to host computes nothing before "
                                     "its resume")
        total, nonzero, matrix = self._batch_demand(ids, extends, demands)
        loads = self._check_resumes(resumes, ids) if resumes else ()
        missing = ([] if lookup.known
                   else [ids[i] for i in (slots == 0).nonzero()[0].tolist()])
        taken = total
        for sus in loads:
            taken = taken.plus(sus.demand)
        if taken.is_empty:  # every token on pages already held (most decode steps)
            for rid in missing:
                self._register(rid)
            return taken
        if quote is not None and quote.before.epoch != self.chain.epoch:
            quote = None  # priced before the chain changed: the take prices it again
        grant = self.chain.take(taken, quote,
                                self._glue.copies(ids, slots, nonzero, matrix, self._requests))
        if missing:
            for rid in missing:
                self._register(rid)
            slots = self._slots_of(ids)  # the new requests' slots (rows empty)
        pages = grant.pages
        if loads:  # the batch's pages first, then each resume's, band by band
            cut = list(total.pages)
            for sus in loads:
                self._restore(sus, [pages[b][cut[b]:cut[b] + n]
                                    for b, n in enumerate(sus.demand.pages)])
                cut = [c + n for c, n in zip(cut, sus.demand.pages, strict=True)]
            pages = tuple(p[:n] for p, n in zip(pages, total.pages, strict=True))
        if not total.is_empty:
            self._distribute(pages, ids, extends, slots, nonzero, matrix)
        return taken

    def _batch_demand(self, ids: tuple[int, ...], extends: tuple[int, ...],
                      demands: Sequence[Demand] | None,
                      ) -> tuple[Demand, Sequence[int], np.ndarray]:
        """The batch's summed demand, the positions of its non-empty demands and their
        ``[len(nonzero), bands]`` matrix (computed when ``demands`` is ``None``).

        Raises:
            InvalidDemandError: demands that do not match the batch.
        """
        if (isinstance(demands, DecodeBatch) and demands.owner is self
                and demands.rids == ids
                and (not extends or set(extends) == {1 + demands.drafts})):
            # priced by decode_demands for this very batch: its total is the take
            return demands.total, demands.nonzero, demands.needs
        if demands is None:
            demands = [self.demand(rid, extend) for rid, extend in zip(ids, extends,
                                                                      strict=True)]
        elif len(demands) != len(ids):
            raise InvalidDemandError(f"{len(demands)} demands for a batch of {len(ids)}")
        nb = self.geom.num_bands
        check_demands(ids, extends, demands, nb)
        zero = (0,) * nb
        nonzero = [i for i, d in enumerate(demands) if d.pages != zero]
        matrix = np.array([demands[i].pages for i in nonzero], dtype=np.int64)
        total = Demand(tuple(matrix.sum(axis=0).tolist())) if nonzero else self._zero()
        return total, nonzero, matrix

    def _distribute(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                    extends: tuple[int, ...], slots: np.ndarray, nonzero: Sequence[int],
                    matrix: np.ndarray) -> None:
        """Hand a take's pages to the requests at ``nonzero`` (batch positions, ascending;
        ``matrix`` their demands, one row each), band by band in batch order (the order
        the take's pages are cut in), into their table rows: a request's first pages of a
        window band start at its window's first page."""
        table = self._table
        at = np.asarray(nonzero, dtype=np.int64)
        slots_at = slots[at]
        for pol in self.geom.policies:
            band = pol.band
            vids = pages[band]
            if not vids:
                continue
            col = matrix[:, band]
            if col.all():  # every row takes pages of this band (a decode step's crossing)
                sel, counts, rows = None, col, slots_at
            else:
                sel = col.nonzero()[0]
                counts, rows = col[sel], slots_at[sel]
            if pol.per_request:
                pos = at.tolist() if sel is None else at[sel].tolist()
                self._glue.take_slots(band, rows, [ids[i] for i in pos],
                                      [extends[i] for i in pos], counts.tolist(), vids,
                                      self._requests)
                continue
            starts = table.rowlen[band][rows]
            if pol.windowed:
                first = table.first[band][rows]
                empty = starts == first
                if empty.any():  # a request's first window pages: from its window start
                    first = np.where(empty, pol.first_page(table.tokens[rows]), first)
                    table.first[band][rows] = first
                    starts = np.where(empty, first, starts)
            table.append(band, rows, starts, counts, vids)
        table.refresh_need(slots_at)

    # --- commits -----------------------------------------------------------------------------

    def commit(self, rid: int, tokens: int) -> int:
        """Record that a forward computed ``tokens`` more tokens of ``rid``, then release
        its window pages wholly before the next token's window (window-tail release).
        With a prefix cache, a commit that completes whole prompt pages inserts the
        prompt's pages so far into the cache (:meth:`CacheGlue.maybe_insert`).

        Returns:
            Window pages released by the window-tail release (duplicates handed back at
            the insert are not counted).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: the pages held do not cover the new tokens.
        """
        facts = self._facts(rid)
        table = self._table
        slot = facts.slot
        now = int(table.tokens[slot])
        new_tokens = now + tokens
        if tokens < 0 or self._uncovered(slot, new_tokens):
            raise InvalidDemandError(f"request {rid}: {tokens} tokens not covered by its pages")
        self._glue.count_junction(facts, now, new_tokens)
        facts.gap = 0  # a partial hit's gap was run by this chunk
        table.tokens[slot] = new_tokens
        released = self.release_window_tail(rid)
        self._glue.maybe_insert(rid, facts, new_tokens)
        return released

    def _uncovered(self, slot: int, tokens: int) -> bool:
        """Whether a band that keeps every token holds fewer pages than ``tokens`` need."""
        table = self._table
        return any(table.rowlen[pol.band, slot] * pol.page_size < tokens
                   for pol in self.geom.policies if not (pol.windowed or pol.per_request))

    def commit_decodes(self, rids: Sequence[int]) -> int:
        """:meth:`commit` of one token for each of ``rids`` (a decode batch), with their
        window-tail pages released in one ``chain.release`` call per window band for the
        whole batch.

        Vectorized over the batch, with the prefix cache on or off: the token counts move
        in the table, the pages whose window start crossed a page boundary are found by
        array arithmetic and gathered from the rows (those below a request's shared pages
        are the cache's: unpinned, not released). A subclass that overrides
        :meth:`commit` (e.g. an engine that keeps window pages until the request ends), a
        batch that names a request twice and a request whose prompt is not in the cache
        yet (its commit may insert it) get :meth:`commit` once per request instead.

        Returns:
            Window pages released.

        Raises:
            UnknownRequestError / InvalidDemandError: as :meth:`commit`, checked for every
                request before any changes.
        """
        ids = tuple(rids)
        lookup = self._known_lookup(ids)
        slots = lookup.slots
        table = self._table
        unique = lookup.unique
        if unique:
            n = table.tokens[slots] + 1
        else:  # a request named c times commits c tokens: check its last one
            _, inverse, counts = np.unique(slots, return_inverse=True, return_counts=True)
            n = table.tokens[slots] + counts[inverse]
        for pol in self.geom.policies:
            if not (pol.windowed or pol.per_request):
                short = table.rowlen[pol.band][slots] * pol.page_size < n
                if short.any():
                    rid = ids[int(short.nonzero()[0][0])]
                    raise InvalidDemandError(f"request {rid}: 1 token not covered by its "
                                             f"pages")
        # every request checked: the one-by-one paths below cannot fail half-way
        if (type(self).commit is not KVManager.commit or not unique
                or self._glue.may_insert(ids)):
            return sum(self.commit(rid, 1) for rid in ids)
        table.tokens[slots] = n
        released = 0
        for pol in self.geom.windows:
            released += self._release_fronts(pol.band, slots, pol.first_page(n))
        return released

    def _release_fronts(self, band: int, slots: np.ndarray, keep_from: np.ndarray) -> int:
        """Release the pages of rows ``slots`` in window band ``band`` before page
        ``keep_from`` (per row); the cache's shared pages among them are unpinned instead.
        Returns the pages taken out of the rows."""
        table = self._table
        first = table.first[band][slots]
        # a row drops pages only where its next window starts past its first held page
        # (then ``min(keep_from, end) - first`` of them): the few rows that crossed a page
        at = (keep_from > first).nonzero()[0]
        if not at.size:
            return 0
        s, f = slots[at], first[at]
        c = np.minimum(keep_from[at], table.rowlen[band][s]) - f
        if not c.all():  # an empty row (end == first) drops nothing
            keep = (c > 0).nonzero()[0]
            if not keep.size:
                return 0
            s, f, c = s[keep], f[keep], c[keep]
        if int(c.sum()) == s.size:  # one page each (a decode step)
            rows, cols = s, f
        else:
            rows = np.repeat(s, c)
            cols = np.repeat(f - (np.cumsum(c) - c), c) + np.arange(rows.size)
        vids = table.tables[band][rows, cols]
        table.tables[band][rows, cols] = table.pads[band]
        table.first[band][s] = f + c
        shared = table.shared[rows]
        if shared.any():
            mine = cols >= shared
            self._glue.unpin_pages(band, vids[~mine])
            self.chain.release(band, vids[mine])
        else:
            self.chain.release(band, vids)
        return int(vids.size)

    def verify(self, rids: Sequence[int], accepted: Sequence[int] | np.ndarray,
               drafts: int) -> int:
        """Settle a speculative step: request ``rids[i]`` computed ``1 + k`` tokens (its
        :meth:`allocate` of ``(rid, 1 + k)``) and keeps ``1 + accepted[i]`` of them.

        Rollback first, for the whole batch in array operations: in every full, window and
        chunked-local band the pages at or past ``ceil((L + 1 + a) / P)`` (``L`` the
        tokens before the step) are taken out of the rows and released in one
        ``chain.release`` per band (a page holding an accepted token stays). Then the
        commit of ``1 + a`` tokens as :meth:`commit_decodes` (window-tail release: the
        window slack behind the new window goes too; the prefix cache's prompt insert,
        if due, through :meth:`commit`). State slots are not released: a request holds
        its ``k`` checkpoint slots for its whole life (the state after the last accepted
        token is one of them and becomes the working state; nothing is recomputed), or
        under ``REPLAY`` its one checkpoint (the engine copies it back and recomputes the
        ``1 + a`` accepted tokens after a rejection: compute, no pages). The
        rejected drafts were never committed, so the prefix cache never sees them.
        ``accepted`` all 0 with ``k = 0`` is :meth:`commit_decodes`.

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
        ids = tuple(rids)
        slots = self._checked_slots(ids, "verify")
        acc = np.asarray(accepted)
        if not isinstance(accepted, np.ndarray) and bool in set(map(type, accepted)):
            acc = np.asarray(accepted, dtype=object)  # True would read as 1: refused below
        if type(drafts) is not int or drafts < 0:
            raise InvalidDemandError(f"drafts must be an int >= 0, got {drafts!r}")
        if (acc.shape != (len(ids),) or (acc.size and acc.dtype.kind not in "iu")
                or (acc.size and not 0 <= int(acc.min()) <= int(acc.max()) <= drafts)):
            raise InvalidDemandError(f"accepted drafts must be {len(ids)} integers in "
                                     f"[0, {drafts}], got {accepted!r}")
        acc = acc.astype(np.int64)
        table = self._table
        n = table.tokens[slots] + 1 + acc
        computed = table.tokens[slots] + 1 + drafts  # the step's tokens: all covered
        for pol in self.geom.policies:
            if pol.per_request:
                continue
            band = pol.band
            end = table.rowlen[band][slots]
            short = end * pol.page_size < computed
            if pol.windowed:
                short &= end > table.first[band][slots]  # an empty window band: no pages
            if short.any():
                at = int(short.nonzero()[0][0])
                raise InvalidDemandError(f"request {ids[at]}: {1 + drafts} tokens not covered "
                                         f"by its pages")
        # every request checked: nothing below fails half-way
        released = 0
        for pol in self.geom.policies:
            if pol.per_request:
                continue
            vids = table.truncate(pol.band, slots, -(-n // pol.page_size))
            if vids.size:
                self.chain.release(pol.band, vids)
                released += int(vids.size)
                self.rolled_back_pages[pol.band] += int(vids.size)
        if type(self).commit is not KVManager.commit or self._glue.may_insert(ids):
            released += sum(self.commit(rid, 1 + int(a))
                            for rid, a in zip(ids, acc.tolist(), strict=True))
        else:
            table.tokens[slots] = n
            for pol in self.geom.windows:
                released += self._release_fronts(pol.band, slots, pol.first_page(n))
        table.refresh_need(slots)
        return released

    def audit_settled(self, rids: Iterable[int]) -> None:
        """What :meth:`verify` leaves, checked for requests ``rids`` (an audit: run it after
        a rollback): no page of a full, window or chunked-local band at or past
        ``ceil(L / P)`` (``L`` its tokens: no rejected draft's page kept), no window page
        before its window (``first_page(L)``: the window slack released), and its state
        slots exactly the geometry's ``state_slots`` (its checkpoints, none leaked or
        lost).

        Raises:
            AuditError: the first request that holds more or less.
            UnknownRequestError: a request that holds no pages.
        """
        table = self._table
        for rid in rids:
            slot = self._facts(rid).slot
            tokens = int(table.tokens[slot])
            for pol in self.geom.policies:
                first, end = table.span(pol.band, slot)
                if pol.per_request:
                    if end and end != self.geom.state_slots:
                        raise AuditError(f"request {rid}: {end} state slots, "
                                         f"{self.geom.state_slots} claimed")
                    continue
                if end > -(-tokens // pol.page_size):
                    raise AuditError(f"request {rid}: band {pol.band} holds {end} pages for "
                                     f"{tokens} tokens (a rolled-back page kept)")
                if pol.windowed and end > first and first < pol.first_page(tokens):
                    raise AuditError(f"request {rid}: band {pol.band} keeps page {first} "
                                     f"behind its window (slack not released)")

    def release_window_tail(self, rid: int) -> int:
        """Release ``rid``'s pages wholly before its next token's window, in every window
        and chunked-local band (each by its own window's policy).

        Returns:
            Window pages taken out of its rows, all bands together (0 if none were out of
            a window).
        """
        facts = self._facts(rid)
        table = self._table
        slot = facts.slot
        tokens = int(table.tokens[slot])
        released = 0
        for pol in self.geom.windows:
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
        retracts anyone). Returns pages released."""
        return sum(self.release_window_tail(rid) for rid in rids if rid in self._requests)

    # --- runs of decode steps (the simulator's fast-forward) -------------------------------

    def decode_run(self, rids: Sequence[int], steps: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages each of ``rids`` adds in each of the next ``steps`` decode steps if all
        of them decode in every one, and which steps' commits release window pages
        (:meth:`RequestTable.run_columns`: the values :meth:`decode_demands` and
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
        if self._glue.may_insert(ids) or self._glue.points_ahead(ids, self._requests):
            return None
        return self._table.run_columns(slots, steps)

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
        table = self._table
        n = table.tokens[slots] + steps
        bad = np.zeros(slots.size, dtype=bool)
        for pol in self.geom.policies:
            if pol.per_request:
                continue
            end = table.rowlen[pol.band][slots]
            bad |= end * pol.page_size < n  # the last token's page is not held
            if pol.windowed:
                first = table.first[pol.band][slots]
                bad |= (pol.first_page(n) > first) & (end > first)  # a release due
        if bad.any():
            rid = ids[int(bad.nonzero()[0][0])]
            raise InvalidDemandError(f"request {rid}: {steps} decode steps are not quiet (a "
                                     f"page is needed or released on the way)")
        table.tokens[slots] = n

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
        """
        facts = self._facts(rid)
        table = self._table
        slot = facts.slot
        out = [table.live(band, slot).tolist() for band in range(self.geom.num_bands)]
        shared = int(table.shared[slot])
        for pol in self.geom.policies:
            if shared and not pol.per_request:  # the cache's pages: not the request's
                first = int(table.first[pol.band, slot])
                out[pol.band] = out[pol.band][max(shared - first, 0):]
        self._glue.release_held(rid, facts, out, insert)
        self._unregister(rid)
        released = 0
        for band, ids in enumerate(out):
            if ids:
                self.chain.release(band, ids)
                released += len(ids)
        return released

    # --- kernels ---------------------------------------------------------------------------

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """Virtual page ids of ``rid`` in ``band`` in token order (int64, shape ``[pages]``,
        a copy of its row).

        For a window band, entry ``j`` is the page of tokens ``[j * P, (j + 1) * P)``;
        released entries hold the band's null page. Translate with
        ``chain.translate(band, table)`` (one call per batch).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            InvalidDemandError: no band ``band`` in this chain.
        """
        slot = self._facts(rid).slot
        if isinstance(band, bool) or not isinstance(band, int | np.integer) \
                or not 0 <= band < self.geom.num_bands:
            raise InvalidDemandError(f"no band {band} in this chain")
        table = self._table
        return table.tables[band][slot, :table.rowlen[band, slot]].copy()

    def held_per_band(self, rids: Iterable[int]) -> tuple[int, ...]:
        """Pages per band (state slots for a state band; low -> high) that requests ``rids``
        hold, read from the table in O(bands) numpy calls: every band's pages from its
        first live one to the last. Ids that hold nothing count 0; an id given twice
        counts twice (as a sum over the ids given).

        Without a prefix cache this is every page the requests own (what the band samples
        count each step); with one, a request's hit pages are the cache's and its saved
        checkpoints are not in its rows: :meth:`owned_per_band` counts those.

        Raises:
            InvalidDemandError: a ``bool`` request id (it would alias request 0 or 1).
        """
        ids = tuple(rids)
        if not ids:
            return (0,) * self.geom.num_bands
        slots = self._slots_of(ids)
        table = self._table
        counts = (table.rowlen[:, slots] - table.first[:, slots]).sum(axis=1)
        return tuple(counts.tolist())

    def owned_per_band(self, rids: Iterable[int]) -> tuple[int, ...]:
        """Pages per band that requests ``rids`` hold as their own: :meth:`held_per_band`
        less the prefix cache's shared pages in their rows, plus the window pages they
        keep for the cache and their saved state checkpoints (ids that hold nothing are
        skipped). The split :meth:`audit` checks page by page.

        Raises:
            InvalidDemandError: a ``bool`` request id.
        """
        ids = tuple(rid for rid in rids if rid in self._requests)
        if not ids:
            return (0,) * self.geom.num_bands
        slots = self._slots_of(ids)
        table = self._table
        counts = list(self.held_per_band(ids))
        shared = table.shared[slots]
        for pol in self.geom.policies:
            band = pol.band
            if pol.per_request:
                counts[band] += sum(len(self._requests[rid].ckpts) for rid in ids)
                continue
            first, end = table.first[band][slots], table.rowlen[band][slots]
            counts[band] -= int((np.minimum(shared, end) - np.minimum(first, shared)).clip(0)
                                .sum())
            if pol.windowed:
                counts[band] += sum(len(self._requests[rid].kept.get(band, ())) for rid in ids)
        return tuple(counts)

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
            ``ceil(L / P)`` pages). A gather of the request table's rows and one
            ``translate``.

        Raises:
            InvalidDemandError: no band ``band`` in this chain, or a ``bool`` request id.
            UnknownRequestError: a request that holds no pages.
        """
        if isinstance(band, bool) or not isinstance(band, int | np.integer) \
                or not 0 <= band < self.geom.num_bands:
            raise InvalidDemandError(f"no band {band} in this chain")
        ids = tuple(rids)
        slots = self._known_slots(ids)
        table = self._table
        width = int(table.rowlen[band][slots].max()) if slots.size else 0
        vids = table.tables[band][slots, :width]
        if not physical or not vids.size:
            return vids
        if table.pads[band] >= 0:
            return self.chain.translate(band, vids)
        out = np.full(vids.shape, -1, dtype=np.int64)
        valid = vids >= 0
        out[valid] = self.chain.translate(band, vids[valid])
        return out

    # --- integrity -------------------------------------------------------------------------

    def audit(self) -> None:
        """Every bound page of the chain is held by exactly one request or the prefix cache,
        or is a null page; every shared page a request reads is the cache's.

        Raises:
            AuditError: a leaked page (bound, held by nobody) or a page held twice.
        """
        table = self._table
        held: list[list[int]] = [[] for _ in range(self.geom.num_bands)]
        shared: list[list[int]] = [[] for _ in range(self.geom.num_bands)]
        for facts in self._requests.values():
            slot = facts.slot
            h = int(table.shared[slot])
            for pol in self.geom.policies:
                first = int(table.first[pol.band, slot])
                for i, v in enumerate(table.live(pol.band, slot).tolist(), first):
                    (shared if i < h and not pol.per_request else held)[pol.band].append(v)
            self._glue.kept_pages(facts, held)
        cached = self._glue.held_pages()
        for band in range(self.geom.num_bands):
            self._audit_band(band, held[band], shared[band],
                             cached[band] if cached is not None else [])
        self._glue.audit(self._requests)

    def _audit_band(self, band: int, held: list[int], shared: list[int],
                    in_cache: list[int]) -> None:
        """One band of :meth:`audit`: requests' own pages, the cache's, the null pages."""
        if len(set(held)) != len(held):
            raise AuditError(f"band {band}: a page is held by two requests")
        owned = set(in_cache)
        if len(owned) != len(in_cache) or owned & set(held):
            raise AuditError(f"band {band}: a page held twice by the cache or by the cache "
                             "and a request")
        if not owned.issuperset(shared):
            raise AuditError(f"band {band}: a request uses a shared page the cache does not "
                             "hold")
        reserved = self.chain.layout.bands[band].reserved_pages
        total = len(held) + len(in_cache)
        bound = self.chain.bound_pages(band)
        if bound != total + reserved:
            raise AuditError(f"band {band}: {bound} pages bound, {len(held)} held by "
                             f"requests + {len(in_cache)} by the cache + {reserved} null: "
                             f"{bound - total - reserved} leaked")
