"""The scheduler's values: its limits (:class:`SchedulerConfig`), admission's decision
for one step before allocation (:class:`ScheduledStep`), the next steps of a decode-only
batch (:class:`DecodeRun`), an admitted-but-unallocatable record
(:class:`UnallocatableEvent`) and the counts behind the metrics
(:class:`SchedulerCounters`). :mod:`kvchain.sched.scheduler` builds and reads them; they
hold no behaviour beyond their own checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvchain.alloc.allocator import MoveHold
from kvchain.alloc.snapshot import ChainSnapshot, Demand, Quote
from kvchain.errors import ConfigError
from kvchain.field_types import check_field_types
from kvchain.requests.batch import DecodeBatch
from kvchain.requests.plan import StepPlan
from kvchain.sched.admission import ReserveConfig, WindowAdmission
from kvchain.sched.queue import CACHE_LOOKAHEAD, CACHE_MAX_PASSES, QueuePolicy
from kvchain.sched.request import DecodeSeq, LoadBack, PrefillChunk
from kvchain.sched.retraction import RetractTo


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler limits.

    Attributes:
        max_running: most requests running at once.
        max_prefill_tokens: prefill tokens per step (all chunks together).
        chunk_size: largest prefill chunk of one request (tokens).
        policy: waiting-queue order.
        window_admission: override of the chain's default window admission mode.
        reserve: how admission reserves future output (policy and knobs).
        audit_every_step: run the chain and KV-manager audits after every step (tests).
        strict: stop at the first admitted-but-unallocatable step with
            :class:`~kvchain.errors.AdmissionDivergenceError` (the library default, so
            every test); ``False`` records the event, retracts the request and goes on
            (``kvchain simulate`` without ``--strict``).
        max_context_tokens: the model's context length (tokens); a request whose prompt
            plus output exceeds it is rejected at arrival with a reason starting with
            ``"context:"`` (``None``: no limit).
        cache_lookahead: ``cache-aware`` order: waiting requests from the head it may
            reorder (>= 1).
        cache_max_passes: ``cache-aware`` order: times a waiting request may be passed
            over before it goes first (>= 0; the starvation bound).
        retract_to: where a retracted request's KV goes (:class:`RetractTo`:
            ``recompute``, the default; ``host`` and ``auto`` need the scheduler's
            ``host`` side, ``auto`` also its ``retract_cost``).
        partial_hits: prefix-cache hits may be *partial* on a chain with a state band
            (off by default: it needs a model runner that can run a forward over
            positions whose KV is cached without writing it, which kvchain's real-model
            runner has not): a hit shares the cache's pages up to ``H`` and its first
            chunk recomputes the gap ``[C, H)`` from the deepest checkpoint ``C`` below
            (:meth:`KVManager.attach` with ``max_gap``; docs/prefix-cache.md).

    Raises:
        ConfigError: a limit below 1 (``cache_max_passes`` below 0).
    """

    max_running: int = 256
    max_prefill_tokens: int = 8192
    chunk_size: int = 8192
    policy: QueuePolicy = QueuePolicy.FCFS
    window_admission: WindowAdmission | None = None
    audit_every_step: bool = False
    strict: bool = True
    reserve: ReserveConfig = field(default_factory=ReserveConfig)
    max_context_tokens: int | None = None
    cache_lookahead: int = CACHE_LOOKAHEAD
    cache_max_passes: int = CACHE_MAX_PASSES
    retract_to: RetractTo = RetractTo.RECOMPUTE
    partial_hits: bool = False

    def __post_init__(self) -> None:
        check_field_types(self)  # e.g. policy="fcfs", max_running=2.5, strict="no"
        for name in ("max_running", "max_prefill_tokens", "chunk_size", "cache_lookahead"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_max_passes < 0:
            raise ConfigError(f"cache_max_passes must be >= 0, got {self.cache_max_passes}")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ConfigError(f"max_context_tokens must be >= 1, got {self.max_context_tokens}")


@dataclass(slots=True)
class ScheduledStep:
    """Admission's decision for one step, before allocation (holds a move pin when the
    ledger relies on page moves, so a gate cannot close in between: contract 6)."""

    decode_demands: DecodeBatch  # the decodes' demands and total (aligned with decodes)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[DecodeSeq] = field(default_factory=list)
    prefill_demands: list[Demand] = field(default_factory=list)  # aligned with prefills
    drafts_priced: int = 0  # the drafts per decode its decode demands were priced for
    quote: Quote | None = None  # the price of the step's whole take (the plan's)
    plan: StepPlan | None = None  # the step's one take (None: nothing to take)
    # (scheduler version, prefills, decodes, resumes) the plan was built for
    basis: tuple[object, ...] | None = None
    pin: MoveHold | None = None
    memory_blocked: bool = False  # a waiting request got no chunk for lack of memory
    loads: list[LoadBack] = field(default_factory=list)  # host load-backs realized
    resumes: list[int] = field(default_factory=list)  # suspended requests loaded back
    host_write_bytes: int = 0  # bytes its suspensions copied to host


@dataclass(frozen=True, slots=True, eq=False)
class DecodeRun:
    """The next steps of a batch that only decodes (:meth:`Scheduler.plan_decode_run`).

    Attributes:
        rids: the running requests, in running order (every step's decode batch).
        starts: their token counts (``computed``) before the run.
        demand: int64 ``[steps, len(rids), num_bands]``: pages each request adds in each
            step (:meth:`kvchain.requests.manager.KVManager.decode_run`).
        released: bool ``[steps]``: the step's commit releases window pages.
        shortest: output tokens the first request to end has left (it ends in step
            ``shortest - 1``, if the run gets that far).
    """

    rids: tuple[int, ...]
    starts: tuple[int, ...]
    demand: np.ndarray
    released: np.ndarray
    shortest: int

    @property
    def steps(self) -> int:
        """Steps the run covers."""
        return int(self.demand.shape[0])


@dataclass(frozen=True, slots=True)
class UnallocatableEvent:
    """Admission accepted work the allocator then refused (a bug; measured, not assumed).

    Attributes:
        rid: the request retracted to let the rest of the step allocate.
        time_s: simulated or engine time of the step (seconds).
        demand: that request's demand in the refused take (pages per band).
        snapshot: the chain's snapshot the take was refused on.
        shortfall_bytes: the refusal's shortfall (bytes) for the whole step's demand.
    """

    rid: int
    time_s: float
    demand: Demand
    snapshot: ChainSnapshot
    shortfall_bytes: int


@dataclass(slots=True)
class SchedulerCounters:
    """Counts for metrics and invariant checks."""

    steps: int = 0
    admission_decisions: int = 0
    admitted: int = 0
    retractions: int = 0
    rejected: int = 0
    rejected_context: int = 0  # of ``rejected``: prompt + output past the context length
    finished: int = 0
    divergences: int = 0  # admitted but unallocatable: UnallocatableEvents recorded
    recomputed_tokens: int = 0  # tokens retracted requests must prefill again
    window_pages_reclaimed: int = 0
    drafted_tokens: int = 0  # draft tokens computed by speculative decode steps
    replayed_tokens: int = 0  # accepted tokens recomputed by REPLAY state rollbacks
    accepted_tokens: int = 0  # of which kept by the verify
    spec_decodes: int = 0  # speculative decodes (one per request per step)
    prompt_tokens: int = 0  # prompts admitted (first admission) while a prefix cache is on
    hit_tokens: int = 0  # of which served by the prefix cache (device and host tier)
    partial_hits: int = 0  # admissions whose hit was partial (a gap recomputed)
    partial_tokens: int = 0  # their gap tokens: pages shared, tokens recomputed
    host_hit_tokens: int = 0  # of those, served by a load-back from the host tier
    loads: int = 0  # load-backs realized
    loads_shortened: int = 0  # of which at an earlier resume point than the host's deepest
    loads_refused: int = 0  # host hits not loaded: no shorter load fit the ledger
    retractions_to_host: int = 0  # of ``retractions``: suspended to host, not recomputed
    host_bytes_retracted: int = 0  # bytes those suspensions copied to host
    resume_bytes_loaded: int = 0  # bytes their resumes loaded back
    resumes: int = 0  # suspended requests loaded back
    recompute_tokens_saved: int = 0  # tokens the suspended requests did not prefill again
    host_retract_fallbacks: int = 0  # host retractions recomputed: the host pools were full
    stall_retractions: int = 0  # of ``retractions``: a step would have run nothing
