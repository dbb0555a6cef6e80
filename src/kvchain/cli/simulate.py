"""``kvchain simulate``: serve a real trace on a real model and GPU with the chain."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from kvchain.cache.radix import CacheGeometry
from kvchain.cli import app
from kvchain.cli.common import (
    hint,
    note_rejections,
    out_console,
    overload_hint,
    staged_outputs,
    stderr_console,
    stopped,
)
from kvchain.cli.prepare import PreparedRun, prepare_run
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
from kvchain.layout import ChainLayout
from kvchain.report.plots import PLOT_FILES, hit_rate_chart, host_chart, write_all_plots
from kvchain.report.tables import band_table, summary_table
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimResult, check_setup, simulate
from kvchain.sim.metrics import OUTPUT_FILES, write_outputs
from kvchain.sim.traces import TRACE_FORMATS_HELP


@app.command("simulate", short_help="Serve a request trace with the chain.",
             epilog="\b\n" + TRACE_FORMATS_HELP)
@run_options()
def simulate_command(
    model: ModelOption = DEFAULT_MODEL,
    config: ConfigOption = None,
    spec: SpecOption = None,
    gpu: GpuOption = DEFAULT_GPU,
    tp: TpOption = 1,
    trace: TraceOption = None,
    out: Annotated[Path | None, typer.Option(help="Write metrics.json, requests.csv and "
                                                  "plots here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
    = False,
    *,
    given: GivenOptions,
) -> None:
    """Simulate serving a request trace with the kvchain memory manager.

    Without --trace, the demo: gpt-oss-120b on one H200, the first 600 requests of the
    Mooncake conversation trace at 0.3x its arrival rate with the prefix cache on, KV buffer
    from --mem-fraction 0.90, the roofline clock. A trace you name runs whole and at its own
    rate unless told otherwise. What the run chose for you is printed on stderr (note:).
    """
    console = out_console(stderr=as_json)
    prep = prepare_run(model=model, config=config, spec=spec, gpu=gpu, tp=tp, trace=trace,
                       given=given, out=out, writes=SIMULATE_FILES)
    run, tr, layout = prep.options, prep.trace, prep.layout
    if not as_json:
        try:  # the set-up's refusals before the header: stdout holds results only
            check_setup(prep.config)
        except KVChainError as exc:
            stopped(exc)
        console.print(Text.assemble(
            (prep.model.name, "bold"), f" on {prep.gpu.name}, trace ", (tr.name, "bold"),
            f" ({len(tr):,} requests, {tr.duration_s:,.0f} s)"
            + (f", step clock {run.step_ms:g} ms" if run.clock is ClockKind.STEPS else "")))
        console.print(band_table(layout))
    result, wall = _simulate(prep, console, as_json)
    summary = result.summary
    settings = _settings(prep, result, wall)
    cache_json = ({"prefix_cache": result.prefix_cache.to_json()}
                  if result.prefix_cache is not None else {})
    plots = (_write(out, result, layout, settings, cache_json) if out is not None else [])
    if as_json:
        print(json.dumps({"config": settings, "summary": summary.to_json(), **cache_json},
                         indent=2))
    else:
        _print_summary(console, prep, result, wall)
        if out is not None:
            console.print(f"wrote {out}/metrics.json, {out}/requests.csv and "
                          + ", ".join(p.name for p in plots))
    note_rejections((r.request_id, r.rejected_reason) for r in result.recorder.records
                    if r.rejected_reason is not None)
    hint_text = overload_hint(summary, tr)
    if hint_text is not None:
        hint(hint_text)


HIT_RATE_FILE, HOST_FILE = "hit_rate.png", "host.png"
SIMULATE_FILES = (*OUTPUT_FILES, *PLOT_FILES, HIT_RATE_FILE, HOST_FILE)
"""Every file ``kvchain simulate --out`` may write (the last two with the prefix cache, the
host tier)."""


def _simulate(prep: PreparedRun, console: Console, as_json: bool) -> tuple[SimResult, float]:
    """The run, with a progress bar of finished requests (none with ``--json``); returns
    its result and its wall time (s). Exits (:func:`stopped`) on a run that stops."""
    started = time.perf_counter()
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,}/"
                  "{task.total:,} requests"), TimeElapsedColumn(), console=stderr_console(),
                  transient=True, disable=as_json) as bar:
        task = bar.add_task("simulate", total=len(prep.trace))
        try:
            result = simulate(prep.config, progress=lambda done, _total: bar.update(
                task, completed=done))
        except KVChainError as exc:
            stopped(exc)
    return result, time.perf_counter() - started


def _settings(prep: PreparedRun, result: SimResult, wall: float) -> dict[str, Any]:
    """The run's settings as written to ``metrics.json`` and ``--json``'s ``config``."""
    run, layout = prep.options, prep.layout
    return {"model": prep.model.name, "gpu": prep.gpu.name, "trace": prep.trace.name,
            "requests": len(prep.trace), "rate_scale": run.rate_scale,
            "mem_fraction": run.mem_fraction, "buffer_bytes": layout.buffer_bytes,
            "page_size": run.page_size, "policy": run.policy.value,
            "reserve": run.reserve.value, "chain": layout.shape_name,
            "clock": run.clock.value,
            "step_ms": run.step_ms if run.clock is ClockKind.STEPS else None,
            "wall_s": round(wall, 3),
            "prefix_cache": result.prefix_cache is not None,
            "cache_points": run.cache_points.resolve(CacheGeometry.of(layout)).value,
            "demo": prep.resolved.demo, "options": run.to_json()}


def _write(out: Path, result: SimResult, layout: ChainLayout, settings: Mapping[str, Any],
           sections: Mapping[str, Any]) -> list[Path]:
    """Write ``metrics.json``, ``requests.csv`` and the plots to ``out``, all or none
    (:func:`~kvchain.cli.common.staged_outputs`); returns the plots' paths."""
    with staged_outputs(out) as stage:
        write_outputs(stage, result.recorder, result.summary, config=settings,
                      sections=sections)
        plots = write_all_plots(result.recorder, stage)
        stats = result.prefix_cache
        if stats is not None:
            plots.append(hit_rate_chart(stats.timeline, stage / HIT_RATE_FILE, stats.bounds()))
            if stats.host_slots:
                plots.append(host_chart(stats.host_timeline, [b.label for b in layout.bands],
                                        stats.host_slot_bytes, stats.host_slots,
                                        stage / HOST_FILE))
    return [out / p.name for p in plots]


def _print_summary(console: Console, prep: PreparedRun, result: SimResult,
                   wall: float) -> None:
    """The summary table and the lines under it: the context's rejections and cuts, the
    prefix cache's hits and evictions, and the run's wall time and page copies."""
    summary = result.summary
    console.print(summary_table(summary, title=f"kvchain simulate: {prep.model.name} / "
                                               f"{prep.trace.name}"))
    context = prep.model.max_context_tokens
    console.print(f"context {context:,} tokens: " if context else "context unknown: ",
                  end="")
    console.print(f"{summary.extra.get('requests_rejected_context', 0):,} requests "
                  f"rejected past it, {summary.extra.get('requests_truncated', 0):,} "
                  "truncated (--truncate)")
    pc = result.prefix_cache
    if pc is not None:
        evicted = ", ".join(f"{band} {n:,}" for band, n in pc.evicted_pages.items())
        console.print(f"prefix cache: {pc.hit_tokens:,} of {pc.prompt_tokens:,} prompt "
                      f"tokens hit ({100 * pc.hit_rate:.2f}%); pages evicted per band: "
                      f"{evicted}; state checkpoints copied on hits: "
                      f"{pc.cow_state_copies:,}; bounds of these requests: "
                      + ", ".join(f"{k} {100 * v:.2f}%" for k, v in pc.bounds().items()))
    console.print(f"simulated {summary.duration_s:,.1f} s of serving in {wall:,.1f} s "
                  f"of wall time; pages copied by moves: "
                  f"{summary.extra.get('pages_copied', 0):,} (copy time "
                  f"{summary.extra.get('copy_time_s', 0.0):,.6f} s, "
                  f"{summary.extra.get('copy_time_pct', 0.0):.4f}% of GPU time, "
                  f"in TTFT/TPOT)")
