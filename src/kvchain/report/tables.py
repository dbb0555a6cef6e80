"""Rich tables: simulation summaries (one run, or several memory managers side by side),
and a chain's bands.

Units in the tables: throughput in tokens per second, latencies in milliseconds, KV
memory in percent of the KV buffer's bytes, split by owner (:data:`KV_DEFINITIONS`, the
tables' caption); ``n/a`` marks a value that is undefined for the run (no finished
request, no step, a counter the loop did not report), ``no cache`` a prefix-cache share
of a run without a prefix cache.
Counters that must be zero for a correct memory manager (admitted but unallocatable,
leaked pages) are shown in bold red when they are not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rich import box
from rich.table import Table
from rich.text import Text

from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass
from kvchain.sim.metrics import Percentiles, SimSummary

NOT_AVAILABLE = "n/a"
"""Cell text of an undefined value."""


@dataclass(frozen=True, slots=True)
class _Row:
    """One metric row: its label (with unit), how to render it from a summary, its short
    label (side-by-side tables at 80 columns) and whether that narrow table shows it."""

    label: str
    render: Callable[[SimSummary], Text]
    short: str = ""
    narrow: bool = True


def _plain(text: str) -> Text:
    return Text(text)


def _count(value: int | None) -> Text:
    return _plain(NOT_AVAILABLE if value is None else f"{value:,}")


def _must_be_zero(value: int | None) -> Text:
    if value is None:
        return _plain(NOT_AVAILABLE)
    return Text(f"{value:,}", style="bold red" if value else "")


def _rate(value: float | None) -> Text:
    return _plain(NOT_AVAILABLE if value is None else f"{value:,.1f}")


NO_CACHE = "no cache"
"""Cell text of a prefix-cache share on a run without a prefix cache."""


def _mean_peak(summary: SimSummary, share: str) -> Text:
    """``"mean / peak"`` in percent of the buffer (``mean_kv_<share>``,
    ``peak_kv_<share>``); ``n/a`` without steps, ``no cache`` for a cache share of a run
    without a prefix cache."""
    mean, peak = (getattr(summary, f"{which}_kv_{share}") for which in ("mean", "peak"))
    if mean is None or peak is None:
        return _plain(NO_CACHE if summary.steps and share.startswith("cache")
                      else NOT_AVAILABLE)
    return _plain(f"{100 * mean:.1f} / {100 * peak:.1f}")


def _ms(percentiles: Percentiles | None, attribute: str) -> Text:
    if percentiles is None:
        return _plain(NOT_AVAILABLE)
    return _plain(f"{1000 * getattr(percentiles, attribute):,.1f}")


def _percentile_ms(summary: SimSummary, *, attribute: str, key: str) -> Text:
    percentiles: Percentiles | None = getattr(summary, attribute)
    return _ms(percentiles, key)


def _latency_rows(name: str, attribute: str) -> list[_Row]:
    return [
        _Row(
            f"{name} {p} (ms)",
            functools.partial(_percentile_ms, attribute=attribute, key=f"{p}_s"),
            narrow=p != "p90",
        )
        for p in ("p50", "p90", "p99")
    ]


KV_DEFINITIONS = (
    "KV rows: % of the KV buffer's bytes, time-weighted mean (weights = step times) / "
    "peak step. requests = pages running requests hold as their own (a prefix-cache hit "
    "is the cache's); locked = prefix-cache pages a running request reads (its hit) or "
    "has just cached (its prompt); evictable = unlocked prefix-cache pages, which "
    "eviction frees for new work; held = requests + locked + evictable = every live page "
    "but the null pages."
)
"""Definitions of the KV rows (:mod:`kvchain.sim.metrics` defines the shares), printed as
the caption of :func:`summary_table` and :func:`comparison_table`."""

_ROWS: tuple[_Row, ...] = (
    _Row(
        "requests (finished / total)",
        lambda s: _plain(f"{s.requests_finished:,} / {s.requests_total:,}"),
        short="finished / total",
    ),
    _Row("rejected", lambda s: _count(s.requests_rejected)),
    _Row("simulated time (s)", lambda s: _plain(f"{s.duration_s:,.1f}")),
    _Row("input throughput (tok/s)", lambda s: _rate(s.input_tokens_per_s),
         short="input tok/s", narrow=False),
    _Row("output throughput (tok/s)", lambda s: _rate(s.output_tokens_per_s),
         short="output tok/s"),
    *_latency_rows("TTFT", "ttft"),
    *_latency_rows("TPOT", "tpot"),
    _Row("end-to-end p50 (ms)", lambda s: _ms(s.e2e, "p50_s"), short="e2e p50 (ms)",
         narrow=False),
    _Row("queueing delay p50 (ms)", lambda s: _ms(s.queueing, "p50_s"),
         short="queue p50 (ms)", narrow=False),
    _Row("peak running requests", lambda s: _count(s.peak_running), short="peak running"),
    _Row("peak waiting requests", lambda s: _count(s.peak_waiting), short="peak waiting"),
    _Row("KV used by requests (%, time-weighted mean / peak)",
         functools.partial(_mean_peak, share="requests"), short="KV requests (%)"),
    _Row("KV cached, locked by running requests (%, mean / peak)",
         functools.partial(_mean_peak, share="cache_locked"), short="KV locked (%)"),
    _Row("KV cached, evictable (%, mean / peak)",
         functools.partial(_mean_peak, share="cache_evictable"),
         short="KV evictable (%)"),
    _Row("KV held: requests + cache (%, mean / peak)",
         functools.partial(_mean_peak, share="utilization"), short="KV held (%)"),
    _Row(
        "retractions (requests retracted)",
        lambda s: _plain(f"{s.retractions:,} ({s.retracted_requests:,})"),
        short="retractions (reqs)",
    ),
    _Row("admitted but unallocatable", lambda s: _must_be_zero(s.admitted_but_unallocatable),
         short="unallocatable (=0)"),
    _Row("leaked pages", lambda s: _must_be_zero(s.leaked_pages), short="leaked pages (=0)"),
)


def metric_labels() -> tuple[str, ...]:
    """The row labels of both tables, in order (units in parentheses)."""
    return tuple(row.label for row in _ROWS)


EXTRA_LABELS = {
    "admission_decisions": "admission pricing decisions",
    "pages_copied": "pages copied by moves",
    "bytes_copied": "bytes copied by moves",
    "copy_steps": "steps that copied pages",
    "recomputed_tokens": "tokens prefilled again after retractions",
    "stall_retractions": "retractions of steps that would run nothing",
    "copy_time_s": "page-copy time (s, in step times)",
    "copy_time_pct": "page-copy time (% of GPU time)",
    "u_star_pct": "U* (% of buffer needed while requests wait)",
    "u_star_mem_pct": "memory-blocked U* (% needed when memory refused the head)",
    "alloc_efficiency_pct": "allocation efficiency (% needed / held)",
    "prefix_hit_rate_pct": "prefix-cache hit rate (% of prompt tokens)",
    "prefix_hit_tokens": "prefix-cache hit tokens",
    "prefix_evicted_pages": "pages evicted from the prefix cache",
    "cow_state_copies": "state checkpoints copied on a hit",
    "partial_hits": "partial hits (pages shared past the checkpoint, gap recomputed)",
    "partial_tokens": "partial-hit gap tokens (pages reused, recomputed: not hits)",
    "prefix_infinite_bound_pct": "infinite-cache hit-rate bound (%, same requests)",
    "prefix_lru_bound_pct": "LRU hit-rate bound (%, the buffer as cache)",
    "requests_rejected_context": "requests rejected past the context",
    "requests_truncated": "requests truncated to the context",
    "memory_blocked_steps": "steps whose head waiting request memory refused",
    "spec_tokens": "speculative drafts per decode (k, --spec-tokens)",
    "spec_decodes": "speculative decode steps (request x step)",
    "spec_accepted_drafts": "drafts accepted",
    "spec_acceptance_rate": "drafts accepted (fraction of drafted)",
    "spec_tokens_per_decode": "tokens kept per speculative decode (1 + accepted)",
    "spec_replayed_tokens": "tokens recomputed by state replay",
    "spec_overhead_peak_bytes": "speculative memory, peak (B: draft pages + slots)",
    "spec_overhead_mean_bytes": "speculative memory, time-weighted mean (B)",
    "spec_overhead_peak_pct": "speculative memory, peak (% of buffer)",
    "spec_overhead_mean_pct": "speculative memory, mean (% of buffer)",
    "draft_peak_bytes": "draft model bands, peak (B held by requests)",
    "draft_peak_pct": "draft model bands, peak (% of buffer)",
    "draft_forward_s": "draft model forwards (s, in step times)",
    "draft_forward_pct": "draft model forwards (% of GPU time)",
    "host_bytes": "host tier: bytes of its slots (--host-bytes)",
    "host_interval_tokens": "host tier: tokens per resume interval of its split",
    "host_hit_tokens": "host tier: prompt tokens served by load-backs",
    "host_hit_rate_pct": "host tier: hit rate (% of prompt tokens, in the hit rate)",
    "host_bytes_written": "host tier: bytes written (write-through at insert)",
    "host_bytes_loaded": "host tier: bytes loaded back to the device",
    "host_loads": "host tier: load-backs",
    "host_loads_shortened": "host tier: load-backs shortened to an earlier resume point",
    "host_loads_refused": "host tier: host hits refused (no load fit the ledger)",
    "host_writes_skipped": "host tier: prompts not written (no room)",
    "host_evicted_pages": "host tier: slots evicted",
    "host_peak_held_bytes": "host tier: peak bytes held",
    "host_held_bytes_end": "host tier: bytes held at the end",
    "host_stranded_full_pages": "host tier: full pages without a resumable state (must be 0)",
    "load_time_s": "host tier: load-back time (s, before overlap)",
    "load_steps": "host tier: steps with load-backs",
    "retractions_to_host": "retractions by host copy (of retractions)",
    "host_bytes_retracted": "bytes copied to host by retractions",
    "resume_bytes_loaded": "bytes loaded back from host on resume",
    "resume_load_time_s": "resume load-back time (s, in step times)",
    "host_write_time_s": "retraction copy-out time (s, in step times)",
    "recompute_tokens_saved": "tokens not prefilled again (host copies)",
    "host_retract_fallbacks": "host retractions recomputed (host full)",
    "host_slots_leaked": "host slots held at the end (leaked)",
}
"""Display labels of the loop's ``extra`` counters (others show their key)."""

EXTRA_SHORT = {
    "admission_decisions": "pricing decisions",
    "pages_copied": "pages copied",
    "bytes_copied": "bytes copied",
    "u_star_pct": "U* (%)",
    "u_star_mem_pct": "mem-blocked U* (%)",
    "alloc_efficiency_pct": "eff (% hi=better)",
    "requests_rejected_context": "past context",
    "requests_truncated": "truncated",
    "prefix_hit_rate_pct": "hit rate (%)",
    "prefix_hit_tokens": "hit tokens",
    "prefix_evicted_pages": "evicted pages",
    "partial_hits": "partial hits",
    "partial_tokens": "partial gap tokens",
    "prefix_infinite_bound_pct": "infinite bound (%)",
    "prefix_lru_bound_pct": "LRU bound (%)",
    "host_hit_rate_pct": "host hit rate (%)",
    "host_bytes_loaded": "host B loaded",
    "load_time_s": "load time (s)",
}
"""Short labels of the ``extra`` counters in side-by-side tables (defined in
:data:`METRIC_DEFINITIONS`)."""

METRIC_DEFINITIONS = (
    "Better: lower latencies and retractions; higher throughput, U*, eff and hit rate. "
    "U* = mean of bytes needed / buffer over steps with requests waiting; "
    "mem-blocked U* = the same over steps whose head waiting request memory refused; "
    "eff = bytes needed / bytes held (prefix-cache pages included); bytes needed = "
    "L x E_full + min(L, W) x E_win + (L mod C) x E_loc + S per running request of L "
    "tokens; hit rate = prompt tokens "
    "served by the prefix cache / prompt tokens admitted (each manager caches in its own "
    "pages); evicted pages = pages and state slots the cache gave up, in each manager's "
    "own pages (the ideal's hold one token each, so its counts are not comparable)."
)
"""One-paragraph definitions printed under side-by-side tables."""


PERCENT_EXTRAS = ("u_star_pct", "u_star_mem_pct", "alloc_efficiency_pct",
                  "prefix_hit_rate_pct", "prefix_infinite_bound_pct", "prefix_lru_bound_pct",
                  "host_hit_rate_pct")
"""``extra`` percentages rounded to 2 decimals where they are made: shown with exactly 2,
so 12.5 reads ``12.50`` beside a ``5.93`` (``f"{12.5:,}"`` dropped the trailing zero)."""


def _extra_cell(key: str, value: int | float) -> str:
    """An ``extra`` counter as a table cell: thousands separators; 2 decimals for
    :data:`PERCENT_EXTRAS`."""
    return f"{value:,.2f}" if key in PERCENT_EXTRAS else f"{value:,}"


def summary_table(summary: SimSummary, *, title: str) -> Table:
    """One run's summary as a two-column table (metric, value).

    Rows: :func:`metric_labels` (latencies in ms, throughput in tok/s, the KV buffer by
    owner in % of its bytes as defined in :mod:`kvchain.sim.metrics`), then any ``extra``
    counters of the summary, by name. The caption is :data:`KV_DEFINITIONS`.

    Args:
        summary: the run's :class:`~kvchain.sim.metrics.SimSummary`.
        title: the table's title (e.g. the model, trace and memory manager).
    """
    table = Table(title=title, title_justify="left", caption=KV_DEFINITIONS,
                  caption_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in _ROWS:
        table.add_row(row.label, row.render(summary))
    for key, value in summary.extra.items():
        table.add_row(EXTRA_LABELS.get(key, key), _extra_cell(key, value))
    return table


NARROW_EXTRAS = ("u_star_pct", "u_star_mem_pct", "alloc_efficiency_pct", "pages_copied",
                 "prefix_hit_rate_pct", "prefix_hit_tokens", "prefix_evicted_pages",
                 "partial_hits", "partial_tokens")
"""``extra`` counters the narrow side-by-side table shows (``wide`` shows all; the partial
hit rows only where a run has them, i.e. ran with ``--partial-hits``)."""


def comparison_table(
    rows: Mapping[str, SimSummary], *, title: str = "memory managers compared",
    wide: bool = False,
) -> Table:
    """Several runs side by side: one column per run (e.g. per memory manager).

    Narrow (default): short labels and the main rows, so four runs fit 80 columns (the
    caption is :data:`KV_DEFINITIONS`);
    ``wide``: every row of :func:`summary_table` with its full label, and every ``extra``
    counter any run has (``n/a`` for runs without).

    Args:
        rows: run name -> summary, in display order.
        title: the table's title.
        wide: all rows, full labels.

    Raises:
        ConfigError: ``rows`` is empty.
    """
    if not rows:
        raise ConfigError("comparison_table needs at least one summary")
    table = Table(title=title, title_justify="left", caption=KV_DEFINITIONS,
                  caption_justify="left", box=None if not wide else box.HEAVY_HEAD,
                  padding=(0, 1))
    table.add_column("metric", no_wrap=True)
    for name in rows:
        table.add_column(name, justify="right", no_wrap=True)
    for row in _ROWS:
        if wide or row.narrow:
            label = row.label if wide else (row.short or row.label)
            table.add_row(label, *(row.render(summary) for summary in rows.values()))
    extra_keys = list(dict.fromkeys(k for s in rows.values() for k in s.extra))
    for key in extra_keys:
        if not wide and key not in NARROW_EXTRAS:
            continue
        table.add_row(
            EXTRA_LABELS.get(key, key) if wide else EXTRA_SHORT.get(key, key),
            *(_extra_cell(key, s.extra[key]) if key in s.extra else NOT_AVAILABLE
              for s in rows.values()),
        )
    return table


def band_table(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer (fits 80 columns): one row
    per band (any number of floats) with its label (the lifetime, e.g. ``window``, or
    ``window128`` when a model has several window sizes), anchor (low/high END or float),
    bytes per token (per slot for state), page bytes, window ``W`` or chunk ``C`` in tokens
    (the column is headed ``W / C`` when a band is chunked-local), null pages and
    index-space cap in pages."""
    table = Table(title=f"chain {layout.shape_name} in {layout.buffer_bytes:,} B "
                        f"({layout.buffer_bytes / 1e9:,.2f} GB), {layout.page_size} tokens/page")
    local = bool(layout.indices_of(LifetimeClass.LOCAL))  # any owner's
    for col in ("band", "anchor", "B/token", "page B", "W / C" if local else "W", "null",
                "max pages"):
        table.add_column(col, justify="left" if col in ("band", "anchor") else "right",
                         no_wrap=True)
    for b in layout.bands:
        c = b.cache_class
        per_token = f"{c.bytes_per_token:,}" if c.is_token_class else f"{c.bytes_per_slot:,}/slot"
        table.add_row(b.label, b.anchor.value, per_token, f"{b.page_bytes:,}",
                      f"{c.window:,}" if c.window else "-", str(b.reserved_pages), f"{b.cap:,}")
    return table
