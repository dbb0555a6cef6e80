"""Every memory manager through the same scheduler, trace and cost model.

The loop is :func:`kvchain.sim.engine.simulate`'s (arrivals -> ``scheduler.step`` -> cost
model -> ``complete``) with the allocator taken from
:func:`kvchain.baselines.build_manager` and the never-fits check of
:class:`kvchain.baselines.BaselineScheduler`; the scheduler, admission ledger, KV manager
and metrics are the same objects for every manager.

Bytes needed by the live requests (the physical minimum, no pages, no rounding)::

    needed = sum over running requests of
             L x E_full + min(L, W) x E_win + (L mod C) x E_loc + S (if it holds a slot)

with ``L`` the tokens a request holds once this step's tokens are in. Per step:

* ``U`` = needed / buffer bytes; **U*** = mean of ``U`` over steps whose waiting queue is
  not empty after admission (steps where a fuller buffer could have admitted more);
* allocation efficiency = sum of needed / sum of held bytes over steps with pages held
  (held = bytes of pages bound to requests, null pages excluded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvchain.baselines import BaselineScheduler, ManagerKind, build_manager
from kvchain.kv_manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sim.cost import GPUCostModel
from kvchain.sim.engine import SimConfig, SimulationStuckError, _record_events
from kvchain.sim.metrics import MetricsRecorder, SimSummary, StepSample, band_samples, summarize
from kvchain.spec.layers import CacheClass, LifetimeClass


@dataclass(frozen=True, slots=True)
class NeededBytes:
    """Bytes per token / request of a model's classes (the ``needed`` formula's terms).

    Attributes:
        e_full: bytes per token of full attention (0 if none).
        e_win: bytes per token of the sliding window (0 if none); ``window``: ``W``.
        e_local: bytes per token of chunked-local attention (0 if none); ``chunk``: ``C``.
        state: ``S`` bytes per request (0 if none).
    """

    e_full: int
    e_win: int
    window: int
    e_local: int
    chunk: int
    state: int

    @staticmethod
    def of(classes: Sequence[CacheClass]) -> NeededBytes:
        """Read the terms off a model's classes."""
        by = {c.lifetime: c for c in classes}

        def e(kind: LifetimeClass) -> tuple[int, int]:
            c = by.get(kind)
            return (c.bytes_per_token, c.window or 0) if c is not None else (0, 0)

        state = by.get(LifetimeClass.STATE)
        return NeededBytes(e(LifetimeClass.FULL)[0], *e(LifetimeClass.WINDOW),
                           *e(LifetimeClass.LOCAL), state.bytes_per_slot if state else 0)

    def of_request(self, tokens: int, holds_state: bool) -> int:
        """Bytes one request of ``tokens`` tokens needs (the module's formula)."""
        total = tokens * self.e_full
        if self.e_win:
            total += min(tokens, self.window) * self.e_win
        if self.e_local:
            total += (tokens % self.chunk) * self.e_local
        if holds_state:
            total += self.state
        return total


@dataclass(frozen=True, slots=True)
class BytesPoint:
    """One step of the bytes-over-time series: time (s), bytes needed and held."""

    t_s: float
    needed_bytes: int
    held_bytes: int


@dataclass(frozen=True, slots=True)
class ManagerRun:
    """One manager's run.

    Attributes:
        kind: the manager.
        rule: its capacity rule in words (with its numbers).
        summary: the same :class:`SimSummary` as ``kvchain simulate``; its ``extra`` has
            ``u_star_pct`` and ``alloc_efficiency_pct`` (percent, 2 decimals) and
            ``bytes_copied``.
        u_star: U* (0..1; None if the waiting queue was never non-empty).
        alloc_efficiency: needed / held bytes (0..1; None if nothing was held).
        series: bytes needed and held over time (at most ``max_points``).
        buffer_bytes: ``B``.
    """

    kind: ManagerKind
    rule: str
    summary: SimSummary
    u_star: float | None
    alloc_efficiency: float | None
    series: tuple[BytesPoint, ...]
    buffer_bytes: int


def run_manager(config: SimConfig, kind: ManagerKind, *, max_points: int = 2_000,
                audit_every_step: bool = False) -> ManagerRun:
    """Serve ``config.trace`` with one memory manager.

    Args:
        config: model, GPU, trace, buffer, page size and scheduler limits (as ``simulate``).
        kind: the memory manager.
        max_points: most points kept in ``series`` (every k-th step).
        audit_every_step: audit the allocator and KV manager after every step (tests).

    Raises:
        ConfigError / BufferTooSmallError: the buffer cannot hold one smallest request
            under this manager.
        SimulationStuckError: requests wait with nothing to run (a bug).
        AdmissionDivergenceError: the allocator refused an admitted batch (a bug).
    """
    buffer = config.layout().buffer_bytes
    setup = build_manager(kind, config.model.classes, buffer, config.page_size)
    layout, alloc = setup.layout, setup.allocator
    kv = KVManager(alloc)  # type: ignore[arg-type]  # duck-typed chain
    sched = BaselineScheduler(kv, config.scheduler)
    cost = GPUCostModel(config.model, config.gpu)
    builder = cost.builder()
    recorder = MetricsRecorder(max_step_samples=config.max_step_samples)
    needed_of = NeededBytes.of(config.model.classes)
    reserved = layout.reserved_bytes
    state_band = kv.geom.state
    requests = sorted(config.trace.requests, key=lambda r: (r.arrival_s, r.request_id))
    total, i, now = len(requests), 0, 0.0
    u_sum, u_steps, needed_sum, held_sum = 0.0, 0, 0, 0
    points: list[BytesPoint] = []

    while i < total or not sched.idle:
        if sched.idle:
            now = max(now, requests[i].arrival_s)
        while i < total and requests[i].arrival_s <= now:
            tr = requests[i]
            recorder.on_arrival(tr.request_id, tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                                output_tokens=tr.output_tokens)
            sched.add(Request(tr.request_id, tr.prompt_tokens, tr.output_tokens, tr.arrival_s),
                      tr.arrival_s)
            i += 1
        batch = sched.step(now)
        if batch.is_empty:
            _record_events(sched, recorder)
            if i < total:
                now = max(now, requests[i].arrival_s)
                continue
            if sched.idle:
                break
            raise SimulationStuckError(
                f"{kind}: {len(sched.waiting)} requests wait, {len(sched.running)} run, "
                f"nothing is planned at t={now:.3f} s")
        # Memory at its fullest: this step's pages are taken, its tokens not yet committed.
        step_tokens = {p.rid: p.tokens for p in batch.prefills}
        step_tokens.update((d.rid, 1) for d in batch.decodes)
        needed = 0
        for rid in sched.running:
            pages = kv.pages(rid) if rid in kv else None
            holds = pages is not None and state_band is not None and bool(pages.slots)
            needed += needed_of.of_request(kv.tokens(rid) + step_tokens.get(rid, 0), holds)
        held = alloc.snapshot().live_bytes - reserved
        if sched.waiting:
            u_sum += needed / buffer
            u_steps += 1
        if held > 0:
            needed_sum += needed
            held_sum += held
        builder.reset()
        for p in batch.prefills:
            builder.add_prefill(p.tokens, p.start)
        for d in batch.decodes:
            builder.add_decode(d.context)
        duration = cost.step_time(builder.build())
        points.append(BytesPoint(now, needed, held))
        now += duration
        sched.complete(batch, StepOutcome(duration), now)
        _record_events(sched, recorder)
        snap = alloc.snapshot()
        recorder.on_step(StepSample(
            t_s=now, duration_s=duration, prefill_tokens=batch.prefill_tokens,
            decode_tokens=len(batch.decodes), running=len(sched.running),
            waiting=len(sched.waiting), bands=band_samples(snap),
            buffer_bytes=buffer, used_bytes=snap.live_bytes - reserved))
        if audit_every_step:
            sched.audit()

    leaked = sum(alloc.bound_pages(b) for b in range(len(layout.bands))) - sum(
        b.reserved_pages for b in layout.bands)
    u_star = u_sum / u_steps if u_steps else None
    efficiency = needed_sum / held_sum if held_sum else None
    extra: dict[str, int | float] = {
        "admitted_but_unallocatable": sched.counters.divergences,
        "leaked_pages": leaked,
        "bytes_copied": alloc.stats.bytes_copied,
    }
    if u_star is not None:
        extra["u_star_pct"] = round(100 * u_star, 2)
    if efficiency is not None:
        extra["alloc_efficiency_pct"] = round(100 * efficiency, 2)
    summary = summarize(recorder, extra=extra)
    stride = max(1, -(-len(points) // max_points))
    return ManagerRun(kind, setup.rule, summary, u_star, efficiency,
                      tuple(points[::stride]), buffer)


def compare_managers(config: SimConfig, kinds: Sequence[ManagerKind] = tuple(ManagerKind), *,
                     audit_every_step: bool = False) -> dict[ManagerKind, ManagerRun]:
    """:func:`run_manager` for every kind, same config (insertion order = ``kinds``)."""
    return {k: run_manager(config, k, audit_every_step=audit_every_step) for k in kinds}
