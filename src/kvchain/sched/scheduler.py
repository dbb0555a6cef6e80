"""Continuous batching on the chain: chunked prefill, decode, retraction (docs/design.md §6).

One step::

    schedule(now)          decode check -> (window-tail reclaim -> retract) ->
                           ChainPrefillBudget: this step's decodes, running prefills'
                           next chunks, futures of running requests, then waiting requests
    allocate(step)         ONE kv.apply of the step plan (one chain.take) for every decode and chunk
    driver.run(batch)      (the engine, the simulator's cost model, or a fake)
    complete(batch, out)   commit tokens, window-tail release, first tokens, finishes

Policies (stated and tested):
* waiting order: ``fcfs`` (arrival; retracted requests go back to the front), ``spf``
  (shortest remaining prefill first, ties by arrival) or ``cache-aware`` (longest
  prefix-cache hit first within a look-ahead of the queue's head, a request passed over
  ``cache_max_passes`` times goes first: :mod:`kvchain.sched.queue`). The walk stops at
  the first request that does not fit (no overtaking, so nothing starves behind smaller
  requests).
* retraction victim: the running request that arrived last (ties: larger id), as in
  vLLM's recompute preemption; it frees everything and is recomputed from its prompt plus
  the tokens it had generated - or, with ``retract_to`` ``host`` (or ``auto`` where the
  cost model finds the copy faster), its pages go to host and are loaded back on resume
  (:mod:`kvchain.sched.retraction`). Suspended requests resume before any waiting request
  is admitted, earliest arrival first, each load-back priced in the one prefill budget.
* a request whose whole life (prompt + output, window peak, state slots) cannot fit the
  empty chain is rejected at once with the reason; nothing else blocks on it.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.bands.geometry import StateRollback
from kvchain.cache.tiered import LoadPlan, TieredPrefixCache
from kvchain.errors import (
    AdmissionDivergenceError,
    BufferTooSmallError,
    CapacityError,
    ConfigError,
    HostPoolFullError,
    InvalidRequestError,
    UnknownRequestError,
)
from kvchain.layout import smallest_request_pages
from kvchain.requests.batch import DecodeBatch, check_rid, sum_demands
from kvchain.requests.demand import context_drafts, lifetime_demand
from kvchain.requests.manager import KVManager
from kvchain.requests.prompt_keys import check_page_keys
from kvchain.requests.suspend import HostSide
from kvchain.sched.admission import (
    AdmissionRules,
    ChainPrefillBudget,
    NewTokenRatio,
    OutputReserve,
    SGLangReserve,
)
from kvchain.sched.queue import QueuePolicy, WaitingQueue
from kvchain.sched.request import (
    DecodeSeq,
    Event,
    EventKind,
    LoadBack,
    PrefillChunk,
    Request,
    RequestStatus,
    StepBatch,
    StepOutcome,
)
from kvchain.sched.retraction import RetractionCost, RetractTo
from kvchain.sched.values import (
    DecodeRun,
    ScheduledStep,
    SchedulerConfig,
    SchedulerCounters,
    UnallocatableEvent,
)


class Scheduler:
    """Continuous-batching scheduler over one :class:`KVManager`.

    Args:
        kv: the KV manager (and through it, the chain).
        config: limits and policies.
        ratio: a new-token-ratio estimator: shorthand for an ``sglang`` reservation with
            it (overrides ``config.reserve``).
        reserve: the reservation policy instance (default: built from ``config.reserve``).
        host: the host slots retraction by host copy suspends requests into (needed by
            ``config.retract_to`` ``host`` and ``auto``).
        retract_cost: ``auto``'s cost model (:class:`RetractionCost`).

    Raises:
        BufferTooSmallError: the empty chain cannot hold the smallest request (a 1-token
            prompt with 1 output token, its window and state slots) - it would never
            start (field case F1).
        ConfigError: ``chunk_size`` or ``max_prefill_tokens`` below the page size (chunks
            are cut to whole pages, so no chunk could ever be admitted); ``retract_to``
            ``host`` or ``auto`` without ``host``, ``auto`` without ``retract_cost``.
    """

    def __init__(self, kv: KVManager, config: SchedulerConfig | None = None,
                 ratio: NewTokenRatio | None = None,
                 reserve: OutputReserve | None = None, host: HostSide | None = None,
                 retract_cost: RetractionCost | None = None) -> None:
        self.kv = kv
        self.chain: Allocator = kv.chain
        self.config = config or SchedulerConfig()
        mode = self.config.retract_to
        if mode is not RetractTo.RECOMPUTE and host is None:
            raise ConfigError(f"retract_to={mode.value} needs host slots (a HostSide: "
                              f"--host-bytes in the simulator)")
        if mode is RetractTo.AUTO and retract_cost is None:
            raise ConfigError("retract_to=auto needs a cost model to compare the host copy "
                              "with the recompute")
        self.host = host
        self.retract_cost = retract_cost
        self.suspended: dict[int, Request] = {}  # suspended to host, in suspension order
        if reserve is None:
            reserve = SGLangReserve(ratio) if ratio is not None else self.config.reserve.build()
        self.reserve = reserve
        self.rules = AdmissionRules.for_layout(self.chain.layout, self.config.window_admission)
        self.waiting = WaitingQueue(self.config.policy, self.config.cache_lookahead,
                                    self.config.cache_max_passes)
        self.running: dict[int, Request] = {}
        self.requests: dict[int, Request] = {}
        self.counters = SchedulerCounters()
        self.unallocatable: list[UnallocatableEvent] = []
        self._events: list[Event] = []
        self._no_points: set[int] = set()  # requests that keep nothing for the cache
        self._no_hit: set[int] = set()  # requests served uncached (their hit never fits)
        # rid -> (device hit, hit after its load-back) in tokens, until its first admission
        self._loaded: dict[int, tuple[int, int]] = {}
        self._resume_bytes: dict[int, int] = {}  # suspended request -> bytes its resume loads
        self._write_bytes = 0  # bytes suspended to host since the last step was scheduled
        self._version = 0  # bumped by every allocate, complete and retraction (a step's basis)
        self._clock = 0.0  # the latest step time seen (schedule, complete, run_decodes; s)
        page = kv.geom.page_size
        if self.config.chunk_size < page or self.config.max_prefill_tokens < page:
            # Admission cuts chunks to whole pages: a smaller cap could never admit one.
            raise ConfigError(f"chunk_size ({self.config.chunk_size}) and max_prefill_tokens "
                              f"({self.config.max_prefill_tokens}) must be at least the page "
                              f"size ({page} tokens)")
        self._empty = self.chain.empty_snapshot()
        layout = self.chain.layout
        smallest = Demand(smallest_request_pages(layout.bands, kv.geom.state_slots))
        if not self._fits_empty(smallest):
            needed = _demand_bytes(self._empty, smallest) + self.chain.layout.reserved_bytes
            why = self._empty_budget().refusal(smallest)
            raise BufferTooSmallError(
                f"the buffer ({self.chain.layout.shape_name}, {self._empty.buffer_bytes:,} B) "
                f"cannot hold the smallest request ({needed:,} B of pages with null pages): "
                f"{why}", needed_bytes=needed, available_bytes=self._empty.buffer_bytes)

    @property
    def ratio(self) -> NewTokenRatio | None:
        """The new-token ratio of an ``sglang`` reservation (None under other policies)."""
        return self.reserve.ratio if isinstance(self.reserve, SGLangReserve) else None

    # --- requests in ------------------------------------------------------------------

    def add(self, request: Request, now: float) -> bool:
        """Queue a request; reject it at once if it exceeds the model's context
        (``config.max_context_tokens``) or can never fit the empty chain. A ``max_tokens``
        past the context is capped at it (``context - prompt_tokens``).

        Returns:
            True if queued, False if rejected (an ``REJECTED`` event says why).

        Raises:
            InvalidRequestError: not a :class:`Request`; a field its constructor refuses
                (:meth:`Request.check`, run again here: a request is mutable, so one
                changed after construction is refused too); a request that is not fresh
                (:func:`_check_fresh`: not ``WAITING``, or with progress - ``computed``,
                ``output_done``, ``retractions``, ``hit_tokens`` not 0, or a
                ``prefill_target`` other than its prompt); a duplicate id, or an id whose
                pages the KV manager already holds; a request object another scheduler
                has queued (each holds and mutates its own: add a copy, which
                ``dataclasses.replace`` makes); page keys other than one per whole
                page of the prompt (``prompt_tokens // P``:
                :func:`~kvchain.requests.prompt_keys.check_page_keys`); or ``now`` not a finite
                time >= 0 (s) (it may be behind the step clock: the simulator adds the
                arrivals due by a step at their own times). Every check runs before
                anything changes: a refused request leaves no id, event or counter behind.
        """
        _check_time(now)
        if not isinstance(request, Request):
            raise InvalidRequestError(f"expected a Request, got {type(request).__name__}")
        request.check()
        _check_fresh(request)
        if request.page_keys is not None:
            check_page_keys(request.rid, request.page_keys, request.prompt_tokens,
                            self.kv.geom.page_size)
        if request.rid in self.requests:
            raise InvalidRequestError(f"duplicate request id {request.rid}")
        if request._holder is not None:
            raise InvalidRequestError(f"request {request.rid}: this Request object is already "
                                      f"queued by another scheduler (both would mutate it); "
                                      f"add a copy (dataclasses.replace)")
        if request.rid in self.kv:
            raise InvalidRequestError(f"request {request.rid}: the KV manager already holds "
                                      f"pages for this id (a request is added before any of "
                                      f"its pages are taken)")
        self.requests[request.rid] = request
        request._holder = self
        self._emit(EventKind.ARRIVED, request.rid, now)
        context = self.config.max_context_tokens
        total = request.prompt_tokens + request.output_tokens
        if context is not None and total > context:
            request.status = RequestStatus.REJECTED
            self.counters.rejected += 1
            self.counters.rejected_context += 1
            self._emit(EventKind.REJECTED, request.rid, now,
                       f"context: {request.prompt_tokens:,} prompt + {request.output_tokens:,} "
                       f"output tokens exceed the model's context of {context:,} tokens")
            return False
        if (context is not None and request.max_tokens is not None
                and request.prompt_tokens + request.max_tokens > context):
            # No request generates past the context, so neither does its limit: admission
            # reserves against the limit, and one past the context (a client's max_tokens
            # of 200,000 on a 131,072-token model) would reserve what never fits, while
            # the never-fits check (capped at the context) let it wait forever.
            request.max_tokens = context - request.prompt_tokens  # >= output_tokens here
        need = self._lifetime_demand(request.prompt_tokens, request.output_limit)
        points = self.kv.points_for(request.page_keys, request.prompt_tokens)
        if points and self._fits_empty(need) and not self._fits_empty(
                self._lifetime_demand(request.prompt_tokens, request.output_limit, points)):
            self._no_points.add(request.rid)  # its checkpoints could never fit: none kept
        if not self._fits_empty(need):
            request.status = RequestStatus.REJECTED
            self.counters.rejected += 1
            share = self._empty_budget().share_refusal(need) or _band_cap_refusal(
                self._empty, need)
            self._emit(EventKind.REJECTED, request.rid, now,
                       f"needs {_demand_bytes(self._empty, need):,} B of pages at its peak, "
                       f"which can never fit on the empty chain "
                       f"({self._empty.free_bytes:,} B free)"
                       + (f": {share}" if share else ""))
            return False
        self.waiting.append(request)
        return True

    def _chunk_cap(self, r: Request, tokens_left: int) -> int:
        """The largest chunk ``r`` may take now: its whole remaining prefill if that fits the
        caps, else the caps cut down to whole pages - so every chunk but a prompt's tail
        starts and ends on a page boundary (what :meth:`RequestGeometry.later_peak_pages`
        relies on). A chunk that would pass the request's junction checkpoint (a page
        boundary, :meth:`KVManager.chunk_cut`) ends there: the state saved for the cache
        is that chunk's end state, and the rest of the prompt is a next chunk."""
        # A partial hit's gap is computed by its first chunk: it takes token budget (and
        # chunk room) but no pages (:meth:`_gap_limit`).
        cap = min(self.config.chunk_size, tokens_left) - self.kv.recompute_tokens(r.rid)
        if cap <= 0:
            return 0
        cut = self.kv.chunk_cut(r.rid) - r.computed
        if 0 < cut < min(cap, r.remaining_prefill):
            return cut
        if r.remaining_prefill <= cap:
            return r.remaining_prefill
        page = self.kv.geom.page_size
        return cap // page * page

    def _fits_empty(self, demand: Demand) -> bool:
        """Whether admission's own predicate (joint or split) fits ``demand`` on the empty
        chain: what "can never fit" means (no other formula)."""
        return self._empty_budget().fits(demand)

    def _empty_budget(self) -> ChainPrefillBudget:
        """A budget on the empty chain, priced by the allocator's planner."""
        return ChainPrefillBudget(self._empty, self.rules, self.chain.planner)

    def _lifetime_demand(self, prompt: int, output: int,
                         points: tuple[int, ...] = ()) -> Demand:
        """:func:`lifetime_demand` under the model's context (drafts capped at it)."""
        return lifetime_demand(self.kv.geom, prompt, output, points,
                               self.config.max_context_tokens)

    # --- one step ---------------------------------------------------------------------

    def schedule(self, now: float) -> ScheduledStep:
        """Decide this step's decodes and prefill chunks (no allocation yet), and build its
        one :class:`~kvchain.requests.plan.StepPlan` from the demands admission computed
        (:meth:`_plan_step`: validated and priced once).

        A step that would run nothing while two or more requests are running is a stall:
        an estimated reservation (``sglang``) can over-admit, so that running prefills
        each end up short of their next chunk with nobody decoding, and the decode check
        never retracts for them. The youngest running request is then retracted (counted
        in ``counters.stall_retractions``) and the step decided again, until it runs
        something or one request is left.

        Raises:
            InvalidRequestError: ``now`` not a finite time >= 0 (s), or earlier than the
                last step's time (a step scheduled, completed or run; the clock never goes
                back); nothing changes.
        """
        self._check_clock(now)
        self._clock = now
        while True:
            step = self._schedule_once(now)
            if (step.decodes or step.prefills or step.resumes or step.loads
                    or len(self.running) < 2):
                break
            self._write_bytes += step.host_write_bytes  # the retried step reports them
            self.counters.stall_retractions += 1
            self._retract(self._youngest(), now)
        self._plan_step(step)
        return step

    def _schedule_once(self, now: float) -> ScheduledStep:
        """One try of :meth:`schedule`'s decision, without its plan."""
        kv = self.kv
        snap, decode_demands = self._decode_check(now)
        step = ScheduledStep(decode_demands)
        step.drafts_priced = priced = decode_demands.drafts
        prefilling: list[Request] = []
        decoding: list[Request] = []
        for r in self.running.values():  # one pass: decodes (running order) and prefills
            (prefilling if r.computed < r.prefill_target else decoding).append(r)
        drafts = self._step_drafts(kv.geom.spec_tokens, decoding)  # what the engine runs
        step.decodes.extend(DecodeSeq(r.rid, r.computed, drafts) for r in decoding)
        step.host_write_bytes, self._write_bytes = self._write_bytes, 0
        if not prefilling and not self.waiting and not self.suspended:
            return step  # decodes only: the decode check already proved they fit
        budget = ChainPrefillBudget(snap, self.rules, self.chain.planner)
        budget.reserve(decode_demands.total)
        # This step's own demand per running request (decodes: from the decode check).
        this_step = {d.rid: (1 + priced, demand)
                     for d, demand in zip(step.decodes, decode_demands, strict=True)}
        # Running prefills continue first, then everyone's future is reserved.
        tokens_left = self._continue_prefills(step, budget, prefilling, this_step)
        running = list(self.running.values())
        # The decoding batch (admission.AdaptiveReserve: the lockstep peak is theirs;
        # prefills and candidates reserve their whole expected output).
        batch = [r for r in running if not r.in_prefill]
        self.reserve.begin_step([r.computed + 1 for r in batch],
                                [r.output_left - 1 for r in batch],
                                [r.output_done for r in batch],
                                [r.output_limit for r in batch], kv.geom.page_size)
        budget.reserve(self.running_futures(running, this_step))
        if not self.suspended or self._admit_resumes(step, budget):
            # (a suspended request that waits for room: nobody overtakes it)
            self._admit_waiting(step, budget, tokens_left)
        self.counters.admission_decisions += budget.decisions
        return step

    def _continue_prefills(self, step: ScheduledStep, budget: ChainPrefillBudget,
                           prefilling: Sequence[Request],
                           this_step: dict[int, tuple[int, Demand]]) -> int:
        """Give each running prefill the largest chunk the ledger fits, reserving its
        demand (the one the chunk search computed: it is the step plan's row) and
        recording it in ``this_step``; returns the prefill tokens left for new work."""
        kv, tokens_left = self.kv, self.config.max_prefill_tokens
        for r in prefilling:
            upper = self._chunk_cap(r, tokens_left)
            found = budget.largest_fit(functools.partial(kv.demand, r.rid), upper,
                                       kv.geom.page_size, _itself)
            c, chunk_demand = found
            if c and chunk_demand is not None:
                budget.reserve(chunk_demand)
                this_step[r.rid] = (c, chunk_demand)
                gap = kv.recompute_tokens(r.rid)
                step.prefills.append(PrefillChunk(r.rid, r.computed, c, gap))
                step.prefill_demands.append(chunk_demand)
                tokens_left -= c + gap
        return tokens_left

    def _admit_waiting(self, step: ScheduledStep, budget: ChainPrefillBudget,
                       tokens_left: int) -> None:
        """Waiting requests, in policy order, while the ledger fits. A prefix-cache hit
        locks its pages first (they stop being evictable supply), so the ledger is
        re-checked on the new snapshot before the rest of the request is priced. Each
        admitted chunk's demand and reservation come from one computation
        (:meth:`_admission_pair`), the demand kept for the step plan."""
        cfg, page = self.config, self.kv.geom.page_size
        for admitted, r in enumerate(self._waiting_order(), len(step.resumes)):
            if tokens_left <= 0 or len(self.running) + admitted >= cfg.max_running:
                break
            self._load_back(r, budget, step)
            attached = self._attach(r)
            # A load-back or an attach may change the cache (a lock, or a lock undone by
            # a hit that can never fit: its node split, the order's version bumped), so
            # the ledger prices from the chain's snapshot now, never a stale one.
            if not self._rebased(budget):
                if attached:
                    self._detach(r, budget)
                step.memory_blocked = True  # the locked hit left the ledger short
                break
            upper = self._chunk_cap(r, tokens_left)
            pair_of = functools.partial(self._admission_pair, r)
            found: tuple[int, tuple[Demand, Demand] | None] = budget.largest_fit(
                pair_of, upper, page, _reserved)
            if not found[0] and attached:
                self._detach(r, budget)
                if self.running or not budget.reserved.is_empty:
                    step.memory_blocked = upper > 0  # as below: memory refused the chunk
                    break
                # Alone, the hit itself may be what does not fit (its locked checkpoint is
                # one state slot more than the request's lifetime): serve it uncached.
                upper = self._chunk_cap(r, tokens_left)
                found = budget.largest_fit(pair_of, upper, page, _reserved)
            c, pair = found
            if not c or pair is None:
                step.memory_blocked = upper > 0  # upper 0: the token budget stopped it
                break
            budget.reserve(pair[1])
            gap = self.kv.recompute_tokens(r.rid)
            step.prefills.append(PrefillChunk(r.rid, r.computed, c, gap))
            step.prefill_demands.append(pair[0])
            tokens_left -= c + gap

    def _attach(self, r: Request) -> bool:
        """Match and lock ``r``'s prompt in the prefix cache (if any, and ``r`` carries
        page keys); its hit tokens count as computed. Returns whether it was attached."""
        if self.kv.cache is None or r.page_keys is None or r.rid in self._no_hit:
            return False
        save = r.rid not in self._no_points
        hit = self.kv.attach(r.rid, r.page_keys, r.prompt_tokens, save, self._gap_limit())
        # What the hit lock keeps: at least the tail and checkpoint the hit resumes from,
        # and every other tail and checkpoint of its locked path.
        extra = Demand(tuple(max(a, b) for a, b in zip(
            self._hit_extra(hit, self.kv.recompute_tokens(r.rid)).pages,
            self.kv.hit_holds(r.rid).pages, strict=True)))
        # Its own resume points past the hit (those at or below it are on the locked path,
        # in ``extra`` already).
        h = hit // self.kv.geom.page_size
        own = (tuple(q for q in self.kv.points_for(r.page_keys, r.prompt_tokens) if q > h)
               if save else ())
        if hit and not self._fits_empty(self._lifetime_demand(
                r.prompt_tokens, r.output_limit, own).plus(extra)):
            # Alone with its hit it could never finish: the hit path's window tails and
            # state checkpoints stay locked for the request's whole life, beyond its own
            # peak (a request that fits alone must always be able to finish alone; seeded
            # stream 131 stalled when only the hit's own tail and checkpoint were counted:
            # its path kept 9 checkpoints). Serve it uncached, now and after a retraction.
            self.kv.detach(r.rid)
            self._no_hit.add(r.rid)
            return False
        r.computed = hit
        return True

    def _load_back(self, r: Request, budget: ChainPrefillBudget, step: ScheduledStep) -> None:
        """Load ``r``'s host hit back to the device before it attaches, if the host tier
        resumes it deeper than the device (:meth:`TieredPrefixCache.plan_load`).

        The load is a demand like any other: its device pages and slots are priced by the
        step's ledger (:meth:`_load_fits`) on the chain's snapshot with the device prefix
        it counts on locked; a load that does not fit is shortened to the host's next
        resume point below, and refused when none fits (the request recomputes). One that
        fits is taken at once with its own quote (price == outcome: the chain realizes the
        quote or refuses it) and inserted into the device cache whole - never half-done -
        so the request's :meth:`_attach` then finds an ordinary device hit there; the
        ledger is rebased on the chain after the take (:meth:`_after_load`). If the request
        is then not admitted, the loaded prefix stays as evictable device cache.
        """
        cache = self.kv.cache
        if (not isinstance(cache, TieredPrefixCache) or r.page_keys is None
                or r.rid in self._no_hit):
            return
        keys, page = r.page_keys, self.kv.geom.page_size
        save = r.rid not in self._no_points
        lifetime = self._lifetime_demand(
            r.prompt_tokens, r.output_limit,
            self.kv.points_for(keys, r.prompt_tokens) if save else ())
        plan = cache.plan_load(keys, r.prompt_tokens)
        deepest = plan.host_pages if plan is not None else 0
        while plan is not None:
            # Alone with the hit it must still be able to finish (as _attach requires).
            if self._fits_empty(lifetime.plus(self._hit_extra(plan.host_pages * page))):
                handle = cache.lock_prefix(keys, plan.full_from)
                if budget.rebase(self.chain.snapshot()) and self._load_fits(budget, plan):
                    granted: tuple[tuple[int, ...], ...] = tuple(
                        () for _ in plan.demand.pages)
                    if not plan.demand.is_empty:
                        granted = self.chain.take(plan.demand,
                                                  self.chain.price(plan.demand)).pages
                    dups = cache.realize_load(keys, plan, granted)
                    cache.unlock(handle)
                    for band, ids in enumerate(dups):
                        if ids:
                            self.chain.release(band, ids)
                    self._after_load(budget)
                    nbytes = sum(n * b.page_bytes for n, b in
                                 zip(plan.demand.pages, self.chain.layout.bands, strict=True))
                    step.loads.append(LoadBack(r.rid, plan.device_pages * page,
                                               plan.host_pages * page, plan.demand.pages,
                                               nbytes))
                    # a prompt may load in several steps (each to a deeper resume point):
                    # the host served from its first load's device hit to its last's end
                    first = self._loaded.get(r.rid, (plan.device_pages * page, 0))[0]
                    self._loaded[r.rid] = (first, plan.host_pages * page)
                    self.counters.loads += 1
                    self.counters.loads_shortened += plan.host_pages < deepest
                    return
                cache.unlock(handle)
                budget.rebase(self.chain.snapshot())
            plan = cache.plan_load(keys, r.prompt_tokens, below=plan.host_pages)
        if deepest:
            self.counters.loads_refused += 1

    def _load_fits(self, budget: ChainPrefillBudget, plan: LoadPlan) -> bool:
        """Whether the ledger fits a load-back's demand (one pricing decision)."""
        return budget.fits(plan.demand)

    def _after_load(self, budget: ChainPrefillBudget) -> None:
        """Price the rest of the step on the chain as the load left it (its pages are
        taken: the snapshot the ledger was built on no longer holds them)."""
        budget.rebase(self.chain.snapshot())

    def _gap_limit(self) -> int:
        """Most pages a partial hit may recompute (``KVManager.attach``'s ``max_gap``): 0
        unless ``config.partial_hits``; else one page less than the smaller of the chunk
        size and the step's prefill tokens, in whole pages, so the gap and at least one
        page of the request's own prompt fit its first chunk (the gap runs in that chunk).
        E.g. 8,192 tokens, ``P = 16``: 511 pages (8,176 tokens)."""
        if not self.config.partial_hits:
            return 0
        cfg = self.config
        return max(0, min(cfg.chunk_size, cfg.max_prefill_tokens) // self.kv.geom.page_size
                   - 1)

    def _hit_extra(self, hit_tokens: int, gap_tokens: int = 0) -> Demand:
        """What a hit of ``hit_tokens`` locks beyond the request's own lifetime demand: per
        window or chunked-local band its tail ``[resume_start(h), h)`` (dead once the
        request's window moves on, held until it ends), per state band the checkpoint
        slot; its full pages are in the lifetime demand already. A partial hit
        (``gap_tokens`` recomputed: its state resumes at ``c = h - gap``) locks the
        checkpoint at ``c`` (none at 0) and, per window band, the tail at ``c`` too (its
        gap reads it): the union of ``[resume_start(c), c)`` and ``[resume_start(h), h)``."""
        page = self.kv.geom.page_size
        h = hit_tokens // page
        c = h - gap_tokens // page
        pages = []
        for pol in self.kv.geom.policies:
            if pol.windowed:
                tail = set(range(pol.resume_start(h), h)) | set(range(pol.resume_start(c), c))
                pages.append(len(tail))
            else:
                pages.append(1 if pol.per_request and c else 0)
        return Demand(tuple(pages))

    def _rebased(self, budget: ChainPrefillBudget) -> bool:
        """Rebase ``budget`` on the chain's snapshot if it changed since the budget's
        (the chain caches one snapshot per epoch, and every change of the prefix cache's
        eviction order is a new epoch: an identity test); return whether what is
        reserved still fits there (``True`` when nothing changed)."""
        snap = self.chain.snapshot()
        return snap is budget.snapshot or budget.rebase(snap)

    def _detach(self, r: Request, budget: ChainPrefillBudget) -> None:
        """Undo :meth:`_attach` of a request not admitted, and rebase the ledger (the
        unlocked pages are evictable supply again: what was reserved fits as before)."""
        self.kv.detach(r.rid)
        r.computed = 0
        budget.rebase(self.chain.snapshot())

    def _plan_step(self, step: ScheduledStep, pin: bool = True) -> None:
        """Build the step's one plan (``KVManager.plan``: validated there, its take priced
        once) from the demands admission computed (the chunks' and the decode check's:
        reused, not computed again), and pin the move gate open until allocation when the
        take needs moves (contract 6: a gate closing between admission and allocation
        must wait). A decode batch priced for other drafts than the step's decodes
        compute (a stale step) is computed again for the take the engine runs."""
        drafts = step.decodes[0].drafts if step.decodes else 0
        if step.decodes and step.decode_demands.drafts != drafts:
            step.decode_demands = self.kv.decode_demands([d.rid for d in step.decodes],
                                                         drafts)
            step.drafts_priced = drafts
        step.basis = (self._version, tuple(step.prefills), tuple(step.decodes),
                      tuple(step.resumes))
        if not step.prefills and not step.decodes and not step.resumes:
            step.plan, step.quote = None, None
            return
        if step.prefills or step.resumes:  # the rows' pairs and all their demands
            rows = ([(p.rid, p.tokens) for p in step.prefills]
                    + [(d.rid, 1 + d.drafts) for d in step.decodes])
            step.plan = self.kv.plan(rows, [*step.prefill_demands, *step.decode_demands],
                                     step.resumes)
        else:  # a decode-only step: the decode batch's value is the plan's rows
            step.plan = self.kv.plan(step.decode_demands)
        step.quote = step.plan.quote
        if pin and step.quote is not None and step.quote.needs_moves and step.pin is None:
            step.pin = self.chain.pin_moves()

    def allocate(self, step: ScheduledStep, now: float) -> StepBatch:
        """Apply the step's plan in one take and move admitted requests to running. The
        plan :meth:`schedule` built for this very step is applied as it is; a step that
        was changed since, or built for an earlier state, is checked
        (:meth:`_check_step`) and planned again.

        If the allocator refuses the admitted batch (a bug), the refusal is recorded as an
        :class:`UnallocatableEvent` (counted in ``counters.divergences``), the most recently
        admitted request of the batch is retracted (a waiting one stays waiting; a running
        one is retracted as by the decode check) and the rest is taken again, until it fits.

        Raises:
            InvalidRequestError: ``step`` not a :class:`ScheduledStep`, or one that names a
                request that is not waiting or running, or one twice (nothing changed).
            AdmissionDivergenceError: ``config.strict`` and the allocator refused the
                admitted batch; nothing was allocated.
        """
        _check_step_type(step)
        try:
            if step.basis != (self._version, tuple(step.prefills), tuple(step.decodes),
                              tuple(step.resumes)):
                self._check_step(step)  # not the step as schedule() planned it
                self._plan_step(step, pin=False)
            while step.plan is not None:
                try:
                    self.kv.apply(step.plan)
                    break
                except CapacityError as exc:
                    self._unallocatable(step, exc, now)
                    self._plan_step(step, pin=False)
        finally:
            if step.pin is not None:
                step.pin.release()
        self._version += 1
        resume_bytes = self._resumed(step, now)
        self._admitted(step, now)
        return StepBatch(tuple(step.prefills), tuple(step.decodes), step.memory_blocked,
                         resumes=tuple(step.resumes), host_write_bytes=step.host_write_bytes,
                         host_read_bytes=resume_bytes, loads=tuple(step.loads))

    def _resumed(self, step: ScheduledStep, now: float) -> int:
        """Move the step's resumed requests to running; returns the bytes they loaded."""
        resume_bytes = 0
        for rid in step.resumes:
            r = self.suspended.pop(rid)
            r.status = RequestStatus.RUNNING
            self.running[rid] = r
            self.counters.resumes += 1
            self._emit(EventKind.ADMITTED, rid, now)
            resume_bytes += self._resume_bytes.pop(rid)
        self.counters.resume_bytes_loaded += resume_bytes
        return resume_bytes

    def _admitted(self, step: ScheduledStep, now: float) -> None:
        """Move the step's newly admitted prefills from waiting to running, counting their
        prefix-cache hits at their first admission."""
        for p in step.prefills:
            r = self.requests[p.rid]
            if r.status is not RequestStatus.WAITING:
                continue
            self.waiting.remove(r)  # O(1): FCFS admits a prefix, SPF deletes lazily
            loaded = self._loaded.pop(r.rid, None)
            if self.kv.cache is not None and r.retractions == 0:
                r.hit_tokens = self.kv.hit_tokens(r.rid)
                self.counters.prompt_tokens += r.prompt_tokens
                self.counters.hit_tokens += r.hit_tokens
                gap = self.kv.partial_tokens(r.rid)
                self.counters.partial_hits += gap > 0
                self.counters.partial_tokens += gap
                if loaded is not None:  # the part of its hit the host tier served
                    self.counters.host_hit_tokens += max(
                        0, min(loaded[1], r.hit_tokens) - loaded[0])
            self.kv.touch(r.rid)
            r.status = RequestStatus.RUNNING
            self.running[r.rid] = r
            self.counters.admitted += 1
            self._emit(EventKind.ADMITTED, r.rid, now)

    def _check_step(self, step: ScheduledStep) -> None:
        """Refuse a step that does not match the scheduler's requests (before any change)."""
        if (len(step.prefill_demands) != len(step.prefills)
                or len(step.decode_demands) != len(step.decodes)):
            raise InvalidRequestError("a step's demands do not match its prefills and decodes")
        if step.loads:
            self._check_loads(step)
        kv = self.kv
        for p in step.prefills:
            # A partial hit's gap is recomputed by its first chunk, exactly: a chunk that
            # skips it would resume the state where no checkpoint is.
            if p.recompute != kv.recompute_tokens(p.rid):
                raise InvalidRequestError(
                    f"request {p.rid}: its chunk at {p.start} recomputes {p.recompute} "
                    f"tokens, but its partial hit needs {kv.recompute_tokens(p.rid)}")
        # Fast path (every step): decodes are distinct running requests, prefills distinct
        # running or waiting ones; only a step that fails it is walked for the message.
        running, requests, waiting = self.running, self.requests, self.waiting
        rids = {d.rid for d in step.decodes}
        if len(rids) == len(step.decodes) and rids <= running.keys():
            for p in step.prefills:
                rid = p.rid
                if rid in rids or not (rid in running or requests.get(rid) in waiting):
                    break
                rids.add(rid)
            else:
                return
        seen: set[int] = set()
        for rid, may_wait in ([(p.rid, True) for p in step.prefills]
                              + [(d.rid, False) for d in step.decodes]):
            r = self.requests.get(rid)
            ok = r is not None and (r.rid in self.running or (may_wait and r in self.waiting))
            if not ok or rid in seen:
                raise InvalidRequestError(f"request {rid} is not schedulable in this step "
                                          f"(unknown, finished, rejected or listed twice)")
            seen.add(rid)

    def _check_loads(self, step: ScheduledStep) -> None:
        """Refuse a step whose load-backs do not match its requests: each names a
        distinct request that is waiting or is one of the step's prefills (a load serves a
        prompt), ends past its start on a page boundary, and took pages of the chain's
        bands."""
        seen: set[int] = set()
        prefills = {p.rid for p in step.prefills}
        page, bands = self.kv.geom.page_size, self.kv.geom.num_bands
        for ld in step.loads:
            r = self.requests.get(ld.rid)
            ok = (r is not None and ld.rid not in seen
                  and (r in self.waiting or ld.rid in prefills)
                  and 0 <= ld.start < ld.end and not ld.end % page
                  and len(ld.pages) == bands and min(ld.pages) >= 0)
            if not ok:
                raise InvalidRequestError(f"load-back of request {ld.rid} does not match the "
                                          f"step (unknown, not waiting, listed twice, or a "
                                          f"bad span {ld.start}..{ld.end})")
            seen.add(ld.rid)

    def _unallocatable(self, step: ScheduledStep, exc: CapacityError, now: float) -> None:
        """Record an admitted-but-unallocatable take and drop one request from the step."""
        self.counters.divergences += 1
        if self.config.strict:
            raise AdmissionDivergenceError(f"admitted batch refused by the allocator: {exc}") \
                from exc
        snap = self.chain.snapshot()
        step.quote = None
        # The most recently admitted request goes first: a new admission (last in the
        # prefill list), else the running request the decode check would retract.
        new = [k for k, p in enumerate(step.prefills)
               if self.requests[p.rid].status is RequestStatus.WAITING]
        if new:
            k = new[-1]
            rid, demand = step.prefills[k].rid, step.prefill_demands[k]
            del step.prefills[k], step.prefill_demands[k]
            if rid in self.kv:  # its prefix-cache hit was locked at admission: unlock it
                self.kv.detach(rid)
                self.requests[rid].computed = 0
        elif step.resumes:  # a load-back: the request stays suspended
            rid = step.resumes.pop()
            demand = self.kv.resume_demand(rid)
        else:
            in_step = ([p.rid for p in step.prefills] + [d.rid for d in step.decodes])
            victim = max((self.requests[rid] for rid in in_step),
                         key=lambda r: (r.arrival_s, r.rid))
            rid = victim.rid
            at = next((k for k, p in enumerate(step.prefills) if p.rid == rid), None)
            if at is not None:
                demand = step.prefill_demands[at]
                del step.prefills[at], step.prefill_demands[at]
            else:
                at = next(k for k, d in enumerate(step.decodes) if d.rid == rid)
                demand = step.decode_demands[at]
                del step.decodes[at]
                step.decode_demands = step.decode_demands.without(at)
            self._retract(victim, now)
        self.unallocatable.append(UnallocatableEvent(rid, now, demand, snap,
                                                     exc.shortfall_bytes))

    def abort(self, step: ScheduledStep) -> None:
        """Drop a step :meth:`schedule` decided that is not to be allocated (an engine
        refused it, e.g. a bad draft proposal): its move pin is released and the
        prefix-cache hits its new admissions locked are unlocked (they stay waiting,
        ``computed`` 0). Nothing was taken for its rows, so every request's pages and
        the chain's free pages are as before :meth:`schedule`; what its decode check and
        admission did as ordinary decisions stays (a retraction; a host load-back's
        prefix, evictable device cache). A later :meth:`allocate` of ``step`` plans it
        again (:meth:`_check_step`).

        Raises:
            InvalidRequestError: ``step`` is not a :class:`ScheduledStep` (nothing changed).
        """
        _check_step_type(step)
        if step.pin is not None:
            step.pin.release()
            step.pin = None
        for p in step.prefills:
            r = self.requests[p.rid]
            if r.status is RequestStatus.WAITING and p.rid in self.kv:
                self.kv.detach(p.rid)  # its hit was locked at admission
                r.computed = 0
        self._version += 1

    def _check_clock(self, now: float) -> None:
        """Refuse a step time that is not a time (:func:`_check_time`) or is earlier than
        the last step's (the scheduler's clock, ``_clock``).

        Raises:
            InvalidRequestError: either.
        """
        _check_time(now)
        if now < self._clock:
            raise InvalidRequestError(f"time goes back: t={now} s after a step at "
                                      f"{self._clock} s")

    def step(self, now: float) -> StepBatch:
        """``allocate(schedule(now))``: the batch to run now."""
        return self.allocate(self.schedule(now), now)

    def complete(self, batch: StepBatch, outcome: StepOutcome, now: float) -> None:
        """Record a finished forward at time ``now``: commit tokens (window-tail release),
        first tokens, finishes (output length or end-of-sequence).

        Raises:
            InvalidRequestError: the batch is not the one just allocated (a request not
                running, listed twice, or at another position), ``outcome`` not a
                :class:`StepOutcome` or naming a request outside the batch (``stopped``:
                not one of its requests; ``accepted``: not one of its decodes), or ``now``
                not a finite time >= 0 (s) or earlier than the step's (the time it was
                scheduled at: a forward ends after it starts); nothing changed.
        """
        self._check_clock(now)
        if not isinstance(batch, StepBatch):
            raise InvalidRequestError(f"expected a StepBatch, got {type(batch).__name__}")
        _check_outcome(batch, outcome)
        kv, running = self.kv, self.running
        if not self._batch_matches(batch):
            seen: set[int] = set()
            for rid, start in ([(p.rid, p.start) for p in batch.prefills]
                               + [(d.rid, d.context) for d in batch.decodes]):
                r = running.get(rid)
                if r is None or rid in seen or start != r.computed:
                    raise InvalidRequestError(f"request {rid} at position {start} is not a "
                                              f"running request of this batch (completed "
                                              f"twice?)")
                seen.add(rid)
        self._version += 1  # a step planned before this commit is planned again
        self._clock = now
        for p in batch.prefills:
            r = self.requests[p.rid]
            kv.commit(r.rid, p.tokens)
            r.computed += p.tokens
            if not r.in_prefill:
                r.output_done += 1  # the last chunk samples the next token
                if r.output_done == 1:
                    self._emit(EventKind.FIRST_TOKEN, r.rid, now)
                self._maybe_finish(r, outcome, now)
        drafts = batch.decodes[0].drafts if batch.decodes else 0
        kept = [1] * len(batch.decodes)  # tokens each decode keeps
        if drafts:
            acc = self.kept_drafts(batch, outcome.accepted)
            kv.verify([d.rid for d in batch.decodes], acc, drafts)  # rollback, then commit
            kept = [1 + a for a in acc]
            self.counters.spec_decodes += len(acc)
            self.counters.drafted_tokens += drafts * len(acc)
            self.counters.accepted_tokens += sum(acc)
            if self.replays_state():
                self.counters.replayed_tokens += sum(1 + a for a in acc if a < drafts)
        elif batch.decodes:
            kv.commit_decodes([d.rid for d in batch.decodes])  # one window release per step
        stopped = outcome.stopped
        for d, n in zip(batch.decodes, kept, strict=True):
            r = running[d.rid]
            r.computed += n
            r.output_done += n
            if r.output_done >= r.output_tokens or r.rid in stopped:
                self._finish(r, now)
        self.reserve.on_step()
        self.counters.steps += 1
        if self.config.audit_every_step:
            self.audit()

    def kept_drafts(self, batch: StepBatch, accepted: Mapping[int, int]) -> list[int]:
        """The drafts each decode of ``batch`` keeps: what the verify accepted
        (``accepted``, absent: 0), at most its drafts and the output it has left after
        the step's own token (a request never generates past its output length). What
        :meth:`complete` commits; an engine that charges the replay of the accepted tokens
        asks for the same counts before.

        Raises:
            InvalidRequestError: ``accepted`` not a mapping.
        """
        if not isinstance(accepted, Mapping):
            raise InvalidRequestError(f"accepted must map request ids to drafts, got "
                                      f"{type(accepted).__name__}")
        running = self.running
        return [max(0, min(accepted.get(d.rid, 0), d.drafts,
                           running[d.rid].output_tokens - running[d.rid].output_done - 1))
                for d in batch.decodes]

    def replays_state(self) -> bool:
        """Whether a speculative step with a rejected draft recomputes the accepted tokens
        through the state layers (``REPLAY`` rollback on a chain with a state band)."""
        geom = self.kv.geom
        return (bool(geom.spec_tokens) and geom.state is not None
                and geom.rollback is StateRollback.REPLAY)

    # --- runs of decode steps (the simulator's fast-forward) -----------------------------

    def plan_decode_run(self, max_steps: int) -> DecodeRun | None:
        """The next steps, up to ``max_steps``, if they are a *decode run*: nothing waits,
        every running request decodes, and the run ends at the latest with the step in
        which the first of them generates its last token (those finish in it, as
        :meth:`complete` finishes them). Every step of a run is a step :meth:`step` would
        plan the same way (no admission to decide, no prefill), except where memory binds,
        which :meth:`run_decodes` checks step by step.

        Returns:
            The run's demands (:meth:`KVManager.decode_run`), or ``None``: no run here
            (waiting or prefilling requests, nothing running, or pages the closed form does
            not cover).

        Raises:
            ConfigError: ``max_steps < 1``.
        """
        if type(max_steps) is not int or max_steps < 1:
            raise ConfigError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if self.waiting or self.suspended or not self.running or self.kv.geom.spec_tokens:
            return None  # speculative steps keep a random count: no closed form
        shortest = max_steps + 1
        for r in self.running.values():
            if r.computed < r.prefill_target:
                return None
            shortest = min(shortest, r.output_tokens - r.output_done)
        rids = tuple(self.running)
        found = self.kv.decode_run(rids, min(max_steps, shortest))
        if found is None:
            return None
        demand, released = found
        return DecodeRun(rids, tuple(self.running[rid].computed for rid in rids), demand,
                         released, shortest)

    def run_decodes(self, run: DecodeRun, steps: int, times: Sequence[float],
                    after_step: Callable[[int, bool], None] | None = None) -> int:
        """Run the first ``steps`` steps of ``run`` (from :meth:`plan_decode_run`, nothing
        changed since) as :meth:`step` + :meth:`complete` would, stopping before the first
        step whose pages need page moves or evictions or do not fit (that step is left to
        :meth:`step`, which copies, evicts or retracts as it decides).

        A step that takes pages prices them on the chain (the planner's answer decides, as
        the decode check's) and takes them in one take; a step whose commit releases window
        pages commits the batch (:meth:`KVManager.commit_decodes`); the quiet steps in
        between only move the token counts (:meth:`KVManager.skip_decodes`). The chain sees
        exactly the takes and releases of the per-step loop. In the step in which requests
        generate their last token, they finish (``FINISHED`` events at that step's time).

        Args:
            run: the run.
            steps: steps to run, ``1 <= steps <= run.steps``.
            times: the clock after each step (seconds), at least ``steps`` of them: the
                ``now`` :meth:`complete` would get.
            after_step: called as ``after_step(j, changed)`` after step ``j`` (0-based)
                completed; ``changed``: pages were taken or released in it, or requests
                finished.

        Returns:
            Steps run (``0 .. steps``).

        Raises:
            InvalidRequestError: ``run`` does not match the running requests (one finished,
                was retracted or moved since), ``steps`` not an int in ``[1, run.steps]``,
                fewer ``times``, one that is not a finite time >= 0, or times that go back
                (each at or after the one before, the first at or after the last step's
                time); nothing changed.
        """
        if not isinstance(run, DecodeRun):
            raise InvalidRequestError(f"expected a DecodeRun, got {type(run).__name__}")
        if (type(steps) is not int or not 1 <= steps <= run.steps
                or len(times) < steps):
            raise InvalidRequestError(f"steps must be an int in [1, {run.steps}] with a time "
                                      f"each, got {steps!r} and {len(times)} times")
        _check_run_times(times[:steps], self._clock)
        running = self.running
        if (len(run.rids) != len(running) or any(
                running.get(rid) is None or running[rid].computed != start
                for rid, start in zip(run.rids, run.starts, strict=True))):
            raise InvalidRequestError("the decode run does not match the running requests")
        rids = list(run.rids)
        totals = run.demand.sum(axis=1)  # [steps, bands]
        taking = totals.any(axis=1)
        cursor = _RunCursor()
        try:
            for j in range(steps):
                take, release = bool(taking[j]), bool(run.released[j])
                if take and not self._run_take(run, j, rids, totals[j], cursor):
                    break
                changed = self._run_commit(run, rids, take or release, times[j], cursor)
                self._clock = times[j]
                if after_step is not None:
                    after_step(j, changed)
        finally:
            if not cursor.counted:
                self.kv.skip_decodes(rids, cursor.pending)
                self._advance(rids, cursor.done)
        return cursor.done

    def _run_take(self, run: DecodeRun, j: int, rids: list[int], total: np.ndarray,
                  cursor: _RunCursor) -> bool:
        """Take step ``j``'s pages of a decode run (``total``: pages per band) through
        its step plan, if the chain prices them without moves or evictions; returns
        whether it did (else the run stops before step ``j``)."""
        kv = self.kv
        quote = self.chain.price(Demand(tuple(total.tolist())))
        if not quote.fits or quote.needs_moves or quote.evicted_units:
            return False
        kv.skip_decodes(rids, cursor.pending)
        cursor.pending = 0
        at = run.demand[j].any(axis=1).nonzero()[0].tolist()
        kv.apply(kv.plan([(rids[i], 1) for i in at],
                         [Demand(tuple(row)) for row in run.demand[j][at].tolist()],
                         quote=quote))
        return True

    def _run_commit(self, run: DecodeRun, rids: list[int], changed: bool, now: float,
                    cursor: _RunCursor) -> bool:
        """Complete one step of a decode run at ``now``: commit the batch where it took or
        releases pages (``changed``), else only count it; in the step where the first
        requests reach their end, move every count and finish them. Returns whether
        pages moved or requests finished."""
        kv = self.kv
        if changed:
            kv.skip_decodes(rids, cursor.pending)
            cursor.pending = 0
            kv.commit_decodes(rids)
        else:
            cursor.pending += 1
        cursor.done += 1
        finishing = cursor.done == run.shortest
        if finishing:  # as complete(): counts move, the ones at their end finish
            kv.skip_decodes(rids, cursor.pending)
            cursor.pending = 0
            self._advance(rids, cursor.done)
            cursor.counted = True
            for rid in rids:
                r = self.running[rid]
                if r.output_done >= r.output_tokens:
                    self._finish(r, now)
        self.reserve.on_step()
        self.counters.steps += 1
        if self.config.audit_every_step and (changed or finishing):
            self.audit()
        return changed or finishing

    def _advance(self, rids: Iterable[int], steps: int) -> None:
        """Count ``steps`` decode steps of running ``rids`` (computed and output tokens)."""
        for rid in rids:
            r = self.running[rid]
            r.computed += steps
            r.output_done += steps

    # --- queries --------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """True when nothing waits, runs or is suspended to host."""
        return not self.waiting and not self.running and not self.suspended

    def drain_events(self) -> list[Event]:
        """Events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def audit(self) -> None:
        """Chain audit plus: every bound page is held by one running request or is a null
        page; with speculative decoding, every running request settled (no rolled-back
        page, window slack or checkpoint slot more or less than its tokens need:
        :meth:`KVManager.audit_settled`) (raises :class:`~kvchain.errors.AuditError`)."""
        self.chain.audit()
        self.kv.audit()
        if self.host is not None:
            self.kv.audit_host(self.host)
        if self.kv.geom.spec_tokens:
            self.kv.audit_settled(self.running)

    # --- internals --------------------------------------------------------------------------

    def _decode_check(self, now: float) -> tuple[ChainSnapshot, DecodeBatch]:
        """Make this step's decode tokens fit: reclaim window pages, then retract.

        Returns:
            The snapshot to admit against and the decodes' demands (running order).
        """
        snap = self.chain.snapshot()
        demands = self._decode_demands()
        if self.chain.planner.fits(snap, demands.total):
            return snap, demands
        self.counters.window_pages_reclaimed += self.kv.reclaim_window_pages(self.running)
        while True:
            snap = self.chain.snapshot()
            demands = self._decode_demands()
            if not self.running or self.chain.planner.fits(snap, demands.total):
                return snap, demands
            self._retract(self._youngest(), now)

    def _youngest(self) -> Request:
        """The running request retraction picks: the last to arrive (ties: highest id)."""
        return max(self.running.values(), key=lambda r: (r.arrival_s, r.rid))

    def _decode_demands(self) -> DecodeBatch:
        """The running decodes' demands (running order), priced for this step's drafts
        (:meth:`_step_drafts` of :meth:`_drafts_priced`)."""
        decoding = [r for r in self.running.values() if r.computed >= r.prefill_target]
        return self.kv.decode_demands([r.rid for r in decoding],
                                      self._step_drafts(self._drafts_priced(), decoding))

    def _step_drafts(self, drafts: int, decoding: Sequence[Request]) -> int:
        """Drafts per decode of a step whose decodes are ``decoding``: ``drafts`` cut by
        :func:`context_drafts` at each one's length under ``config.max_context_tokens``,
        the least of them (a decode batch computes ``1 + d`` tokens for every request, so
        one request near the end of its context takes fewer drafts for the whole step, and
        no request's KV runs past the context). ``drafts`` without a context."""
        context = self.config.max_context_tokens
        if context is None or not drafts:
            return drafts
        return min((context_drafts(drafts, r.computed, context) for r in decoding),
                   default=drafts)

    def _last_drafts(self, r: Request) -> int:
        """Drafts priced for ``r``'s last speculative step (its lifetime's ``k`` extra
        tokens): :func:`context_drafts` at that step's length ``prompt + limit - 2``."""
        return context_drafts(self._drafts_priced(), r.prompt_tokens + r.output_limit - 2,
                              self.config.max_context_tokens)

    def _drafts_priced(self) -> int:
        """Draft tokens per decode the decode check, the futures and admission price: the
        KV manager's ``spec_tokens`` (each decode computes ``1 + k`` tokens, its window
        holds ``W + k``, its lifetime ``k`` tokens more; the ``k`` checkpoint slots are
        the geometry's). A test's planted subclass prices 0 to show the
        admitted-but-unallocatable count going non-zero."""
        return self.kv.geom.spec_tokens

    def running_futures(self, running: Iterable[Request],
                        this_step: dict[int, tuple[int, Demand]]) -> Demand:
        """The running requests' reserved futures, summed per band (pages; what admission
        reserves before any waiting request is priced).

        One :meth:`_future` per running request, computed afresh each step and summed
        directly: a request's future depends on its position, this step's tokens and the
        reservation policy's estimate, which move every step for a decoding request, so
        there is nothing to keep between steps (the incremental ledger this replaces
        reused 0 of 356,307 contributions on a memory-bound run and cost 1.8x this sum).

        Args:
            running: the running requests (any order).
            this_step: request id -> (its tokens in this step, their demand, already
                reserved); a request absent from it has no tokens this step.
        """
        zero = Demand.zeros(self.kv.geom.num_bands)
        return sum_demands((self._future(r, *this_step.get(r.rid, (0, zero)))
                            for r in running), self.kv.geom.num_bands)

    def _future(self, r: Request, now_tokens: int, this_step: Demand) -> Demand:
        """Pages ``r`` needs beyond this step's ``now_tokens`` tokens (whose own demand,
        ``this_step``, is already reserved): rest of its prefill, then its expected output
        (ratio), the window's later peak."""
        rest_prefill = r.remaining_prefill - (now_tokens if r.in_prefill else 0)
        # KV still to come after the prefill: remaining_output - 1 (the last sampled token
        # is never fed back); a decode's own token (and drafts) is this step's. A request
        # still in its prefill will decode speculatively: k tokens more (the drafts of
        # its last step, in the cache until verified).
        output, expected = self._output_reserve(r, not r.in_prefill)
        if r.in_prefill:
            spec = self._last_drafts(r)
            output, expected = output + spec, expected + spec
        # Later chunks are reserved at one page: the scheduler cuts them to what fits.
        full_step = self.kv.demand(r.rid, now_tokens, rest_prefill + output,
                                   min(self.kv.geom.page_size, max(rest_prefill, 1)),
                                   rest_prefill + expected)
        return Demand(tuple(max(0, a - b) for a, b in
                            zip(full_step.pages, this_step.pages, strict=True)))

    def _admission_demand(self, r: Request, chunk: int) -> Demand:
        """A waiting request's first chunk plus its future (rest of the prefill, expected
        output, window peak, state slots); after a prefix-cache hit, from the hit on
        (:meth:`_admission_pair`'s second value)."""
        return self._admission_pair(r, chunk)[1]

    def _admission_pair(self, r: Request, chunk: int) -> tuple[Demand, Demand]:
        """``(the chunk's own demand, the chunk plus its future)`` for waiting ``r``, in one
        demand computation (:meth:`KVManager.demand_pair`): what the step takes and what
        admission reserves."""
        rest = r.prefill_target - r.computed - chunk
        output, expected = self._output_reserve(r, False)
        spec = self._last_drafts(r)  # its speculative steps' drafts (k tokens more)
        output, expected = output + spec, expected + spec
        hc = min(self.kv.geom.page_size, max(rest, 1))
        return self.kv.demand_pair(r.rid, chunk, rest + output, hc, rest + expected)

    def _output_reserve(self, r: Request, decoding: bool) -> tuple[int, int]:
        """``(reserved, expected)``: KV tokens of future output the policy reserves for
        ``r`` (up to its limit; ``decoding``: ``r`` decodes this step, so it is one of the
        batch the policy's :meth:`~kvchain.sched.admission.OutputReserve.begin_step` saw, holding
        ``computed + 1`` tokens after it) and the tokens it expects ``r`` to generate (its
        window's later peak is reserved over them:
        :func:`~kvchain.requests.demand.request_demand`'s ``horizon``)."""
        left, done, limit = r.output_left - 1, r.output_done, r.output_limit
        return (self.reserve.tokens(left, done, limit, r.computed + 1 if decoding else None),
                self.reserve.horizon(left, done, limit))

    def _waiting_order(self) -> Iterable[Request]:
        """Waiting requests in policy order, read lazily from the queue (no copy, no sort:
        the walk stops at the first request that does not fit, and nothing changes the
        queue during it; :mod:`kvchain.sched.queue`). ``cache-aware`` ranks the look-ahead
        by the hit each request would get now (a pure match; FCFS without a cache)."""
        if self.waiting.policy is QueuePolicy.CACHE_AWARE and self.kv.cache is not None:
            return self.waiting.cache_aware_order(self._cached_tokens)
        return iter(self.waiting)

    def _cached_tokens(self, r: Request) -> int:
        """Prompt tokens of waiting ``r`` the prefix cache would serve now (0 without
        page keys)."""
        if r.page_keys is None:
            return 0
        return self.kv.cached_tokens(r.page_keys, r.prompt_tokens)

    def _admit_resumes(self, step: ScheduledStep, budget: ChainPrefillBudget) -> bool:
        """Admit suspended requests, earliest arrival first, while the ledger fits each one's
        load-back plus its future (:meth:`_resume_demand`) and ``max_running`` allows; the
        admitted are loaded back in this step's take. Returns whether every suspended
        request was admitted (if not, the waiting queue waits behind it)."""
        limit = self.config.max_running
        for r in sorted(self.suspended.values(), key=lambda r: (r.arrival_s, r.rid)):
            if len(self.running) + len(step.resumes) >= limit:
                return False
            need = self._resume_demand(r)
            if not budget.fits(need):
                step.memory_blocked = True
                return False
            budget.reserve(need)
            step.resumes.append(r.rid)
        return True

    def _resume_demand(self, r: Request) -> Demand:
        """A suspended request's load-back (:meth:`KVManager.resume_demand`: the pages it
        held) plus its future from its position once loaded, priced as a candidate's: the
        rest of its prefill, or its next decode token, then its expected output."""
        rest = r.remaining_prefill
        output, expected = self._output_reserve(r, False)
        hc = min(self.kv.geom.page_size, max(rest, 1))
        spec = self._last_drafts(r)
        # its next decode (and drafts, cut at the context)
        extend = 0 if r.in_prefill else 1 + self._step_drafts(self._drafts_priced(), (r,))
        future = self.kv.demand(r.rid, extend, rest + output + spec, hc,
                                rest + expected + spec)
        return self.kv.resume_demand(r.rid).plus(future)

    def _to_host(self, r: Request) -> bool:
        """Whether retracting ``r`` copies it to host: ``retract_to`` host, or ``auto``
        when (1) no other running request reads ``r``'s prefix-cache pages (copied to host,
        they would come back as a second, private copy of pages the cache keeps for the
        others: device memory the sharing saved, lost while ``r`` runs again), and (2) the
        cost model finds the copy of all it holds faster than recomputing what the prefix
        cache would not serve it again - its ``computed`` tokens less the prompt tokens the
        cache matches now (a pure match, its own inserted prompt included, which a
        recompute re-hits unless it is evicted meanwhile: an optimistic recompute, so
        ``auto`` leans to recompute where the cache serves the victim)."""
        mode = self.config.retract_to
        if mode is RetractTo.RECOMPUTE or not r.computed:
            return False
        if mode is RetractTo.HOST:
            return True
        assert self.retract_cost is not None
        if self.kv.shared_by_others(r.rid):
            return False
        redo = r.computed
        if r.page_keys is not None and r.rid not in self._no_hit:
            redo -= min(redo, self.kv.cached_tokens(r.page_keys, r.prompt_tokens))
        return self.retract_cost.host_is_cheaper(redo, self.kv.suspend_bytes(r.rid))

    def _suspend(self, r: Request, now: float) -> bool:
        """Retract ``r`` by host copy; False (nothing changed) when the host pools have no
        room (counted as a fallback to recompute)."""
        assert self.host is not None
        try:
            sus = self.kv.suspend(r.rid, self.host)
        except HostPoolFullError:
            self.counters.host_retract_fallbacks += 1
            return False
        del self.running[r.rid]
        self.suspended[r.rid] = r
        r.status = RequestStatus.WAITING
        r.retractions += 1
        self._resume_bytes[r.rid] = sus.nbytes
        self._write_bytes += sus.nbytes
        c = self.counters
        c.retractions += 1
        c.retractions_to_host += 1
        c.host_bytes_retracted += sus.nbytes
        c.recompute_tokens_saved += r.computed
        self.reserve.on_retract()
        self._emit(EventKind.RETRACTED, r.rid, now)
        return True

    def _retract(self, r: Request, now: float) -> None:
        self._version += 1
        if self._to_host(r) and self._suspend(r, now):
            return
        self.kv.free(r.rid, insert=False)
        del self.running[r.rid]
        r.status = RequestStatus.WAITING
        r.retractions += 1
        r.computed = 0
        r.prefill_target = r.prompt_tokens + r.output_done
        self.counters.recomputed_tokens += r.prefill_target  # prefilled again
        self.waiting.appendleft(r)
        self.counters.retractions += 1
        self.reserve.on_retract()
        self._emit(EventKind.RETRACTED, r.rid, now)

    def _batch_matches(self, batch: StepBatch) -> bool:
        """Whether every request of ``batch`` is running, listed once, at its position
        (what :meth:`complete` requires; the fast check of every step)."""
        running = self.running
        n = 0
        for p in batch.prefills:
            r = running.get(p.rid)
            if r is None or p.start != r.computed:
                return False
            n += 1
        for d in batch.decodes:
            r = running.get(d.rid)
            if r is None or d.context != r.computed:
                return False
            n += 1
        rids = {p.rid for p in batch.prefills}
        rids.update(d.rid for d in batch.decodes)
        return len(rids) == n

    def _maybe_finish(self, r: Request, outcome: StepOutcome, now: float) -> None:
        if r.output_done >= r.output_tokens or r.rid in outcome.stopped:
            self._finish(r, now)

    def _finish(self, r: Request, now: float) -> None:
        self.kv.free(r.rid)
        del self.running[r.rid]
        r.status = RequestStatus.FINISHED
        self.counters.finished += 1
        self.reserve.on_finish(r.output_done, r.output_limit)
        self._emit(EventKind.FINISHED, r.rid, now)

    def _emit(self, kind: EventKind, rid: int, now: float, detail: str = "") -> None:
        self._events.append(Event(kind, rid, now, detail))

    def request(self, rid: int) -> Request:
        """The request with id ``rid``.

        Raises:
            InvalidDemandError: ``rid`` not an int request id (:func:`check_rid`: a bool
                or a float ``1.0`` would alias request 1).
            UnknownRequestError: no request ``rid`` was added.
        """
        check_rid(rid)
        try:
            return self.requests[rid]
        except KeyError:
            raise UnknownRequestError(f"no request {rid}") from None


@dataclass(slots=True)
class _RunCursor:
    """Where :meth:`Scheduler.run_decodes` is: steps done, quiet steps whose tokens are
    not committed yet, and whether the requests' counts already moved by ``done``."""

    done: int = 0
    pending: int = 0
    counted: bool = False


def _itself(d: Demand) -> Demand:
    """The identity (a chunk search whose values are the demands themselves)."""
    return d


def _reserved(pair: tuple[Demand, Demand]) -> Demand:
    """What admission reserves of an :meth:`Scheduler._admission_pair`."""
    return pair[1]


def _demand_bytes(snapshot: ChainSnapshot, demand: Demand) -> int:
    return sum(d * b.page_bytes for d, b in zip(demand.pages, snapshot.bands, strict=True))


def _band_cap_refusal(empty: ChainSnapshot, need: Demand) -> str | None:
    """Why ``need`` can never fit the empty chain although its bytes fit the free bytes:
    the first band whose pages exceed what that band can ever hold (``cap``: a fixed
    pool's size, or a band's index-space cap); ``None`` when the bytes themselves do not
    fit or no band binds. E.g. fixed pools on jet-nemotron-2b in 300 MB: a request of
    196,509,696 B needs more full pages than the full pool's 2,676."""
    if _demand_bytes(empty, need) > empty.free_bytes:
        return None
    for d, b in zip(need.pages, empty.bands, strict=True):
        if d > b.cap - b.live:
            return (f"its {d:,} {b.label} pages pass the {b.cap - b.live:,} that band can "
                    f"ever hold (its pool or index space)")
    return None


def _check_step_type(step: object) -> None:
    """Refuse a step that is not a :class:`ScheduledStep` (InvalidRequestError)."""
    if not isinstance(step, ScheduledStep):
        raise InvalidRequestError(f"expected a ScheduledStep (from schedule), got "
                                  f"{type(step).__name__}")


def _check_outcome(batch: StepBatch, outcome: object) -> None:
    """Refuse a step outcome that is not a :class:`StepOutcome`, or names a request outside
    ``batch``: a stop of a request the step did not compute, drafts accepted for one that
    did not decode in it (a typo'd id would be dropped silently).

    Raises:
        InvalidRequestError: as above.
    """
    if not isinstance(outcome, StepOutcome):
        raise InvalidRequestError(f"expected a StepOutcome, got {type(outcome).__name__}")
    if outcome.stopped or outcome.accepted:
        decodes = {d.rid for d in batch.decodes}
        bad = sorted(set(outcome.accepted) - decodes)
        if bad:
            raise InvalidRequestError(f"a step outcome accepts drafts of requests that do "
                                      f"not decode in its batch: {bad[:8]}")
        bad = sorted(set(outcome.stopped) - decodes - {p.rid for p in batch.prefills})
        if bad:
            raise InvalidRequestError(f"a step outcome stops requests that are not in its "
                                      f"batch: {bad[:8]}")


def _check_fresh(r: Request) -> None:
    """Refuse a request that is not fresh: :meth:`Scheduler.add` queues a request that
    has not started - status ``WAITING`` and no progress (``computed``, ``output_done``,
    ``retractions`` and ``hit_tokens`` 0, ``prefill_target`` its prompt, the
    constructor's default). A running or finished request would never be scheduled, and
    one with progress would diverge from the KV manager, which holds none of its pages
    (its own retractions requeue requests without this check).

    Raises:
        InvalidRequestError: as above.
    """
    if r.status is not RequestStatus.WAITING:
        raise InvalidRequestError(f"request {r.rid}: add takes a new request (status "
                                  f"waiting), got status {r.status.value}")
    for name in ("computed", "output_done", "retractions", "hit_tokens"):
        value = getattr(r, name)
        if value:
            raise InvalidRequestError(f"request {r.rid}: add takes a new request with no "
                                      f"progress, got {name}={value}")
    if r.prefill_target != r.prompt_tokens:
        raise InvalidRequestError(f"request {r.rid}: add takes a new request whose "
                                  f"prefill_target is its prompt ({r.prompt_tokens} tokens), "
                                  f"got {r.prefill_target}")


def _check_run_times(times: Sequence[float], last: float) -> None:
    """Refuse a decode run's step times unless each is a finite time >= 0 (s) at or after
    the one before, the first at or after ``last`` (the scheduler's clock). Floats are
    checked by C-level scans (``map``; a run passes about 70 of them); anything else, or
    a refusal, by :func:`_check_time` one by one, which names the first bad time.

    Raises:
        InvalidRequestError: as above.
    """
    if (set(map(type, times)) <= {float} and all(map(math.isfinite, times))
            and (not times or times[0] >= max(last, 0.0))
            and all(map(operator.le, times, times[1:]))):
        return  # every time a finite float, in order from ``last`` and 0
    for t in times:
        _check_time(t)
        if t < last:
            raise InvalidRequestError(f"the run's step times go back: {t} s after {last} s")
        last = t


def _check_time(now: object) -> None:
    """Refuse a clock reading that is not a finite number of seconds >= 0 (a bool, NaN,
    infinity or a negative time would order events wrongly or never end a wait).

    Raises:
        InvalidRequestError: as above.
    """
    if (isinstance(now, bool) or not isinstance(now, numbers.Real)
            or not math.isfinite(now) or now < 0):
        raise InvalidRequestError(f"time must be a finite number of seconds >= 0, got {now!r}")
