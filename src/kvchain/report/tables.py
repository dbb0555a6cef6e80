"""Rich tables of simulation summaries: one run, or several memory managers side by side.

Units in the tables: throughput in tokens per second, latencies in milliseconds,
utilization in percent of the KV buffer's bytes; ``n/a`` marks a value that is undefined
for the run (no finished request, no step, a counter the loop did not report).
Counters that must be zero for a correct memory manager (admitted but unallocatable,
leaked pages) are shown in bold red when they are not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from kvchain.errors import ConfigError
from kvchain.sim.metrics import Percentiles, SimSummary

NOT_AVAILABLE = "n/a"
"""Cell text of an undefined value."""


@dataclass(frozen=True, slots=True)
class _Row:
    """One metric row: its label (with unit) and how to render it from a summary."""

    label: str
    render: Callable[[SimSummary], Text]


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


def _percent(fraction: float | None) -> Text:
    return _plain(NOT_AVAILABLE if fraction is None else f"{100 * fraction:.1f}")


def _ms(percentiles: Percentiles | None, attribute: str) -> Text:
    if percentiles is None:
        return _plain(NOT_AVAILABLE)
    return _plain(f"{1000 * getattr(percentiles, attribute):,.1f}")


def _latency_rows(name: str, attribute: str) -> list[_Row]:
    return [
        _Row(
            f"{name} {p} (ms)",
            lambda s, p=p: _ms(getattr(s, attribute), f"{p}_s"),
        )
        for p in ("p50", "p90", "p99")
    ]


_ROWS: tuple[_Row, ...] = (
    _Row(
        "requests (finished / total)",
        lambda s: _plain(f"{s.requests_finished:,} / {s.requests_total:,}"),
    ),
    _Row("rejected", lambda s: _count(s.requests_rejected)),
    _Row("simulated time (s)", lambda s: _plain(f"{s.duration_s:,.1f}")),
    _Row("input throughput (tok/s)", lambda s: _rate(s.input_tokens_per_s)),
    _Row("output throughput (tok/s)", lambda s: _rate(s.output_tokens_per_s)),
    *_latency_rows("TTFT", "ttft"),
    *_latency_rows("TPOT", "tpot"),
    _Row("end-to-end p50 (ms)", lambda s: _ms(s.e2e, "p50_s")),
    _Row("queueing delay p50 (ms)", lambda s: _ms(s.queueing, "p50_s")),
    _Row("peak running requests", lambda s: _count(s.peak_running)),
    _Row("peak waiting requests", lambda s: _count(s.peak_waiting)),
    _Row("mean KV utilization (%, time-weighted)", lambda s: _percent(s.mean_kv_utilization)),
    _Row("peak KV utilization (%)", lambda s: _percent(s.peak_kv_utilization)),
    _Row(
        "retractions (requests retracted)",
        lambda s: _plain(f"{s.retractions:,} ({s.retracted_requests:,})"),
    ),
    _Row("admitted but unallocatable", lambda s: _must_be_zero(s.admitted_but_unallocatable)),
    _Row("leaked pages", lambda s: _must_be_zero(s.leaked_pages)),
)


def metric_labels() -> tuple[str, ...]:
    """The row labels of both tables, in order (units in parentheses)."""
    return tuple(row.label for row in _ROWS)


EXTRA_LABELS = {
    "admission_decisions": "admission pricing decisions",
    "pages_copied": "pages copied by moves",
    "bytes_copied": "bytes copied by moves",
    "u_star_pct": "U* (% of buffer needed while requests wait)",
    "alloc_efficiency_pct": "allocation efficiency (% needed / held)",
    "prefix_hit_rate_pct": "prefix-cache hit rate (% of prompt tokens)",
    "prefix_hit_tokens": "prefix-cache hit tokens",
    "prefix_evicted_pages": "pages evicted from the prefix cache",
    "cow_state_copies": "state checkpoints copied on a hit",
}
"""Display labels of the loop's ``extra`` counters (others show their key)."""


def summary_table(summary: SimSummary, *, title: str) -> Table:
    """One run's summary as a two-column table (metric, value).

    Rows (see :func:`metric_labels`): requests finished / total, rejected, simulated time,
    input and output throughput (tok/s), TTFT and TPOT p50/p90/p99 (ms), end-to-end and
    queueing p50 (ms), peak running / waiting requests, mean (time-weighted) and peak KV
    utilization (%), retractions, admitted-but-unallocatable, leaked pages; then any
    ``extra`` counters of the summary, by name.

    Args:
        summary: the run's :class:`~kvchain.sim.metrics.SimSummary`.
        title: the table's title (e.g. the model, trace and memory manager).
    """
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in _ROWS:
        table.add_row(row.label, row.render(summary))
    for key, value in summary.extra.items():
        table.add_row(EXTRA_LABELS.get(key, key), f"{value:,}")
    return table


def comparison_table(
    rows: Mapping[str, SimSummary], *, title: str = "memory managers compared"
) -> Table:
    """Several runs side by side: one column per run (e.g. per memory manager).

    The rows are those of :func:`summary_table`; ``extra`` counters are listed when any run
    has them (``n/a`` for runs without).

    Args:
        rows: run name -> summary, in display order.
        title: the table's title.

    Raises:
        ConfigError: ``rows`` is empty.
    """
    if not rows:
        raise ConfigError("comparison_table needs at least one summary")
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    for row in _ROWS:
        table.add_row(row.label, *(row.render(summary) for summary in rows.values()))
    extra_keys = list(dict.fromkeys(k for s in rows.values() for k in s.extra))
    for key in extra_keys:
        table.add_row(
            EXTRA_LABELS.get(key, key),
            *(f"{s.extra[key]:,}" if key in s.extra else NOT_AVAILABLE for s in rows.values()),
        )
    return table
