"""Tests of kvchain.report.tables: exact cell text of the summary and comparison tables."""

from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType

import pytest
from rich.console import Console
from rich.table import Table

from kvchain.errors import ConfigError
from kvchain.report.tables import comparison_table, metric_labels, summary_table
from kvchain.sim.metrics import Percentiles, SimSummary

SUMMARY = SimSummary(
    requests_total=1_200,
    requests_finished=1_150,
    requests_rejected=3,
    duration_s=600.0,
    input_tokens_per_s=12_345.678,
    output_tokens_per_s=2_000.04,
    ttft=Percentiles(0.0625, 0.25, 1.5, 1_150),
    tpot=Percentiles(0.015, 0.02, 0.0451, 1_100),
    e2e=Percentiles(4.0, 9.0, 20.0, 1_150),
    queueing=Percentiles(0.005, 0.1, 0.8, 1_150),
    steps=30_000,
    peak_running=256,
    peak_waiting=40,
    mean_kv_utilization=0.8125,
    peak_kv_utilization=0.99,
    mean_kv_requests=0.0625,
    peak_kv_requests=0.25,
    mean_kv_cache_locked=0.125,
    peak_kv_cache_locked=0.5,
    mean_kv_cache_evictable=0.625,
    peak_kv_cache_evictable=0.875,
    retractions=12,
    retracted_requests=9,
    admitted_but_unallocatable=0,
    leaked_pages=None,
    extra=MappingProxyType({"relocations": 5}),
)


def render(table: Table) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(table)
    return console.export_text()


def cells(text: str, label: str) -> list[str]:
    """The cells of the row whose first cell is ``label``."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.strip("│┃ ").split("│")]
        if parts and parts[0] == label:
            return parts[1:]
    raise AssertionError(f"row {label!r} not found in\n{text}")


def test_summary_table_cells() -> None:
    text = render(summary_table(SUMMARY, title="gpt-oss-20b on azure-conv"))
    assert "gpt-oss-20b on azure-conv" in text
    assert cells(text, "requests (finished / total)") == ["1,150 / 1,200"]
    assert cells(text, "input throughput (tok/s)") == ["12,345.7"]
    assert cells(text, "output throughput (tok/s)") == ["2,000.0"]
    assert cells(text, "TTFT p50 (ms)") == ["62.5"]
    assert cells(text, "TTFT p99 (ms)") == ["1,500.0"]
    assert cells(text, "TPOT p90 (ms)") == ["20.0"]
    assert cells(text, "TPOT p99 (ms)") == ["45.1"]
    assert cells(text, "peak running requests") == ["256"]
    # KV by owner, mean / peak in % (0.0625 -> 6.2: Python rounds the tie 6.25 to even)
    assert cells(text, "KV used by requests (%, time-weighted mean / peak)") == ["6.2 / 25.0"]
    assert cells(text, "KV cached, locked by running requests (%, mean / peak)") == [
        "12.5 / 50.0"]
    assert cells(text, "KV cached, evictable (%, mean / peak)") == ["62.5 / 87.5"]
    assert cells(text, "KV held: requests + cache (%, mean / peak)") == ["81.2 / 99.0"]
    assert not any("utilization" in label for label in metric_labels())
    assert "requests = pages running requests hold as their own" in " ".join(text.split())
    assert cells(text, "retractions (requests retracted)") == ["12 (9)"]
    assert cells(text, "rejected") == ["3"]
    assert cells(text, "admitted but unallocatable") == ["0"]
    assert cells(text, "leaked pages") == ["n/a"]
    assert cells(text, "relocations") == ["5"]
    assert len(metric_labels()) == 22


def test_comparison_table_columns_and_missing_values() -> None:
    empty_run = replace(
        SUMMARY,
        requests_finished=0,
        ttft=None,
        tpot=None,
        input_tokens_per_s=None,
        mean_kv_utilization=None,
        mean_kv_cache_locked=None,
        peak_kv_cache_locked=None,
        mean_kv_cache_evictable=None,
        peak_kv_cache_evictable=None,
        leaked_pages=4,
        extra=MappingProxyType({}),
    )
    text = render(comparison_table({"kvchain": SUMMARY, "fixed pools": empty_run}, wide=True))
    assert "memory managers compared" in text
    header = next(line for line in text.splitlines() if "kvchain" in line)
    assert header.index("kvchain") < header.index("fixed pools")
    assert cells(text, "TTFT p50 (ms)") == ["62.5", "n/a"]
    assert cells(text, "input throughput (tok/s)") == ["12,345.7", "n/a"]
    assert cells(text, "KV held: requests + cache (%, mean / peak)") == ["81.2 / 99.0", "n/a"]
    # a run with steps but no prefix cache: its cache rows say so, not 0
    assert cells(text, "KV cached, evictable (%, mean / peak)") == ["62.5 / 87.5", "no cache"]
    assert cells(text, "leaked pages") == ["n/a", "4"]
    assert cells(text, "relocations") == ["5", "n/a"]
    with pytest.raises(ConfigError):
        comparison_table({})


def test_narrow_comparison_of_four_managers_fits_80_columns() -> None:
    runs = {name: SUMMARY for name in ("kvchain", "fixed-pools", "equal-page", "ideal")}
    console = Console(record=True, width=80, color_system=None)
    console.print(comparison_table(runs))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing truncated
    header = next(line for line in text.splitlines() if "kvchain" in line).split()
    assert header[-4:] == ["kvchain", "fixed-pools", "equal-page", "ideal"]
    row = next(line for line in text.splitlines() if line.lstrip().startswith("TTFT p50"))
    assert row.split()[-4:] == ["62.5"] * 4
    assert not any(line.lstrip().startswith("TTFT p90") for line in text.splitlines())
    assert not any("partial" in line for line in text.splitlines())  # no run has them


def test_narrow_comparison_shows_partial_hits_where_a_run_has_them() -> None:
    # one run with --partial-hits (3 partial hits, 96 gap tokens), one without: the narrow
    # table keeps both rows, n/a for the run that has no such counters
    partial = replace(SUMMARY, extra=MappingProxyType({**SUMMARY.extra, "partial_hits": 3,
                                                       "partial_tokens": 96}))
    text = render(comparison_table({"partial": partial, "plain": SUMMARY}))
    rows = {line.strip().rsplit(None, 2)[0]: line.split()[-2:] for line in text.splitlines()
            if line.strip().startswith("partial")}
    assert rows == {"partial hits": ["3", "n/a"], "partial gap tokens": ["96", "n/a"]}


def test_nonzero_bug_counters_are_red() -> None:
    table = summary_table(replace(SUMMARY, leaked_pages=2), title="t")
    console = Console(record=True, width=160, force_terminal=True, color_system="standard")
    console.print(table)
    styled = console.export_text(styles=True)
    assert re.search(r"\x1b\[1;31m *2\x1b\[0m", styled)  # bold red


def test_band_table_lists_every_band_of_a_five_band_chain() -> None:
    from kvchain.layout import plan_layout
    from kvchain.model.declared import declare_model
    from kvchain.report.tables import band_table

    m = declare_model("m", full=30, windows=[(20, 128), (8, 11)], local=4, chunk_tokens=64,
                      state=1_000)
    table = band_table(plan_layout(m.classes, 1 << 20, 16))
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    labels = [line.split()[1] for line in text.splitlines()
              if line.startswith("│") and line.split()[1] != "band"]
    assert labels == ["state", "window128", "local", "window11", "full"]  # bytes/request
    assert "float" in text and text.count("float") == 3


def test_kv_rows_at_full_buffer_still_fit_80_columns() -> None:
    """The widest KV cells ("100.0 / 100.0" in four columns) fit the narrow table, and the
    short labels name the owner of each row."""
    full = replace(SUMMARY, **{f"{w}_kv_{share}": 1.0 for w in ("mean", "peak")
                               for share in ("requests", "cache_locked", "cache_evictable",
                                             "utilization")})
    runs = {name: full for name in ("kvchain", "fixed-pools", "equal-page", "ideal")}
    console = Console(record=True, width=80, color_system=None)
    console.print(comparison_table(runs))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "…" not in text
    for short in ("KV requests (%)", "KV locked (%)", "KV evictable (%)",
                  "KV held (%)"):
        row = next(line for line in text.splitlines() if line.lstrip().startswith(short))
        assert row[len(row) - len(row.lstrip()) + len(short):].split() == [
            "100.0", "/", "100.0"] * 4


def test_kv_rows_of_a_run_without_steps_are_not_available() -> None:
    """No step: every KV row is n/a (not "no cache": nothing says the cache was off)."""
    empty = replace(SUMMARY, steps=0, **{f"{w}_kv_{share}": None for w in ("mean", "peak")
                                         for share in ("requests", "cache_locked",
                                                       "cache_evictable", "utilization")})
    text = render(summary_table(empty, title="t"))
    assert cells(text, "KV used by requests (%, time-weighted mean / peak)") == ["n/a"]
    assert cells(text, "KV cached, evictable (%, mean / peak)") == ["n/a"]


def test_hit_rate_percentages_show_two_decimals() -> None:
    """The summary's extra percentages are rounded to 2 decimals where made; a value whose
    second decimal is 0 (12.5) used to print as "12.5" beside "5.93". Counters stay as
    they are."""
    run = replace(SUMMARY, extra=MappingProxyType({
        "prefix_hit_rate_pct": 3.92, "prefix_infinite_bound_pct": 5.93,
        "prefix_lru_bound_pct": 12.5, "prefix_hit_tokens": 100_352}))
    text = render(summary_table(run, title="t"))
    assert cells(text, "LRU hit-rate bound (%, the buffer as cache)") == ["12.50"]
    assert cells(text, "infinite-cache hit-rate bound (%, same requests)") == ["5.93"]
    assert cells(text, "prefix-cache hit tokens") == ["100,352"]
    wide = render(comparison_table({"a": run, "b": SUMMARY}, wide=True))
    assert cells(wide, "LRU hit-rate bound (%, the buffer as cache)") == ["12.50", "n/a"]


def test_band_table_heads_the_chunk_column_w_slash_c_on_a_local_band():
    """The W column showed a chunked-local band's chunk size under "W": a layout with a
    local band heads it "W / C"; one with windows only keeps "W"."""
    from kvchain.layout import plan_layout
    from kvchain.model.declared import declare_model
    from kvchain.report.tables import band_table

    local = declare_model("l", full=1_000, local=1_000, chunk_tokens=64)
    window = declare_model("w", full=1_000, window=1_000, window_tokens=64)
    headers = [[c.header for c in band_table(plan_layout(m.classes, buffer_bytes=10_000_000,
                                                          page_size=16)).columns]
               for m in (local, window)]
    assert headers[0][4] == "W / C" and headers[1][4] == "W"
