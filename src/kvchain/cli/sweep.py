"""``kvchain sweep``: a grid of simulations (models x GPUs x tp x traces x rate scales x
memory fractions x prefix cache x managers) on a local process pool or Ray, and an SLO
search.

Axes come from ``--grid FILE`` (TOML or YAML) and/or options (comma-separated lists); an
option given on the command line overrides the file. Outputs in ``--out`` (see
:mod:`kvchain.report.sweep`). With ``--slo`` the rate-scale axis is replaced by a bisection
per configuration (:func:`kvchain.sim.sweep.bisect_rate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvchain.cli import app
from kvchain.cli.common import (
    fail,
    note,
    out_console,
    prepare_out_dir,
    stderr_console,
    stopped,
    warn,
)
from kvchain.cli.run_options import GivenOptions, inert_warnings, run_options
from kvchain.errors import ConfigError, KVChainError
from kvchain.report.sweep import (
    append_row,
    check_row,
    drop_torn_row,
    numbered_rows,
    plot_rows,
    print_whole,
    row_columns,
    slo_table,
    sweep_table,
    write_table,
)
from kvchain.sim.sweep import (
    AXES,
    SLO,
    SLOTask,
    SweepGrid,
    SweepPoint,
    check_search_bounds,
    gpus_needed,
    load_grid_file,
    parse_slo,
    point_config,
    run_point,
    run_slo_search,
    slo_tasks,
    upgrade_row,
)
from kvchain.sim.sweep_run import (
    RayUnavailableError,
    default_workers,
    require_ray,
    run_local,
    run_ray,
)


def _split(text: str | None, key: str) -> list[Any] | None:
    """``"a,b"`` -> ``["a", "b"]`` with numbers parsed (None stays None)."""
    if text is None:
        return None
    out: list[Any] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            out.append(int(item) if key in ("tp",) else
                       float(item) if key in ("rate_scales", "mem_fractions") else item)
        except ValueError:
            raise ConfigError(f"--{key.replace('_', '-')}: {item!r} is not a number") from None
    return out


SLO_RANGE = "0.25,64"
"""``--slo-range`` when not given: rate scales 0.25x to 64x searched."""
SLO_TOL = 0.02
"""``--slo-tol`` when not given: the bisection stops at 2 % relative width."""


def _range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--slo-range: expected LO,HI rate scales, got {text!r}") from None
    return lo, hi


def sweep_defaults_note(data: dict[str, Any], grid: SweepGrid, slo: bool) -> str | None:
    """What the sweep took by default that neither the grid file nor an option set, one
    line (``note:`` on stderr; ``None`` when everything was set): the axes at their
    defaults (with ``--slo`` the rate scales are searched, so not listed), and all requests
    of each trace when ``requests`` and ``end_s`` are unset. E.g. ``chosen for this sweep:
    models gpt-oss-120b, traces azure-conv, ..., all requests of each trace (--requests)``.
    """
    items = [f"{axis} {','.join(str(v) for v in getattr(grid, axis))}" for axis in AXES
             if axis not in data and not (slo and axis == "rate_scales")]
    if data.get("requests") is None and data.get("end_s") is None:
        items.append("all requests of each trace (--requests)")
    return "chosen for this sweep: " + ", ".join(items) if items else None


@app.command("sweep", short_help="A grid of simulations, or the highest rate meeting an SLO.")
@run_options(sweep=True)
def sweep_command(
    out: Annotated[Path, typer.Option(help="Output folder (sweep.jsonl, sweep.csv, "
                                           "sweep.parquet, plots; slo.csv with --slo).")],
    grid: Annotated[Path | None, typer.Option(help="Grid file (.toml, or .yaml with "
                                                   "pyyaml).")] = None,
    models: Annotated[str | None, typer.Option(help="Models, comma-separated.")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPUs, comma-separated.")] = None,
    tp: Annotated[str | None, typer.Option(help="Tensor-parallel sizes, comma-separated.")]
    = None,
    traces: Annotated[str | None, typer.Option(help="Traces, comma-separated.")] = None,
    rate_scales: Annotated[str | None, typer.Option(help="Arrival-rate multipliers.")] = None,
    mem_fractions: Annotated[str | None, typer.Option(help="GPU memory fractions.")] = None,
    prefix_caches: Annotated[str | None, typer.Option(
        help="Prefix cache per point: auto (on when the trace has content keys), on, off; "
             "comma-separated.")] = None,
    managers: Annotated[str | None, typer.Option(
        help="Managers: kvchain,fixed-pools,equal-page,ideal.")] = None,
    workers: Annotated[int | None, typer.Option(help="Local worker processes (default: all "
                                                     "cores).")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="Run the points as Ray tasks.")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster address (implies "
                                                         "--ray).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip points already in "
                                                          "OUT/sweep.jsonl (slo.jsonl with "
                                                          "--slo); without it they are "
                                                          "replaced.")] = False,
    slo: Annotated[str | None, typer.Option(help="Targets, e.g. ttft_p99=2s,tpot_p99=50ms: "
                                                 "search the highest rate meeting them.")]
    = None,
    target_rate: Annotated[float | None, typer.Option(help="With --slo: GPUs needed for "
                                                           "this many requests/s.")] = None,
    slo_range: Annotated[str | None, typer.Option(
        help=f"With --slo: rate scales searched, LO,HI (default {SLO_RANGE}).")] = None,
    slo_tol: Annotated[float | None, typer.Option(
        help=f"With --slo: relative tolerance of the bisection (default {SLO_TOL:g}).")]
    = None,
    plots: Annotated[bool, typer.Option(help="Write plots against rate.")] = True,
    *,
    given: GivenOptions,
) -> None:
    """Run a grid of simulations, or with --slo find the highest rate meeting latency
    targets per configuration and manager.

    Every run option of simulate (but the axes: --rate-scales, --mem-fractions,
    --prefix-caches) applies to every point, with simulate's defaults; a grid file takes
    the same names as keys (reserve = "full"), and an option given here overrides it.
    """
    console = out_console()
    try:
        data: dict[str, Any] = load_grid_file(grid) if grid is not None else {}
        cli = {"models": _split(models, "models"), "gpus": _split(gpus, "gpus"),
               "tp": _split(tp, "tp"), "traces": _split(traces, "traces"),
               "rate_scales": _split(rate_scales, "rate_scales"),
               "mem_fractions": _split(mem_fractions, "mem_fractions"),
               "prefix_caches": _split(prefix_caches, "prefix_caches"),
               "managers": _split(managers, "managers")}
        data.update({k: v for k, v in cli.items() if v is not None})
        data.update(given.typed_values())
        jsonl = out / ("slo.jsonl" if slo is not None else "sweep.jsonl")
        plan = _plan(data, given, workers, slo, target_rate, slo_range, slo_tol,
                     ray or ray_address is not None, jsonl if resume else None)
        if jsonl.is_dir():  # not removable as a finished sweep's file: refuse before a write
            raise ConfigError(f"{jsonl}: a folder, not a sweep's JSON-lines file")
        prepare_out_dir(out)
    except KVChainError as exc:
        fail(exc)
    for message, where in plan.inert.items():
        warn(f"{message} ({', '.join(dict.fromkeys(where))})")
    chosen = sweep_defaults_note(data, plan.grid, plan.slo is not None)
    if chosen:
        note(chosen)
    rows, ran, wall = _run(plan, jsonl, resume, ray or ray_address is not None,
                           ray_address, console)
    if plan.slo is not None:
        for row in rows:
            if target_rate is not None:
                row["target_rate_rps"] = target_rate
                row["gpus_needed"] = gpus_needed(target_rate, row.get("max_rate_rps"),
                                                 int(row["tp"]))
        written = write_table(rows, out / "slo.csv")
        print_whole(console, slo_table(rows, target_rate))
        console.print(f"bisection to {plan.tol:.1%} relative on rate scales "
                      f"[{plan.lo:g}, {plan.hi:g}]")
    else:
        written = write_table(rows, out / "sweep.csv")
        print_whole(console, sweep_table(rows))
        if plots:
            written += plot_rows(rows, out)
    console.print(f"{ran} run in {wall:,.1f} s of wall time; wrote "
                  + ", ".join(p.name for p in [jsonl, *written]))


@dataclass(frozen=True)
class _SweepPlan:
    """A checked sweep, before any run: the grid and its points, the local workers, the
    SLO search's targets and bounds (``slo`` None: a plain grid), the warnings of
    options a configuration cannot act on (message -> ``model/trace`` of each), what runs
    (``tasks``: the points, or one :class:`SLOTask` per configuration) with their
    ``keys``, and the rows of the resume file that match a key (``done``: key -> row,
    checked; empty without ``--resume``)."""

    grid: SweepGrid
    points: list[SweepPoint]
    workers: int
    slo: SLO | None
    lo: float
    hi: float
    tol: float
    inert: dict[str, list[str]]
    tasks: list[SweepPoint] | list[SLOTask]
    keys: list[str]
    done: dict[str, dict[str, Any]]


def _plan(data: dict[str, Any], given: GivenOptions, workers: int | None, slo: str | None,
          target_rate: float | None, slo_range: str | None, slo_tol: float | None,
          use_ray: bool, resume_from: Path | None) -> _SweepPlan:
    """Check the whole sweep before any run, any line of output or any write: the grid
    (``data``: the grid file's keys under the options given), the workers, the SLO flags
    (each needs ``--slo``; targets, rate and bounds finite), Ray when asked for, every
    configuration (unknown model, GPU or trace; the cache on for a keyless trace), and
    the rows of ``resume_from`` (``--resume``'s jsonl; None: not resuming) that match a
    task (:func:`_resumed`).

    Raises:
        ConfigError and subclasses: the first of the above that fails;
            RayUnavailableError: Ray asked for and not installed.
    """
    grid = SweepGrid.from_mapping(data)
    points = grid.points()
    n_workers = default_workers() if workers is None else workers
    if n_workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {n_workers}")
    slo_spec = parse_slo(slo) if slo is not None else None
    for flag, value in (("--target-rate", target_rate), ("--slo-range", slo_range),
                        ("--slo-tol", slo_tol)):
        if value is not None and slo_spec is None:
            raise ConfigError(f"{flag} needs --slo")
    if target_rate is not None:
        gpus_needed(target_rate, None, 1)  # validates the target
    lo, hi = _range(SLO_RANGE if slo_range is None else slo_range)
    tol = SLO_TOL if slo_tol is None else slo_tol
    check_search_bounds(lo, hi, tol)
    if use_ray:
        require_ray()  # before the out folder is touched or a finished sweep cleared
    inert: dict[str, list[str]] = {}
    for p in {p.config_key(): p for p in points}.values():
        config = point_config(p)
        layout = config.layout()
        config.check_cache(layout)  # e.g. the cache on for a keyless trace
        for message in inert_warnings(p.run_options(), given, config.cache_on(layout),
                                      layout):
            inert.setdefault(message, []).append(f"{p.model}/{p.trace}")
    tasks: list[SweepPoint] | list[SLOTask] = points
    if slo_spec is not None:
        tasks = slo_tasks(points, slo_spec, lo, hi, tol)
    keys = [t.key() for t in tasks]
    columns = row_columns(None if slo_spec is None else [m for m, _ in slo_spec.targets])
    done = _resumed(resume_from, set(keys), columns) if resume_from is not None else {}
    return _SweepPlan(grid, points, n_workers, slo_spec, lo, hi, tol, inert, tasks, keys,
                      done)


def _resumed(jsonl: Path, keys: set[str], columns: dict[str, tuple[type, ...]],
             ) -> dict[str, dict[str, Any]]:
    """The rows of ``jsonl`` whose key is one of ``keys`` (key -> row, the last of equal
    keys), each upgraded (:func:`upgrade_row`) and checked to carry ``columns``
    (:func:`check_row`); rows of other keys are kept in the file but not read further.

    Raises:
        ConfigError: as :func:`numbered_rows` and :func:`check_row` (naming file and line).
    """
    done: dict[str, dict[str, Any]] = {}
    for line, row in numbered_rows(jsonl):
        if row["key"] in keys:
            row = upgrade_row(row)
            check_row(row, columns, f"{jsonl}:{line}")
            done[row["key"]] = row
    return done


def _run(plan: _SweepPlan, jsonl: Path, resume: bool, use_ray: bool,
         ray_address: str | None, console: Console) -> tuple[list[dict[str, Any]], int, float]:
    """Run the plan's tasks (points or SLO searches) not already done (``plan.done``, read
    with ``resume``; without it ``jsonl`` is replaced), each row appended to ``jsonl`` as it
    finishes, on Ray or the local workers with a progress bar. Returns every row in the
    plan's order, the number run and their wall time (s). Exits (:func:`fail` /
    :func:`stopped`) on Ray unavailable or a run that stops."""
    tasks: list[Any] = list(plan.tasks)
    fn: Any = run_slo_search if plan.slo is not None else run_point
    keys, done_rows = plan.keys, plan.done
    if not resume and jsonl.exists():
        jsonl.unlink()
    elif resume and drop_torn_row(jsonl):  # else the next row would follow the torn one
        warn(f"{jsonl}: its torn last line (an interrupted write) is dropped; its point "
             f"runs again")
    todo = [i for i, k in enumerate(keys) if k not in done_rows]
    console.print(f"{len(tasks)} {'searches' if plan.slo else 'points'}, {len(todo)} to run "
                  f"({len(tasks) - len(todo)} already in {jsonl.name}) on "
                  + (f"Ray ({ray_address or 'local'})" if use_ray else
                     f"{plan.workers} local worker(s)"))
    started = time.perf_counter()
    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr_console(), transient=True) as bar:
        task_id = bar.add_task("sweep", total=len(todo))

        def on_done(_i: int, row: dict[str, Any]) -> None:
            append_row(jsonl, row)
            bar.advance(task_id)

        todo_tasks = [tasks[i] for i in todo]
        try:
            if use_ray:
                new = run_ray(fn, todo_tasks, ray_address, on_done)
            else:
                new = run_local(fn, todo_tasks, plan.workers, on_done)
        except RayUnavailableError as exc:
            fail(exc)
        except KVChainError as exc:
            stopped(exc)
    by_key = dict(done_rows)
    by_key.update(zip([keys[i] for i in todo], new, strict=True))
    return [by_key[k] for k in keys], len(todo), time.perf_counter() - started
