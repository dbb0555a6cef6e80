"""``kvchain simulate``: serve a real trace on a real model and GPU with the chain."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvchain.admission import ReservePolicy
from kvchain.cache.radix import CacheGeometry, ResumePolicy
from kvchain.cli import app
from kvchain.cli.common import (
    KV_DTYPE_HELP,
    STATE_DTYPE_HELP,
    CachePointsOption,
    PrefixCacheOption,
    check_flags,
    load_spec,
    overload_hint,
    prepare_out_dir,
    render_bands,
    reserve_config,
    warn_buffer,
)
from kvchain.errors import KVChainError
from kvchain.gpu import get_gpu
from kvchain.report.plots import hit_rate_chart, write_all_plots
from kvchain.report.tables import summary_table
from kvchain.sched.scheduler import QueuePolicy, SchedulerConfig
from kvchain.sim.cost import DEFAULT_STEP_MS, ClockKind, GPUCostModel
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.metrics import write_outputs
from kvchain.sim.traces import MOONCAKE_BLOCK_TOKENS, TRACE_FORMATS_HELP, load_trace
from kvchain.spec.layers import CacheDtype

DEFAULT_MODEL = "gpt-oss-120b"
DEFAULT_GPU = "h200"
# The default run (README "Quickstart"): gpt-oss-120b on one H200 serving the first 600
# requests of the Mooncake conversation trace at 0.3x its arrival rate. The trace carries
# content keys (hash_ids), so the prefix cache is on; its cached prompts fill the 58.5 GB
# buffer within minutes, so memory binds and the planner evicts; at 0.3x one GPU keeps up
# (TTFT p50 under 2 s, a short queue), and the run takes well under a minute on one core.
DEFAULT_TRACE = "mooncake"
DEFAULT_REQUESTS = 600
DEFAULT_RATE_SCALE = 0.3
DEFAULT_END_S = 1e9  # no time cut: --requests bounds the default run


@app.command("simulate", short_help="Serve a request trace with the chain.",
             epilog="\b\n" + TRACE_FORMATS_HELP)
def simulate_command(
    model: Annotated[str, typer.Option(help="Bundled model name (see `kvchain models`).")]
    = DEFAULT_MODEL,
    config: Annotated[Path | None, typer.Option(help="A Hugging Face config.json instead "
                                                     "of --model.")] = None,
    spec: Annotated[Path | None, typer.Option(help="A JSON file declaring classes by bytes "
                                                   "(as for `kvchain plan`).")] = None,
    gpu: Annotated[str, typer.Option(help="GPU: a100, h100, h200, b200.")] = DEFAULT_GPU,
    trace: Annotated[str, typer.Option(help="Bundled trace (azure-conv, azure-code, mooncake, "
                                            "sharegpt) or a trace file (formats below).")]
    = DEFAULT_TRACE,
    requests: Annotated[int | None, typer.Option(
        help="Keep the first N requests (default 600, the default run's slice).")]
    = DEFAULT_REQUESTS,
    end_s: Annotated[float, typer.Option(help="Keep arrivals before this second.")]
    = DEFAULT_END_S,
    rate_scale: Annotated[float, typer.Option(
        help="Arrival-rate multiplier (default 0.3: a load one H200 sustains on the default "
             "run).")] = DEFAULT_RATE_SCALE,
    block_tokens: Annotated[int, typer.Option(help="Tokens per hash_ids block of a generic "
                                                   "trace.")] = MOONCAKE_BLOCK_TOKENS,
    mem_fraction: Annotated[float, typer.Option(help="GPU memory fraction for weights + "
                                                     "KV.")] = 0.9,
    buffer_bytes: Annotated[int | None, typer.Option(help="KV buffer bytes (overrides the "
                                                          "GPU memory model).")] = None,
    page_size: Annotated[int, typer.Option(help="Tokens per page.")] = 16,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size (the simulated GPU is one "
                                         "rank).")] = 1,
    policy: Annotated[QueuePolicy, typer.Option(help="Waiting-queue order.")]
    = QueuePolicy.FCFS,
    max_running: Annotated[int, typer.Option(help="Most running requests.")] = 256,
    chunk_size: Annotated[int, typer.Option(help="Prefill chunk tokens.")] = 8192,
    clock: Annotated[ClockKind, typer.Option(help="roofline: GPU cost model; steps: each "
                                                  "scheduler step is one --step-ms tick "
                                                  "(instant compute).")] = ClockKind.ROOFLINE,
    step_ms: Annotated[float, typer.Option(help="Tick of --clock steps, ms of trace time.")]
    = DEFAULT_STEP_MS,
    reserve: Annotated[ReservePolicy, typer.Option(
        help="Reservation for future output: sglang (decaying new-token ratio), adaptive "
             "(learned from finished requests; default) or full (to each limit).")]
        = ReservePolicy.ADAPTIVE,
    new_token_ratio: Annotated[str | None, typer.Option(
        help="INIT,FLOOR,DECAY of the sglang new-token ratio (default 0.7,0.098,0.001003); "
             "only with --reserve sglang.")] = None,
    seed: Annotated[int, typer.Option(help="Seed (Poisson arrivals of length-only "
                                           "traces).")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write metrics.json, requests.csv and "
                                                  "plots here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
    = False,
    strict: Annotated[bool, typer.Option(help="Stop at the first admitted-but-unallocatable "
                                              "step (exit 1) instead of counting it.")]
    = False,
    kv_dtype: Annotated[CacheDtype | None, typer.Option(help=KV_DTYPE_HELP)] = None,
    state_dtype: Annotated[CacheDtype | None, typer.Option(help=STATE_DTYPE_HELP)] = None,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Cut the prompt of a request past the model's context to "
                           "context - output tokens (counted) instead of rejecting it.")]
    = False,
    prefix_cache: PrefixCacheOption = None,
    cache_points: CachePointsOption = ResumePolicy.AUTO,
) -> None:
    """Simulate serving a request trace with the kvchain memory manager.

    Defaults: gpt-oss-120b on one H200, the first 600 requests of the Mooncake conversation
    trace at 0.3x its arrival rate with the prefix cache on, KV buffer from --mem-fraction
    0.90, the roofline clock.
    """
    console = Console(stderr=as_json)
    try:
        check_flags(requests=requests, end_s=end_s, rate_scale=rate_scale,
                    block_tokens=block_tokens, mem_fraction=mem_fraction,
                    buffer_bytes=buffer_bytes, page_size=page_size, tp=tp,
                    max_running=max_running, chunk_size=chunk_size, step_ms=step_ms, seed=seed)
        model_spec = load_spec(model, config, spec_file=spec, tp=tp, kv_dtype=kv_dtype,
                               state_dtype=state_dtype)
        gpu_spec = get_gpu(gpu)
        tr = load_trace(trace, first=requests, end_s=end_s, rate_scale=rate_scale, seed=seed,
                        block_tokens=block_tokens)
        sim_config = SimConfig(
            model_spec, gpu_spec, tr, mem_fraction=mem_fraction, page_size=page_size,
            scheduler=SchedulerConfig(max_running=max_running, chunk_size=chunk_size,
                                      max_prefill_tokens=max(chunk_size, 8192),
                                      policy=policy, strict=strict,
                                      reserve=reserve_config(reserve, new_token_ratio)),
            buffer_bytes=buffer_bytes, clock=clock, step_ms=step_ms,
            truncate_to_context=truncate, prefix_cache=prefix_cache, cache_points=cache_points)
        layout = sim_config.layout()
        sim_config.check_cache(layout)
        if clock is ClockKind.ROOFLINE:
            GPUCostModel(model_spec, gpu_spec)  # a model it cannot price fails here, typed
        prepare_out_dir(out)
    except KVChainError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    warn_buffer(model_spec, gpu_spec, buffer_bytes, spec_file=spec)
    if not as_json:
        console.print(f"[bold]{escape(model_spec.name)}[/bold] on {gpu_spec.name}, trace "
                      f"[bold]{escape(tr.name)}[/bold] ({len(tr):,} requests, "
                      f"{tr.duration_s:,.0f} s)"
                      + (f", step clock {step_ms:g} ms" if clock is ClockKind.STEPS else ""))
        console.print(render_bands(layout))
    started = time.perf_counter()
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,}/"
                  "{task.total:,} requests"), TimeElapsedColumn(), console=console,
                  transient=True, disable=as_json) as bar:
        task = bar.add_task("simulate", total=len(tr))
        try:
            result = simulate(sim_config, progress=lambda done, _total: bar.update(
                task, completed=done))
        except KVChainError as exc:
            console.print(f"[red]stopped:[/red] {type(exc).__name__}: {escape(str(exc))}")
            raise typer.Exit(1) from None
    wall = time.perf_counter() - started
    summary = result.summary
    settings = {"model": model_spec.name, "gpu": gpu_spec.name, "trace": tr.name,
                "requests": len(tr), "rate_scale": rate_scale, "mem_fraction": mem_fraction,
                "buffer_bytes": layout.buffer_bytes, "page_size": page_size,
                "policy": policy.value, "reserve": reserve.value, "chain": layout.shape_name,
                "clock": clock.value,
                "step_ms": step_ms if clock is ClockKind.STEPS else None,
                "wall_s": round(wall, 3),
                "prefix_cache": result.prefix_cache is not None,
                "cache_points": cache_points.resolve(CacheGeometry.of(layout)).value}
    cache_json = ({"prefix_cache": result.prefix_cache.to_json()}
                  if result.prefix_cache is not None else {})
    if out is not None:
        write_outputs(out, result.recorder, summary, config=settings, sections=cache_json)
        plots = write_all_plots(result.recorder, out)
        if result.prefix_cache is not None:
            plots.append(hit_rate_chart(result.prefix_cache.timeline, out / "hit_rate.png",
                                        result.prefix_cache.bounds()))
    if as_json:
        print(json.dumps({"config": settings, "summary": summary.to_json(), **cache_json},
                         indent=2))
    else:
        console.print(summary_table(summary, title=f"kvchain simulate: {model_spec.name} / "
                                                   f"{tr.name}"))
        context = model_spec.max_context_tokens
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
        if out is not None:
            console.print(f"wrote {out}/metrics.json, {out}/requests.csv and "
                          + ", ".join(p.name for p in plots))
    hint = overload_hint(summary, tr)
    if hint is not None:
        Console(stderr=True).print(f"[yellow]hint:[/yellow] {escape(hint)}")
