"""The serving simulator's event loop: a real trace through the real scheduler, admission
and chain, with the clock advanced by the GPU cost model or a fixed tick per step
(``SimConfig.clock``; docs/design.md §6).

Loop::

    arrivals due by `now` -> scheduler.step(now)  (admission + one chain take)
    -> cost model prices the batch, plus the pages the chain copied since the previous
       step (compaction, relocation: 2 x bytes / HBM bandwidth, serialized before the
       forward; :mod:`kvchain.sim.cost`) -> now += step time -> scheduler.complete(...)
    -> lifecycle events and a step sample (bands, utilization, queues) to the recorder

When nothing runs and nothing can be scheduled, the clock jumps to the next arrival. Only
the model's math is replaced; the memory manager runs exactly as in an engine.

Fast-forward (``SimConfig.fast_forward``, on by default): between events - an arrival due,
a waiting request, a prefill chunk, a point where memory could bind (a take that would not
fit, move pages or evict) - the steps only decode, and the loop advances them as one *decode
run* (:func:`_decode_run`): their page-boundary crossings and window releases in closed form
(:meth:`Scheduler.plan_decode_run`), their times as array arithmetic over the cost model,
the chain's takes and releases of exactly the steps that have them, the quiet steps as a
token-count update, one step sample per step, and the finishes of its last step. Every
number comes out as the per-step loop gives it (``--no-fast-forward``, the oracle;
``tests/sim/test_fast_forward.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np

from kvchain.alloc.allocator import Allocator, EvictingAllocator
from kvchain.alloc.chain import Chain, ChainStats
from kvchain.alloc.snapshot import ChainSnapshot
from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.host_cache import HostTier, host_tier_refusal
from kvchain.cache.radix import CacheGeometry, PrefixCache, cache_refusal
from kvchain.cache.tiered import TieredPrefixCache
from kvchain.errors import BufferUnsupportedError, ConfigError, KVChainError
from kvchain.gpu import GPUSpec, kv_buffer_bytes
from kvchain.layout import ChainLayout, check_smallest_request, plan_layout
from kvchain.model.draft import check_spec_tokens
from kvchain.model.layers import TARGET, LifetimeClass
from kvchain.model.spec import ModelSpec
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import HostSide, host_side_for
from kvchain.sched.request import EventKind, Request, StepBatch, StepOutcome
from kvchain.sched.retraction import RetractTo
from kvchain.sched.scheduler import Scheduler, SchedulerConfig, UnallocatableEvent
from kvchain.sim.cost import (
    ClockKind,
    DraftCostModel,
    GPUCostModel,
    HostRetractionCost,
    StepClock,
    StepWorkBuilder,
    host_transfer_time,
    overlapped_time,
)
from kvchain.sim.metrics import (
    DEFAULT_MAX_STEP_SAMPLES,
    BandSample,
    MetricsRecorder,
    SimSummary,
    band_samples,
    check_max_step_samples,
    request_owned_pages,
    summarize,
)
from kvchain.sim.prefix import (
    PrefixCacheStats,
    default_cache_off_reason,
    has_content_keys,
    host_interval_tokens,
    request_page_keys,
    trace_block_tokens,
    truncated_request,
)
from kvchain.sim.run_options import RunOptions, check_retract_to
from kvchain.sim.traces import Trace, TraceRequest


class SimulationStuckError(KVChainError, RuntimeError):
    """Requests wait, nothing runs and nothing can be admitted: a scheduler bug."""


FROM_OPTIONS = SchedulerConfig()
"""The default of :attr:`SimConfig.scheduler`, a marker (compared by identity): build the
scheduler's limits from the options."""

#: The options :meth:`RunOptions.scheduler_config` turns into the scheduler's limits.
SCHEDULER_OPTIONS = ("policy", "max_running", "chunk_size", "reserve", "new_token_ratio",
                     "strict", "retract_to", "partial_hits")


@dataclass(frozen=True, slots=True)
class SimConfig(RunOptions):
    """One simulation's inputs: what runs - ``model`` (per rank), ``gpu``, ``trace``
    (already cut: :meth:`RunOptions.load_trace`) - and, keyword-only, every
    :class:`~kvchain.sim.run_options.RunOptions` field, inherited with its meaning, units,
    default and rule stated there once (:meth:`SimConfig.of` builds it from a ``RunOptions``). The
    options that cut the trace or build the model (``requests``, ``end_s``, ``rate_scale``,
    ``block_tokens``, ``kv_dtype``, ``state_dtype``, ``weight_format``, ``draft_model``)
    were applied before; the loop does not read them. What the loop adds to them:

    Attributes:
        scheduler: the scheduler's limits. :data:`FROM_OPTIONS` (the default): built from
            the options (:meth:`RunOptions.scheduler_config`), ``strict`` on by default here
            (a library run stops at the first admitted-but-unallocatable step; the
            commands' default is off, :mod:`kvchain.sim.run_options`). Given: used as is,
            and the options of :data:`SCHEDULER_OPTIONS` keep their defaults or say the
            same.
        max_step_samples: step samples kept for plots (totals stay exact; no option).

    What the loop makes of the options beyond their help: ``buffer_bytes=None`` is
    :func:`kvchain.gpu.kv_buffer_bytes`; a prompt cut by ``truncate`` counts in
    ``requests_truncated``, one whose output alone reaches the context is still rejected
    (reason ``context:``, ``requests_rejected_context``); ``fast_forward=False`` is the
    oracle of :func:`_decode_run`; ``spec_tokens`` decodes through
    :meth:`StepWorkBuilder.add_verify`, the accepted ``a`` being the leading successes of
    ``k`` Bernoulli draws (``P(a >= j) = p^j``, ``p = spec_acceptance``), one generator per
    run seeded by ``seed``; ``host_bytes`` load-backs (:mod:`kvchain.cache.tiered`) are
    charged at the GPU's host link (:func:`host_transfer_time`) overlapped layer by layer
    with the step's forward (:func:`~kvchain.sim.cost.overlapped_time`), and host-copy
    retractions take their slots from the same bytes (:func:`retraction_host`).

    Raises:
        ConfigError: as :class:`RunOptions` (a wrong type names the field, a value out of
            range its flag); ``max_step_samples`` not ``None`` or an int >= 6
            (:func:`~kvchain.sim.metrics.check_max_step_samples`); ``spec_tokens`` at or
            past the model's context
            (:func:`~kvchain.model.draft.check_spec_tokens`); a given ``scheduler`` that
            the scheduler options contradict; its ``retract_to`` without ``host_bytes``
            (:func:`~kvchain.sim.run_options.check_retract_to`).
    """

    model: ModelSpec
    gpu: GPUSpec
    trace: Trace
    scheduler: SchedulerConfig = FROM_OPTIONS
    max_step_samples: int = DEFAULT_MAX_STEP_SAMPLES
    strict: bool = field(default=True, kw_only=True)  # SchedulerConfig's default

    def __post_init__(self) -> None:
        RunOptions.__post_init__(self)
        check_max_step_samples(self.max_step_samples)
        check_spec_tokens(self.spec_tokens, self.model)
        if self.scheduler is FROM_OPTIONS:
            object.__setattr__(self, "scheduler", self.scheduler_config())
        elif (any(getattr(self, f.name) != f.default for f in fields(self)
                  if f.name in SCHEDULER_OPTIONS)
              and self.scheduler != self.scheduler_config()):
            raise ConfigError("the scheduler's limits are given both as scheduler= and as "
                              f"options ({', '.join(SCHEDULER_OPTIONS)}) that differ: give "
                              "one of the two")
        check_retract_to(self.scheduler.retract_to, self.host_bytes, self.clock)

    @classmethod
    def of(cls, options: RunOptions, model: ModelSpec, gpu: GPUSpec, trace: Trace
           ) -> SimConfig:
        """The run of ``model`` on ``gpu`` serving ``trace`` (already cut:
        :meth:`RunOptions.load_trace`) under ``options`` (every field carried over by name),
        the scheduler built from them.

        Raises:
            ConfigError: ``options`` not a :class:`RunOptions`; as :class:`SimConfig`.
        """
        if not isinstance(options, RunOptions):
            raise ConfigError(f"options must be a RunOptions, got {type(options).__name__}")
        return cls(model, gpu, trace, **{f.name: getattr(options, f.name)
                                         for f in fields(RunOptions)})

    def layout(self) -> ChainLayout:
        """The chain layout for this model and buffer.

        Raises:
            ConfigError: a memory fraction that leaves no room for the KV buffer.
            BufferTooSmallError: a buffer that cannot hold one smallest request (with
                its speculative checkpoint slots, ``spec_tokens`` under CHECKPOINTS).
        """
        buffer = self.buffer_bytes
        if buffer is None:
            buffer = kv_buffer_bytes(self.gpu, self.model.resident_weight_bytes,
                                     mem_fraction=self.mem_fraction)
        layout = plan_layout(self.model.classes, buffer, self.page_size)
        # A speculative request claims more state slots (its checkpoints): the smallest
        # request must fit with them, or the run could admit none.
        slots = RequestGeometry.of(layout, self.spec_tokens, self.spec_rollback).state_slots
        if slots > layout.state_slots_per_request:
            check_smallest_request(layout, slots)
        return layout

    def cache_on(self, layout: ChainLayout) -> bool:
        """Whether the run serves cached prefixes on ``layout``: ``prefix_cache`` when
        given, else on when the trace carries content keys, on any chain (with a memory
        manager that can evict:
        :func:`simulate` keeps it off for one that cannot)."""
        if self.prefix_cache is not None:
            return self.prefix_cache
        return default_cache_off_reason(self.trace, layout) is None

    def check_cache(self, layout: ChainLayout) -> None:
        """Refuse prefix-cache settings that cannot take effect on ``layout`` and this
        trace, instead of running without the cache the caller asked for.

        Raises:
            ConfigError: ``prefix_cache=True`` on a trace without content keys (no request
                carries ``prefix_block_ids``: nothing could ever hit), or on a chain the
                cache cannot key (:func:`kvchain.cache.radix.cache_refusal`:
                several state bands, e.g. a draft model's). Any number of window and
                chunked-local bands takes the cache; ``layout`` is the run's chain.
                ``scheduler.partial_hits`` with the cache on, on a chain without a state
                band (a partial hit could never differ from an ordinary one).
                ``host_bytes`` with the cache on, on a chain the host tier cannot serve
                (:func:`kvchain.cache.host_cache.host_tier_refusal`: several full bands;
                with the cache off the host bytes serve retraction alone, as before).
        """
        if self.prefix_cache and not has_content_keys(self.trace):
            raise ConfigError(f"--prefix-cache: trace {self.trace.name!r} carries no content "
                              "keys (no request has hash_ids), so no prompt could hit; run "
                              "it without --prefix-cache")
        refused = cache_refusal(RequestGeometry.of(layout)) if self.prefix_cache else None
        if refused is not None:
            raise ConfigError(f"--prefix-cache: {refused}; run it without --prefix-cache")
        if (self.scheduler.partial_hits and self.cache_on(layout)
                and RequestGeometry.of(layout).state is None):
            raise ConfigError("--partial-hits: the model has no recurrent state band, so "
                              "every hit already ends where its pages match (there is no "
                              "checkpoint to recompute from); run it without --partial-hits")
        if self.host_bytes is not None:
            host_refused = host_tier_refusal(RequestGeometry.of(layout))
            if host_refused is not None and self.cache_on(layout):
                raise ConfigError(f"--host-bytes: no host tier on this chain: {host_refused}")
            retracts = self.scheduler.retract_to is not RetractTo.RECOMPUTE
            if not self.cache_on(layout) and not retracts:
                why = ("--no-prefix-cache" if self.prefix_cache is False
                       else default_cache_off_reason(self.trace, layout))
                raise ConfigError(f"--host-bytes: the host tier sits below the prefix cache, "
                                  f"which is off for this run ({why}); host memory serves "
                                  f"it only for --retract-to host or auto")
            if self.gpu.host_link is None:
                raise ConfigError(f"--host-bytes: GPU {self.gpu.name} has no host link "
                                  f"figure, so load-backs cannot be timed")


@dataclass(frozen=True, slots=True)
class SimResult:
    """What a simulation produced.

    Attributes:
        summary: the numbers (throughput, TTFT/TPOT percentiles, utilization...).
        recorder: per-request records and step samples (plots, requests.csv).
        layout: the chain layout simulated.
        chain_stats: the chain's counters (takes, releases, pages copied).
        admission_decisions: pricing decisions made by admission.
        unallocatable: the scheduler's admitted-but-unallocatable events (request,
            demand, snapshot, shortfall); their count is
            ``summary.admitted_but_unallocatable``.
        prefix_cache: the prefix cache's figures, or ``None`` when it was off.
        fast_forward_steps: steps advanced in decode runs (``SimConfig.fast_forward``), of
            ``summary.steps`` in all; 0 with it off.
    """

    summary: SimSummary
    recorder: MetricsRecorder
    layout: ChainLayout
    chain_stats: ChainStats
    admission_decisions: int
    unallocatable: tuple[UnallocatableEvent, ...] = ()
    prefix_cache: PrefixCacheStats | None = None
    fast_forward_steps: int = 0


def simulate(config: SimConfig, *, allocator: Allocator | None = None,
             on_allocated: Callable[[Scheduler, StepBatch, float], None] | None = None,
             progress: Callable[[int, int], None] | None = None,
             audit_every_step: bool = False) -> SimResult:
    """Serve ``config.trace`` with kvchain (or another memory manager) and return the metrics.

    Args:
        config: model, GPU, trace and limits.
        allocator: the memory manager, any :class:`~kvchain.alloc.allocator.Allocator`: a
            :class:`Chain` (default: a bookkeeping-only chain of ``config.layout()``) or a
            baseline's pool allocator; its ``layout`` is the one simulated.
        on_allocated: called as ``on_allocated(scheduler, batch, now)`` after each step's
            pages are taken and before its forward (memory at its fullest), e.g. to measure
            bytes needed against bytes held.
        progress: called as ``progress(done, total)`` (requests finished or rejected) after
            each step that changed it.
        audit_every_step: run the chain and KV-manager audits after every step (slow; tests;
            in a fast-forwarded decode run, after every step that takes or releases pages).

    Returns:
        The :class:`SimResult`; ``summary.admitted_but_unallocatable`` (events recorded when
        ``config.scheduler.strict`` is off) and ``summary.leaked_pages`` must be 0.
        ``summary.extra`` also has the page copies charged to step times
        (``pages_copied``, ``bytes_copied``, ``copy_steps``, ``copy_time_s`` seconds,
        ``copy_time_pct`` of GPU time = the sum of step times) and ``recomputed_tokens``
        (tokens retracted requests prefilled again).

    Raises:
        ConfigError / BufferTooSmallError: from the layout; ConfigError from
            :meth:`SimConfig.check_cache` (prefix-cache or host-tier settings that cannot
            take effect; a host tier on a memory manager that cannot evict).
        SimulationStuckError: requests left waiting with nothing to run (a bug).
        AdmissionDivergenceError: ``config.scheduler.strict`` and the allocator refused an
            admitted batch (a bug).
    """
    run = _Run(config, allocator, audit_every_step)
    run.serve(on_allocated, progress)
    return run.result()


def check_setup(config: SimConfig, *, allocator: Allocator | None = None) -> None:
    """Build what :func:`simulate` builds before its first step (the chain or
    ``allocator``'s bands, the prefix cache and host tier, the request layer, the
    scheduler) and drop it: its set-up's refusals, before any step runs. ``compare``
    checks every memory manager this way before it runs the first, so a manager whose
    split of the buffer holds no request fails at once, not after the others' runs.

    Raises:
        As :func:`simulate`'s set-up: ConfigError / BufferTooSmallError (the layout, the
        cache or host settings, the scheduler's smallest-request check).
    """
    _Run(config, allocator, audit=False)


def _prefix_cache(config: SimConfig, chain: Allocator, block: int, audit: bool
                  ) -> tuple[PrefixCache | None, HostTier | None, PrefixCacheStats | None]:
    """The run's prefix cache (none when :meth:`SimConfig.cache_on` says off or the memory
    manager cannot evict), its host tier under it (``config.host_bytes``) and the stats
    the run fills: resume points on the trace's content-block boundaries (``block``
    tokens, rounded up to whole pages).

    Raises:
        ConfigError: ``--host-bytes`` with nothing to put a host tier under (a memory
            manager without a prefix cache, retraction by recompute), host memory this
            machine cannot index, or a host tier that holds no resume interval.
    """
    layout = chain.layout
    use_cache = config.cache_on(layout)
    if (config.host_bytes is not None and use_cache
            and not isinstance(chain, EvictingAllocator)
            and config.scheduler.retract_to is RetractTo.RECOMPUTE):
        raise ConfigError("--host-bytes: this memory manager has no prefix cache to put a "
                          "host tier under")
    if not (use_cache and isinstance(chain, EvictingAllocator)):
        return None, None, None
    interval = -(-block // layout.page_size) * layout.page_size
    geom = CacheGeometry.of(layout)
    host: HostTier | None = None
    cache: PrefixCache
    if config.host_bytes is not None:
        host_interval = host_interval_tokens(config.trace, geom, interval,
                                             config.cache_points.resolve(geom))
        with _host_bytes_refused(config.host_bytes):
            host = HostTier(layout, config.host_bytes, host_interval, geom,
                            audit=True if audit else None)
        if host.plan.intervals == 0 and config.scheduler.retract_to is RetractTo.RECOMPUTE:
            # (with --retract-to host/auto the same bytes also serve suspensions, which
            # fall back to recompute when they do not fit: counted, not refused)
            raise ConfigError(
                f"--host-bytes {config.host_bytes:,}: the host tier holds no resume "
                f"interval of {host.plan.interval_tokens:,} tokens (one needs "
                f"{host.plan.interval_bytes:,} B of slots), so nothing could be written")
        cache = TieredPrefixCache(geom, host, interval_tokens=interval,
                                  policy=config.cache_points)
    else:
        cache = PrefixCache(geom, interval_tokens=interval, policy=config.cache_points)
    stats = PrefixCacheStats(interval_tokens=interval)
    if host is not None:
        stats.host_slot_bytes = host.page_bytes
        stats.host_slots = tuple(pool.slots for pool in host.pools)
    return cache, host, stats


def _clock_of(config: SimConfig, host_copies: bool) -> tuple[
        GPUCostModel | StepClock, StepWorkBuilder, DraftCostModel | None,
        HostRetractionCost | None]:
    """The run's clock and its work builder, the draft model's cost (speculative runs with
    a draft) and the cost of host copies (``host_copies``: retraction by host copy), both
    on the roofline only; the step clock charges a fixed tick (instant compute: a model
    without weights runs too)."""
    if config.clock is ClockKind.ROOFLINE:
        clock = GPUCostModel(config.model, config.gpu)
        draft = DraftCostModel.of(config.model, config.gpu) if config.spec_tokens else None
        return (clock, clock.builder(), draft,
                HostRetractionCost(clock) if host_copies else None)
    # The largest window (chunk) of each kind: StepWork only counts attention spans.
    windows = [c.window for c in config.model.cache_classes(LifetimeClass.WINDOW)]
    locals_ = [c.window for c in config.model.cache_classes(LifetimeClass.LOCAL)]
    return (StepClock(config.step_ms / 1000),
            StepWorkBuilder(max((w for w in windows if w), default=None),
                            max((c for c in locals_ if c), default=None)), None, None)


@dataclass(slots=True)
class _Charges:
    """What the steps charged beside their forwards (seconds, counts): page copies (each
    step pays the bytes the chain copied since the previous one: ``copied`` so far),
    host -> device load-backs (before overlap) and the host copies of retraction."""

    copied: int
    copy_s: float = 0.0
    copy_steps: int = 0  # steps that copied (each waits for the previous forward's fence)
    load_s: float = 0.0
    load_steps: int = 0
    resume_load_s: float = 0.0
    suspend_write_s: float = 0.0


class _Run:
    """One :func:`simulate` run: its parts (the chain, prefix cache and host tier, the
    request layer, the scheduler, the clock, the recorder), the trace in arrival order
    (``i``: the next request to arrive), the clock reading ``now`` (seconds) and the
    totals the steps add up. :meth:`serve` is the event loop, :meth:`result` the metrics.

    Raises:
        As :func:`simulate` (the set-up's errors, in this order: the layout, the cache
        settings, the request layer, the host side of retraction, the cost model).
    """

    def __init__(self, config: SimConfig, allocator: Allocator | None, audit: bool) -> None:
        self.config = config
        chain = self.chain = allocator if allocator is not None else Chain(config.layout())
        layout = self.layout = chain.layout
        config.check_cache(layout)
        self.block = trace_block_tokens(config.trace)
        self.cache, self.host, self.stats = _prefix_cache(config, chain, self.block, audit)
        self.kv = KVManager(chain, self.cache, config.spec_tokens, config.spec_rollback)
        self.spec = config.spec_tokens
        self.draws = np.random.default_rng(config.seed)
        self.spec_bytes = _SpecBytes.of(layout, self.kv)
        self.context = config.scheduler.max_context_tokens or config.model.max_context_tokens
        sched_config = replace(config.scheduler, audit_every_step=audit,
                               max_context_tokens=self.context)
        self.retract_host: HostSide | None = None
        if sched_config.retract_to is not RetractTo.RECOMPUTE:
            with _host_bytes_refused(config.host_bytes):
                self.retract_host = retraction_host(layout, config.host_bytes, self.block,
                                                    self.host)
        self.clock, self.builder, self.draft_cost, self.host_cost = _clock_of(
            config, self.retract_host is not None)
        self.sched = Scheduler(self.kv, sched_config, host=self.retract_host,
                               retract_cost=self.host_cost)
        self.recorder = MetricsRecorder(max_step_samples=config.max_step_samples,
                                        prefix_cache=self.cache is not None)
        self.null_pages = tuple(b.reserved_pages for b in layout.bands)
        self.requests = sorted(config.trace.requests, key=lambda r: (r.arrival_s, r.request_id))
        self.served: list[TraceRequest] = []  # the requests as served (truncated), in order
        self.charges = _Charges(chain.stats.bytes_copied)
        self.i = self.done = 0
        self.now = 0.0
        self.truncated = 0
        self.memory_blocked = 0  # steps whose head waiting request memory refused
        self.fast_steps = 0

    def serve(self, on_allocated: Callable[[Scheduler, StepBatch, float], None] | None,
              progress: Callable[[int, int], None] | None) -> None:
        """The event loop (the module's docstring), until every request ended.

        Raises:
            SimulationStuckError: requests wait with nothing to run (a bug).
        """
        sched, requests, total = self.sched, self.requests, len(self.requests)
        fast = self.config.fast_forward and on_allocated is None and not self.spec
        while self.i < total or not sched.idle:
            if sched.idle:
                self.now = max(self.now, requests[self.i].arrival_s)
            if fast and self._fast_forward(progress):
                continue
            self._arrive()
            batch = sched.step(self.now)
            self.memory_blocked += batch.memory_blocked
            if batch.is_empty:
                self.done += _record_events(sched, self.recorder)
                if self.i < total:
                    self.now = max(self.now, requests[self.i].arrival_s)
                    continue
                if sched.idle:
                    break
                raise SimulationStuckError(
                    f"{len(sched.waiting)} requests wait, {len(sched.running)} run, and the "
                    f"scheduler plans nothing at t={self.now:.3f} s")
            if on_allocated is not None:
                on_allocated(sched, batch, self.now)
            accepted = self._forward_work(batch)
            self._complete(batch, self._step_seconds(batch), accepted, progress)

    def _sample(self) -> _StepBytes:
        return _StepBytes.now(self.chain, self.kv, self.sched, self.cache, self.null_pages)

    def _fast_forward(self, progress: Callable[[int, int], None] | None) -> bool:
        """Advance a decode run (:func:`_decode_run`) up to the next arrival, if none is
        due now and one starts here; returns whether steps ran."""
        i, requests = self.i, self.requests
        if i < len(requests) and requests[i].arrival_s <= self.now:
            return False
        ran, self.now, ended = _decode_run(
            self.sched, self.clock, self.recorder, self.now,
            requests[i].arrival_s if i < len(requests) else math.inf, self._sample)
        if not ran:
            return False
        self.fast_steps += ran
        if ended:
            self.done += ended
            if progress is not None:
                progress(self.done, len(requests))
        return True

    def _arrive(self) -> None:
        """Add the requests due by ``now`` to the scheduler (truncated to the context
        when ``config.truncate`` asks), with their page keys when a cache runs."""
        config, context, requests = self.config, self.context, self.requests
        while self.i < len(requests) and requests[self.i].arrival_s <= self.now:
            tr = requests[self.i]
            if (config.truncate and context is not None
                    and tr.prompt_tokens + tr.output_tokens > context
                    and tr.output_tokens < context):
                tr = truncated_request(tr, context - tr.output_tokens, self.block)
                self.truncated += 1
            self.served.append(tr)
            prompt = tr.prompt_tokens
            self.recorder.on_arrival(tr.request_id, tr.arrival_s, prompt_tokens=prompt,
                                     output_tokens=tr.output_tokens)
            keys = (request_page_keys(tr, self.block, self.layout.page_size)
                    if self.cache is not None else None)
            self.sched.add(Request(tr.request_id, prompt, tr.output_tokens, tr.arrival_s,
                                   max_tokens=tr.max_tokens, page_keys=keys), tr.arrival_s)
            self.i += 1

    def _forward_work(self, batch: StepBatch) -> dict[int, int]:
        """The step's work into the builder (a partial hit's gap is prefill compute at its
        own context: every layer runs; a rejected speculative step that replays its state
        recomputes its accepted tokens) and, in a speculative run, the drafts each decode
        keeps (leading acceptances drawn with ``config.spec_acceptance``)."""
        builder, sched = self.builder, self.sched
        builder.reset()
        for p in batch.prefills:
            builder.add_prefill(p.tokens + p.recompute, p.start - p.recompute)
        accepted: dict[int, int] = {}
        if self.spec and batch.decodes:
            ok = self.draws.random((len(batch.decodes), self.spec)) < self.config.spec_acceptance
            drawn = np.cumprod(ok, axis=1).sum(axis=1).tolist()  # leading acceptances
            accepted = dict(zip((d.rid for d in batch.decodes), drawn, strict=True))
        for d in batch.decodes:
            if d.drafts:
                builder.add_verify(d.context, d.drafts)
            else:
                builder.add_decode(d.context)
        if accepted and sched.replays_state():
            for d, a in zip(batch.decodes, sched.kept_drafts(batch, accepted), strict=True):
                if a < d.drafts:  # state copied back, the accepted tokens recomputed
                    builder.add_prefill(1 + a, d.context)
        return accepted

    def _step_seconds(self, batch: StepBatch) -> float:
        """The step's duration (seconds): the page copies since the previous step, the
        forward (its load-backs overlapped layer by layer), the host copies of retraction
        (serialized: :class:`HostRetractionCost`) and the draft model's forwards."""
        clock, charges, chain = self.clock, self.charges, self.chain
        step_copied = chain.stats.bytes_copied - charges.copied
        charges.copied += step_copied
        step_copy_s = clock.copy_time(step_copied)
        if step_copied:
            charges.copy_s += step_copy_s
            charges.copy_steps += 1
        forward = clock.step_time(self.builder.build())
        if batch.loads:
            # Load-backs: their bytes over the host link, overlapped layer by layer with
            # the forward that reads them (the step's fixed overhead is host work, not
            # overlapped: as host_hit_ttft).
            load_s = host_transfer_time(batch.load_bytes, self.config.gpu)
            charges.load_s += load_s
            charges.load_steps += 1
            overhead = clock.step_overhead_s if isinstance(clock, GPUCostModel) else 0.0
            forward = overhead + overlapped_time(load_s, max(0.0, forward - overhead),
                                                 max(1, self.config.model.num_layers))
        duration = forward + step_copy_s
        host_cost = self.host_cost
        if host_cost is not None and (batch.host_write_bytes or batch.host_read_bytes):
            w, r = (host_cost.transfer_s(batch.host_write_bytes),
                    host_cost.transfer_s(batch.host_read_bytes))
            charges.suspend_write_s += w
            charges.resume_load_s += r
            duration += w + r
        if self.draft_cost is not None:
            draft_s = self.draft_cost.step_seconds(
                ((p.tokens, p.start) for p in batch.prefills),
                ((d.context, d.drafts) for d in batch.decodes))
            duration += draft_s
            self.spec_bytes.draft_s += draft_s
        return duration

    def _complete(self, batch: StepBatch, duration: float, accepted: dict[int, int],
                  progress: Callable[[int, int], None] | None) -> None:
        """Advance the clock by the step, complete it in the scheduler (the speculative
        bytes read around its verify), then record its events and its sample and the
        cache's timelines."""
        kv, sched, spec_bytes, stats = self.kv, self.sched, self.spec_bytes, self.stats
        spec_bytes.step_s += duration
        spec_bytes.held_draft(kv, sched)
        self.now += duration
        if accepted:
            spec_bytes.before_verify(kv)
        sched.complete(batch, StepOutcome(duration, accepted=accepted), self.now)
        if accepted:
            spec_bytes.after_verify(kv, sched)
        before = self.done
        self.done += _record_events(sched, self.recorder)
        _record_step(self.recorder, self._sample(), t_s=self.now, duration_s=duration,
                     prefill_tokens=batch.prefill_tokens, decode_tokens=len(batch.decodes),
                     running=len(sched.running), waiting=len(sched.waiting))
        if progress is not None and self.done != before:
            progress(self.done, len(self.requests))
        if self.host is not None and stats is not None:
            held = self.host.held_slots()
            if not stats.host_timeline or stats.host_timeline[-1][1] != held:
                stats.host_timeline.append((self.now, held))
        if stats is not None and sched.counters.prompt_tokens != (
                stats.timeline[-1][1] if stats.timeline else 0):
            stats.timeline.append((self.now, sched.counters.prompt_tokens,
                                   sched.counters.hit_tokens))

    def result(self) -> SimResult:
        """The run's :class:`SimResult` (call after :meth:`serve`)."""
        chain, sched, layout, cache = self.chain, self.sched, self.layout, self.cache
        self.recorder.finish_steps(self._sample().bands)
        cached = sum(len(ids) for ids in cache.held_pages()) if cache is not None else 0
        leaked = sum(chain.bound_pages(b) for b in range(len(layout.bands))) - sum(
            b.reserved_pages for b in layout.bands) - cached
        busy = self.recorder.step_totals.duration_s  # GPU time: step times, copies included
        c, charges = sched.counters, self.charges
        extra: dict[str, int | float] = {
            "admitted_but_unallocatable": c.divergences,
            "leaked_pages": leaked,
            "admission_decisions": c.admission_decisions,
            "bytes_copied": chain.stats.bytes_copied,
            "recomputed_tokens": c.recomputed_tokens,
            "pages_copied": chain.stats.pages_copied,
            "copy_steps": charges.copy_steps,
            "copy_time_s": round(charges.copy_s, 6),
            "copy_time_pct": round(100 * charges.copy_s / busy, 4) if busy > 0 else 0.0,
            "requests_rejected_context": c.rejected_context,
            "requests_truncated": self.truncated,
            "memory_blocked_steps": self.memory_blocked,
        }
        if c.stall_retractions:  # (only runs with an estimated reservation)
            extra["stall_retractions"] = c.stall_retractions
        if self.spec:
            extra.update(self.spec_bytes.extra(sched, layout.buffer_bytes))
        extra.update(self._host_extra())
        extra.update(self._retract_extra())
        extra.update(self._cache_extra())
        summary = summarize(self.recorder, extra=extra)
        return SimResult(summary, self.recorder, layout, chain.stats, c.admission_decisions,
                         tuple(sched.unallocatable), self.stats, self.fast_steps)

    def _host_extra(self) -> dict[str, int | float]:
        """The host tier's figures (none without one)."""
        host, c = self.host, self.sched.counters
        if host is None:
            return {}
        hs = host.stats
        return {
            "host_bytes": host.capacity_bytes,
            "host_interval_tokens": host.plan.interval_tokens,
            "host_hit_tokens": c.host_hit_tokens,
            "host_hit_rate_pct": round(100 * c.host_hit_tokens / c.prompt_tokens, 2)
            if c.prompt_tokens else 0.0,
            "host_bytes_written": hs.bytes_written,
            "host_bytes_loaded": hs.bytes_loaded,
            "host_loads": c.loads,
            "host_loads_shortened": c.loads_shortened,
            "host_loads_refused": c.loads_refused,
            "host_writes_skipped": hs.writes_skipped,
            "host_evicted_pages": sum(hs.evicted or ()),
            "host_peak_held_bytes": hs.peak_held_bytes,
            "host_held_bytes_end": host.held_bytes,
            "host_stranded_full_pages": host.stranded_full_pages(),
            "load_time_s": round(self.charges.load_s, 6),
            "load_steps": self.charges.load_steps,
        }

    def _retract_extra(self) -> dict[str, int | float]:
        """Retraction by host copy's figures (none under retraction by recompute)."""
        retract_host, c = self.retract_host, self.sched.counters
        if retract_host is None:
            return {}
        return {"retractions_to_host": c.retractions_to_host,
                "host_bytes_retracted": c.host_bytes_retracted,
                "resume_bytes_loaded": c.resume_bytes_loaded,
                "resume_load_time_s": round(self.charges.resume_load_s, 6),
                "host_write_time_s": round(self.charges.suspend_write_s, 6),
                "recompute_tokens_saved": c.recompute_tokens_saved,
                "host_retract_fallbacks": c.host_retract_fallbacks,
                "host_slots_leaked": sum(retract_host.held.values())}

    def _cache_extra(self) -> dict[str, int | float]:
        """The prefix cache's figures, its stats filled in (none without a cache)."""
        stats, cache, kv, c = self.stats, self.cache, self.kv, self.sched.counters
        if stats is None or cache is None:
            return {}
        stats.prompt_tokens = c.prompt_tokens
        stats.hit_tokens = c.hit_tokens
        stats.evicted_pages = {b.label: n for b, n in zip(self.layout.bands,
                                                          cache.evicted_pages, strict=True)}
        stats.cow_state_copies = kv.glue.cow_state_copies
        stats.cow_bytes = kv.glue.cow_bytes
        stats.checkpoints_saved = kv.glue.checkpoints_saved
        stats.junctions_saved = kv.glue.junctions_saved
        stats.partial_hits = c.partial_hits
        stats.partial_tokens = c.partial_tokens
        admitted = {rec.request_id for rec in self.recorder.records
                    if rec.admitted_s is not None}
        served = replace(self.config.trace, requests=tuple(self.served))
        return {"prefix_hit_rate_pct": round(100 * stats.hit_rate, 2),
                "prefix_hit_tokens": stats.hit_tokens,
                **({"partial_hits": stats.partial_hits, "partial_tokens": stats.partial_tokens}
                   if self.config.scheduler.partial_hits else {}),
                "prefix_evicted_pages": sum(cache.evicted_pages),
                "cow_state_copies": kv.glue.cow_state_copies,
                **stats.add_bounds(served, self.layout, admitted, {
                    rid: r.page_keys for rid, r in self.sched.requests.items()})}


@contextmanager
def _host_bytes_refused(host_bytes: int | None) -> Iterator[None]:
    """Host pools this machine cannot index (``--host-bytes`` of 10**18, say: free lists
    of hundreds of billions of slot ids) are bad input, named as the option: a
    :class:`~kvchain.errors.ConfigError` instead of the pool's
    :class:`~kvchain.errors.BufferUnsupportedError`."""
    try:
        yield
    except BufferUnsupportedError as exc:
        raise ConfigError(f"--host-bytes {host_bytes:,}: more host memory than this machine "
                          f"can index ({exc})") from None


def retraction_host(layout: ChainLayout, host_bytes: int | None, block_tokens: int,
                    tier: HostTier | None = None) -> HostSide:
    """The host slots retraction by host copy suspends requests into: the host prefix
    cache's own pools when the run keeps one (``tier``: the same ``--host-bytes``, one
    budget; a suspension takes slots through :meth:`HostTier.take_slots
    <kvchain.cache.host_cache.HostTier.take_slots>`, evicting host cache units as needed),
    else ``host_bytes`` split between the chain's classes by the host tier's rule
    (:func:`kvchain.requests.suspend.host_side_for`, resume intervals of the trace's content
    block rounded up to whole pages, as the prefix cache's points). The one place a run
    decides this.

    Raises:
        ConfigError: no ``host_bytes``.
    """
    if not host_bytes:
        raise ConfigError("retraction by host copy needs host memory (--host-bytes)")
    if tier is not None:
        return HostSide.of_tier(tier)
    page = layout.page_size
    return host_side_for(layout, host_bytes, -(-block_tokens // page) * page)


@dataclass(slots=True)
class _SpecBytes:
    """The speculative memory overhead of a run, step by step: the ``k`` checkpoint slots
    every running request with state holds (bytes of ``k`` slots each; one under
    ``REPLAY``), plus the pages of
    rejected drafts held from the step's take until its verify rolled them back (the
    window slack past the accepted tokens included): their bytes are this step's
    transient overhead."""

    page_bytes: tuple[int, ...]
    state_bands: tuple[int, ...]
    spec: int
    extra_slots: int
    draft_bands: tuple[int, ...] = ()
    rolled: tuple[int, ...] = ()
    peak_bytes: int = 0
    sum_bytes: int = 0
    steps: int = 0
    draft_peak_bytes: int = 0  # bytes running requests hold in the draft's bands, peak
    draft_s: float = 0.0  # seconds of the draft model's forwards (DraftCostModel)
    step_s: float = 0.0  # seconds of every step (forwards and copies)

    @staticmethod
    def of(layout: ChainLayout, kv: KVManager) -> _SpecBytes:
        return _SpecBytes(tuple(b.page_bytes for b in layout.bands),
                          layout.indices_of(LifetimeClass.STATE), kv.geom.spec_tokens,
                          kv.geom.state_slots - layout.state_slots_per_request,
                          tuple(i for i, b in enumerate(layout.bands)
                                if b.cache_class.owner != TARGET))

    def held_draft(self, kv: KVManager, sched: Scheduler) -> None:
        """After a step's take (drafts held): the bytes of the draft's bands, peak. O(bands)
        through the request layer's per-band counts; nothing without draft bands."""
        if self.draft_bands:
            held = kv.reads.held_per_band(sched.running)
            self.draft_peak_bytes = max(self.draft_peak_bytes, sum(
                held[b] * self.page_bytes[b] for b in self.draft_bands))

    def before_verify(self, kv: KVManager) -> None:
        self.rolled = tuple(kv.speculation.rolled_back_pages)

    def after_verify(self, kv: KVManager, sched: Scheduler) -> None:
        rolled = kv.speculation.rolled_back_pages
        transient = sum((n - m) * pb for n, m, pb in zip(rolled, self.rolled, self.page_bytes,
                                                         strict=True))
        slots = 0
        if self.state_bands:  # every state band (a draft's too) holds the extra slots
            held = kv.reads.held_per_band(sched.running)
            slots = sum(held[b] * self.extra_slots // kv.geom.state_slots
                        * self.page_bytes[b] for b in self.state_bands)
        now = transient + slots
        self.peak_bytes = max(self.peak_bytes, now)
        self.sum_bytes += now
        self.steps += 1

    def extra(self, sched: Scheduler, buffer_bytes: int) -> dict[str, int | float]:
        c = sched.counters
        mean = self.sum_bytes / self.steps if self.steps else 0.0
        return {
            "spec_tokens": self.spec,
            "spec_decodes": c.spec_decodes,
            "spec_accepted_drafts": c.accepted_tokens,
            "spec_acceptance_rate": round(c.accepted_tokens / c.drafted_tokens, 4)
            if c.drafted_tokens else 0.0,
            # tokens a speculative decode keeps: the sampled one and the accepted drafts
            "spec_tokens_per_decode": round(1 + c.accepted_tokens / c.spec_decodes, 4)
            if c.spec_decodes else 0.0,
            "spec_replayed_tokens": c.replayed_tokens,
            "spec_overhead_peak_bytes": self.peak_bytes,
            "spec_overhead_mean_bytes": round(mean),
            "spec_overhead_peak_pct": round(100 * self.peak_bytes / buffer_bytes, 4),
            "spec_overhead_mean_pct": round(100 * mean / buffer_bytes, 4),
        } | ({} if not (self.draft_bands or self.draft_s) else {  # a draft model's
            "draft_peak_bytes": self.draft_peak_bytes,
            "draft_peak_pct": round(100 * self.draft_peak_bytes / buffer_bytes, 4),
            "draft_forward_s": round(self.draft_s, 6),
            "draft_forward_pct": round(100 * self.draft_s / self.step_s, 4)
            if self.step_s else 0.0,
        })


#: Most steps one decode run covers (bounds its arrays: ``steps x running x bands``).
FAST_FORWARD_MAX_STEPS = 256


@dataclass(frozen=True, slots=True)
class _StepBytes:
    """What a step's sample needs of the chain after the step, in O(bands): used bytes
    (live bytes less the null pages), the prefix cache's held and evictable bytes, and
    :meth:`bands`, the band samples with their owners (O(bands + running)), built only
    for a step the recorder keeps (:meth:`MetricsRecorder.record_step`)."""

    snap: ChainSnapshot
    used: int
    cached: int
    evictable: int
    kv: KVManager
    rids: tuple[int, ...]
    cache: PrefixCache | None
    null_pages: tuple[int, ...]

    @staticmethod
    def now(chain: Allocator, kv: KVManager, sched: Scheduler, cache: PrefixCache | None,
            null_pages: tuple[int, ...]) -> _StepBytes:
        """The chain, its requests and its cache as they are now."""
        snap = chain.snapshot()
        cached = evictable = 0
        if cache is not None:
            page_bytes = [band.page_bytes for band in snap.bands]
            cached = sum(n * pb for n, pb in zip(cache.held_counts, page_bytes, strict=True))
            order = snap.evictable
            if order.units:
                evictable = sum(n * pb for n, pb in zip(order.freed(order.units), page_bytes,
                                                        strict=True))
        return _StepBytes(snap, snap.live_bytes - chain.layout.reserved_bytes, cached,
                          evictable, kv, tuple(sched.running), cache,
                          null_pages)

    def bands(self) -> tuple[BandSample, ...]:
        """The band samples (:func:`band_samples`) of the snapshot, with their owners."""
        return band_samples(
            self.snap, reserved_pages=self.null_pages,
            request_pages=request_owned_pages(self.kv, self.rids),
            cached_pages=self.cache.held_counts if self.cache is not None else None)


def _record_step(recorder: MetricsRecorder, now: _StepBytes, *, t_s: float,
                 duration_s: float, prefill_tokens: int, decode_tokens: int, running: int,
                 waiting: int) -> None:
    """One step to the recorder, its band samples built only if it keeps the step."""
    recorder.record_step(
        t_s=t_s, duration_s=duration_s, prefill_tokens=prefill_tokens,
        decode_tokens=decode_tokens, running=running, waiting=waiting,
        buffer_bytes=now.snap.buffer_bytes, used_bytes=now.used, bands=now.bands,
        cached_bytes=now.cached, evictable_bytes=now.evictable)


def _decode_run(sched: Scheduler, clock: GPUCostModel | StepClock,
                recorder: MetricsRecorder, now: float, next_arrival: float,
                sample: Callable[[], _StepBytes],
                ) -> tuple[int, float, int]:
    """Advance a run of decode-only steps from ``now`` in one update, if the next steps
    are one (:meth:`Scheduler.plan_decode_run`): the steps' times as array arithmetic over
    the cost model (:meth:`GPUCostModel.run_times`; each step's own batch and context
    lengths), cut before the first step that would start at or after ``next_arrival``
    (the per-step loop adds an arrival due by a step's start before planning it), then
    :meth:`Scheduler.run_decodes` (which stops where memory could bind, and finishes the
    requests that end in the run's last step) and one step sample per step (the band
    samples read again only after a step that took or released pages or ended requests;
    lifecycle events recorded before the step's sample, as in the per-step loop). No page
    copies: a step that would move pages ends the run.

    Returns:
        ``(steps run, the clock after them, requests ended)``; ``(0, now, 0)`` when no run
        starts here.
    """
    run = sched.plan_decode_run(FAST_FORWARD_MAX_STEPS)
    if run is None:
        return 0, now, 0
    starts = np.asarray(run.starts, dtype=np.int64)
    work = _builder_of(clock).decode_run(starts, run.steps)
    durations = clock.run_times(work)
    times = np.add.accumulate(np.concatenate(([now], durations)))  # as `now += d`, in order
    steps = int(np.searchsorted(times[:run.steps], next_arrival, side="left"))
    if steps < 1:
        return 0, now, 0
    d_list, t_list = durations.tolist(), times.tolist()
    n = len(run.rids)
    now_bytes = sample()
    ended = 0

    def after_step(j: int, changed: bool) -> None:
        nonlocal now_bytes, ended
        if changed:
            ended += _record_events(sched, recorder)
            now_bytes = sample()
        _record_step(recorder, now_bytes, t_s=t_list[j + 1], duration_s=d_list[j],
                     prefill_tokens=0, decode_tokens=n, running=len(sched.running),
                     waiting=0)

    ran = sched.run_decodes(run, steps, t_list[1:], after_step)
    return ran, t_list[ran], ended


def _builder_of(clock: GPUCostModel | StepClock) -> StepWorkBuilder:
    """The work builder whose windows the clock prices (the step clock's are irrelevant:
    it charges a fixed tick)."""
    return clock.builder() if isinstance(clock, GPUCostModel) else StepWorkBuilder()


def _record_events(sched: Scheduler, recorder: MetricsRecorder) -> int:
    """Forward the scheduler's lifecycle events to the recorder; return how many requests
    ended (finished or rejected)."""
    ended = 0
    for ev in sched.drain_events():
        kind = ev.kind
        if kind is EventKind.ADMITTED:
            recorder.on_admitted(ev.rid, ev.time_s, sched.requests[ev.rid].hit_tokens)
        elif kind is EventKind.FIRST_TOKEN:
            recorder.on_first_token(ev.rid, ev.time_s)
        elif kind is EventKind.FINISHED:
            r = sched.requests[ev.rid]
            record = recorder.record(ev.rid)
            if record.first_token_s is None:  # finished within its prefill step
                recorder.on_first_token(ev.rid, ev.time_s)
            extra = r.output_done - record.output_done
            if extra > 0:
                recorder.on_token(ev.rid, ev.time_s, extra)
            recorder.on_finished(ev.rid, ev.time_s)
            ended += 1
        elif kind is EventKind.RETRACTED:
            recorder.on_retracted(ev.rid, ev.time_s)
        elif kind is EventKind.REJECTED:
            recorder.on_rejected(ev.rid, ev.time_s, ev.detail)
            ended += 1
    return ended
