"""The step path of the request layer: a step's demands, its one plan, the take that
realizes it, and the decode batch's commit (``kv.steps``, a :class:`StepPath`).

A scheduler step runs :meth:`StepPath.decode_demands` (the decode batch's demands, the
band policies' formulas over the gathered table rows), :meth:`StepPath.plan` (the one
immutable :class:`~kvchain.requests.plan.StepPlan`: validated and priced once),
:meth:`StepPath.apply` (one ``chain.take`` of the plan as it is, the grant handed to the
rows band by band) and :meth:`StepPath.commit_decodes` (the decode batch's tokens and its
window-tail release in one ``chain.release`` per window band). Runs of quiet decode steps
(the simulator's fast-forward) are :meth:`StepPath.decode_run` and
:meth:`StepPath.skip_decodes`.

Like the manager's other collaborators it is built over what it reads (the rows, the
geometry, the chain, the glue) and the manager's own steps it calls (``demand``,
``commit``, a suspension's checks and restore), as callables looked up at each call, so a
planted-defect subclass of the manager or a test's wrapper of ``kv.demand`` is seen here;
it never imports the manager.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import ForgedQuoteError, InvalidDemandError, StalePlanError
from kvchain.requests import table as table_module
from kvchain.requests.batch import (
    MAX_RUN_STEPS,
    DecodeBatch,
    batch_ids,
    check_count,
    check_demands,
    check_rid,
    distinct_rows,
    request_ids,
)
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand, request_demands
from kvchain.requests.lookup import SlotLookup
from kvchain.requests.plan import StepPlan
from kvchain.requests.rows import Rows
from kvchain.requests.suspend import Suspended

#: plans a step path remembers as its own (:meth:`StepPath._issue`): a step builds one or
#: two (the decode check's batch, the step's plan), a retried step a few more
_ISSUED = 16

#: ``demand(rid, extend) -> Demand``: the manager's demand of one request (its
#: :meth:`StepPath.demand`, looked up on the manager at each call)
DemandOf = Callable[[int, int], Demand]
#: ``commit(rid, tokens) -> window pages released``: the manager's commit of one request
CommitOne = Callable[[int, int], int]
#: ``check_resumes(resumes, ids) -> records``: the suspensions' check of a take's resumes
CheckResumes = Callable[[Sequence[int], tuple[int, ...]], tuple[Suspended, ...]]
#: ``restore(record, vids)``: a resume's pages handed back to its rows
Restore = Callable[[Suspended, Sequence[Sequence[int]]], None]


class StepPath:
    """The step path of one manager's requests (``kv.steps``): demands, the step plan, its
    take, the decode batch's commit, runs of quiet decode steps.

    Args:
        rows: the manager's requests and their table.
        geom: the chain's request geometry.
        chain: the allocator every take and release goes to.
        glue: the prefix cache's part (resume points, copies, state slots, unpins).
        suspended: request id -> its suspension record (the suspensions' one dict).
        demand: the manager's one-request demand (the slow paths: a batch reaching a
            resume point, a stale plan's rows, a batch without demands).
        commit: the manager's commit of one request (the one-by-one decode commit).
        check_resumes, restore: the suspensions' check of a take's resumes and the
            hand-back of a resume's pages.
        keep_window_tail: the manager's window-tail strategy (decode commits go one by
            one when it is set: :class:`~kvchain.requests.commits.Commits`).
    """

    def __init__(self, rows: Rows, geom: RequestGeometry, chain: Allocator, glue: CacheGlue,
                 suspended: Mapping[int, Suspended], demand: DemandOf, commit: CommitOne,
                 check_resumes: CheckResumes, restore: Restore,
                 keep_window_tail: bool = False) -> None:
        self._rows, self._geom, self._chain, self._glue = rows, geom, chain, glue
        self._table = rows.table
        self._requests = rows.facts
        self._suspended = suspended
        self._demand, self._commit = demand, commit
        self._check_resumes, self._restore = check_resumes, restore
        self._keep_window_tail = keep_window_tail
        index = rows.index  # request ids -> slots, the last batch's kept
        self._lookup = index.lookup
        self._slots_of = index.slots_of
        self._known_lookup = index.known_lookup
        self._checked_slots = index.checked_slots
        self._zero_demand = Demand.zeros(geom.num_bands)
        # the needs of a plan without a non-empty row: one read-only [0, bands] array
        self._no_needs = np.zeros((0, geom.num_bands), dtype=np.int64)
        self._no_needs.setflags(write=False)
        # pages per band -> the one Demand of those pages, shared by the decode batches'
        # rows: interning of immutable values (a Demand is a frozen value compared by its
        # pages, so which instance a row gets never changes a result), bounded by
        # clearing it past 4,096 distinct rows
        self._demand_memo: dict[tuple[int, ...], Demand] = {}
        self._issued: dict[int, StepPlan] = {}  # the last plans built here (_issue)
        # the page bands (full, window, local): the coverage check's rows
        self._page_bands = [pol.band for pol in geom.policies if not pol.per_request]

    # --- demands ---------------------------------------------------------------------------

    def demand(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
               horizon: int = 0) -> Demand:
        """:func:`request_demand` for ``rid`` at its current position (a request suspended
        to host: at its position once resumed, beyond the pages its resume loads back).

        Raises:
            InvalidDemandError: ``rid`` not an int id (:func:`check_rid`: a bool would
                alias request 0 or 1); as :func:`request_demand`.
        """
        held, tokens, points, gap = self._position(rid)
        return request_demand(self._geom, held, tokens, extend, headroom, headroom_chunk,
                              points, horizon, gap)

    def demand_pair(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
                    horizon: int = 0) -> tuple[Demand, Demand]:
        """``(self.demand(rid, extend), self.demand(rid, extend, headroom, headroom_chunk,
        horizon))`` in one demand computation (:func:`request_demands`): what a chunk takes
        and what admission reserves for it. A request that holds nothing (and is not
        suspended) is priced from nothing held.

        Raises:
            InvalidDemandError: ``rid`` not an int id (:func:`check_rid`: a bool would
                alias request 0 or 1); as :func:`request_demand`.
        """
        held, tokens, points, gap = self._position(rid)
        return request_demands(self._geom, held, tokens, extend, headroom, headroom_chunk,
                               points, horizon, gap)

    def _position(self, rid: int) -> tuple[HeldPages, int, Sequence[int], int]:
        """``(held pages, tokens, checkpoint points, recompute gap)`` of ``rid``, what its
        demand is priced from: its table row; a request suspended to host at its position
        once resumed; one unknown here from nothing held (no points, no gap).

        Raises:
            InvalidDemandError: ``rid`` not an int id (:func:`check_rid`).
        """
        check_rid(rid)
        facts = self._requests.get(rid)
        if facts is None:
            sus = self._suspended.get(rid)
            if sus is None:
                return NOTHING_HELD, 0, (), 0
            return sus.held, sus.tokens, (), 0
        slot = facts.slot
        return self._table.held(slot), int(self._table.tokens[slot]), facts.points, facts.gap

    def decode_demands(self, rids: Sequence[int], drafts: int = 0) -> DecodeBatch:
        """``[self._demand(rid, 1 + drafts) for rid in rids]`` (equal values), for a decode
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
            on) that :meth:`plan` / ``KVManager.allocate`` of ``(rid, 1 + drafts)`` for the same
            ``rids`` take as computed, and :meth:`apply` takes as it is.

        Raises:
            InvalidDemandError: ``drafts`` not an int in ``[0, k]`` (``k`` the manager's
                ``spec_tokens``: its window slack and state checkpoints are sized for at
                most ``k`` drafts), ``rids`` not a sequence of int ids
                (:func:`~kvchain.requests.batch.request_ids`), or one named twice.
            UnknownRequestError: one that holds no pages (its first tokens are a chunk's).
        """
        drafts = check_count(drafts, "drafts", 0, self._geom.spec_tokens)
        ids = request_ids(rids, "decode_demands' rids")
        extend = 1 + drafts
        lookup = distinct_rows(self._known_lookup(ids), "decode batch")
        if self._glue.reaches_point(ids, self._requests):
            demands = [self._demand(rid, extend) for rid in ids]
            empty = self._zero_demand.pages
            at = [i for i, d in enumerate(demands) if d.pages != empty]
            return self._decode_value(lookup, drafts, demands, at, np.array(
                [demands[i].pages for i in at], dtype=np.int64))
        slots = lookup.slots
        zero = self._zero_demand
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
        for i, d in zip(at, self._interned(keys), strict=True):
            out[i] = d
        # the total over a few rows' ints (a numpy sum and its list cost more)
        few = len(keys) <= table_module.SCALAR_ROWS
        total = Demand(tuple(map(sum, zip(*keys, strict=True)))) if few else None
        return self._decode_value(lookup, drafts, out, at, matrix, tokens, total)

    def _interned(self, keys: list[tuple[int, ...]]) -> list[Demand]:
        """The one :class:`Demand` of each of ``keys`` (pages per band), from the memo."""
        memo = self._demand_memo
        if len(memo) > 4_096:
            memo.clear()
        out = []
        for key in keys:
            d = memo.get(key)
            if d is None:
                d = memo[key] = Demand(key)
            out.append(d)
        return out

    def _decode_value(self, lookup: SlotLookup, drafts: int, demands: Sequence[Demand],
                      nonzero: Sequence[int], needs: np.ndarray | None = None,
                      tokens: np.ndarray | None = None, total: Demand | None = None
                      ) -> StepPlan:
        """The decode batch's plan over ``lookup``'s rows, with the rows' token counts
        (``tokens``, int64 ``[rows]``, a fresh gather the plan keeps; ``None``: read now),
        their total (``None``: the column sums of ``needs``) and the chain's epoch it was
        computed on."""
        if needs is None or not len(nonzero):
            needs = self._no_needs
            total = self._zero_demand
        elif total is None:
            total = Demand(tuple(needs.sum(axis=0).tolist()))
        return self._issue(StepPlan.frozen(
            self, lookup.ids, drafts, tuple(demands), tuple(nonzero), needs, total=total,
            version=lookup.version,
            at=self._table.tokens[lookup.slots] if tokens is None else tokens,
            epoch=self._chain.epoch))

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
        return plan is not None and self._issued.get(id(plan)) is plan

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
                ``batch``; see ``KVManager.allocate``).
            quote: the chain's price of the take (the rows' total plus the resumes'
                load-backs), if the caller has it; priced here when absent or priced
                before the chain's epoch moved (an empty take is not priced).

        Returns:
            The plan (``quote`` set unless the take is empty).

        Raises:
            InvalidDemandError: a request listed twice, an entry not a pair of ints, a
                negative or non-integer token count, a request suspended to host, demands
                not one Demand of int pages per band per row (``check_demands``), a
                resume not suspended, named twice or in the batch. BufferArgumentError: a
                resume's host slots no longer held. ForgedQuoteError: ``quote`` is not a
                Quote. Nothing changed on any.
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
        elif quote is None or quote.before.epoch != self._chain.epoch:
            quote = self._chain.price(taken)  # the take's token: the step's one price
        # (a price may build the epoch's snapshot: with a prefix cache, a new epoch; the
        # plan holds from the chain the quote priced)
        return self._issue(StepPlan.frozen(
            self, ids, drafts, rows[0], rows[1], rows[2], total=total, extends=extends,
            resumes=tuple(s.rid for s in loads),
            loads=load, quote=quote,
            version=lookup.version, at=at, epoch=self._chain.epoch))

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
                and batch.epoch == self._chain.epoch
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
        if quote is None or quote.before.epoch != self._chain.epoch:
            quote = self._chain.price(taken)
        return self._issue(batch.priced(quote, self._chain.epoch))

    def apply(self, plan: StepPlan) -> Demand:
        """Realize ``plan`` in one chain take (none when it takes nothing), trusting it: no
        second validation, no demand computed again while the chain's epoch is the one
        it was built at. Its rows get their pages (band by band in row order), its new
        requests their rows, its resumes their pages back (``KVManager.allocate``).

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
                self._rows.register(rid)
            return taken
        quote = plan.quote
        if quote is not None and quote.before.epoch != self._chain.epoch:
            quote = None  # priced before the chain changed: the take prices it again
        slots = lookup.slots
        grant = self._chain.take(taken, quote, self._glue.copies(
            ids, slots, plan.nonzero, plan.needs, self._requests))
        if missing:
            for rid in missing:
                self._rows.register(rid)
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
        if (plan.epoch != self._chain.epoch or plan.version != table.version) and any(
                self._demand(rid, n) != d
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

    def _batch_demand(self, ids: tuple[int, ...], extends: tuple[int, ...],
                      lookup: SlotLookup, demands: Sequence[Demand] | None,
                      ) -> tuple[tuple[tuple[Demand, ...], tuple[int, ...], np.ndarray], Demand,
                                 int, np.ndarray]:
        """The rows' demands, the positions of the non-empty ones and their ``[len(nonzero),
        bands]`` matrix (computed when ``demands`` is ``None``), their total, the drafts
        of the decode batch they came from (0 otherwise) and the rows' tokens they were
        computed at (now, or the reused batch's).

        Raises:
            InvalidDemandError: demands that are not one valid Demand per row
                (:func:`~kvchain.requests.batch.check_demands`).
        """
        if (self._issued_here(demands) and isinstance(demands, StepPlan)
                and demands.rids == ids and demands.tokens == extends
                and demands.version == lookup.version and demands.at is not None
                and demands.epoch == self._chain.epoch):
            # computed by this manager for these very rows on this chain: the plan keeps
            # the rows' tokens they were computed at, which apply compares with the rows'
            # tokens then (a row that moved since makes the plan stale there)
            return ((demands.demands, demands.nonzero, demands.needs), demands.total,
                    demands.drafts, demands.at)
        tokens = self._table.tokens[lookup.slots]
        if demands is None:
            demands = [self._demand(rid, extend) for rid, extend in zip(ids, extends,
                                                                      strict=True)]
        nb = self._geom.num_bands
        check_demands(ids, extends, demands, nb)
        zero = (0,) * nb
        nonzero = tuple(i for i, d in enumerate(demands) if d.pages != zero)
        if not nonzero:
            return ((tuple(demands), (), np.zeros((0, nb), dtype=np.int64)), self._zero_demand, 0,
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
        if len(nonzero) <= table_module.SCALAR_ROWS:  # ``item`` reads, no gather
            row_slots = [slots.item(i) for i in nonzero]
            self._distribute_rows(pages, ids, extends, row_slots, nonzero, matrix)
            self._table.refresh_rows(row_slots)
            return
        at = np.asarray(nonzero, dtype=np.int64)
        self._distribute_columns(pages, ids, extends, slots[at], at, matrix)

    def _distribute_columns(self, pages: tuple[tuple[int, ...], ...], ids: tuple[int, ...],
                            extends: tuple[int, ...], slots_at: np.ndarray, at: np.ndarray,
                            matrix: np.ndarray) -> None:
        """:meth:`_distribute` of many rows (``slots_at``: the slots of the batch positions
        ``at``) over numpy columns (``RequestTable.append``; state slots: ``take_slots``)."""
        table = self._table
        for pol in self._geom.policies:
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
                         extends: tuple[int, ...], rows: list[int],
                         nonzero: Sequence[int], matrix: np.ndarray) -> None:
        """:meth:`_distribute` of a few rows (``rows``: the slots of ``nonzero``), row by
        row over Python ints, the same hand-out (state slots: ``take_slots``)."""
        table = self._table
        needs = matrix.tolist()
        for pol in self._geom.policies:
            band = pol.band
            vids = pages[band]
            if not vids:
                continue
            got = [j for j, need in enumerate(needs) if need[band]]
            if pol.per_request:
                self._glue.take_slots(band, np.array([rows[j] for j in got], dtype=np.int64),
                                      [ids[nonzero[j]] for j in got],
                                      [extends[nonzero[j]] for j in got],
                                      [needs[j][band] for j in got], vids, self._requests)
                continue
            cut = 0
            for j in got:
                slot, n = rows[j], needs[j][band]
                start = table.start_column(pol, slot)
                table.put_row(band, slot, start, vids[cut:cut + n])
                cut += n

    # --- the decode batch's commit ---------------------------------------------------------

    def uncovered(self, slots: int | np.ndarray, tokens: int | np.ndarray) -> Any:
        """Whether a page band's row ends before ``tokens``: a full band holds fewer pages
        than ``tokens`` need, or a window / chunked-local band's last page held (its row
        is indexed by token page) ends before token ``tokens``. One row (``slots`` an int:
        a bool) or many (int64 ``[n]`` rows and tokens: a bool ``[n]`` mask)."""
        rowlen = self._table.rowlen
        if isinstance(slots, np.ndarray):  # the shortest page band's row (one P for all)
            bands = self._page_bands
            if not bands:  # only state bands: nothing to cover
                return np.zeros(slots.shape, dtype=bool)
            end = rowlen[bands[0]][slots]  # 1-D gathers (a 2-D one costs more)
            for band in bands[1:]:
                end = np.minimum(end, rowlen[band][slots])
            return end * self._geom.page_size < tokens
        short: Any = False
        for pol in self._geom.policies:
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
                twice (one token each, as ``allocate``) or ``rids`` not a sequence of int
                ids.
        """
        ids = request_ids(rids, "commit_decodes' rids")
        lookup = distinct_rows(self._known_lookup(ids), "decode commit")
        slots = lookup.slots
        table = self._table
        n = table.tokens[slots] + 1
        short = self.uncovered(slots, n)
        if short.any():
            rid = ids[int(short.nonzero()[0][0])]
            raise InvalidDemandError(f"request {rid}: 1 token not covered by its pages")
        # every request checked: the one-by-one paths below cannot fail half-way
        if self._keep_window_tail or self._glue.may_insert(ids):
            return sum(self._commit(rid, 1) for rid in ids)
        table.tokens[slots] = n
        released = 0
        for pol in self._geom.windows:
            released += self.release_fronts(pol.band, slots, pol.first_page(n))
        return released

    def release_fronts(self, band: int, slots: np.ndarray, keep_from: np.ndarray) -> int:
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
            pos = at.tolist()  # ``item`` reads of the rows (no gathers)
            got = self._front_columns(band, [slots.item(i) for i in pos],
                                      [first.item(i) for i in pos],
                                      [keep_from.item(i) for i in pos])
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
            self._chain.release(band, vids[mine])
        else:
            self._chain.release(band, vids)
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
                request named twice, ``rids`` not a sequence of int ids, or ``steps`` not
                an int in ``[1, MAX_RUN_STEPS]`` (:data:`~kvchain.requests.batch.MAX_RUN_STEPS`).
        """
        ids = request_ids(rids, "decode_run's rids")
        steps = check_count(steps, "a decode run's steps", 1, MAX_RUN_STEPS)
        slots = self._checked_slots(ids)
        if self._glue.may_insert(ids) or self._glue.points_ahead(ids, self._requests):
            return None
        return self._table.run_columns(slots, steps)

    def skip_decodes(self, rids: Sequence[int], steps: int) -> None:
        """Commit ``steps`` decode tokens for each of ``rids`` in steps that need no page and
        release none (the quiet steps of a decode run): only the token counts move.

        Raises:
            UnknownRequestError: a request that holds no pages.
            InvalidDemandError: a request named twice, ``rids`` not a sequence of int ids,
                ``steps`` not an int in ``[0, MAX_BATCH_TOKENS]``, or a request whose
                pages do not cover its next ``steps`` tokens in the full or a window band,
                or whose window would release a page on the way (those steps are not
                quiet: commit them with :meth:`commit_decodes`). Nothing changes then.
        """
        steps = check_count(steps, "steps")
        ids = request_ids(rids, "skip_decodes' rids")
        slots = self._checked_slots(ids)
        if not steps or not ids:
            return
        table = self._table
        n = table.tokens[slots] + steps
        bad = np.zeros(slots.size, dtype=bool)
        for pol in self._geom.policies:
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

