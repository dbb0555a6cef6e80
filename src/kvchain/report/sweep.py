"""Sweep outputs: result rows as JSON lines, CSV and Parquet, plots against rate, and the
SLO table.

Files in a sweep's output folder:

* ``sweep.jsonl``: one JSON row per finished point, appended as points finish (what
  ``--resume`` reads back);
* ``sweep.csv`` (and ``sweep.parquet`` when pyarrow is installed): every row in grid order,
  columns = the union of the rows' keys;
* ``sweep-<n>.png``: per configuration (model, GPU, tp, trace, memory fraction), output
  throughput and TTFT/TPOT p99 against offered request rate, one line per manager;
* with ``--slo``: ``slo.jsonl`` / ``slo.csv``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from kvchain.errors import ConfigError
from kvchain.sim.run_options import RunOptions
from kvchain.unique_fields import user_json

Row = Mapping[str, Any]


def numbered_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The rows of a sweep's JSON-lines file with their line numbers (empty when it does
    not exist); a torn last line (an interrupted write) is skipped. Every row is a JSON
    object with a string ``key`` (``--resume`` matches rows on it).

    Raises:
        ConfigError: the file cannot be read (e.g. a folder) or is not UTF-8 text, or a
            line (before the last, for bad JSON) that is not a JSON object with a string
            ``key``; the message names the file and the line.
    """
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last row
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{path}:{n}: not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            row = user_json(line, unique=False)
        except ConfigError:
            if n == len(lines):
                break
            raise ConfigError(f"{path}:{n}: not a JSON row") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n}: not a JSON object")
        if not isinstance(row.get("key"), str):
            raise ConfigError(f"{path}:{n}: a row needs a string \"key\", got "
                              f"{row.get('key')!r}")
        rows.append((n, row))
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of :func:`numbered_rows`, without their line numbers.

    Raises:
        ConfigError: as :func:`numbered_rows`.
    """
    return [row for _, row in numbered_rows(path)]


_NUMBER: tuple[type, ...] = (int, float)
_MAYBE_NUMBER: tuple[type, ...] = (int, float, type(None))
_SCALAR: tuple[type, ...] = (str, int, float, bool, type(None))
_SETTINGS: dict[str, tuple[type, ...]] = {
    "key": (str,), "model": (str,), "gpu": (str,), "tp": (int,), "trace": (str,),
    "mem_fraction": _NUMBER, "manager": (str,), "requests": _SCALAR, "end_s": _SCALAR,
    "page_size": _SCALAR, "max_running": _SCALAR, "chunk_size": _SCALAR, "seed": _SCALAR,
    "prefix_cache": (str,)}


def row_columns(slo_metrics: Sequence[str] | None) -> dict[str, tuple[type, ...]]:
    """The columns the tables, plots and GPU counts read from a result row, each with the
    JSON types a fresh row's value has (``type(None)``: may be null; ``bool`` only where
    listed, though it is an ``int``): a plain sweep's row (:func:`kvchain.sim.sweep.
    run_point`) when ``slo_metrics`` is None, else an SLO search's row (:func:`kvchain.sim.
    sweep.run_slo_search`) with those target metrics (e.g. ``["ttft_p99"]``). Columns a
    fresh row has only sometimes (the hit rates) are not listed: :func:`check_row` checks
    them when present."""
    if slo_metrics is None:
        return {**_SETTINGS, "rate_scale": _NUMBER, "requests_total": (int,),
                "requests_finished": (int,), "offered_rate_rps": _MAYBE_NUMBER,
                "output_tokens_per_s": _MAYBE_NUMBER, "ttft_p99_s": _MAYBE_NUMBER,
                "tpot_p99_s": _MAYBE_NUMBER}
    columns = {**_SETTINGS, "slo": (str,), "rel_tol": _NUMBER, "evaluations": (int,),
               "max_rate_scale": _MAYBE_NUMBER, "fail_rate_scale": _MAYBE_NUMBER,
               "max_rate_rps": _MAYBE_NUMBER, "fail_rate_rps": _MAYBE_NUMBER}
    for metric in slo_metrics:
        columns[f"at_best_{metric}_s"] = _MAYBE_NUMBER
        columns[f"at_fail_{metric}_s"] = _MAYBE_NUMBER
    return columns


_SOMETIMES = {"prefix_hit_rate_pct": _MAYBE_NUMBER, "host_hit_rate_pct": _MAYBE_NUMBER}


def check_row(row: Row, columns: Mapping[str, tuple[type, ...]], where: str) -> None:
    """Refuse a row read back (``--resume``) that lacks a column of ``columns``
    (:func:`row_columns`) or holds a value of another type there (or in a hit-rate column
    it has), rather than crash or show it later.

    Raises:
        ConfigError: the first such column, with ``where`` (``file:line``).
    """
    for name, kinds in {**columns, **{k: v for k, v in _SOMETIMES.items() if k in row}}.items():
        if name not in row:
            raise ConfigError(f"{where}: the row has no {name!r}")
        value = row[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ConfigError(f"{where}: {name!r} is {value!r}, expected "
                              + " or ".join("null" if k is type(None) else k.__name__
                                            for k in kinds))


def drop_torn_row(path: Path) -> bool:
    """Cut a torn last line (not JSON: an interrupted write, the line
    :func:`numbered_rows` skips) off the JSON-lines file ``path``, so rows appended next
    start on a line of their own; returns whether one was cut (a missing file: no).

    Raises:
        OSError: the file cannot be read or written.
    """
    if not path.exists():
        return False
    data = path.read_bytes()
    body = data.rstrip(b"\n")
    start = body.rfind(b"\n") + 1
    last = body[start:]
    if not last.strip():
        return False
    try:
        user_json(last.decode("utf-8"), unique=False)
        return False
    except (ConfigError, UnicodeDecodeError):
        pass
    with path.open("r+b") as fh:
        fh.truncate(start)
    return True


def append_row(path: Path, row: Row) -> None:
    """Append one row to a JSON-lines file (flushed at once)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(row), sort_keys=False) + "\n")


def columns(rows: Iterable[Row]) -> list[str]:
    """Union of the rows' keys, first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def write_table(rows: Sequence[Row], csv_path: Path) -> list[Path]:
    """Write ``rows`` as CSV (empty cells for missing values) and, when pyarrow is
    installed, as Parquet next to it (same stem). Returns the paths written."""
    cols = columns(rows)
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in cols})
    written = [csv_path]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    table = pa.Table.from_pylist([{k: row.get(k) for k in cols} for row in rows])
    parquet = csv_path.with_suffix(".parquet")
    pq.write_table(table, parquet)
    written.append(parquet)
    return written


_GROUP = ("model", "gpu", "tp", "trace", "mem_fraction", "prefix_cache", "requests", "end_s",
          "page_size", "max_running", "chunk_size", "seed")


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")
"""Per manager (in order of first appearance across the sweep, the same in every PNG): a
marker and a dash style, so equal lines drawn over each other stay visible."""


def plot_rows(rows: Sequence[Row], out: Path) -> list[Path]:
    """Per configuration (rows equal on everything but rate scale and manager): a PNG of
    output throughput (tok/s, higher is better), TTFT p99 and TPOT p99 (ms, lower is
    better) against offered request rate (requests/s), one line per manager, each with its
    own marker and dash style (:data:`_MARKERS`, :data:`_DASHES`). Returns the paths
    written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in _GROUP), []).append(row)
    order = list(dict.fromkeys(str(row.get("manager")) for row in rows))
    paths: list[Path] = []
    for n, (group, members) in enumerate(groups.items(), 1):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        managers: dict[str, list[Row]] = {}
        for row in members:
            managers.setdefault(str(row.get("manager")), []).append(row)
        panels = (("output_tokens_per_s", 1.0, "output tokens / s (higher is better)",
                   "throughput"),
                  ("ttft_p99_s", 1e3, "ms (lower is better)", "TTFT p99"),
                  ("tpot_p99_s", 1e3, "ms (lower is better)", "TPOT p99"))
        for ax, (col, factor, unit, title) in zip(axes, panels, strict=True):
            for manager, mrows in managers.items():
                pts = sorted((r["offered_rate_rps"], r[col] * factor) for r in mrows
                             if r.get("offered_rate_rps") is not None and r.get(col) is not None)
                if pts:
                    i = order.index(manager)
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2, label=manager,
                            marker=_MARKERS[i % len(_MARKERS)],
                            linestyle=_DASHES[i % len(_DASHES)], markerfacecolor="none")
            ax.set_title(title)
            ax.set_xlabel("offered rate (requests / s)")
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(" / ".join(f"{k}={v}" for k, v in zip(_GROUP[:6], group, strict=False)),
                     fontsize=9)
        fig.tight_layout()
        path = out / f"sweep-{n}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def slo_table(rows: Sequence[Row], target_rps: float | None) -> Table:
    """A rich table of an SLO search: one line per configuration, per manager side by side
    the highest rate meeting the SLO (requests / s and the rate scale) and, with a target
    rate, the GPUs needed.

    Configuration settings every row shares (model, GPU, tp, trace, memory fraction, prefix
    cache) go to the title; the rest are columns. A rate found at the top of the searched
    range shows as ``>=`` (the SLO may hold higher); a configuration whose lowest rate fails
    shows ``not met`` and ``<`` that rate scale, and the caption says what was measured
    there (:func:`not_met_lines`). Cells are never cut or folded: two managers with GPUs
    fit 80 columns (print with :func:`print_whole`: a wider table, e.g. with a
    prefix-cache column, is then printed whole at its own width).

    Args:
        rows: result rows as :func:`kvchain.sim.sweep.run_slo_search` returns them.
        target_rps: the ``--target-rate`` (requests / s), or ``None``.
    """
    managers = list(dict.fromkeys(str(r["manager"]) for r in rows))
    config_keys = ("model", "gpu", "tp", "trace", "mem_fraction", "prefix_cache")
    configs: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        configs.setdefault(tuple(r.get(k) for k in config_keys), {})[str(r["manager"])] = r
    varying = [i for i, k in enumerate(config_keys)
               if len({repr(c[i]) for c in configs}) > 1]
    first = next(iter(configs), ())
    shared = ", ".join([f"{k}={first[i]}" for i, k in enumerate(config_keys)
                        if i not in varying and first and first[i] not in (None, "auto")]
                       + _changed_options(rows))
    slo = rows[0]["slo"] if rows else ""
    title = f"highest rate meeting {slo}"
    if target_rps is not None:
        title += f"; GPUs for {target_rps:g} req/s"
    if shared:
        title += f"\n{shared}"
    names = [config_keys[i].replace("_", "\n", 1) for i in varying]  # "prefix\ncache"
    for m in managers:
        names += [f"{m}\nreq/s", f"{m}\nx scale"]
        if target_rps is not None:
            names.append(f"{m}\nGPUs")
    body: list[list[str]] = []
    for config, by_manager in configs.items():
        cells = [str(config[i]) for i in varying]
        for m in managers:
            got = by_manager.get(m)
            if got is None or got.get("max_rate_scale") is None:
                low = got.get("fail_rate_scale") if got is not None else None
                cells += ["not met", "-" if low is None else f"<{low:.3g}"]
            else:
                rps = got.get("max_rate_rps")
                more = ">=" if got.get("fail_rate_scale") is None else ""
                cells += [f"{more}{rps:,.2f}" if rps else "-",
                          f"{more}{got['max_rate_scale']:.3g}"]
            if target_rps is not None:
                gpus = got.get("gpus_needed") if got is not None else None
                cells.append("-" if gpus is None else f"{gpus:,}")
        body.append(cells)
    caption = "\n".join(not_met_lines(rows)) or None
    return _whole_cells_table(title, names, body, len(varying), caption)


def _seconds(value: float) -> str:
    """A latency for a caption: ``2.31 s`` from one second up, else ``45.7 ms``."""
    return f"{value:,.2f} s" if value >= 1 else f"{value * 1e3:,.1f} ms"


def not_met_lines(rows: Sequence[Row]) -> list[str]:
    """One line per SLO search that no rate met: the manager and the configuration's
    settings, the rate scale and offered rate where the targets already failed (the lowest
    searched), and every target metric measured there, e.g. ``kvchain, h100, azure-conv:
    at rate scale 0.25 (1.31 req/s) ttft_p99 3.20 s, tpot_p99 41.0 ms`` (targets in the
    title). Rows without ``at_fail_`` values (written before they existed) say so."""
    out = []
    for r in rows:
        if r.get("max_rate_scale") is not None:
            continue
        who = ", ".join(str(r[k]) for k in ("manager", "model", "gpu", "trace")
                        if r.get(k) is not None)
        measured = [f"{k[len('at_fail_'):-2]} {_seconds(v)}" for k, v in r.items()
                    if k.startswith("at_fail_") and v is not None]
        scale, rps = r.get("fail_rate_scale"), r.get("fail_rate_rps")
        where = f"at rate scale {scale:g}" if scale is not None else "at the lowest rate"
        if rps:
            where += f" ({rps:,.2f} req/s)"
        out.append(f"not met, {who}: {where} " + (", ".join(measured) if measured
                                                  else "(no measurements in this row)"))
    return out


def _whole_cells_table(title: str, names: Sequence[str], body: Sequence[Sequence[str]],
                       left: int, caption: str | None = None, edges: bool = True) -> Table:
    """A borderless rich table whose cells are never cut or folded: each column is at
    least as wide as its longest cell and its longest header line (headers may take two
    lines, so tables with many columns fit 80 columns); the first ``left`` columns are
    left-aligned (settings), the rest right-aligned (numbers). ``edges=False`` drops the
    blank edge columns and outer padding (4 characters more for cells)."""
    table = Table(title=title, box=box.SIMPLE, caption=caption, pad_edge=edges,
                  show_edge=edges)
    for i, name in enumerate(names):
        width = max([len(line[i]) for line in body] + [len(p) for p in name.split("\n")])
        table.add_column(name, no_wrap=True, min_width=width,
                         justify="left" if i < left else "right")
    for cells in body:
        table.add_row(*cells)
    return table


def _changed_options(rows: Sequence[Row]) -> list[str]:
    """Run options the rows carry beyond the grid's columns that every row shares, as
    ``key=value`` title parts (integers with thousands separators: ``buffer_bytes=
    67,289,933,312``). A row carries an option only when it differs from its default
    (``SweepPoint.params``), e.g. ``reserve``; ``buffer_bytes`` is each point's own buffer,
    so a sweep over GPUs has none in its title. An option missing from a row or differing
    between rows is left out: the title names only settings every point really shares."""
    known = [f.name for f in fields(RunOptions)]
    parts = []
    for k in known:
        if k in _AXES or k in ("rate_scale", "mem_fraction") or not rows:
            continue
        if any(k not in r for r in rows) or len({repr(r[k]) for r in rows}) > 1:
            continue
        value = rows[0][k]
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        parts.append(f"{k}={shown}")
    return parts


# Grid parameters a sweep row carries, in the order a results table shows them.
_AXES = ("manager", "model", "gpu", "tp", "trace", "rate_scale", "mem_fraction",
         "prefix_cache", "requests", "end_s", "page_size", "max_running", "chunk_size", "seed")


def sweep_table(rows: Sequence[Row]) -> Table:
    """A rich table of a plain sweep's results, one line per point in grid order.

    Columns: the grid parameters whose values differ between rows (a parameter every point
    shares goes to the title instead, so a sweep over rate scales shows only the rate), then
    finished / total requests, offered rate (requests / s), output tokens / s, TTFT p99 and
    TPOT p99 (ms; the caption says so) and the prefix-cache hit rate (%) when the rows carry
    one. A missing value (no request finished) shows as ``-``. Cells are never cut or
    folded; settings' headers take two lines (``rate\nscale``) and the table has no blank
    edges, so three varying settings usually fit 80 columns; print it with
    :func:`print_whole` so a wider one is not cropped at the console's edge.

    Args:
        rows: result rows as :func:`kvchain.sim.sweep.run_point` returns them.
    """
    varying = [a for a in _AXES if len({repr(r.get(a)) for r in rows}) > 1]
    shared = [f"{a}={rows[0][a]}" for a in ("model", "gpu", "tp", "trace", "manager",
                                             "prefix_cache")
              if a not in varying and rows and rows[0].get(a) not in (None, "auto")]
    shared += _changed_options(rows)
    title = "sweep" + (": " + ", ".join(shared) if shared else "")
    with_hits = any(r.get("prefix_hit_rate_pct") is not None for r in rows)
    metrics = [("done", "finished"), ("req/s", "offered_rate_rps"),
               ("out\ntok/s", "output_tokens_per_s"), ("TTFT\np99", "ttft_p99_s"),
               ("TPOT\np99", "tpot_p99_s")]
    if with_hits:
        metrics.append(("hit\n%", "prefix_hit_rate_pct"))
    if any(r.get("host_hit_rate_pct") is not None for r in rows):
        metrics.append(("host\nhit %", "host_hit_rate_pct"))

    def cell(row: Row, key: str) -> str:
        if key == "finished":
            return f"{row.get('requests_finished', 0):,}/{row.get('requests_total', 0):,}"
        value = row.get(key)
        if value is None:
            return "-"
        if key.endswith("_p99_s"):
            return f"{value * 1e3:,.1f}"
        return f"{value:,.2f}" if key != "output_tokens_per_s" else f"{value:,.0f}"

    body = [[str(r.get(a)) for a in varying] + [cell(r, k) for _, k in metrics] for r in rows]
    # headers take two lines (a setting's name split at its first "_": "prefix\ncache") and
    # the table has no blank edges, so a sweep over three settings (rate x prefix cache x
    # managers, or GPUs x traces x managers) with its hit column fits 80 columns
    names = [a.replace("_", "\n", 1) for a in varying] + [name for name, _ in metrics]
    return _whole_cells_table(title, names, body, len(varying),
                              "req/s: offered rate; TTFT and TPOT p99 in ms", edges=False)


def table_width(table: Table) -> int:
    """Columns (characters) ``table`` needs to show every cell whole: its widest rendering
    measured on an unbounded console (the title may still wrap)."""
    wide = Console(width=100_000, file=io.StringIO(), color_system=None, markup=False)
    return wide.measure(table).maximum


def print_whole(console: Console, table: Table) -> None:
    """Print ``table`` on ``console`` with every column whole: a table wider than the
    console (many settings vary) is printed at its own width, uncropped (a terminal then
    wraps its lines), instead of rich cutting off the columns past the console's edge.

    (``console.print(width=...)`` cannot widen: rich caps it at the console's width, which
    cut every cell of ``compare --wide`` to "…" at 80 columns; the console is widened for
    the one print instead.)"""
    width = console.width
    console.width = max(width, table_width(table))
    try:
        console.print(table, crop=False)
    finally:
        console.width = width
