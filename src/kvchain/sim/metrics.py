"""What a simulation records, and the summary computed from it.

The event loop calls a :class:`MetricsRecorder` as things happen - per request (arrival,
first admission, tokens, retraction, finish, rejection) and once per scheduling step (a
:class:`StepSample` with the chain's bands) - then :func:`summarize` turns the records into
a :class:`SimSummary`, and :func:`write_outputs` writes ``metrics.json`` and
``requests.csv``.

Each step sample's bands say who owns their live bytes (:class:`BandSample`): the null
page, requests' own pages, and the prefix cache's pages (locked by a running hit or
evictable); the four add up to the live bytes on a correct chain (``unowned_bytes == 0``).
The kept samples go to ``metrics.json["step_samples"]`` as columns
(:func:`step_samples_json`).

Definitions (the same as vLLM's and SGLang's serving benchmarks, over *finished* requests):

- TTFT  = first_token_s - arrival_s
- TPOT  = (finished_s - first_token_s) / (output_done - 1), only for output_done > 1
- end-to-end latency = finished_s - arrival_s
- queueing delay = admitted_s (first admission) - arrival_s
- throughput = prompt (input) or generated (output) tokens of finished requests / duration_s,
  where duration_s runs from the earliest arrival to the last recorded time (step end or
  request event).
- KV memory of a step, as fractions of the KV buffer's bytes (``buffer_bytes``), split by
  owner (the same owners as the band samples' columns, summed over the bands):

  - *held* (``mean_kv_utilization`` / ``peak_kv_utilization``) = ``used_bytes``: every
    live page but the null pages, i.e. requests' own pages **plus** the prefix cache's;
  - *requests* (``*_kv_requests``) = ``used_bytes - cached_bytes``: pages running requests
    hold as their own (a request's prefix-cache hit is the cache's, not the request's);
  - *cache locked* (``*_kv_cache_locked``) = ``cached_bytes - evictable_bytes``: prefix-
    cache pages a running request locks (its hit, or its own prompt cached at its prefill
    end);
  - *cache evictable* (``*_kv_cache_evictable``) = ``evictable_bytes``: unlocked cached
    pages, which eviction frees when an admission needs the bytes;

  so requests + cache locked + cache evictable = held. Each mean is weighted by step
  duration (idle time between steps is not counted; the plain mean over steps when every
  step lasted 0 s); each peak is the largest value of one step (peaks of the parts need not
  add up to the peak of the whole). A run without a prefix cache reports its two cache
  shares as None ("no cache"), not 0.

Percentiles use ``numpy.percentile`` with its default linear interpolation between the two
nearest ranks (method ``"linear"``, Hyndman & Fan type 7): e.g. the p90 of
``[1, 2, 3, 4, 5]`` is 4.6.

Step samples can be down-sampled (``max_step_samples``) so that 10^6 steps keep bounded
memory; the summary never reads the kept samples, only exact running totals updated on every
step, so down-sampling changes plots, never numbers.
"""

from __future__ import annotations

import csv
import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from kvchain.alloc.snapshot import ChainSnapshot
from kvchain.errors import ConfigError, MetricsError
from kvchain.layout import Anchor
from kvchain.requests.manager import KVManager

# --- per-request records ----------------------------------------------------------------


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (times in simulated seconds; None = not yet / never).

    Attributes:
        request_id: the trace's request id.
        arrival_s: arrival time.
        prompt_tokens: prompt length, tokens.
        output_tokens: tokens the trace asks for.
        admitted_s: time of the first admission (a re-admission after a retraction keeps it).
        first_token_s: time the first output token was emitted (end of the first prefill).
        finished_s: time the last output token was emitted.
        retractions: times the request was retracted (preempted) and sent back to waiting.
        rejected_reason: why it was rejected (never admitted to completion), or None.
        output_done: output tokens generated so far; a retraction keeps them (recompute
            preemption recomputes prompt + generated tokens and continues).
        hit_tokens: prompt tokens the prefix cache served at the first admission (device
            or host tier; 0 with the cache off or on a miss). A re-admission after a
            retraction keeps it, as ``admitted_s``.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    retractions: int = 0
    rejected_reason: str | None = None
    output_done: int = 0
    hit_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, seconds; None before the first token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, seconds:
        ``(finished_s - first_token_s) / (output_done - 1)``; None unless finished with
        more than one output token."""
        if self.finished_s is None or self.first_token_s is None or self.output_done < 2:
            return None
        return (self.finished_s - self.first_token_s) / (self.output_done - 1)

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency (arrival to last token), seconds; None unless finished."""
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        """Queueing delay (arrival to first admission), seconds; None if never admitted."""
        return None if self.admitted_s is None else self.admitted_s - self.arrival_s


# --- per-step samples -------------------------------------------------------------------


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise MetricsError(what)


def _check_after(record: RequestRecord, attr: str, t_s: float, event: str,
                 missing: str) -> None:
    """Refuse ``event`` at ``t_s`` unless ``record.<attr>`` is set and not after ``t_s``.

    Raises:
        MetricsError: ``"<event>: request <id> at <t_s> s <missing> before (<attr>=..)"``.
    """
    seen = getattr(record, attr)
    if seen is None or t_s < seen:
        raise MetricsError(f"{event}: request {record.request_id} at {t_s} s {missing} "
                           f"before ({attr}={seen})")


def _raise_first(ok: Sequence[bool], messages: Sequence[str], prefix: str = "") -> None:
    """Raise :class:`MetricsError` with the message of the first check in ``ok`` that
    failed (a ``__post_init__``'s checks, each evaluated once)."""
    raise MetricsError(prefix + next(m for good, m in zip(ok, messages, strict=True)
                                     if not good))


@dataclass(frozen=True, slots=True)
class BandSample:
    """One band of the chain at the end of a step (byte frontiers, counts only).

    Every count is in bytes = pages x the band's page bytes (a state band's "pages" are
    state slots). Every live page has exactly one owner (the band's null page, a running
    request, the prefix cache), so when ``request_bytes`` is counted ``request_bytes +
    cached_bytes + reserved_bytes == live_bytes``; :attr:`unowned_bytes` is the difference
    (0 on a correct chain; a leaked page makes it positive, a page counted twice negative).
    The owners' counts come from three independent sources (the layout, the request table,
    the cache's counters and eviction order), so they are not forced to agree here: a
    sample records what each said, and :attr:`unowned_bytes` (and ``evictable_bytes <=
    cached_bytes``) is the check that they do.

    Attributes:
        label: the band's lifetime class (``"state"``, ``"window"``, ``"full"``...).
        lo: first byte of the band's span.
        hi: one past its last byte (``lo <= hi``); the span is ``[lo, hi)``.
        live_bytes: bytes of live (held) pages in the span (null pages included).
        hole_bytes: bytes of hole (free) pages in the span.
        anchor: where the band is pinned (LOW / HIGH END, FLOAT); None if unknown (the band
            chart then infers it from the frontiers).
        reserved_bytes: bytes of the band's reserved (null) pages.
        request_bytes: bytes of pages running requests hold as their own (a request's
            prefix-cache hit is the cache's), or None (not counted).
        cached_bytes: bytes of pages the prefix cache holds, locked by a running request's
            hit or not (0 without a cache).
        evictable_bytes: bytes of the cache's unlocked pages, what eviction can free
            (``<= cached_bytes``).

    Raises:
        MetricsError: negative values, ``lo > hi``, live + holes larger than the span.
    """

    label: str
    lo: int
    hi: int
    live_bytes: int
    hole_bytes: int
    anchor: Anchor | None = None
    reserved_bytes: int = 0
    request_bytes: int | None = None
    cached_bytes: int = 0
    evictable_bytes: int = 0

    def __post_init__(self) -> None:
        lo, hi, live, holes = self.lo, self.hi, self.live_bytes, self.hole_bytes
        request = self.request_bytes
        ok = (0 <= lo <= hi, live >= 0 and holes >= 0, live + holes <= hi - lo,
              min(self.reserved_bytes, self.cached_bytes, self.evictable_bytes) >= 0
              and (request is None or request >= 0))
        if all(ok):
            return  # the common case: no message is formatted (recording cost per step)
        _raise_first(ok, (
            f"need 0 <= lo <= hi, got lo={lo}, hi={hi}",
            f"live_bytes and hole_bytes must be >= 0, got {live} and {holes}",
            f"live {live} + holes {holes} B exceed the span of {hi - lo} B",
            f"reserved, request, cached and evictable bytes must be >= 0, got "
            f"{self.reserved_bytes}, {request}, {self.cached_bytes}, {self.evictable_bytes}"),
            f"band {self.label!r}: ")

    @property
    def unowned_bytes(self) -> int | None:
        """``live - reserved - request - cached`` bytes: 0 when every live page has one
        owner; None when ``request_bytes`` was not counted."""
        if self.request_bytes is None:
            return None
        return self.live_bytes - self.reserved_bytes - self.request_bytes - self.cached_bytes


def band_samples(
    snapshot: ChainSnapshot,
    *,
    reserved_pages: Sequence[int] | None = None,
    request_pages: Sequence[int] | None = None,
    cached_pages: Sequence[int] | None = None,
) -> tuple[BandSample, ...]:
    """The bands of a chain snapshot as samples (low -> high).

    ``live_bytes = live * page_bytes`` and ``hole_bytes = holes * page_bytes`` of each
    :class:`~kvchain.alloc.snapshot.BandSnapshot` (live pages include the band's reserved
    null page, as in the snapshot). The owners' counts are pages per band (low -> high),
    converted with the same page bytes: ``reserved_pages`` (the layout's reserved pages),
    ``request_pages`` (:func:`request_owned_pages`) and ``cached_pages``
    (``PrefixCache.held_counts``); ``evictable_bytes`` is what the snapshot's eviction order
    frees when every unit goes (``evictable.freed(evictable.units)``: the cache's unlocked
    pages), read in O(bands).

    Raises:
        MetricsError: a count sequence whose length is not the number of bands, or counts
            that break :class:`BandSample`'s checks.
    """
    n = len(snapshot.bands)
    for name, counts in (("reserved_pages", reserved_pages), ("request_pages", request_pages),
                         ("cached_pages", cached_pages)):
        _check(counts is None or len(counts) == n,
               f"{name} needs one count per band ({n}), got {counts!r}")
    order = snapshot.evictable
    evictable = order.freed(order.units) if order.units else (0,) * n
    return tuple(
        BandSample(
            label=band.label,
            lo=band.lo,
            hi=band.hi,
            live_bytes=band.live * band.page_bytes,
            hole_bytes=band.holes * band.page_bytes,
            anchor=band.anchor,
            reserved_bytes=reserved_pages[i] * band.page_bytes if reserved_pages else 0,
            request_bytes=request_pages[i] * band.page_bytes if request_pages else None,
            cached_bytes=cached_pages[i] * band.page_bytes if cached_pages else 0,
            evictable_bytes=evictable[i] * band.page_bytes,
        )
        for i, band in enumerate(snapshot.bands)
    )


def request_owned_pages(kv: KVManager, rids: Iterable[int]) -> tuple[int, ...]:
    """Pages per band (low -> high) that requests ``rids`` hold as their own: their prefix-
    cache hit excluded (the cache owns it), state checkpoints and window pages saved for
    the cache included until the request hands them over (:meth:`Reads.owned_per_band`,
    array sums over the request table; without a prefix cache
    ``held_per_band``: every page a request holds is its own). Ids ``kv``
    holds nothing for are skipped."""
    if kv.cache is None:
        return kv.reads.held_per_band(rids)
    return kv.reads.owned_per_band(rids)


@dataclass(frozen=True, slots=True)
class StepSample:
    """The state at the end of one scheduling step.

    Attributes:
        t_s: simulated time at the end of the step, seconds.
        duration_s: the step's duration, seconds (>= 0).
        prefill_tokens: prompt tokens computed in the step.
        decode_tokens: tokens decoded in the step (one per running decode).
        running: requests in the batch.
        waiting: requests in the waiting queue.
        bands: the chain's bands, ordered low -> high bytes.
        buffer_bytes: bytes of the whole KV buffer (> 0).
        used_bytes: live bytes held (reserved pages such as null pages excluded):
            requests' own pages plus the prefix cache's, ``0 <= used_bytes <=
            buffer_bytes`` (:attr:`request_bytes` and :attr:`cached_bytes` split it).
        needed_bytes: bytes the live requests strictly need (e.g. without page rounding), for
            comparisons between memory managers; None when the loop does not compute it.

    Raises:
        MetricsError: non-finite or negative times, negative counts, used bytes outside
            ``[0, buffer_bytes]``, a band beyond the buffer.
    """

    t_s: float
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    bands: tuple[BandSample, ...]
    buffer_bytes: int
    used_bytes: int
    needed_bytes: float | None = None

    def __post_init__(self) -> None:
        counts = (self.prefill_tokens, self.decode_tokens, self.running, self.waiting)
        needed = self.needed_bytes
        ok = (math.isfinite(self.t_s), math.isfinite(self.duration_s) and self.duration_s >= 0,
              min(counts) >= 0, self.buffer_bytes > 0,
              0 <= self.used_bytes <= self.buffer_bytes,
              all(band.hi <= self.buffer_bytes for band in self.bands),
              needed is None or (math.isfinite(needed) and needed >= 0))
        if all(ok):
            return  # the common case: no message is formatted (recording cost per step)
        beyond = [b for b in self.bands if b.hi > self.buffer_bytes][:1]
        _raise_first(ok, (
            f"step t_s must be finite, got {self.t_s!r}",
            f"step duration_s must be finite and >= 0, got {self.duration_s!r}",
            "step token and request counts must be >= 0, got prefill={}, decode={}, "
            "running={}, waiting={}".format(*counts),
            f"buffer_bytes must be > 0, got {self.buffer_bytes}",
            f"used_bytes must be in [0, {self.buffer_bytes}], got {self.used_bytes}",
            "".join(f"band {b.label!r} ends at {b.hi} B, beyond the buffer "
                    f"({self.buffer_bytes} B)" for b in beyond),
            f"needed_bytes must be None or finite and >= 0, got {needed!r}"))

    @property
    def utilization(self) -> float:
        """Held share of the step: ``used_bytes / buffer_bytes`` (0..1): requests' own
        pages plus the prefix cache's (every live page but the null pages)."""
        return self.used_bytes / self.buffer_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes the prefix cache holds, locked or not: the bands' ``cached_bytes`` summed
        (0 without a cache)."""
        return sum(band.cached_bytes for band in self.bands)

    @property
    def evictable_bytes(self) -> int:
        """Bytes of the prefix cache's unlocked pages: the bands' ``evictable_bytes``
        summed."""
        return sum(band.evictable_bytes for band in self.bands)

    @property
    def request_bytes(self) -> int:
        """Bytes running requests hold as their own: ``used_bytes - cached_bytes`` (the
        held bytes less the prefix cache's). On a correct chain it is the bands'
        ``request_bytes`` summed (``unowned_bytes == 0``); it is derived from the cache's
        counters so that the recorder pays O(bands), not O(requests), per step."""
        return _own_bytes(self.used_bytes, self.cached_bytes)

    @property
    def locked_bytes(self) -> int:
        """Bytes of the prefix cache's locked pages (a running request's hit, or its own
        prompt's pages, cached as it prefills): ``cached_bytes - evictable_bytes``."""
        return _locked_bytes(self.cached_bytes, self.evictable_bytes)


def _own_bytes(used_bytes: int, cached_bytes: int) -> int:
    """Requests' own bytes of a step: the held bytes less the prefix cache's."""
    return used_bytes - cached_bytes


def _locked_bytes(cached_bytes: int, evictable_bytes: int) -> int:
    """The prefix cache's locked bytes of a step: its bytes less the evictable ones."""
    return cached_bytes - evictable_bytes


def _time_weighted_mean(seconds: float, duration_s: float, plain_sum: float,
                        steps: int) -> float | None:
    """``seconds / duration_s`` (a per-step value weighted by step durations); the plain
    mean ``plain_sum / steps`` when every step lasted 0 s; None without steps."""
    if steps == 0:
        return None
    if duration_s > 0:
        return seconds / duration_s
    return plain_sum / steps


@dataclass(frozen=True, slots=True)
class ShareTotals:
    """Exact totals of one per-step share of the KV buffer (a fraction of its bytes) over
    every recorded step: what the summary's time-weighted mean and peak are computed from.

    Attributes:
        fraction_seconds: sum of ``fraction * duration_s`` over steps (fraction x seconds).
        fraction_sum: sum of the fractions over steps (the mean of an all-zero-duration
            run).
        peak: the largest fraction of one step; None without steps.
    """

    fraction_seconds: float = 0.0
    fraction_sum: float = 0.0
    peak: float | None = None

    def mean(self, totals: StepTotals) -> float | None:
        """Time-weighted mean over the steps of ``totals``, as
        :attr:`StepTotals.mean_utilization`."""
        return _time_weighted_mean(self.fraction_seconds, totals.duration_s,
                                   self.fraction_sum, totals.steps)


@dataclass(frozen=True, slots=True)
class StepTotals:
    """Exact running totals over every recorded step (down-sampling does not touch them).

    Attributes:
        steps: steps recorded.
        duration_s: sum of step durations, seconds.
        utilization_seconds: sum of ``utilization * duration_s`` (fraction x seconds).
        utilization_sum: sum of utilization over steps (for an all-zero-duration run).
        peak_utilization: largest step utilization (0..1); None without steps.
        peak_running: most requests in one batch.
        peak_waiting: longest waiting queue.
        prefill_tokens: prompt tokens computed, all steps.
        decode_tokens: tokens decoded, all steps.
        needed_fraction_seconds: sum of ``needed_bytes / buffer_bytes * duration_s`` over
            steps that report ``needed_bytes``.
        needed_duration_s: duration of the steps that report ``needed_bytes``.
        requests: share of requests' own bytes (``StepSample.request_bytes``).
        cache_locked: share of the prefix cache's locked bytes (cached - evictable).
        cache_evictable: share of the prefix cache's evictable bytes.
        prefix_cache: whether the run had a prefix cache (the recorder's setting).
    """

    steps: int
    duration_s: float
    utilization_seconds: float
    utilization_sum: float
    peak_utilization: float | None
    peak_running: int
    peak_waiting: int
    prefill_tokens: int
    decode_tokens: int
    needed_fraction_seconds: float
    needed_duration_s: float
    requests: ShareTotals
    cache_locked: ShareTotals
    cache_evictable: ShareTotals
    prefix_cache: bool

    @property
    def mean_utilization(self) -> float | None:
        """Time-weighted mean held share (used / buffer bytes; weights = step durations);
        the plain mean when every step lasted 0 s; None without steps."""
        return _time_weighted_mean(self.utilization_seconds, self.duration_s,
                                   self.utilization_sum, self.steps)


# --- the recorder -----------------------------------------------------------------------

OUTPUT_FILES = ("metrics.json", "requests.csv")
"""The files :func:`write_outputs` writes, in that order."""

DEFAULT_MAX_STEP_SAMPLES = 2_000
"""Default cap on kept step samples, extremes included: about one per pixel column of the
band chart (11 inches at 100-200 dpi), a few hundred kB whatever the run's length."""

_EXTREMES = 4  # peak utilization, peak running, peak waiting, last step


class _ShareSum:
    """Running totals of one share (:class:`ShareTotals`), O(1) per step."""

    __slots__ = ("peak", "seconds", "total")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.total = 0.0
        self.peak: float | None = None

    def add(self, fraction: float, duration_s: float) -> None:
        self.seconds += fraction * duration_s
        self.total += fraction
        if self.peak is None or fraction > self.peak:
            self.peak = fraction

    def totals(self) -> ShareTotals:
        return ShareTotals(self.seconds, self.total, self.peak)


def check_max_step_samples(value: object) -> None:
    """Refuse a cap on kept step samples other than ``None`` or an int of at least 6 (the
    five extremes kept plus one ordinary sample; :class:`MetricsRecorder`).

    Raises:
        ConfigError: ``value`` is not ``None`` or an int (never a bool) ``>= 6``.
    """
    if value is not None and (type(value) is not int or value < 2 + _EXTREMES):
        raise ConfigError(f"max_step_samples must be an int >= {2 + _EXTREMES} or None, "
                          f"got {value!r}")


class MetricsRecorder:
    """Collects request events and step samples during one simulation.

    Request events (each takes the request id and the simulated time ``t_s``, seconds):

    ``on_arrival`` (creates the record) -> ``on_admitted`` -> ``on_first_token`` ->
    ``on_token`` ... -> ``on_finished``; ``on_retracted`` may come any time between
    admission and finish (the request goes back to waiting; a later ``on_admitted`` keeps
    the first admission time); ``on_rejected`` ends a request that will never run.

    Step samples: ``on_step`` (or :meth:`record_step`, which builds the bands only for a
    step it keeps) once per scheduling step, in time order. With ``max_step_samples=N``
    at most ``N`` samples are kept: evenly spaced over simulated time (the first step of
    every bucket of ``d`` seconds; ``d`` is set from the run so far when ``N - 4`` is
    first exceeded and doubles whenever it is exceeded again, so ``(N - 4) / 2`` to
    ``N - 4`` of them) plus the extremes (the step of peak utilization, of peak running,
    of peak waiting, the last step). The totals behind the summary are exact over all
    steps; memory is O(N) whatever the run's length.

    Every step also adds its KV shares by owner to exact totals (see the module doc):
    requests' own bytes (``used_bytes - cached_bytes``), the prefix cache's locked bytes
    (``cached_bytes - evictable_bytes``) and its evictable bytes, each / ``buffer_bytes``;
    ``on_step`` sums them from the sample's bands, ``record_step`` takes the two cache
    totals as numbers (O(1) per step either way, O(bands) to sum).

    Args:
        max_step_samples: cap on kept samples, extremes included (>= 6), or None to keep
            all.
        prefix_cache: whether the run has a prefix cache. Without one (False) the
            summary's cache shares are None ("no cache", not 0) and a step that reports
            cached bytes is refused.

    Raises:
        ConfigError: ``max_step_samples`` below 6.
        MetricsError: (from the event methods) an unknown or repeated id, an event out of
            order, a time before the arrival or going backwards; the recorder is unchanged.
    """

    def __init__(self, *, max_step_samples: int | None = DEFAULT_MAX_STEP_SAMPLES,
                 prefix_cache: bool = True) -> None:
        check_max_step_samples(max_step_samples)
        if not isinstance(prefix_cache, bool):
            raise ConfigError(f"prefix_cache must be a bool, got {prefix_cache!r}")
        self._max_samples = max_step_samples
        self._prefix_cache = prefix_cache
        self._requests = _ShareSum()
        self._cache_locked = _ShareSum()
        self._cache_evictable = _ShareSum()
        self._records: dict[int, RequestRecord] = {}
        self._first_arrival_s: float | None = None
        self._last_time_s: float | None = None
        # step samples: (step index, sample), the first of every `_bucket_s` seconds since
        # `_t0_s` (0.0: every step, until the cap is first exceeded)
        self._bucket_s = 0.0
        self._t0_s: float | None = None
        self._last_bucket = -1
        self._even: list[tuple[int, StepSample]] = []
        self._extremes: dict[str, tuple[int, StepSample]] = {}
        self._last_scalars: tuple[Any, ...] | None = None  # record_step's last step
        self._last_step_t_s = -math.inf
        self._steps = 0
        self._duration_s = 0.0
        self._util_seconds = 0.0
        self._util_sum = 0.0
        self._peak_util: float | None = None
        self._peak_running = 0
        self._peak_waiting = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._needed_fraction_seconds = 0.0
        self._needed_duration_s = 0.0

    # -- request events --

    def _record(self, request_id: int, t_s: float, event: str) -> RequestRecord:
        record = self._records.get(request_id)
        if record is None:
            raise MetricsError(f"{event}: unknown request id {request_id} (no on_arrival)")
        _check(
            math.isfinite(t_s) and t_s >= record.arrival_s,
            f"{event}: request {request_id} at t={t_s!r} s, before its arrival "
            f"({record.arrival_s} s)",
        )
        _check(
            record.finished_s is None and record.rejected_reason is None,
            f"{event}: request {request_id} already "
            f"{'finished' if record.finished_s is not None else 'rejected'}",
        )
        return record

    def _saw(self, t_s: float) -> None:
        if self._last_time_s is None or t_s > self._last_time_s:
            self._last_time_s = t_s

    def on_arrival(
        self, request_id: int, t_s: float, *, prompt_tokens: int, output_tokens: int
    ) -> None:
        """A request arrives (creates its record).

        Raises:
            MetricsError: a repeated id, a non-finite time, token counts below 1.
        """
        _check(request_id not in self._records, f"on_arrival: repeated request id {request_id}")
        _check(math.isfinite(t_s), f"on_arrival: request {request_id}: t_s={t_s!r}")
        _check(
            prompt_tokens >= 1 and output_tokens >= 1,
            f"on_arrival: request {request_id}: prompt_tokens and output_tokens must be >= 1, "
            f"got {prompt_tokens} and {output_tokens}",
        )
        self._records[request_id] = RequestRecord(
            request_id=request_id,
            arrival_s=t_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )
        if self._first_arrival_s is None or t_s < self._first_arrival_s:
            self._first_arrival_s = t_s
        self._saw(t_s)

    def on_admitted(self, request_id: int, t_s: float, hit_tokens: int = 0) -> None:
        """The scheduler admits the request (first admission time kept on re-admission).

        Args:
            hit_tokens: prompt tokens the prefix cache served at this admission (kept
                from the first admission only).

        Raises:
            MetricsError: an unknown request, a non-finite time, or ``hit_tokens``
                outside ``[0, prompt_tokens]``.
        """
        record = self._record(request_id, t_s, "on_admitted")
        _check(
            isinstance(hit_tokens, int) and 0 <= hit_tokens <= record.prompt_tokens,
            f"on_admitted: request {request_id}: hit_tokens={hit_tokens!r} outside "
            f"[0, {record.prompt_tokens}]",
        )
        if record.admitted_s is None:
            record.admitted_s = t_s
            record.hit_tokens = hit_tokens
        self._saw(t_s)

    def on_first_token(self, request_id: int, t_s: float) -> None:
        """A prefill ends and emits one output token (counted in ``output_done``).

        The first call sets ``first_token_s``; a later one (the prefill that recomputes a
        retracted request) only counts its token.

        Raises:
            MetricsError: the request was never admitted, or ``t_s`` precedes admission.
        """
        record = self._record(request_id, t_s, "on_first_token")
        _check_after(record, "admitted_s", t_s, "on_first_token", "was not admitted")
        if record.first_token_s is None:
            record.first_token_s = t_s
        record.output_done += 1
        self._saw(t_s)

    def on_token(self, request_id: int, t_s: float, tokens: int = 1) -> None:
        """Decode steps emit ``tokens`` (>= 1) more output tokens.

        Raises:
            MetricsError: no first token yet, ``tokens < 1``, or ``t_s`` before it.
        """
        record = self._record(request_id, t_s, "on_token")
        _check(tokens >= 1, f"on_token: request {request_id}: tokens must be >= 1, got {tokens}")
        _check_after(record, "first_token_s", t_s, "on_token", "has no first token")
        record.output_done += tokens
        self._saw(t_s)

    def on_finished(self, request_id: int, t_s: float) -> None:
        """The request's last token is out; it leaves the batch.

        Raises:
            MetricsError: no first token yet, a time before it, or a second finish.
        """
        record = self._record(request_id, t_s, "on_finished")
        _check_after(record, "first_token_s", t_s, "on_finished", "has no first token")
        record.finished_s = t_s
        self._saw(t_s)

    def on_retracted(self, request_id: int, t_s: float) -> None:
        """The request is retracted (preempted) to the waiting queue; its pages are freed.

        Raises:
            MetricsError: the request was never admitted.
        """
        record = self._record(request_id, t_s, "on_retracted")
        _check(
            record.admitted_s is not None,
            f"on_retracted: request {request_id} was never admitted",
        )
        record.retractions += 1
        self._saw(t_s)

    def on_rejected(self, request_id: int, t_s: float, reason: str) -> None:
        """The request will never run (e.g. it can never fit the chain).

        Raises:
            MetricsError: an empty reason, or the request already finished or rejected.
        """
        record = self._record(request_id, t_s, "on_rejected")
        _check(bool(reason), f"on_rejected: request {request_id}: reason must not be empty")
        record.rejected_reason = reason
        self._saw(t_s)

    # -- steps --

    def on_step(self, sample: StepSample) -> None:
        """Record one scheduling step (totals always; the sample itself if kept).

        Raises:
            MetricsError: ``sample.t_s`` earlier than the previous step's, or cached bytes
                on a recorder without a prefix cache (the recorder is unchanged).
        """
        self._step(sample.t_s, sample.duration_s, sample.prefill_tokens, sample.decode_tokens,
                   sample.running, sample.waiting, sample.buffer_bytes, sample.used_bytes,
                   sample.needed_bytes, sample.cached_bytes, sample.evictable_bytes,
                   lambda: sample, True)

    def record_step(self, *, t_s: float, duration_s: float, prefill_tokens: int,
                    decode_tokens: int, running: int, waiting: int, buffer_bytes: int,
                    used_bytes: int, bands: Callable[[], tuple[BandSample, ...]],
                    needed_bytes: float | None = None, cached_bytes: int = 0,
                    evictable_bytes: int = 0) -> bool:
        """Record one scheduling step given its numbers (as :class:`StepSample`'s fields),
        calling ``bands()`` (the chain's bands now, e.g. :func:`band_samples`) only if the
        step is kept: a new peak, or the first step of its time bucket. The last step's
        numbers are remembered; :meth:`finish_steps` keeps it with its bands.

        ``cached_bytes`` and ``evictable_bytes`` are the step's prefix-cache bytes, all
        bands together (what ``bands()``'s ``cached_bytes`` / ``evictable_bytes`` sum to:
        ``PrefixCache.held_counts`` and the snapshot's eviction order, O(bands) to read);
        the exact KV shares by owner of every step come from them, kept or not.

        Returns:
            Whether the step was kept (``bands()`` was called).

        Raises:
            MetricsError: as :meth:`on_step`, or numbers :class:`StepSample` refuses, or
                negative cache bytes (checked on every step, kept or not; the recorder is
                unchanged).
        """
        _check(cached_bytes >= 0 and evictable_bytes >= 0,
               f"record_step: cached_bytes and evictable_bytes must be >= 0, got "
               f"{cached_bytes} and {evictable_bytes}")
        if not (math.isfinite(t_s) and math.isfinite(duration_s) and duration_s >= 0
                and min(prefill_tokens, decode_tokens, running, waiting) >= 0
                and 0 <= used_bytes <= buffer_bytes and buffer_bytes > 0
                and (needed_bytes is None
                     or (math.isfinite(needed_bytes) and needed_bytes >= 0))):
            StepSample(t_s, duration_s, prefill_tokens, decode_tokens, running, waiting, (),
                       buffer_bytes, used_bytes, needed_bytes)  # raises with the message
        scalars = (t_s, duration_s, prefill_tokens, decode_tokens, running, waiting,
                   buffer_bytes, used_bytes, needed_bytes)

        def build() -> StepSample:
            return StepSample(t_s, duration_s, prefill_tokens, decode_tokens, running,
                              waiting, bands(), buffer_bytes, used_bytes, needed_bytes)

        kept = self._step(*scalars, cached_bytes, evictable_bytes, build, False)
        self._last_scalars = scalars if not kept else None
        return kept

    def finish_steps(self, bands: Callable[[], tuple[BandSample, ...]]) -> None:
        """Keep the last step recorded by :meth:`record_step` (if it was not kept), with
        ``bands()`` now: call it once the run is over, while the chain is as that step
        left it. Nothing to do after :meth:`on_step` (it keeps the last step itself)."""
        scalars = self._last_scalars
        if scalars is None:
            return
        self._last_scalars = None
        (t_s, duration_s, prefill_tokens, decode_tokens, running, waiting, buffer_bytes,
         used_bytes, needed_bytes) = scalars
        self._extremes["last"] = (self._steps - 1, StepSample(
            t_s, duration_s, prefill_tokens, decode_tokens, running, waiting, bands(),
            buffer_bytes, used_bytes, needed_bytes))

    def _step(self, t_s: float, duration_s: float, prefill_tokens: int, decode_tokens: int,
              running: int, waiting: int, buffer_bytes: int, used_bytes: int,
              needed_bytes: float | None, cached_bytes: int, evictable_bytes: int,
              make: Callable[[], StepSample], keep_last: bool) -> bool:
        """The totals of one step, and whether (and where) its sample is kept; ``make()``
        builds the sample, called at most once and only when it is kept."""
        if not t_s >= self._last_step_t_s:
            raise MetricsError(f"on_step: t_s={t_s} s is before the previous step "
                               f"({self._last_step_t_s} s)")
        if cached_bytes and not self._prefix_cache:
            raise MetricsError(f"on_step: {cached_bytes} B held by a prefix cache on a "
                               "recorder without one (prefix_cache=False)")
        index = self._steps
        self._last_step_t_s = t_s
        self._saw(t_s)
        utilization = used_bytes / buffer_bytes
        self._steps += 1
        self._duration_s += duration_s
        self._util_seconds += utilization * duration_s
        self._util_sum += utilization
        self._requests.add(_own_bytes(used_bytes, cached_bytes) / buffer_bytes, duration_s)
        if self._prefix_cache:
            self._cache_locked.add(_locked_bytes(cached_bytes, evictable_bytes) / buffer_bytes,
                                   duration_s)
            self._cache_evictable.add(evictable_bytes / buffer_bytes, duration_s)
        self._prefill_tokens += prefill_tokens
        self._decode_tokens += decode_tokens
        if needed_bytes is not None:
            fraction = needed_bytes / buffer_bytes
            self._needed_fraction_seconds += fraction * duration_s
            self._needed_duration_s += duration_s
        sample: StepSample | None = None
        if self._peak_util is None or utilization > self._peak_util:
            self._peak_util = utilization
            sample = make()
            self._extremes["peak_utilization"] = (index, sample)
        if running > self._peak_running or index == 0:
            self._peak_running = max(self._peak_running, running)
            sample = sample or make()
            self._extremes["peak_running"] = (index, sample)
        if waiting > self._peak_waiting or index == 0:
            self._peak_waiting = max(self._peak_waiting, waiting)
            sample = sample or make()
            self._extremes["peak_waiting"] = (index, sample)
        if self._t0_s is None:
            self._t0_s = t_s
        bucket = int((t_s - self._t0_s) / self._bucket_s) if self._bucket_s else index
        if bucket > self._last_bucket:
            self._last_bucket = bucket
            sample = sample or make()
            self._even.append((index, sample))
            cap = self._max_samples
            if cap is not None and len(self._even) > cap - _EXTREMES:
                self._coarsen(t_s, cap - _EXTREMES)
        if keep_last:
            self._extremes["last"] = (index, sample or make())
        elif sample is not None:
            self._extremes.pop("last", None)
        return sample is not None

    def _coarsen(self, t_s: float, cap: int) -> None:
        """Widen the time buckets until at most ``cap`` evenly spaced samples are left:
        first to ``span / (cap / 2)`` seconds (``span``: the run so far), then doubling;
        each bucket keeps its first sample (the buckets nest, so the spacing stays even)."""
        t0 = self._t0_s
        assert t0 is not None
        span = t_s - t0
        if not self._bucket_s:
            self._bucket_s = max(span / max(cap // 2, 1), 1e-9)
        even = self._even
        while True:
            width = self._bucket_s
            kept: list[tuple[int, StepSample]] = []
            last = -1
            for i, smp in even:
                b = int((smp.t_s - t0) / width)
                if b > last:
                    kept.append((i, smp))
                    last = b
            if len(kept) <= cap:
                break
            self._bucket_s *= 2
        self._even = kept
        self._last_bucket = last

    # -- read access --

    @property
    def records(self) -> tuple[RequestRecord, ...]:
        """Request records in arrival-event order (the live objects: do not mutate)."""
        return tuple(self._records.values())

    def record(self, request_id: int) -> RequestRecord:
        """The record of one request.

        Raises:
            MetricsError: unknown id.
        """
        record = self._records.get(request_id)
        if record is None:
            raise MetricsError(f"unknown request id {request_id}")
        return record

    @property
    def step_samples(self) -> tuple[StepSample, ...]:
        """Kept step samples in time order: all of them, or the evenly spaced ones plus the
        extremes when down-sampled."""
        merged = dict(self._even)
        merged.update(self._extremes.values())
        return tuple(sample for _, sample in sorted(merged.items(), key=lambda kv: kv[0]))

    @property
    def step_totals(self) -> StepTotals:
        """Exact totals over every recorded step."""
        return StepTotals(
            steps=self._steps,
            duration_s=self._duration_s,
            utilization_seconds=self._util_seconds,
            utilization_sum=self._util_sum,
            peak_utilization=self._peak_util,
            peak_running=self._peak_running,
            peak_waiting=self._peak_waiting,
            prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
            needed_fraction_seconds=self._needed_fraction_seconds,
            needed_duration_s=self._needed_duration_s,
            requests=self._requests.totals(),
            cache_locked=self._cache_locked.totals(),
            cache_evictable=self._cache_evictable.totals(),
            prefix_cache=self._prefix_cache,
        )

    @property
    def prefix_cache(self) -> bool:
        """Whether the run has a prefix cache (the ``prefix_cache`` argument)."""
        return self._prefix_cache

    @property
    def duration_s(self) -> float:
        """Seconds from the earliest arrival to the last recorded time (0.0 if empty)."""
        if self._first_arrival_s is None or self._last_time_s is None:
            return 0.0
        return self._last_time_s - self._first_arrival_s


# --- summary ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 / p90 / p99 of a latency, seconds (numpy linear interpolation).

    Attributes:
        p50_s, p90_s, p99_s: the percentiles, seconds.
        count: how many values they summarize (>= 1).
    """

    p50_s: float
    p90_s: float
    p99_s: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles | None:
        """Percentiles of ``values`` (seconds); None for an empty sequence.

        Example: ``Percentiles.of([1, 2, 3, 4, 5])`` -> p50 3.0, p90 4.6, p99 4.96.
        """
        if len(values) == 0:
            return None
        p50, p90, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 90, 99])
        return cls(float(p50), float(p90), float(p99), len(values))


_COUNTER_KEYS = ("admitted_but_unallocatable", "leaked_pages")


@dataclass(frozen=True, slots=True)
class SimSummary:
    """The numbers of one simulation (see the module doc for definitions).

    Attributes:
        requests_total: requests that arrived.
        requests_finished: requests that finished.
        requests_rejected: requests rejected.
        duration_s: earliest arrival to last recorded time, seconds.
        input_tokens_per_s: prompt tokens of finished requests / duration_s; None if 0 s.
        output_tokens_per_s: generated tokens of finished requests / duration_s; None if 0 s.
        ttft: TTFT percentiles over finished requests (None if none finished).
        tpot: TPOT percentiles over finished requests with more than one output token.
        e2e: end-to-end latency percentiles over finished requests.
        queueing: queueing delay (arrival -> first admission) over finished requests.
        steps: scheduling steps.
        peak_running: most requests in one batch.
        peak_waiting: longest waiting queue.
        mean_kv_utilization, peak_kv_utilization: the *held* share of the KV buffer's
            bytes (the module doc's definitions), its time-weighted mean and its largest
            value in one step (0..1); None without steps.
        mean_kv_requests, peak_kv_requests: the same of the *requests* share.
        mean_kv_cache_locked, peak_kv_cache_locked, mean_kv_cache_evictable,
            peak_kv_cache_evictable: the same of the *cache locked* and *cache evictable*
            shares; None also without a prefix cache.
        retractions: retractions, all requests together.
        retracted_requests: requests retracted at least once.
        admitted_but_unallocatable: admitted requests whose allocation then failed (must be
            0 for kvchain); None when the loop did not report it.
        leaked_pages: pages still held after every request left; None when not reported.
        extra: other counters the loop passed to :func:`summarize` (read-only mapping).
    """

    requests_total: int
    requests_finished: int
    requests_rejected: int
    duration_s: float
    input_tokens_per_s: float | None
    output_tokens_per_s: float | None
    ttft: Percentiles | None
    tpot: Percentiles | None
    e2e: Percentiles | None
    queueing: Percentiles | None
    steps: int
    peak_running: int
    peak_waiting: int
    mean_kv_utilization: float | None
    peak_kv_utilization: float | None
    mean_kv_requests: float | None
    peak_kv_requests: float | None
    mean_kv_cache_locked: float | None
    peak_kv_cache_locked: float | None
    mean_kv_cache_evictable: float | None
    peak_kv_cache_evictable: float | None
    retractions: int
    retracted_requests: int
    admitted_but_unallocatable: int | None
    leaked_pages: int | None
    extra: Mapping[str, int | float] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: field name -> value; percentiles as nested dicts, None as
        null. :meth:`from_json` reads it back."""
        out: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, Percentiles):
                value = asdict(value)  # p50_s, p90_s, p99_s, count
            elif spec.name == "extra":
                value = dict(value)
            out[spec.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimSummary:
        """The summary written by :meth:`to_json` (e.g. the ``summary`` of a metrics.json).

        Raises:
            ConfigError: a missing or unknown field.
        """
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data and n != "extra"]
        unknown = [k for k in data if k not in names]
        if missing or unknown:
            raise ConfigError(f"summary JSON: missing fields {missing}, unknown fields {unknown}")
        values: dict[str, Any] = {}
        for name in names:
            value = data.get(name, {}) if name == "extra" else data[name]
            if name in ("ttft", "tpot", "e2e", "queueing") and value is not None:
                value = Percentiles(**value)
            elif name == "extra":
                value = MappingProxyType(dict(value))
            values[name] = value
        return cls(**values)


def _checked_extra(extra: Mapping[str, int | float]) -> dict[str, int | float]:
    checked: dict[str, int | float] = {}
    for key, value in extra.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"extra counter {key!r} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"extra counter {key!r} must be finite, got {value!r}")
        if key in _COUNTER_KEYS and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"extra counter {key!r} must be an int >= 0, got {value!r}")
        checked[key] = value
    return checked


def summarize(
    recorder: MetricsRecorder, *, extra: Mapping[str, int | float] = MappingProxyType({})
) -> SimSummary:
    """Summarize a finished (or interrupted) simulation.

    Args:
        recorder: the recorder the event loop filled.
        extra: counters of the loop; ``admitted_but_unallocatable`` and ``leaked_pages``
            become summary fields, any other key lands in ``SimSummary.extra``.

    Returns:
        the :class:`SimSummary`.

    Raises:
        ConfigError: a non-numeric or non-finite counter, or a known counter that is not
            an int >= 0.
    """
    counters = _checked_extra(extra)
    records = recorder.records
    finished = [r for r in records if r.finished_s is not None]
    duration = recorder.duration_s
    totals = recorder.step_totals

    def rate(tokens: int) -> float | None:
        return tokens / duration if duration > 0 else None

    def values(attribute: str) -> list[float]:
        out = [getattr(r, attribute) for r in finished]
        return [v for v in out if v is not None]

    known = {key: int(counters.pop(key)) for key in _COUNTER_KEYS if key in counters}
    cache = totals.prefix_cache
    locked, evictable = totals.cache_locked, totals.cache_evictable
    return SimSummary(
        requests_total=len(records),
        requests_finished=len(finished),
        requests_rejected=sum(r.rejected_reason is not None for r in records),
        duration_s=duration,
        input_tokens_per_s=rate(sum(r.prompt_tokens for r in finished)),
        output_tokens_per_s=rate(sum(r.output_done for r in finished)),
        ttft=Percentiles.of(values("ttft_s")),
        tpot=Percentiles.of(values("tpot_s")),
        e2e=Percentiles.of(values("e2e_s")),
        queueing=Percentiles.of(values("queue_s")),
        steps=totals.steps,
        peak_running=totals.peak_running,
        peak_waiting=totals.peak_waiting,
        mean_kv_utilization=totals.mean_utilization,
        peak_kv_utilization=totals.peak_utilization,
        mean_kv_requests=totals.requests.mean(totals),
        peak_kv_requests=totals.requests.peak,
        mean_kv_cache_locked=locked.mean(totals) if cache else None,
        peak_kv_cache_locked=locked.peak if cache else None,
        mean_kv_cache_evictable=evictable.mean(totals) if cache else None,
        peak_kv_cache_evictable=evictable.peak if cache else None,
        retractions=sum(r.retractions for r in records),
        retracted_requests=sum(r.retractions > 0 for r in records),
        admitted_but_unallocatable=known.get("admitted_but_unallocatable"),
        leaked_pages=known.get("leaked_pages"),
        extra=MappingProxyType(counters),
    )


# --- outputs ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimOutputs:
    """Files written by :func:`write_outputs`.

    Attributes:
        metrics_json: ``metrics.json``: ``{"config": ..., "summary": ...}``.
        requests_csv: ``requests.csv``: one row per request (:data:`REQUEST_CSV_COLUMNS`).
    """

    metrics_json: Path
    requests_csv: Path


REQUEST_CSV_COLUMNS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "output_done",
    "admitted_s",
    "first_token_s",
    "finished_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "retractions",
    "rejected_reason",
    "hit_tokens",
)
"""Columns of requests.csv (times in seconds; an empty cell = not happened / undefined)."""


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise ConfigError(f"config value {value!r} of type {type(value).__name__} is not JSON")


STEP_SAMPLE_COLUMNS = ("t_s", "duration_s", "prefill_tokens", "decode_tokens", "running",
                       "waiting", "used_bytes")
"""Per-step columns of ``metrics.json["step_samples"]`` (one list each, a value a kept
sample)."""

BAND_SAMPLE_COLUMNS = ("lo", "hi", "live_bytes", "hole_bytes", "reserved_bytes",
                       "request_bytes", "cached_bytes", "evictable_bytes")
"""Per-band columns of ``metrics.json["step_samples"]["bands"]`` (:class:`BandSample`)."""


def step_samples_json(samples: Sequence[StepSample]) -> dict[str, Any]:
    """The kept step samples as columns: the ``step_samples`` section of ``metrics.json``.

    ``{"count": n, "buffer_bytes": B, "t_s": [...], ... (STEP_SAMPLE_COLUMNS),
    "bands": [{"label": "window", "anchor": "low", "lo": [...], ... (BAND_SAMPLE_COLUMNS)},
    ...]}``: every list has ``n`` entries, sample ``i`` at index ``i``, in time order; a
    band a sample lacks (or a ``request_bytes`` it did not count) is ``null``. Bytes per
    band: ``live_bytes = reserved_bytes + request_bytes + cached_bytes`` (null page,
    requests' own pages, prefix-cache pages) when the owners were counted; of the cached
    bytes, ``evictable_bytes`` are unlocked (see :class:`BandSample`). ``buffer_bytes`` is
    the last sample's (the buffer does not change during a run).
    """
    out: dict[str, Any] = {"count": len(samples),
                           "buffer_bytes": samples[-1].buffer_bytes if samples else None}
    for column in STEP_SAMPLE_COLUMNS:
        out[column] = [getattr(s, column) for s in samples]
    labels = list(dict.fromkeys(b.label for s in samples for b in s.bands))
    bands: list[dict[str, Any]] = []
    for label in labels:
        found = [next((b for b in s.bands if b.label == label), None) for s in samples]
        anchor = next((b.anchor for b in found if b is not None and b.anchor is not None),
                      None)
        entry: dict[str, Any] = {"label": label,
                                 "anchor": anchor.value if anchor is not None else None}
        for column in BAND_SAMPLE_COLUMNS:
            entry[column] = [None if b is None else getattr(b, column) for b in found]
        bands.append(entry)
    out["bands"] = bands
    return out


def write_outputs(
    out_dir: str | Path,
    recorder: MetricsRecorder,
    summary: SimSummary,
    *,
    config: Mapping[str, Any] = MappingProxyType({}),
    sections: Mapping[str, Any] = MappingProxyType({}),
) -> SimOutputs:
    """Write ``metrics.json`` (config + summary) and ``requests.csv`` into ``out_dir``.

    ``sections`` adds top-level sections after the summary (e.g. ``prefix_cache``); the
    last section, ``step_samples``, is the recorder's kept step samples as columns
    (:func:`step_samples_json`: per step time, tokens, queues, used bytes, and per band its
    frontiers and who owns its live bytes), written on one line to keep the file small.

    ``out_dir`` is created if missing; existing files of those names are replaced. Floats
    are written with Python's shortest round-trip repr. Config values may be JSON types,
    paths or enums (written as strings).

    Raises:
        ConfigError: a config value that is not JSON-serializable (nothing is written).
    """
    try:
        metrics_text = json.dumps(
            {"config": dict(config), "summary": summary.to_json(), **dict(sections)},
            indent=2,
            allow_nan=False,
            default=_json_default,
        )
        steps_text = json.dumps(step_samples_json(recorder.step_samples), allow_nan=False,
                                separators=(",", ":"))
    except ValueError as exc:
        raise ConfigError(f"metrics.json: {exc}") from None
    metrics_text = f'{metrics_text[:-2]},\n  "step_samples": {steps_text}\n}}'
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    metrics_path = directory / OUTPUT_FILES[0]
    metrics_path.write_text(metrics_text + "\n", encoding="utf-8")
    requests_path = directory / OUTPUT_FILES[1]
    with requests_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUEST_CSV_COLUMNS)
        for record in recorder.records:
            row = [getattr(record, column) for column in REQUEST_CSV_COLUMNS]
            writer.writerow(["" if value is None else value for value in row])
    return SimOutputs(metrics_json=metrics_path, requests_csv=requests_path)
