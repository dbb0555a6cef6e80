"""``kvchain models``: the bundled models, their lifetime classes and bytes.

Columns: ``E_full`` (bytes per token of full attention), ``E_win`` with ``W`` (sliding
window), ``E_local`` with ``C`` (chunked-local attention), ``S`` (state bytes per
request), total / active parameters, and the data's source. Bytes are per
tensor-parallel rank (``--tp``) in the chosen KV dtype (``--kv-dtype``; state keeps the
model's dtype).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from kvchain.catalog import list_models, load_model
from kvchain.cli import app
from kvchain.cli.common import fail, out_console, warn
from kvchain.errors import ConfigError
from kvchain.model import CacheDtype, LifetimeClass


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One row of ``kvchain models`` (bytes per rank).

    Attributes:
        name: catalog name.
        classes: lifetime classes joined with ``+`` (e.g. ``"state+window+full"``).
        e_full: full-attention bytes per token (0 if none).
        e_win: sliding-window bytes per token (0 if none); ``w``: window tokens. A model
            with several window sizes: bytes of all window classes, the largest window
            (``classes`` names each, e.g. ``window11+window128+full``).
        e_local: chunked-local bytes per token (0 if none); ``c``: chunk tokens (likewise).
        s: state bytes per request (0 if none).
        total_params, active_params: parameter counts.
        weight_bytes: weight bytes per rank.
        tp: tensor-parallel ranks the bytes are per rank of.
        source, license: where the data came from.
        error: why the model cannot be split over ``tp`` ranks (then bytes are 0).
    """

    name: str
    classes: str
    e_full: int
    e_win: int
    w: int | None
    e_local: int
    c: int | None
    s: int
    total_params: int
    active_params: int
    weight_bytes: int
    tp: int
    source: str
    license: str
    error: str | None = None


def model_rows(*, tp: int = 1, kv_dtype: CacheDtype = CacheDtype.BF16) -> list[ModelRow]:
    """The rows of every bundled model, in catalog order.

    A model whose heads ``tp`` does not divide gets a row with ``error`` set.
    """
    rows = []
    for entry in list_models():
        base: dict[str, Any] = {
            "name": entry.name,
            "total_params": entry.total_params,
            "active_params": entry.active_params,
            "tp": tp,
            "source": entry.source,
            "license": entry.license,
        }
        try:
            spec = load_model(entry.name, tp=tp, kv_dtype=kv_dtype)
        except ConfigError as exc:
            rows.append(
                ModelRow(
                    classes=entry.lifetimes,
                    e_full=0,
                    e_win=0,
                    w=None,
                    e_local=0,
                    c=None,
                    s=0,
                    weight_bytes=0,
                    error=str(exc),
                    **base,
                )
            )
            continue
        windows = spec.cache_classes(LifetimeClass.WINDOW)
        locals_ = spec.cache_classes(LifetimeClass.LOCAL)
        rows.append(
            ModelRow(
                classes="+".join(c.label for c in spec.classes),
                e_full=spec.bytes_per_token(LifetimeClass.FULL),
                e_win=spec.bytes_per_token(LifetimeClass.WINDOW),
                w=max((c.window or 0 for c in windows), default=0) or None,
                e_local=spec.bytes_per_token(LifetimeClass.LOCAL),
                c=max((c.window or 0 for c in locals_), default=0) or None,
                s=spec.state_bytes,
                weight_bytes=spec.weight_bytes,
                **base,
            )
        )
    return rows


def _bytes(value: int, tokens: int | None = None) -> str:
    if value == 0:
        return "-"
    return f"{value:,} ({tokens:,})" if tokens is not None else f"{value:,}"


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B"


def _table(rows: list[ModelRow], tp: int, kv_dtype: CacheDtype, wide: bool = False) -> Table:
    """The models table. Narrow (fits 80 columns): model, E_full, the window or local
    class (a chain holds at most one), S; ``wide``: classes, E_win and E_loc apart, and
    parameters too."""
    table = Table(title=f"Bundled models (per rank, tp={tp}, KV {kv_dtype.value})",
                  caption="E: bytes per token, S: bytes per request; W: window tokens, "
                          "C: chunk tokens; - : no such class",
                  box=None if not wide else box.HEAVY_HEAD, padding=(0, 1),
                  caption_justify="left")
    table.add_column("model", no_wrap=True)
    if wide:
        table.add_column("classes", no_wrap=True)
    table.add_column("E_full", justify="right", no_wrap=True)
    if wide:
        table.add_column("E_win (W)", justify="right", no_wrap=True)
        table.add_column("E_loc (C)", justify="right", no_wrap=True)
    else:
        table.add_column("E_win|loc (W|C)", justify="right", no_wrap=True)
    table.add_column("S", justify="right", no_wrap=True)
    if wide:
        table.add_column("params total / active", justify="right", no_wrap=True)
    errors = []
    for r in rows:
        if r.error is not None:
            cells = ["-"] * (5 if wide else 3)
            errors.append(f"{r.name}: {r.error}")
        elif wide:
            cells = [r.classes, _bytes(r.e_full), _bytes(r.e_win, r.w), _bytes(r.e_local, r.c),
                     _bytes(r.s)]
        else:
            floating = _bytes(r.e_win, r.w) if r.e_win else _bytes(r.e_local, r.c)
            cells = [_bytes(r.e_full), floating, _bytes(r.s)]
        if wide:
            cells.append(f"{_params(r.total_params)} / {_params(r.active_params)}")
        table.add_row(r.name, *cells)
    if errors:
        table.caption = f"{table.caption}\nnot at this tp: " + "; ".join(errors)
    return table


@app.command("models", short_help="Bundled models: lifetime classes and bytes.")
def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    tp: Annotated[
        int, typer.Option("--tp", min=1, help="Tensor-parallel ranks (bytes per rank).")
    ] = 1,
    kv_dtype: Annotated[
        CacheDtype, typer.Option("--kv-dtype", help="Element type of attention K/V.")
    ] = CacheDtype.BF16,
    wide: Annotated[bool, typer.Option("--wide", help="All columns: classes, E_win and "
                                       "E_loc apart, parameters (about 140 columns, never "
                                       "cut; at a narrow terminal pipe to `less -S`).")
                    ] = False,
) -> None:
    """List the bundled models: lifetime classes, E_full, E_win (W), E_local (C), S, params."""
    rows = model_rows(tp=tp, kv_dtype=kv_dtype)
    if rows and all(r.error is not None for r in rows):  # nothing to show: every row "-"
        first = rows[0]
        fail(f"--tp {tp} splits no bundled model (each needs a tp that divides its heads, "
             f"e.g. {first.name}: {first.error}); --tp 1 splits nothing")
    if as_json:
        if wide:
            warn("--wide changes nothing with --json (the JSON holds every field)")
        typer.echo(json.dumps([asdict(r) for r in rows], indent=2))
        return
    table = _table(rows, tp, kv_dtype, wide)
    console = out_console()
    if wide:
        # The wide table is as wide as its cells: a narrower terminal wraps its lines (or
        # `less -S` scrolls them) rather than rich cutting numbers to "…".
        needed = out_console(width=10_000).measure(table).maximum
        if needed > console.width:
            console = out_console(width=needed)
    console.print(table)
