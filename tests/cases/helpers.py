"""Harness of the field-case tests (``docs/field-cases.md``).

Classes are declared by bytes directly, chains are built by the project's own layout
(``plan_layout``), and :func:`run_to_completion` drives a :class:`Scheduler` with a
:class:`FixedStepDriver`, checking after EVERY step the invariants listed at the top of
docs/field-cases.md:

* every page is in exactly one place (``sched.audit()``: the chain's audit - bands
  disjoint, span == live + holes, tables a bijection - plus every bound page held by one
  request or a null page; here also the byte sum ``spans + gaps == B``);
* nothing admitted fails to allocate (``counters.divergences == 0``; an
  :class:`AdmissionDivergenceError` propagates and fails the test);
* no request is retracted in the step right after a step that admitted work;
* on an idle chain any request that fits the empty chain finishes (a step that runs
  nothing while requests wait and none runs is a stall and fails the run), and at the end
  every request that was queued has finished.

Window pages wholly out of every running request's window are also checked to be released
after each step (window-tail release), unless a test turns that off on purpose.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.buffer import BufferBackend
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.requests.manager import KVManager
from kvchain.sched.admission import NewTokenRatio
from kvchain.sched.driver import FixedStepDriver
from kvchain.sched.request import (
    Event,
    EventKind,
    Request,
    RequestStatus,
    StepBatch,
)
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

# --- classes by bytes --------------------------------------------------------------------


def full_class(bytes_per_token: int) -> CacheClass:
    """A full-attention class of ``bytes_per_token`` B (all layers of the class)."""
    return CacheClass(LifetimeClass.FULL, bytes_per_token, 0, None, ())


def window_class(bytes_per_token: int, window: int) -> CacheClass:
    """A sliding-window class of ``bytes_per_token`` B and a window of ``window`` tokens."""
    return CacheClass(LifetimeClass.WINDOW, bytes_per_token, 0, window, ())


def local_class(bytes_per_token: int, chunk: int) -> CacheClass:
    """A chunked-local attention class (attention chunk of ``chunk`` tokens)."""
    return CacheClass(LifetimeClass.LOCAL, bytes_per_token, 0, chunk, ())


def state_class(bytes_per_slot: int) -> CacheClass:
    """A recurrent-state class of ``bytes_per_slot`` B per state slot."""
    return CacheClass(LifetimeClass.STATE, 0, bytes_per_slot, None, ())


def make_scheduler(classes: Sequence[CacheClass], buffer_bytes: int, page_size: int, *,
                   config: SchedulerConfig | None = None, ratio: NewTokenRatio | None = None,
                   state_slots: int = 1, null_pages: bool = True,
                   buffer: BufferBackend | None = None) -> Scheduler:
    """A scheduler over a fresh chain laid out by ``plan_layout`` from the given numbers."""
    layout = plan_layout(classes, buffer_bytes, page_size, state_slots_per_request=state_slots,
                         null_pages=null_pages)
    return Scheduler(KVManager(Chain(layout, buffer)), config, ratio)


def band_index(layout: ChainLayout, lifetime: LifetimeClass) -> int:
    """Band index of a lifetime class (fails the test if the chain has none)."""
    i = layout.index_of(lifetime)
    assert i is not None, f"no {lifetime} band in {layout.shape_name}"
    return i


def seed_running(sched: Scheduler, rid: int, prompt: int, output: int,
                 arrival_s: float = 0.0) -> Request:
    """Put a request in the running set as if its whole prompt had just been prefilled in
    one chunk and its window tail released (a running request as the cases describe it:
    it holds its full pages and the window pages of its next token's window, and has
    produced its first output token)."""
    kv = sched.kv
    kv.allocate([(rid, prompt)])
    kv.commit(rid, prompt)
    r = Request(rid, prompt, output, arrival_s, status=RequestStatus.RUNNING,
                computed=prompt, output_done=1)
    sched.requests[rid] = r
    sched.running[rid] = r
    return r


# --- per-step invariant checks ------------------------------------------------------------


def check_byte_partition(snap: ChainSnapshot) -> None:
    """Bands lie in order inside ``[0, B]`` and ``spans + gaps == B`` (every byte is in
    exactly one band span or one gap)."""
    prev = 0
    total = 0
    for band in snap.bands:
        assert band.lo >= prev, f"{band.label} overlaps the band below"
        assert (band.hi - band.lo) == (band.live + band.holes) * band.page_bytes, band
        total += (band.lo - prev) + (band.hi - band.lo)
        prev = band.hi
    total += snap.buffer_bytes - prev
    assert total == snap.buffer_bytes


def check_accounting(sched: Scheduler, holders: Iterable[int], external: Demand) -> None:
    """Chain audit, then per band: bound pages == pages held by ``holders`` (ids the KV
    manager holds) + null pages + pages held outside the KV manager (``external``)."""
    sched.chain.audit()
    kv = sched.kv
    geom = kv.geom
    held = [0] * geom.num_bands
    for rid in holders:
        if rid not in kv:
            continue
        pages = kv.held(rid)
        for band in range(geom.num_bands):
            first, end = pages.span(band)
            held[band] += end - first
    for band in range(geom.num_bands):
        reserved = sched.chain.layout.bands[band].reserved_pages
        bound = sched.chain.bound_pages(band)
        assert bound == held[band] + reserved + external.pages[band], (
            f"band {band}: {bound} bound != {held[band]} held + {reserved} null + "
            f"{external.pages[band]} external")


def check_window_released(sched: Scheduler, rids: Iterable[int]) -> None:
    """No request holds a window page wholly before its next token's window."""
    kv = sched.kv
    for rid in rids:
        if rid not in kv:
            continue
        held = kv.held(rid)
        for pol in kv.geom.windows:
            first, end = held.span(pol.band)
            keep_from = pol.first_page(kv.tokens(rid))
            assert end == first or first >= keep_from, (
                f"request {rid} at {kv.tokens(rid)} tokens still holds band {pol.band} "
                f"pages from page {first}, its window starts at page {keep_from}")


# --- the run loop -----------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    """What a run did.

    Attributes:
        steps: forward steps run.
        end_s: clock at the end (seconds; one ``step_s`` per step).
        events: every lifecycle event, in order.
        batches: every step's batch, in order.
        max_running: most requests running at once.
        peak_pages: per request, the most pages held in each band at once (after an
            allocation, before the window-tail release of the commit).
        peak_bytes: per request, the most bytes held at once.
        admitted_at: per request, the step index of its (first) admission.
        stalled: the run stopped because requests waited on a chain that admitted nothing
            while nothing ran (only with ``allow_stall``).
    """

    steps: int = 0
    end_s: float = 0.0
    events: list[Event] = field(default_factory=list)
    batches: list[StepBatch] = field(default_factory=list)
    max_running: int = 0
    peak_pages: dict[int, list[int]] = field(default_factory=dict)
    peak_bytes: dict[int, int] = field(default_factory=dict)
    admitted_at: dict[int, int] = field(default_factory=dict)
    stalled: bool = False

    def kinds(self, kind: EventKind) -> list[int]:
        """Request ids of the events of one kind, in order."""
        return [e.rid for e in self.events if e.kind is kind]

    def digest(self) -> str:
        """SHA-256 of the event log (kind, request, time, detail): equal logs, equal hash."""
        h = hashlib.sha256()
        for e in self.events:
            h.update(f"{e.kind.value}|{e.rid}|{e.time_s!r}|{e.detail}\n".encode())
        return h.hexdigest()


def held_pages(sched: Scheduler, rid: int) -> list[int]:
    """Pages ``rid`` holds per band (window: pages of its window span)."""
    kv = sched.kv
    geom = kv.geom
    held = kv.held(rid)
    return [end - first for first, end in map(held.span, range(geom.num_bands))]


def run_to_completion(
    sched: Scheduler,
    requests: Iterable[Request] = (),
    *,
    arrivals: Iterable[tuple[int, Request]] = (),
    driver: FixedStepDriver | None = None,
    start_s: float = 0.0,
    max_steps: int = 20_000,
    external: Demand | Callable[[], Demand] | None = None,
    holders: Iterable[int] = (),
    allow_stall: bool = False,
    check_window_release: bool = True,
    before_step: Callable[[int, Scheduler], None] | None = None,
    after_step: Callable[[int, Scheduler, StepBatch], None] | None = None,
) -> RunResult:
    """Run ``sched`` until nothing waits or runs, checking the README invariants after
    every step (module docstring).

    Args:
        sched: the scheduler (possibly with requests already running or waiting).
        requests: requests added before the first step.
        arrivals: ``(step index, request)``: added right before that step.
        driver: the fake model (``FixedStepDriver(1.0)`` if omitted: one second a step).
        start_s: clock at the start.
        max_steps: a run longer than this fails (a livelock).
        external: pages held outside the KV manager, or a function giving them now (then
            the accounting is checked by band instead of ``sched.audit()``).
        holders: ids held by the KV manager but unknown to the scheduler (fillers).
        allow_stall: stop (``stalled=True``) instead of failing when requests wait on a
            chain where nothing runs and nothing is admitted.
        check_window_release: check the window-tail release after every step.
        before_step: called with ``(step index, sched)`` before each step.
        after_step: called with ``(step index, sched, batch)`` after each step completed.
    """
    driver = driver or FixedStepDriver(1.0)
    pending = sorted(arrivals, key=lambda a: a[0])
    holders = list(holders)
    now = start_s
    result = RunResult()
    for r in requests:
        sched.add(r, now)
    prev_admitted = False
    step = 0
    while True:
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1], now)
        if sched.idle and not pending:
            break
        assert step < max_steps, f"no end after {max_steps} steps: {sched.counters}"
        if before_step is not None:
            before_step(step, sched)
        admitted0, retracted0 = sched.counters.admitted, sched.counters.retractions
        batch = sched.step(now)
        admitted = sched.counters.admitted > admitted0
        retracted = sched.counters.retractions > retracted0
        assert not (prev_admitted and retracted), (
            f"step {step}: a retraction right after a step that admitted work")
        assert sched.counters.divergences == 0
        for e in sched.drain_events():
            result.events.append(e)
            if e.kind is EventKind.ADMITTED:
                result.admitted_at.setdefault(e.rid, step)
        if batch.is_empty:
            # Nothing changes without an outside event: a stall unless requests arrive
            # later or the test changes the chain before a later step.
            if not pending and before_step is None:
                if allow_stall:
                    result.stalled = True
                    break
                raise AssertionError(
                    f"step {step}: stall - {len(sched.waiting)} waiting, "
                    f"{len(sched.running)} running, nothing scheduled "
                    f"({sched.chain.snapshot()})")
            now += driver.step_s
            step += 1
            prev_admitted = False
            continue
        result.batches.append(batch)
        result.max_running = max(result.max_running, len(sched.running))
        page_bytes = [b.page_bytes for b in sched.chain.layout.bands]
        for rid in {p.rid for p in batch.prefills} | {d.rid for d in batch.decodes}:
            pages = held_pages(sched, rid)
            peak = result.peak_pages.setdefault(rid, [0] * len(pages))
            for i, n in enumerate(pages):
                peak[i] = max(peak[i], n)
            nbytes = sum(n * b for n, b in zip(pages, page_bytes, strict=True))
            result.peak_bytes[rid] = max(result.peak_bytes.get(rid, 0), nbytes)
        outcome = driver.run(batch)
        now += outcome.duration_s
        sched.complete(batch, outcome, now)
        for e in sched.drain_events():
            result.events.append(e)
        if external is None:
            sched.audit()
            outside = Demand.zeros(sched.kv.geom.num_bands)
        else:
            outside = external if isinstance(external, Demand) else external()
        check_accounting(sched, [*sched.running, *holders], outside)
        check_byte_partition(sched.chain.snapshot())
        if check_window_release:
            check_window_released(sched, [*sched.running, *holders])
        if after_step is not None:
            after_step(step, sched, batch)
        prev_admitted = admitted
        step += 1
        result.steps += 1
    result.end_s = now
    if not result.stalled:
        unfinished = [r.rid for r in sched.requests.values()
                      if r.status not in (RequestStatus.FINISHED, RequestStatus.REJECTED)]
        assert not unfinished, f"requests {unfinished} did not finish"
    return result
