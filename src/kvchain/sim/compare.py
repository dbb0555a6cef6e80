"""Every memory manager through the same scheduler, trace and cost model.

The loop is :func:`kvchain.sim.engine.simulate` itself with the allocator taken from
:func:`kvchain.baselines.build_manager` (its ``empty_snapshot`` judges requests that can
never fit); the scheduler, admission ledger, KV manager and metrics are the same objects
for every manager.

Bytes needed by the live requests (the physical minimum, no pages, no rounding)::

    needed = sum over running requests of
             L x E_full + min(L, W) x E_win + (L mod C) x E_loc + S (if it holds a slot)

with ``L`` the tokens a request holds once this step's tokens are in. Per step:

* ``U`` = needed / buffer bytes; **U*** = mean of ``U`` over steps whose waiting queue is
  not empty after admission (steps where a fuller buffer could have admitted more);
* **memory-blocked U*** = mean of ``U`` over the steps in which admission stopped at a
  waiting request because memory had no room for its smallest chunk
  (``StepBatch.memory_blocked``). U* also averages steps where the step's token budget or
  ``max_running``, not memory, held the queue back, so it cannot reach 1; this one can;
* allocation efficiency = sum of needed / sum of held bytes over steps with pages held
  (held = bytes of pages bound to requests or to the prefix cache, null pages excluded).

Prefix cache: every manager gets the same one (:mod:`kvchain.cache`), with the same
settings (``SimConfig.prefix_cache``, ``cache_points``; on when the trace has content keys,
as in ``simulate``): the chain and the baselines' pool allocators all take the cache as
their evictor, so cached pages are evictable supply their planner prices. The cache uses
each manager's own pages (e.g. the equal-page pool's 544-token pages on a Qwen3-Next-like
state hybrid, whose page keys then never match a first 512-token content block, as in
vLLM). Held bytes include cached pages (they are bound in the buffer), so with the cache on
allocation efficiency falls as the cache fills the buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvchain.baselines import ManagerKind, ManagerSetup, build_manager
from kvchain.errors import BufferTooSmallError, ConfigError
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.sched.request import StepBatch
from kvchain.sched.scheduler import Scheduler
from kvchain.sim.engine import SimConfig, check_setup, simulate
from kvchain.sim.metrics import SimSummary, summarize
from kvchain.sim.prefix import PrefixCacheStats


@dataclass(frozen=True, slots=True)
class NeededBytes:
    """Bytes per token / request of a model's classes (the ``needed`` formula's terms).

    Attributes:
        e_full: bytes per token of full attention (0 if none).
        e_win: bytes per token of the sliding window (0 if none); ``window``: ``W``.
        e_local: bytes per token of chunked-local attention (0 if none); ``chunk``: ``C``.
        state: ``S`` bytes per request (0 if none).
        more: further window or local classes of a model with several sizes, as
            ``(bytes per token, W or C tokens, is_local)``.
    """

    e_full: int
    e_win: int
    window: int
    e_local: int
    chunk: int
    state: int
    more: tuple[tuple[int, int, bool], ...] = ()

    @staticmethod
    def of(classes: Sequence[CacheClass]) -> NeededBytes:
        """Read the terms off a model's classes: every full class adds to ``e_full`` and
        every state class to ``state`` (a target's and its draft model's both count); a
        second window or local class goes to ``more``."""
        by: dict[LifetimeClass, CacheClass] = {}
        more: list[tuple[int, int, bool]] = []
        e_full = sum(c.bytes_per_token for c in classes if c.lifetime is LifetimeClass.FULL)
        state = sum(c.bytes_per_slot for c in classes if c.lifetime is LifetimeClass.STATE)
        for c in classes:
            if c.lifetime in (LifetimeClass.FULL, LifetimeClass.STATE):
                continue
            if c.lifetime in by:
                more.append((c.bytes_per_token, c.window or 1, c.lifetime is LifetimeClass.LOCAL))
            else:
                by[c.lifetime] = c

        def e(kind: LifetimeClass) -> tuple[int, int]:
            c = by.get(kind)
            return (c.bytes_per_token, c.window or 0) if c is not None else (0, 0)

        return NeededBytes(e_full, *e(LifetimeClass.WINDOW), *e(LifetimeClass.LOCAL), state,
                           tuple(more))

    def of_request(self, tokens: int, holds_state: bool) -> int:
        """Bytes one request of ``tokens`` tokens needs (the module's formula)."""
        total = tokens * self.e_full
        if self.e_win:
            total += min(tokens, self.window) * self.e_win
        if self.e_local:
            total += (tokens % self.chunk) * self.e_local
        for e, span, local in self.more:
            total += (tokens % span if local else min(tokens, span)) * e
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
            ``u_star_pct``, ``u_star_mem_pct`` and ``alloc_efficiency_pct`` (percent, 2
            decimals) and ``bytes_copied``.
        u_star: U* (0..1; None if the waiting queue was never non-empty).
        u_star_mem: memory-blocked U* (0..1; None if memory never refused the head).
        alloc_efficiency: needed / held bytes (0..1; None if nothing was held).
        series: bytes needed and held over time (at most ``max_points``).
        buffer_bytes: ``B``.
        prefix_cache: the prefix cache's figures (hit tokens and rate, pages evicted per
            band), or ``None`` when the cache was off; ``summary.extra`` then also has
            ``prefix_hit_rate_pct``, ``prefix_hit_tokens`` and ``prefix_evicted_pages``.
        rejected: ``(request id, reason)`` of every rejected request, in arrival order.
        page_tokens: tokens per page of the manager's own pages (the equal-page pool's
            grown block; 1 for the exact-bytes ideal); 0 when not known.
    """

    kind: ManagerKind
    rule: str
    summary: SimSummary
    u_star: float | None
    alloc_efficiency: float | None
    series: tuple[BytesPoint, ...]
    buffer_bytes: int
    u_star_mem: float | None = None
    prefix_cache: PrefixCacheStats | None = None
    rejected: tuple[tuple[int, str], ...] = ()
    page_tokens: int = 0

    def straddle_note(self, block_tokens: int) -> str | None:
        """Why this manager's prefix cache hits less: its pages straddle the trace's
        content blocks of ``block_tokens`` tokens (neither size divides the other), so a
        page's key depends on every block it overlaps and two prompts share a page only
        where they share all of those blocks (the equal-page pool's 544-token pages on a
        state hybrid, against Mooncake's 512-token blocks: a shared first block alone is
        no shared page). ``None`` with the cache off, an unknown page size, or pages that
        tile the blocks."""
        p, b = self.page_tokens, block_tokens
        if self.prefix_cache is None or p <= 0 or b <= 0 or p % b == 0 or b % p == 0:
            return None
        return (f"{self.kind}: its {p:,}-token pages straddle the trace's {b:,}-token "
                f"content blocks, so prompts share a cached page only where they share "
                f"every block it overlaps (hit rate "
                f"{100 * self.prefix_cache.hit_rate:.2f} %)")


class _BytesObserver:
    """Measures bytes needed against bytes held after each step's allocation."""

    def __init__(self, needed_of: NeededBytes, buffer_bytes: int, reserved_bytes: int) -> None:
        self.needed_of = needed_of
        self.buffer = buffer_bytes
        self.reserved = reserved_bytes
        self.u_sum, self.u_steps, self.needed_sum, self.held_sum = 0.0, 0, 0, 0
        self.u_mem_sum, self.u_mem_steps = 0.0, 0
        self.points: list[BytesPoint] = []

    def __call__(self, sched: Scheduler, batch: StepBatch, now: float) -> None:
        kv = sched.kv
        state_band = kv.geom.state
        step_tokens = {p.rid: p.tokens for p in batch.prefills}
        step_tokens.update((d.rid, 1) for d in batch.decodes)
        needed = 0
        for rid in sched.running.keys() | step_tokens.keys():
            holds = state_band is not None and kv.held(rid).span(state_band)[1] > 0
            needed += self.needed_of.of_request(kv.tokens(rid) + step_tokens.get(rid, 0), holds)
        held = kv.chain.snapshot().live_bytes - self.reserved
        if sched.waiting:
            self.u_sum += needed / self.buffer
            self.u_steps += 1
        if batch.memory_blocked:
            self.u_mem_sum += needed / self.buffer
            self.u_mem_steps += 1
        if held > 0:
            self.needed_sum += needed
            self.held_sum += held
        self.points.append(BytesPoint(now, needed, held))


def run_manager(config: SimConfig, kind: ManagerKind, *, max_points: int = 2_000,
                audit_every_step: bool = False,
                progress: Callable[[int, int], None] | None = None) -> ManagerRun:
    """Serve ``config.trace`` with one memory manager (:func:`kvchain.sim.engine.simulate`
    with that manager's allocator, measuring bytes needed and held after each allocation).

    Args:
        config: model, GPU, trace, buffer, page size, scheduler limits and prefix-cache
            settings (``prefix_cache``, ``cache_points``), as for ``simulate``; every
            manager runs with the same settings.
        kind: the memory manager.
        max_points: most points kept in ``series`` (every k-th step).
        audit_every_step: audit the allocator and KV manager after every step (tests).
        progress: called as ``progress(done, total)`` (requests ended), as in ``simulate``.

    Raises:
        ConfigError / BufferTooSmallError: the buffer cannot hold one smallest request
            under this manager.
        SimulationStuckError: requests wait with nothing to run (a bug).
        AdmissionDivergenceError: the allocator refused an admitted batch (a bug).
    """
    buffer = config.layout().buffer_bytes
    setup, config = _manager_setup(config, kind)
    page = setup.layout.page_size
    observer = _BytesObserver(NeededBytes.of(config.model.classes), buffer,
                              setup.layout.reserved_bytes)
    result = simulate(config, allocator=setup.allocator,
                      on_allocated=observer, audit_every_step=audit_every_step,
                      progress=progress)
    u_star = observer.u_sum / observer.u_steps if observer.u_steps else None
    u_mem = observer.u_mem_sum / observer.u_mem_steps if observer.u_mem_steps else None
    efficiency = observer.needed_sum / observer.held_sum if observer.held_sum else None
    extra: dict[str, int | float] = dict(result.summary.extra)
    extra["admitted_but_unallocatable"] = result.summary.admitted_but_unallocatable or 0
    extra["leaked_pages"] = result.summary.leaked_pages or 0
    if u_star is not None:
        extra["u_star_pct"] = round(100 * u_star, 2)
    if u_mem is not None:
        extra["u_star_mem_pct"] = round(100 * u_mem, 2)
    if efficiency is not None:
        extra["alloc_efficiency_pct"] = round(100 * efficiency, 2)
    summary = summarize(result.recorder, extra=extra)
    points = observer.points
    stride = max(1, -(-len(points) // max_points))
    return ManagerRun(kind, setup.rule, summary, u_star, efficiency,
                      tuple(points[::stride]), buffer, u_mem, result.prefix_cache,
                      tuple((r.request_id, r.rejected_reason)
                            for r in result.recorder.records
                            if r.rejected_reason is not None), page)


def _manager_setup(config: SimConfig, kind: ManagerKind) -> tuple[ManagerSetup, SimConfig]:
    """``kind``'s memory manager on ``config``'s buffer, and the config it runs under: a
    manager with larger pages (equal-page) chunks prefills in whole pages of its own."""
    setup = build_manager(kind, config.model.classes, config.layout().buffer_bytes,
                          config.page_size)
    page = setup.layout.page_size
    sched = config.scheduler
    if sched.chunk_size < page or sched.max_prefill_tokens < page:
        config = replace(config, scheduler=replace(
            sched, chunk_size=max(sched.chunk_size, page),
            max_prefill_tokens=max(sched.max_prefill_tokens, page)))
    return setup, config


def check_kinds(kinds: Sequence[ManagerKind]) -> None:
    """Refuse a list of managers to compare that is empty, names something that is not a
    :class:`ManagerKind`, or names one twice (it would run the same simulation twice and
    report it once).

    Raises:
        ConfigError: says which.
    """
    if not kinds:
        raise ConfigError("managers: names no manager")
    bad = [k for k in kinds if not isinstance(k, ManagerKind)]
    if bad:
        raise ConfigError(f"managers: {bad[0]!r} is not a ManagerKind (one of "
                          f"{[str(m) for m in ManagerKind]})")
    repeated = sorted({str(k) for k in kinds if list(kinds).count(k) > 1})
    if repeated:
        raise ConfigError(f"managers: {', '.join(repeated)} named twice")


def compare_managers(config: SimConfig, kinds: Sequence[ManagerKind] = tuple(ManagerKind), *,
                     audit_every_step: bool = False,
                     progress: Callable[[ManagerKind, int, int], None] | None = None
                     ) -> dict[ManagerKind, ManagerRun]:
    """:func:`run_manager` for every kind, same config (insertion order = ``kinds``);
    ``progress(kind, done, total)`` reports each run's requests ended.

    Raises:
        ConfigError: ``kinds`` empty, not managers, or with a repeat (:func:`check_kinds`);
            and what :func:`run_manager` raises, its message led by the manager's name
            (``fixed-pools: the buffer ... cannot hold the smallest request``).
    """
    check_kinds(kinds)
    for k in kinds:  # every manager's set-up before the first run (check_setup)
        try:
            setup, manager_config = _manager_setup(config, k)
            check_setup(manager_config, allocator=setup.allocator)
        except BufferTooSmallError as exc:  # each manager splits the buffer its own way
            raise BufferTooSmallError(f"{k}: {exc}", needed_bytes=exc.needed_bytes,
                                      available_bytes=exc.available_bytes) from None
    runs = {}
    for k in kinds:
        step = None if progress is None else (
            lambda done, total, k=k: progress(k, done, total))
        runs[k] = run_manager(config, k, audit_every_step=audit_every_step, progress=step)
    return runs
