"""``kvchain compare``: every memory manager on the same model, GPU, trace and scheduler.

Managers: kvchain, fixed-pools, equal-page, ideal (:mod:`kvchain.baselines.managers`), each
with the same prefix cache as ``kvchain simulate`` gives kvchain. Prints
:func:`kvchain.report.tables.comparison_table` (80 columns, ``--wide`` for every row) with
the metrics' definitions, or ``--json`` (:func:`compare_json`); ``--out DIR`` writes
``compare.json`` and :func:`kvchain.report.compare.compare_plot`'s ``compare.png``. The run
options are simulate's (:mod:`kvchain.cli.run_options`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from kvchain.baselines import ManagerKind
from kvchain.cli import app
from kvchain.cli.common import (
    fail,
    hint,
    note,
    note_rejections,
    out_console,
    overload_hint,
    staged_outputs,
    stderr_console,
    stopped,
)
from kvchain.cli.prepare import prepare_run
from kvchain.cli.run_options import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    ConfigOption,
    GivenOptions,
    GpuOption,
    ModelOption,
    SpecOption,
    TpOption,
    TraceOption,
    run_options,
)
from kvchain.errors import KVChainError
from kvchain.report.compare import compare_plot
from kvchain.report.sweep import print_whole
from kvchain.report.tables import METRIC_DEFINITIONS, comparison_table
from kvchain.sim.compare import ManagerRun, check_kinds, compare_managers
from kvchain.sim.prefix import trace_block_tokens
from kvchain.sim.traces import TRACE_FORMATS_HELP


def compare_json(runs: dict[ManagerKind, ManagerRun]) -> dict[str, object]:
    """The runs as JSON: manager -> rule, U*, memory-blocked U*, allocation efficiency,
    buffer bytes, the summary (``SimSummary.to_json``; its ``extra`` has the hit rate, hit
    tokens and evicted pages), and ``prefix_cache`` (``PrefixCacheStats.to_json``: prompt
    and hit tokens, hit rate, pages evicted per band; ``null`` when the cache was off)."""
    return {
        str(k): {"rule": r.rule, "u_star": r.u_star, "u_star_mem": r.u_star_mem,
                 "alloc_efficiency": r.alloc_efficiency,
                 "buffer_bytes": r.buffer_bytes, "summary": r.summary.to_json(),
                 "prefix_cache": (r.prefix_cache.to_json()
                                  if r.prefix_cache is not None else None)}
        for k, r in runs.items()
    }


@app.command("compare", short_help="Every memory manager on one trace.",
             epilog="\b\n" + TRACE_FORMATS_HELP)
@run_options()
def compare(
    model: ModelOption = DEFAULT_MODEL,
    config: ConfigOption = None,
    spec: SpecOption = None,
    gpu: GpuOption = DEFAULT_GPU,
    tp: TpOption = 1,
    trace: TraceOption = None,
    managers: Annotated[str, typer.Option(
        help="Comma-separated managers: kvchain,fixed-pools,equal-page,ideal.")] =
        "kvchain,fixed-pools,equal-page,ideal",
    out: Annotated[Path | None, typer.Option(help="Write compare.json and compare.png "
                                                  "here.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Every metric, full labels, cells "
                                       "never cut (wider than 80 columns).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
        = False,
    *,
    given: GivenOptions,
) -> None:
    """Run every memory manager on the same model, GPU, trace and scheduler.

    The run options and their defaults are simulate's (without --trace, the same demo,
    about 3 minutes on one core for the four managers: the ideal's one-token pages are the
    slow part); what the run chose for you is printed on stderr (note:).
    """
    console = out_console(stderr=as_json)
    try:
        kinds = [ManagerKind(m.strip()) for m in managers.split(",") if m.strip()]
    except ValueError:
        raise typer.BadParameter(f"managers must be among "
                                 f"{', '.join(str(k) for k in ManagerKind)}; got {managers!r}"
                                 ) from None
    try:
        check_kinds(kinds)
    except KVChainError as exc:
        fail(exc)
    prep = prepare_run(model=model, config=config, spec=spec, gpu=gpu, tp=tp, trace=trace,
                       given=given, out=out, writes=("compare.json", "compare.png"))
    model_spec, gpu_spec = prep.model, prep.gpu
    tr, cfg, cfg_layout = prep.trace, prep.config, prep.layout
    buffer = cfg_layout.buffer_bytes
    title = f"{model_spec.name} on {gpu_spec.name}, {tr.name} x{len(tr):,}, buffer {buffer:,} B"
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed:,}/{task.total:,} requests"),
                      TimeElapsedColumn(), console=stderr_console(), transient=True,
                      disable=as_json) as bar:
            tasks = {k: bar.add_task(str(k), total=len(tr)) for k in kinds}
            runs = compare_managers(cfg, kinds, progress=lambda k, done, _total: bar.update(
                tasks[k], completed=done))
    except KVChainError as exc:
        stopped(exc)
    data = compare_json(runs)
    written = []
    if out is not None:
        with staged_outputs(out) as stage:  # both files or neither
            (stage / "compare.json").write_text(json.dumps(data, indent=2))
            compare_plot(runs, stage / "compare.png", title=title)
        written = [out / "compare.json", out / "compare.png"]
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        table = comparison_table({str(k): r.summary for k, r in runs.items()}, title=title,
                                 wide=wide)
        if wide:
            print_whole(console, table)  # every cell whole, past the terminal's width
        else:
            console.print(table)
        console.print(METRIC_DEFINITIONS, soft_wrap=False)
        for k, r in runs.items():
            console.print(Text.assemble((str(k), "bold"), f": {r.rule}"))
    for k, r in runs.items():
        note_rejections(r.rejected, who=str(k))
        straddle = r.straddle_note(trace_block_tokens(tr))
        if straddle is not None:
            note(straddle)
    if as_json:
        return  # stdout is the JSON alone; the files are where --out said
    if written:
        console.print("wrote " + ", ".join(str(p) for p in written))
    hint_text = overload_hint(next(iter(runs.values())).summary, tr)
    if hint_text is not None:
        hint(hint_text)
