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
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from kvchain.errors import ConfigError

Row = Mapping[str, Any]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (empty when it does not exist); a torn last line (an
    interrupted write) is skipped.

    Raises:
        ConfigError: a line before the last that is not a JSON object.
    """
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if n == len(lines):
                break
            raise ConfigError(f"{path}:{n}: not a JSON row") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n}: not a JSON object")
        rows.append(row)
    return rows


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


_GROUP = ("model", "gpu", "tp", "trace", "mem_fraction", "requests", "end_s", "page_size",
          "max_running", "chunk_size", "seed")


def plot_rows(rows: Sequence[Row], out: Path) -> list[Path]:
    """Per configuration (rows equal on everything but rate scale and manager): a PNG of
    output throughput (tok/s), TTFT p99 and TPOT p99 (ms) against offered request rate
    (requests/s), one line per manager. Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in _GROUP), []).append(row)
    paths: list[Path] = []
    for n, (group, members) in enumerate(groups.items(), 1):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        managers: dict[str, list[Row]] = {}
        for row in members:
            managers.setdefault(str(row.get("manager")), []).append(row)
        panels = (("output_tokens_per_s", 1.0, "output tokens / s", "throughput"),
                  ("ttft_p99_s", 1e3, "ms", "TTFT p99"),
                  ("tpot_p99_s", 1e3, "ms", "TPOT p99"))
        for ax, (col, factor, unit, title) in zip(axes, panels, strict=True):
            for manager, mrows in managers.items():
                pts = sorted((r["offered_rate_rps"], r[col] * factor) for r in mrows
                             if r.get("offered_rate_rps") is not None and r.get(col) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=1.2,
                            label=manager)
            ax.set_title(title)
            ax.set_xlabel("offered rate (requests / s)")
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(" / ".join(f"{k}={v}" for k, v in zip(_GROUP[:5], group, strict=False)),
                     fontsize=9)
        fig.tight_layout()
        path = out / f"sweep-{n}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def slo_table(rows: Sequence[Row], target_rps: float | None) -> Table:
    """A rich table: one line per configuration, per manager the highest rate meeting the
    SLO (requests/s and rate scale) and, with a target rate, the GPUs needed."""
    managers = list(dict.fromkeys(str(r["manager"]) for r in rows))
    configs: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        configs.setdefault(tuple(r.get(k) for k in _GROUP[:5]), {})[str(r["manager"])] = r
    slo = rows[0]["slo"] if rows else ""
    title = f"highest rate meeting {slo}"
    if target_rps is not None:
        title += f"; GPUs for {target_rps:g} req/s"
    table = Table(title=title, min_width=60)
    # At 80 columns two managers with GPUs leave no room for whole names: cells fold
    # (wrap mid-word) instead of being cut to an ellipsis, so every name and rate shows.
    for col in ("model", "gpu", "tp", "trace", "mem"):
        table.add_column(col, overflow="fold")
    for m in managers:
        table.add_column(f"{m} req/s (x scale)", justify="right", overflow="fold")
        if target_rps is not None:
            table.add_column(f"{m} GPUs", justify="right", overflow="fold")
    for config, by_manager in configs.items():
        cells = [str(v) for v in config]
        for m in managers:
            got = by_manager.get(m)
            if got is None or got.get("max_rate_scale") is None:
                cells.append("not met")
            else:
                rps = got.get("max_rate_rps")
                more = ">=" if got.get("fail_rate_scale") is None else ""
                cells.append(f"{more}{rps:,.2f} (x{got['max_rate_scale']:.3g})" if rps
                             else f"x{got['max_rate_scale']:.3g}")
            if target_rps is not None:
                gpus = got.get("gpus_needed") if got is not None else None
                cells.append("-" if gpus is None else f"{gpus:,}")
        table.add_row(*cells)
    return table
