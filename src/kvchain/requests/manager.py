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
from typing import Any

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.cache.radix import PrefixCache
from kvchain.errors import (
    ForgedQuoteError,
    InvalidDemandError,
    ReservedPageError,
    StalePlanError,
)
from kvchain.requests import table as table_module
from kvchain.requests.attach import Attach
from kvchain.requests.audit import Audit
from kvchain.requests.batch import DecodeBatch, batch_ids, check_demands, distinct_rows, request_ids
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.commits import Commits, check_tail_strategy
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand, request_demands
from kvchain.requests.lookup import SlotLookup
from kvchain.requests.plan import StepPlan
from kvchain.requests.reads import Reads
from kvchain.requests.rows import Rows
from kvchain.requests.speculative import Speculation
from kvchain.requests.suspend import HostSide, Suspended, Suspensions
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts, RequestView

#: plans a manager remembers as its own (:meth:`KVManager._issue`): a step builds one or
#: two (the decode check's batch, the step's plan), a retried step a few more
_ISSUED = 16


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
        keep_window_tail: the window-tail release strategy: release out-of-window pages
            only when the decode check reclaims them (:meth:`reclaim_window_pages`) or
            the request ends, not at every commit (engines that keep window pages until
            they need the room; :class:`~kvchain.requests.commits.Commits`).

    The class is the facade: the commits and releases are :attr:`commits`', the hits
    :attr:`attachments`', the read views :attr:`reads`', the verify :attr:`speculation`'s,
    the suspensions :attr:`suspensions`', the audits :attr:`audits`' (each built here over
    the rows, the geometry, the chain and the glue, never the manager).

    Raises:
        ConfigError: a prefix cache on an allocator without an evictor hook, or with
            ``keep_window_tail``; ``spec_tokens`` not an int >= 0.
    """

    def __init__(self, chain: Allocator, cache: PrefixCache | None = None,
                 spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.CHECKPOINTS,
                 keep_window_tail: bool = False) -> None:
        check_tail_strategy(cache is not None, keep_window_tail)  # before any change
        self.chain = chain
        self.geom = RequestGeometry.of(chain.layout, spec_tokens, rollback)
        pads = []
        for band in range(self.geom.num_bands):
            try:
                pads.append(chain.null_page(band))
            except ReservedPageError:
                pads.append(-1)
        self._table = RequestTable(self.geom.policies, pads)
        rows = self._rows = Rows(self._table)  # the requests' facts by id, over the table
        self._requests: dict[int, CacheFacts] = rows.facts
        index = rows.index  # request ids -> slots, the last batch's kept
        self._lookup = index.lookup
        self._slots_of = index.slots_of
        self._known_lookup = index.known_lookup
        self._known_slots = index.known_slots
        self._checked_slots = index.checked_slots
        self._zero_demand = Demand.zeros(self.geom.num_bands)
        # the needs of a plan without a non-empty row: one read-only [0, bands] array
        self._no_needs = np.zeros((0, self.geom.num_bands), dtype=np.int64)
        self._no_needs.setflags(write=False)
        # pages per band -> the one Demand of those pages, shared by the decode batches'
        # rows: interning of immutable values (a Demand is a frozen value compared by its
        # pages, so which instance a row gets never changes a result), bounded by
        # clearing it past 4,096 distinct rows
        self._demand_memo: dict[tuple[int, ...], Demand] = {}
        self._issued: dict[int, StepPlan] = {}  # the last plans built here (_issue)
        self._glue = glue = CacheGlue(chain, cache, self.geom, self._table)
        self.cache = cache
        # the collaborators get what they read (rows, geometry, chain, glue), and the
        # manager's own steps they call as callables, looked up at each call
        self.reads = Reads(rows, self.geom, chain)  # page and block tables, pages per band
        self.commits = Commits(rows, self.geom, chain, glue, self._uncovered,
                               keep_window_tail)  # commits, window-tail release, free
        self.suspensions = Suspensions(  # requests suspended to host
            rows, self.reads, lambda rid: self.free(rid, insert=False),
            lambda rid, quote: self.allocate([], None, quote, resumes=(rid,)))
        self._suspended = self.suspensions.records  # the one record (rid ->), read here
        self.attachments = Attach(rows, glue, self._suspended)  # prefix-cache hits by id
        self.speculation = Speculation(  # verify of speculative steps
            rows, self.geom, chain, glue, lambda rid, n: self.commit(rid, n),
            self._release_fronts, batched=not keep_window_tail)
        self.audits = Audit(rows, self.geom, chain, glue)  # the page and rollback audits

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
        """:meth:`Rows.of <kvchain.requests.rows.Rows.of>` (UnknownRequestError)."""
        return self._rows.of(rid)

    def pages(self, rid: int) -> RequestView:
        """A read-only view of what request ``rid`` holds.

        Raises:
            UnknownRequestError: it holds nothing.
        """
        return RequestView(self._table, self._rows.of(rid))

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
            held, tokens = (sus.held, sus.tokens) if sus is not None else (NOTHING_HELD, 0)
            return request_demand(self.geom, held, tokens, extend, headroom, headroom_chunk,
                                  horizon=horizon)
        slot = facts.slot
        return request_demand(self.geom, self._table.held(slot), int(self._table.tokens[slot]),
                              extend, headroom, headroom_chunk, facts.points,
                              horizon, facts.gap)

    @property
    def num_requests(self) -> int:
        """Requests holding pages."""
        return len(self._requests)

    # --- prefix cache (:class:`CacheGlue`, :class:`Attach`) ----------------------------------

    def points_for(self, keys: Sequence[int] | None, after: int = 0,
                   junction: int = 0) -> tuple[int, ...]:
        """:meth:`CacheGlue.points_for`: resume points a request with these keys saves."""
        return self._glue.points_for(keys, after, junction)

    def cached_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """:meth:`CacheGlue.cached_tokens`: tokens a prompt would hit now (a pure match)."""
        return self._glue.cached_tokens(keys, prompt_tokens)

    def chunk_cut(self, rid: int) -> int:
        """:meth:`Attach.chunk_cut <kvchain.requests.attach.Attach.chunk_cut>`."""
        return self.attachments.chunk_cut(rid)

    def attach(self, rid: int, keys: Sequence[int], prompt_tokens: int,
               save_points: bool = True, max_gap: int = 0) -> int:
        """:meth:`Attach.attach <kvchain.requests.attach.Attach.attach>` (hit tokens)."""
        return self.attachments.attach(rid, keys, prompt_tokens, save_points, max_gap)

    def recompute_tokens(self, rid: int) -> int:
        """:meth:`Attach.recompute_tokens <kvchain.requests.attach.Attach.recompute_tokens>`."""
        return self.attachments.recompute_tokens(rid)

    def partial_tokens(self, rid: int) -> int:
        """:meth:`CacheGlue.partial_tokens`: hit tokens ``rid`` shares but recomputes."""
        return self._glue.partial_tokens(rid)

    def detach(self, rid: int) -> None:
        """:meth:`Attach.detach <kvchain.requests.attach.Attach.detach>` (its errors)."""
        self.attachments.detach(rid)

    def touch(self, rid: int) -> None:
        """:meth:`Attach.touch <kvchain.requests.attach.Attach.touch>`."""
        self.attachments.touch(rid)

    def hit_holds(self, rid: int) -> Demand:
        """:meth:`Attach.hit_holds <kvchain.requests.attach.Attach.hit_holds>`."""
        return self.attachments.hit_holds(rid)

    def hit_tokens(self, rid: int) -> int:
        """:meth:`CacheGlue.hit_tokens`: tokens of ``rid`` served by the cache."""
        return self._glue.hit_tokens(rid)

    def shared_by_others(self, rid: int) -> int:
        """:meth:`Attach.shared_by_others <kvchain.requests.attach.Attach.shared_by_others>`."""
        return self.attachments.shared_by_others(rid)

    # --- rows ------------------------------------------------------------------------------

    def _register(self, rid: int) -> CacheFacts:
        """:meth:`Rows.register <kvchain.requests.rows.Rows.register>`."""
        return self._rows.register(rid)

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

    # --- decode demands ----------------------------------------------------------------------

    def demand_pair(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
                    horizon: int = 0) -> tuple[Demand, Demand]:
        """``(self.demand(rid, extend), self.demand(rid, extend, headroom, headroom_chunk,
        horizon))`` in one demand computation (:func:`request_demands`): what a chunk takes
        and what admission reserves for it. A request that holds nothing (and is not
        suspended) is priced from nothing held.

        Raises:
            InvalidDemandError: as :func:`request_demand`.
        """
        facts = self._requests.get(rid)
        if facts is None:
            sus = self._suspended.get(rid)
            held, tokens = (sus.held, sus.tokens) if sus is not None else (NOTHING_HELD, 0)
            return request_demands(self.geom, held, tokens, extend, headroom, headroom_chunk,
                                   horizon=horizon)
        slot = facts.slot
        return request_demands(self.geom, self._table.held(slot),
                               int(self._table.tokens[slot]), extend, headroom,
                               headroom_chunk, facts.points, horizon, facts.gap)

    def decode_demands(self, rids: Sequence[int], drafts: int = 0) -> DecodeBatch:
        """``[self.demand(rid, 1 + drafts) for rid in rids]`` (equal values), for a decode
        batch (``drafts = k > 0``: a speculative step, ``1 + k`` tokens each: the token
        sampled last and ``k`` drafts; its window bands hold ``W + k`` tokens).

        Vectorized over the batch (:meth:`RequestTable.decode_rows`: the band policies'
        formulas over the gathered rows); a :class:`Demand` is built only for the requests
        that need a page (about one in ``P`` per band per step; the rest share one empty
        demand). With a prefix cache the same (no kept window tail is reserved: each goes to
        the cache at the commit of the chunk that reaches its point); a request whose next
        token reaches one of its resume points (a checkpoint slot more: one still in its
        prefill) sends the batch through :meth:`demand`.

        Returns:
            A :class:`DecodeBatch` (the :class:`~kvchain.requests.plan.StepPlan` of the
            batch, unpriced: an immutable sequence of demands aligned with ``rids``, with
            their ``[rows, bands]`` matrix and total, and the rows' state it was computed
            on) that :meth:`plan` / :meth:`allocate` of ``(rid, 1 + drafts)`` for the same
            ``rids`` take as computed, and :meth:`apply` takes as it is.

        Raises:
            InvalidDemandError: ``drafts`` not an int >= 0, ``rids`` not a sequence of int
                ids (:func:`~kvchain.requests.batch.request_ids`), or one named twice.
            UnknownRequestError: one that holds no pages (its first tokens are a chunk's).
        """
        if type(drafts) is not int or drafts < 0:
            raise InvalidDemandError(f"drafts must be an int >= 0, got {drafts!r}")
        ids = request_ids(rids, "decode_demands' rids")
        extend = 1 + drafts
        lookup = distinct_rows(self._known_lookup(ids), "decode batch")
        if self._glue.reaches_point(ids, self._requests):
            demands = [self.demand(rid, extend) for rid in ids]
            empty = self._zero().pages
            at = [i for i, d in enumerate(demands) if d.pages != empty]
            return self._decode_value(lookup, drafts, demands, at, np.array(
                [demands[i].pages for i in at], dtype=np.int64))
        slots = lookup.slots
        zero = self._zero()
        out = [zero] * len(ids)
        table = self._table
        tokens = table.tokens[slots]  # the rows' tokens: the check's and the plan's basis
        # page boundary within the step's tokens
        check = ((tokens + drafts if drafts else tokens) >= table.need_at[slots]).nonzero()[0]
        if not check.size:
            return self._decode_value(lookup, drafts, out, (), tokens=tokens)
        needs, keys, matrix = table.decode_rows(slots[check], extend)
        if not needs:
            return self._decode_value(lookup, drafts, out, (), tokens=tokens)
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
        return self._decode_value(lookup, drafts, out, at, matrix, tokens)

    def _decode_value(self, lookup: SlotLookup, drafts: int, demands: Sequence[Demand],
                      nonzero: Sequence[int], needs: np.ndarray | None = None,
                      tokens: np.ndarray | None = None) -> StepPlan:
        """The decode batch's plan over ``lookup``'s rows, with the rows' token counts
        (``tokens``, int64 ``[rows]``, a fresh gather the plan keeps; ``None``: read now)
        and the chain's epoch it was computed on."""
        if needs is None or not len(nonzero):
            needs = self._no_needs
            total: Demand = self._zero()
        else:
            total = Demand(tuple(needs.sum(axis=0).tolist()))
        return self._issue(StepPlan.frozen(
            self, lookup.ids, drafts, tuple(demands), tuple(nonzero), needs, total=total,
            version=lookup.version,
            at=self._table.tokens[lookup.slots] if tokens is None else tokens,
            epoch=self.chain.epoch))

    def _issue(self, plan: StepPlan) -> StepPlan:
        """Record ``plan`` as built here (the plan object itself is the token, as a quote
        is the chain's: a copy with other fields, ``dataclasses.replace``, is not one);
        the last :data:`_ISSUED` are kept."""
        issued = self._issued
        issued[id(plan)] = plan
        if len(issued) > _ISSUED:
            del issued[next(iter(issued))]
        return plan

    def _issued_here(self, plan: object) -> bool:
        """Whether ``plan`` is one of the plans this manager issued (identity)."""
        return self._issued.get(id(plan)) is plan

    # --- the step plan: built and validated once, applied as it is -------------------------

    def plan(self, batch: Sequence[tuple[int, int]] | StepPlan,
             demands: Sequence[Demand] | None = None, resumes: Sequence[int] = (),
             quote: Quote | None = None) -> StepPlan:
        """The one immutable :class:`StepPlan` of a step's take: validated here, once; its
        demands computed once (or taken from the caller); its take priced once.

        Args:
            batch: ``(request id, tokens to compute)`` pairs (a prefill chunk, or
                ``1 + drafts`` for a decode); each request at most once. Or a decode
                batch from :meth:`decode_demands` itself (its rows, ``1 + drafts`` tokens
                each): one this manager issued on the chain and table as they are is
                checked for distinct int ids, none suspended, and priced as it is;
                another is read as its pairs and its demands.
            demands: the rows' demands if the caller just computed them (same order, no
                change in between): a plan of this manager (:meth:`decode_demands`) for
                the same rows and tokens, still current, is taken as it is; any other
                sequence of :class:`Demand` (a list from :meth:`demand`, a value from
                another manager) is validated once here; ``None``: computed here.
            resumes: suspended requests to load back in the same take (none of them in
                ``batch``; see :meth:`allocate`).
            quote: the chain's price of the take (the rows' total plus the resumes'
                load-backs), if the caller has it; priced here when absent or priced
                before the chain's epoch moved (an empty take is not priced).

        Returns:
            The plan (``quote`` set unless the take is empty).

        Raises:
            InvalidDemandError: a request listed twice, an entry not a pair of ints, a
                negative or non-integer token count, a request suspended to host, demands
                that do not match the batch, a resume not suspended, named twice or in
                the batch. BufferArgumentError: a resume's host slots no longer held.
                ForgedQuoteError: ``quote`` is not a Quote. Nothing changed on any.
        """
        if quote is not None and not isinstance(quote, Quote):
            raise ForgedQuoteError(f"expected a Quote from the allocator's price, got "
                                   f"{type(quote).__name__}")
        if isinstance(batch, StepPlan):
            if demands is None and not resumes and self._fresh_batch(batch):
                return self._priced(batch, quote)
            demands, batch = batch, list(zip(batch.rids, batch.tokens, strict=True))
        ids, extends, lookup = self._checked_rows(batch)
        rows, total, drafts, at = self._batch_demand(ids, extends, lookup, demands)
        loads = self._check_resumes(resumes, ids) if resumes else ()
        load = None
        for sus in loads:
            load = sus.demand if load is None else load.plus(sus.demand)
        taken = total if load is None else total.plus(load)
        if taken.is_empty:
            quote = None
        elif quote is None or quote.before.epoch != self.chain.epoch:
            quote = self.chain.price(taken)  # the take's token: the step's one price
        # (a price may build the epoch's snapshot: with a prefix cache, a new epoch; the
        # plan holds from the chain the quote priced)
        return self._issue(StepPlan.frozen(
            self, ids, drafts, rows[0], rows[1], rows[2], total=total, extends=extends,
            resumes=tuple(s.rid for s in loads),
            loads=load, quote=quote,
            version=lookup.version, at=at, epoch=self.chain.epoch))

    def _checked_rows(self, batch: Sequence[tuple[int, int]],
                      ) -> tuple[tuple[int, ...], tuple[int, ...], SlotLookup]:
        """A batch's request ids, token counts and slot lookup, checked: pairs of ints,
        each request once, none suspended to host.

        Raises:
            InvalidDemandError: see :meth:`plan`.
        """
        ids, extends = batch_ids(batch)
        lookup = self._lookup(ids, ints=True)  # batch_ids: every id is an int
        if not lookup.unique:
            raise InvalidDemandError("a request appears twice in one allocation batch")
        if self._suspended and not self._suspended.keys().isdisjoint(ids):
            raise InvalidDemandError("a request suspended to host computes nothing before "
                                     "its resume")
        return ids, extends, lookup

    def _fresh_batch(self, batch: StepPlan) -> bool:
        """Whether ``batch``, handed to :meth:`plan` as the batch itself, is a decode batch
        this manager issued on the chain and table as they are, whose rows are distinct
        ints, none suspended (then it is its own plan's rows: the one validation)."""
        if not (self._issued_here(batch) and batch.at is not None and not batch.resumes
                and batch.epoch == self.chain.epoch
                and batch.version == self._table.version):
            return False
        ids = batch.rids
        lookup = self._lookup(ids)
        # the plan's rows are its lookup's own tuple (decode_demands): its int check is
        # kept with it
        if not (lookup.ints if lookup.ids is ids else set(map(type, ids)) <= {int}):
            return False
        return lookup.unique and (not self._suspended
                                  or self._suspended.keys().isdisjoint(ids))

    def _priced(self, batch: StepPlan, quote: Quote | None) -> StepPlan:
        """``batch`` as a plan priced once (``quote`` kept if current), built against the
        chain after its price."""
        taken = batch.total
        if taken.is_empty:
            return batch
        if quote is None or quote.before.epoch != self.chain.epoch:
            quote = self.chain.price(taken)
        return self._issue(batch.priced(quote, self.chain.epoch))

    def apply(self, plan: StepPlan) -> Demand:
        """Realize ``plan`` in one chain take (none when it takes nothing), trusting it: no
        second validation, no demand computed again while the chain's epoch is the one
        it was built at. Its rows get their pages (band by band in row order), its new
        requests their rows, its resumes their pages back (:meth:`allocate`).

        If the chain's epoch moved since the build (a prefix-cache lock, another take),
        the rows' demands are checked against the rows now, and a plan priced before is
        priced again by the take, as ``Chain.take`` does.

        Returns:
            The demand taken (:attr:`StepPlan.taken`).

        Raises:
            StalePlanError: ``plan`` is not a plan this manager built, or its rows changed
                since (a token committed, a request bound or unbound, a row's demand
                moved), or a resume is no longer suspended.
            BufferArgumentError: a resume whose host slots are no longer held.
            ForgedQuoteError, StaleQuoteError: its quote is not the chain's for its take.
            CapacityError: the take does not fit.

            On every error the chain and every request are as before.
        """
        lookup = self._current(plan)
        loads = self._current_resumes(plan)
        taken = plan.taken
        ids = plan.rids
        missing = ([] if lookup.known
                   else [ids[i] for i in (lookup.slots == 0).nonzero()[0].tolist()])
        if taken.is_empty:  # every token on pages already held (most decode steps)
            for rid in missing:
                self._register(rid)
            return taken
        quote = plan.quote
        if quote is not None and quote.before.epoch != self.chain.epoch:
            quote = None  # priced before the chain changed: the take prices it again
        slots = lookup.slots
        grant = self.chain.take(taken, quote, self._glue.copies(
            ids, slots, plan.nonzero, plan.needs, self._requests))
        if missing:
            for rid in missing:
                self._register(rid)
            slots = self._slots_of(ids)  # the new requests' slots (rows empty)
        pages = self._restore_all(loads, plan.total, grant.pages)
        if not plan.total.is_empty:
            self._distribute(pages, ids, plan.tokens, slots, plan.nonzero, plan.needs)
        return taken

    def _current(self, plan: StepPlan) -> SlotLookup:
        """The slot lookup of ``plan``'s rows, if it is this manager's and its rows are as
        at its build: their tokens, and, once the chain's epoch or the table's slot
        version moved (a take, a release, a cache lock, a request bound or unbound), their
        demands (computed again and compared: the slow path).

        Raises:
            StalePlanError: it is not (nothing changed).
        """
        if not self._issued_here(plan) or plan.at is None:
            raise StalePlanError("a step plan is applied by the manager that built it "
                                 "(the value it issued, not a copy)")
        table = self._table
        lookup = self._lookup(plan.rids, ints=True)  # built from checked ids
        if not (table.tokens[lookup.slots] == plan.at).all():  # same length: same rows
            raise StalePlanError("a request's tokens moved since the plan was built")
        if (plan.epoch != self.chain.epoch or plan.version != table.version) and any(
                self.demand(rid, n) != d
                for rid, n, d in zip(plan.rids, plan.tokens, plan.demands, strict=True)):
            raise StalePlanError("a request's pages changed since the plan was built")
        return lookup

    def _current_resumes(self, plan: StepPlan) -> tuple[Suspended, ...]:
        """The records of ``plan``'s resumes, each still suspended with its host slots held.

        Raises:
            StalePlanError: one is no longer suspended. BufferArgumentError: its host
                slots are gone.
        """
        out = []
        for rid in plan.resumes:
            sus = self._suspended.get(rid)
            if sus is None:
                raise StalePlanError(f"request {rid} is no longer suspended to host")
            sus.check_held()
            out.append(sus)
        return tuple(out)

    def _restore_all(self, loads: Sequence[Suspended], total: Demand,
                     pages: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        """Give each resume its cut of a take's pages (the rows' pages first, then each
        resume's, band by band) and return the rows' pages."""
        if not loads:
            return pages
        cut = list(total.pages)
        for sus in loads:
            self._restore(sus, [pages[b][cut[b]:cut[b] + n]
                                for b, n in enumerate(sus.demand.pages)])
            cut = [c + n for c, n in zip(cut, sus.demand.pages, strict=True)]
        return tuple(p[:n] for p, n in zip(pages, total.pages, strict=True))

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, batch: Sequence[tuple[int, int]],
                 demands: Sequence[Demand] | None = None, quote: Quote | None = None,
                 resumes: Sequence[int] = ()) -> Demand:
        """``apply(plan(batch, demands, resumes, quote))``: take the pages a batch needs to
        compute its tokens, in one chain take (none when the batch needs no page: an empty
        take binds nothing), together with the load-back of the suspended requests
        ``resumes`` (:meth:`suspend`): the take's demand is the batch's plus each resume's
        :attr:`Suspended.demand`, so one quote prices both.

        Args:
            batch: ``(request id, tokens to compute)`` pairs (a prefill chunk, or 1 for a
                decode); each request at most once.
            demands: the batch's demands if the caller just computed them (:meth:`plan`).
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
            InvalidDemandError, BufferArgumentError, ForgedQuoteError: as :meth:`plan`.
            ForgedQuoteError: ``quote`` was not issued by the allocator for this demand.
            CapacityError: the batch does not fit.

            On every error the chain and every request are as before.
        """
        return self.apply(self.plan(batch, demands, resumes, quote))

    def _batch_demand(self, ids: tuple[int, ...], extends: tuple[int, ...],
                      lookup: SlotLookup, demands: Sequence[Demand] | None,
                      ) -> tuple[tuple[tuple[Demand, ...], tuple[int, ...], np.ndarray], Demand,
                                 int, np.ndarray]:
        """The rows' demands, the positions of the non-empty ones and their ``[len(nonzero),
        bands]`` matrix (computed when ``demands`` is ``None``), their total, the drafts
        of the decode batch they came from (0 otherwise) and the rows' tokens they were
        computed at (now, or the reused batch's).

        Raises:
            InvalidDemandError: demands that do not match the batch.
        """
        if (self._issued_here(demands) and isinstance(demands, StepPlan)
                and demands.rids == ids and demands.tokens == extends
                and demands.version == lookup.version and demands.at is not None
                and demands.epoch == self.chain.epoch):
            # computed by this manager for these very rows on this chain: the plan keeps
            # the rows' tokens they were computed at, which apply compares with the rows'
            # tokens then (a row that moved since makes the plan stale there)
            return ((demands.demands, demands.nonzero, demands.needs), demands.total,
                    demands.drafts, demands.at)
        tokens = self._table.tokens[lookup.slots]
        if demands is None:
            demands = [self.demand(rid, extend) for rid, extend in zip(ids, extends,
                                                                      strict=True)]
        elif len(demands) != len(ids):
            raise InvalidDemandError(f"{len(demands)} demands for a batch of {len(ids)}")
        nb = self.geom.num_bands
        check_demands(ids, extends, demands, nb)
        zero = (0,) * nb
        nonzero = tuple(i for i, d in enumerate(demands) if d.pages != zero)
        if not nonzero:
            return ((tuple(demands), (), np.zeros((0, nb), dtype=np.int64)), self._zero(), 0,
                    tokens)
        matrix = np.array([demands[i].pages for i in nonzero], dtype=np.int64)
        total = Demand(tuple(matrix.sum(axis=0).tolist()))
        return (tuple(demands), nonzero, matrix), total, 0, tokens

    def _distribute(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                    extends: tuple[int, ...], slots: np.ndarray, nonzero: Sequence[int],
                    matrix: np.ndarray) -> None:
        """Hand a take's pages to the requests at ``nonzero`` (batch positions, ascending;
        ``matrix`` their demands, one row each), band by band in batch order (the order
        the take's pages are cut in), into their table rows: a request's first pages of a
        window band start at its window's first page. Up to ``SCALAR_ROWS`` rows (a
        small batch's decode step) row by row over ints (``RequestTable.put_row``), more
        over numpy columns (``RequestTable.append``): a numpy call costs about 0.5-1 us
        whatever its length."""
        table = self._table
        at = np.asarray(nonzero, dtype=np.int64)
        slots_at = slots[at]
        if len(nonzero) <= table_module.SCALAR_ROWS:
            self._distribute_rows(pages, ids, extends, slots_at, nonzero, matrix)
            table.refresh_need(slots_at)
            return
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
            table.append(band, rows, table.start_columns(pol, rows), counts, vids)
        table.refresh_need(slots_at)

    def _distribute_rows(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                         extends: tuple[int, ...], slots_at: np.ndarray,
                         nonzero: Sequence[int], matrix: np.ndarray) -> None:
        """:meth:`_distribute` of a few rows (``slots_at``: the rows of ``nonzero``), row
        by row over Python ints, the same hand-out (state slots: ``take_slots``)."""
        table = self._table
        rows, needs = slots_at.tolist(), matrix.tolist()
        for pol in self.geom.policies:
            band = pol.band
            vids = pages[band]
            if not vids:
                continue
            got = [j for j, need in enumerate(needs) if need[band]]
            if pol.per_request:
                self._glue.take_slots(band, slots_at[got], [ids[nonzero[j]] for j in got],
                                      [extends[nonzero[j]] for j in got],
                                      [needs[j][band] for j in got], vids, self._requests)
                continue
            cut = 0
            for j in got:
                slot, n = rows[j], needs[j][band]
                start = table.start_column(pol, slot)
                table.put_row(band, slot, start, vids[cut:cut + n])
                cut += n

    # --- commits (:class:`Commits`) ----------------------------------------------------------

    def commit(self, rid: int, tokens: int) -> int:
        """:meth:`Commits.commit <kvchain.requests.commits.Commits.commit>` (its errors)."""
        return self.commits.commit(rid, tokens)

    def _uncovered(self, slots: int | np.ndarray, tokens: int | np.ndarray) -> Any:
        """Whether a page band's row ends before ``tokens``: a full band holds fewer pages
        than ``tokens`` need, or a window / chunked-local band's last page held (its row
        is indexed by token page) ends before token ``tokens``. One row (``slots`` an int:
        a bool) or many (int64 ``[n]`` rows and tokens: a bool ``[n]`` mask)."""
        rowlen = self._table.rowlen
        short: Any = False
        for pol in self.geom.policies:
            if not pol.per_request:
                short = short | (rowlen[pol.band][slots] * pol.page_size < tokens)
        return short

    def commit_decodes(self, rids: Sequence[int]) -> int:
        """:meth:`commit` of one token for each of ``rids`` (a decode batch), with their
        window-tail pages released in one ``chain.release`` call per window band for the
        whole batch.

        Vectorized over the batch, with the prefix cache on or off: the token counts move
        in the table, the pages whose window start crossed a page boundary are found by
        array arithmetic and gathered from the rows (those below a request's shared pages
        are the cache's: unpinned, not released). A manager built with
        ``keep_window_tail`` (an engine that keeps window pages until it needs them) and a
        request whose prompt is not in the cache yet (its commit may insert it) get
        :meth:`commit` once per request instead.

        Returns:
            Window pages released.

        Raises:
            UnknownRequestError / InvalidDemandError: as :meth:`commit`, checked for every
                request before any changes; InvalidDemandError too for a request named
                twice (one token each, as :meth:`allocate`) or ``rids`` not a sequence of
                int ids.
        """
        ids = request_ids(rids, "commit_decodes' rids")
        lookup = distinct_rows(self._known_lookup(ids), "decode commit")
        slots = lookup.slots
        table = self._table
        unique = lookup.unique
        if unique:
            n = table.tokens[slots] + 1
        else:  # a request named c times commits c tokens: check its last one
            _, inverse, counts = np.unique(slots, return_inverse=True, return_counts=True)
            n = table.tokens[slots] + counts[inverse]
        short = self._uncovered(slots, n)
        if short.any():
            rid = ids[int(short.nonzero()[0][0])]
            raise InvalidDemandError(f"request {rid}: 1 token not covered by its pages")
        # every request checked: the one-by-one paths below cannot fail half-way
        if (self.commits.keep_window_tail or not unique
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
        if at.size <= table_module.SCALAR_ROWS:  # a small batch's step: over the rows' ints
            got = self._front_columns(band, slots[at].tolist(), first[at].tolist(),
                                      keep_from[at].tolist())
            if got is None:
                return 0
            rows, cols = got
        else:
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
            table.first[band][s] = f + c
        vids = table.tables[band][rows, cols]
        table.tables[band][rows, cols] = table.pads[band]
        shared = table.shared[rows] if self._glue.cache is not None else None
        if shared is not None and shared.any():  # no cache: no row shares a page
            mine = cols >= shared
            self._glue.unpin_pages(band, vids[~mine])
            self.chain.release(band, vids[mine])
        else:
            self.chain.release(band, vids)
        return int(vids.size)

    def _front_columns(self, band: int, slots: list[int], first: list[int],
                       keep_from: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_release_fronts` of a few rows over ints: the ``(rows, cols)`` of their
        pages before ``keep_from`` (``min(keep_from, end) - first`` per row, int64), their
        first live pages moved past them; ``None`` when no row drops a page."""
        table = self._table
        rows: list[int] = []
        cols: list[int] = []
        for slot, f, k in zip(slots, first, keep_from, strict=True):
            c = min(k, int(table.rowlen[band, slot])) - f
            if c > 0:  # an empty row (end == first) drops nothing
                rows += [slot] * c
                cols += range(f, f + c)
                table.first[band, slot] = f + c
        if not rows:
            return None
        return np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)

    def verify(self, rids: Sequence[int], accepted: Sequence[int] | np.ndarray,
               drafts: int) -> int:
        """:meth:`Speculation.verify <kvchain.requests.speculative.Speculation.verify>`:
        settle a speculative step (its errors). Returns pages released."""
        return self.speculation.verify(rids, accepted, drafts)

    def audit_settled(self, rids: Iterable[int]) -> None:
        """:meth:`Audit.settled <kvchain.requests.audit.Audit.settled>` (AuditError)."""
        self.audits.settled(rids)

    def release_window_tail(self, rid: int) -> int:
        """:meth:`Commits.release_window_tail
        <kvchain.requests.commits.Commits.release_window_tail>` (its errors)."""
        return self.commits.release_window_tail(rid)

    def reclaim_window_pages(self, rids: Iterable[int]) -> int:
        """:meth:`Commits.reclaim_window_pages
        <kvchain.requests.commits.Commits.reclaim_window_pages>`."""
        return self.commits.reclaim_window_pages(rids)

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
        """:meth:`Commits.free <kvchain.requests.commits.Commits.free>` (its errors)."""
        return self.commits.free(rid, insert)

    # --- kernels (:class:`Reads`) ------------------------------------------------------------

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """:meth:`Reads.page_table <kvchain.requests.reads.Reads.page_table>` (its errors)."""
        return self.reads.page_table(rid, band)

    # --- integrity (:class:`Audit`) ---------------------------------------------------------

    def audit(self) -> None:
        """:meth:`Audit.pages <kvchain.requests.audit.Audit.pages>` (AuditError)."""
        self.audits.pages()
