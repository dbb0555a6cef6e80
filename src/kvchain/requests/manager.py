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

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.cache.radix import PrefixCache
from kvchain.errors import (
    ForgedQuoteError,
    InvalidDemandError,
    ReservedPageError,
    UnknownRequestError,
)
from kvchain.requests.audit import Audit
from kvchain.requests.batch import DecodeBatch, batch_ids, check_demands
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand
from kvchain.requests.lookup import SlotIndex
from kvchain.requests.reads import Reads
from kvchain.requests.speculative import Speculation
from kvchain.requests.suspend import HostSide, Suspended, Suspensions
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts, RequestView


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
        pads = []
        for band in range(self.geom.num_bands):
            try:
                pads.append(chain.null_page(band))
            except ReservedPageError:
                pads.append(-1)
        self._table = RequestTable(self.geom.policies, pads)
        self._requests: dict[int, CacheFacts] = {}
        index = SlotIndex(self._table)  # request ids -> slots, the last batch's kept
        self._lookup = index.lookup
        self._slots_of = index.slots_of
        self._known_lookup = index.known_lookup
        self._known_slots = index.known_slots
        self._checked_slots = index.checked_slots
        self._zero_demand = Demand.zeros(self.geom.num_bands)
        # pages per band -> the one Demand of those pages, shared by the decode batches'
        # rows: interning of immutable values (a Demand is a frozen value compared by its
        # pages, so which instance a row gets never changes a result), bounded by
        # clearing it past 4,096 distinct rows
        self._demand_memo: dict[tuple[int, ...], Demand] = {}
        self._glue = CacheGlue(chain, cache, self.geom, self._table)
        self.cache = cache
        self.audits = Audit(self)  # the page and rollback audits
        self.reads = Reads(self)  # page and block tables, pages per band
        self.speculation = Speculation(self)  # verify of speculative steps
        self.suspensions = Suspensions(self)  # requests suspended to host
        self._suspended = self.suspensions.records  # the one record (rid ->), read here

    @property
    def glue(self) -> CacheGlue:
        """The prefix cache's part (:class:`CacheGlue`), whose counters the simulator
        reports: ``cow_state_copies``, ``cow_bytes``, ``checkpoints_saved``,
        ``junctions_saved``, ``prompts_inserted``, ``chunk_inserts``."""
        return self._glue

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

    def _zero(self) -> Demand:
        """The empty demand of this chain's bands (one shared immutable value)."""
        return self._zero_demand

    # --- retraction by host copy (:class:`Suspensions`; the scheduler's calls) -------------

    def suspend(self, rid: int, host: HostSide) -> Suspended:
        """:meth:`Suspensions.suspend` (its errors)."""
        return self.suspensions.suspend(rid, host)

    def suspend_bytes(self, rid: int) -> int:
        """:meth:`Suspensions.suspend_bytes`."""
        return self.suspensions.suspend_bytes(rid)

    def resume_demand(self, rid: int) -> Demand:
        """:meth:`Suspensions.resume_demand` (its errors)."""
        return self.suspensions.resume_demand(rid)

    def audit_host(self, host: HostSide) -> None:
        """:meth:`Suspensions.audit` (its errors)."""
        self.suspensions.audit(host)

    def _check_resumes(self, resumes: Sequence[int], ids: tuple[int, ...]
                       ) -> tuple[Suspended, ...]:
        return self.suspensions.check_resumes(resumes, ids)

    def _restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        self.suspensions.restore(sus, vids)

    def shared_by_others(self, rid: int) -> int:
        """Full pages of ``rid``'s prefix-cache pages that another running request also
        reads (locks): what a suspension to host would copy and its resume hold as a second,
        private copy (:mod:`kvchain.requests.suspend`). 0 if it holds nothing or no lock."""
        facts = self._requests.get(rid)
        return self._glue.shared_by_others(rid, facts) if facts is not None else 0

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
        grant = self.chain.take(taken, quote)
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
        """:meth:`Speculation.verify <kvchain.requests.speculative.Speculation.verify>`:
        settle a speculative step (rollback, then the commit of the accepted tokens; its
        errors). Returns pages released."""
        return self.speculation.verify(rids, accepted, drafts)

    def audit_settled(self, rids: Iterable[int]) -> None:
        """:meth:`Audit.settled <kvchain.requests.audit.Audit.settled>`: what
        :meth:`verify` leaves, for requests ``rids`` (raises AuditError)."""
        self.audits.settled(rids)

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

    # --- kernels (:class:`Reads`) ------------------------------------------------------------

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """:meth:`Reads.page_table <kvchain.requests.reads.Reads.page_table>`: ``rid``'s
        virtual page ids in ``band``, token order (int64 ``[pages]``; its errors)."""
        return self.reads.page_table(rid, band)

    # --- integrity (:class:`Audit`) ---------------------------------------------------------

    def audit(self) -> None:
        """:meth:`Audit.pages <kvchain.requests.audit.Audit.pages>`: every bound page held
        once (a request, the cache or a null page; raises AuditError)."""
        self.audits.pages()
