"""``kvchain compare``: every memory manager on the same model, GPU, trace and scheduler.

Managers: kvchain, fixed-pools, equal-page, ideal (:mod:`kvchain.baselines.managers`).
Shows a progress bar per manager, then prints a table (``comparison_table``: throughput,
TTFT/TPOT, retractions, peak running, U*, memory-blocked U* and allocation efficiency in
percent, and with the prefix cache on its hit rate, hit tokens and evicted pages; 80
columns, ``--wide`` for every row) with the metrics' definitions, or ``--json``. Every
manager gets the same prefix cache (``--prefix-cache/--no-prefix-cache``, default on when
the trace has content keys; ``--cache-points``), as ``kvchain simulate`` gives kvchain.
With ``--out DIR`` writes ``compare.json`` and ``compare.png`` (throughput, U* and
memory-blocked U* per manager, labelled; bytes needed and held over time) and says where.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvchain.admission import ReservePolicy
from kvchain.baselines import ManagerKind
from kvchain.cache.radix import ResumePolicy
from kvchain.cli import app
from kvchain.cli.common import (
    KV_DTYPE_HELP,
    STATE_DTYPE_HELP,
    CachePointsOption,
    PrefixCacheOption,
    check_flags,
    fail,
    hint,
    load_spec,
    overload_hint,
    prepare_out_dir,
    reserve_config,
    warn_buffer,
)
from kvchain.errors import ConfigError, KVChainError
from kvchain.gpu import get_gpu
from kvchain.report.tables import METRIC_DEFINITIONS, comparison_table
from kvchain.sched.scheduler import QueuePolicy, SchedulerConfig
from kvchain.sim.compare import ManagerRun, compare_managers
from kvchain.sim.cost import DEFAULT_STEP_MS, ClockKind, GPUCostModel
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import MOONCAKE_BLOCK_TOKENS, TRACE_FORMATS_HELP, load_trace
from kvchain.spec.layers import CacheDtype


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


def compare_plot(runs: dict[ManagerKind, ManagerRun], path: Path, *, title: str = "") -> Path:
    """PNG of a comparison, three panels under ``title`` (model, trace, buffer):

    1. output throughput (tokens/s) per manager, each bar labelled with its value;
    2. U* and memory-blocked U* (%) per manager, labelled; U* = mean of bytes needed /
       buffer over steps with requests waiting; memory-blocked U* = the same over steps
       whose head waiting request memory refused (the caption says so);
    3. bytes needed (dashed) and held (solid) over simulated time, GB (1e9 B), with the
       buffer's size as a black line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    names = [str(k) for k in runs]
    tput = [r.summary.output_tokens_per_s or 0.0 for r in runs.values()]
    ustar = [100 * (r.u_star or 0.0) for r in runs.values()]
    umem = [100 * (r.u_star_mem or 0.0) for r in runs.values()]
    bars = axes[0].bar(names, tput, color="tab:blue")
    axes[0].bar_label(bars, labels=[f"{v:,.0f}" for v in tput], fontsize=8)
    axes[0].set_ylabel("output tokens / s")
    axes[0].set_title("output throughput")
    x = list(range(len(names)))
    width = 0.4
    b1 = axes[1].bar([i - width / 2 for i in x], ustar, width, color="tab:green", label="U*")
    b2 = axes[1].bar([i + width / 2 for i in x], umem, width, color="tab:olive",
                     label="memory-blocked U*")
    axes[1].bar_label(b1, labels=[f"{v:.1f}" for v in ustar], fontsize=7)
    axes[1].bar_label(b2, labels=[f"{v:.1f}" for v in umem], fontsize=7)
    axes[1].set_xticks(x, names)
    axes[1].set_ylabel("% of the buffer")
    axes[1].set_ylim(0, 115)
    axes[1].legend(fontsize=7, loc="upper right")
    axes[1].set_title("bytes needed / buffer while requests wait")
    for idx, (k, r) in enumerate(runs.items()):
        color = f"C{idx}"
        t = [p.t_s for p in r.series]
        axes[2].plot(t, [p.held_bytes / 1e9 for p in r.series], color=color, lw=1,
                     label=f"{k} held")
        axes[2].plot(t, [p.needed_bytes / 1e9 for p in r.series], color=color, lw=1, ls="--")
    if runs:
        axes[2].axhline(next(iter(runs.values())).buffer_bytes / 1e9, color="k", lw=0.8,
                        label="buffer")
    axes[2].set_title("bytes held (solid) and needed (dashed)")
    axes[2].set_xlabel("simulated time (s)")
    axes[2].set_ylabel("GB")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.text(0.01, 0.01, "U* = mean over steps with requests waiting of (bytes needed / "
             "buffer); memory-blocked U* = the same over steps in which memory refused the "
             "head waiting request. Bytes needed = L x E_full + min(L, W) x E_win + "
             "(L mod C) x E_loc + S per running request of L tokens.", fontsize=7,
             wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95 if title else 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@app.command("compare", short_help="Every memory manager on one trace.",
             epilog="\b\n" + TRACE_FORMATS_HELP)
def compare(
    model: Annotated[str, typer.Option(help="catalog model name")] = "gpt-oss-120b",
    config: Annotated[Path | None, typer.Option(help="a Hugging Face config.json instead of "
                                                     "--model")] = None,
    spec: Annotated[Path | None, typer.Option(help="a JSON file declaring classes by bytes "
                                                   "(as for `kvchain plan`)")] = None,
    gpu: Annotated[str, typer.Option(help="GPU name (h100, h200, ...)")] = "h200",
    trace: Annotated[str, typer.Option(help="bundled trace name or trace file (formats "
                                            "below)")] = "azure-conv",
    requests: Annotated[int | None, typer.Option(help="first N requests")] = 500,
    end_s: Annotated[float | None, typer.Option(help="keep arrivals before this second")]
    = None,
    rate_scale: Annotated[float, typer.Option(help="arrival-rate multiplier")] = 1.0,
    block_tokens: Annotated[int, typer.Option(help="tokens per hash_ids block of a generic "
                                                   "trace")] = MOONCAKE_BLOCK_TOKENS,
    mem_fraction: Annotated[float, typer.Option(help="GPU memory fraction")] = 0.9,
    buffer_bytes: Annotated[int | None, typer.Option(
        help="KV buffer bytes (overrides the GPU-derived size; small = memory binds)")] = None,
    page_size: Annotated[int, typer.Option(help="tokens per page")] = 16,
    tp: Annotated[int, typer.Option(help="tensor-parallel ranks")] = 1,
    policy: Annotated[QueuePolicy, typer.Option(help="waiting-queue order")] = QueuePolicy.FCFS,
    max_running: Annotated[int, typer.Option(help="most running requests")] = 256,
    chunk_size: Annotated[int, typer.Option(help="prefill chunk tokens")] = 8192,
    clock: Annotated[ClockKind, typer.Option(help="roofline: GPU cost model; steps: one "
                                                  "--step-ms tick per scheduler step")]
    = ClockKind.ROOFLINE,
    step_ms: Annotated[float, typer.Option(help="tick of --clock steps, ms")]
    = DEFAULT_STEP_MS,
    reserve: Annotated[ReservePolicy, typer.Option(
        help="Reservation for future output: sglang (decaying new-token ratio), adaptive "
             "(learned from finished requests; default) or full (to each limit).")]
        = ReservePolicy.ADAPTIVE,
    new_token_ratio: Annotated[str | None, typer.Option(
        help="INIT,FLOOR,DECAY of the sglang new-token ratio (default 0.7,0.098,0.001003); "
             "only with --reserve sglang.")] = None,
    managers: Annotated[str, typer.Option(
        help="comma-separated managers: kvchain,fixed-pools,equal-page,ideal")] =
        "kvchain,fixed-pools,equal-page,ideal",
    out: Annotated[Path | None, typer.Option(help="write compare.json and compare.png here")]
        = None,
    wide: Annotated[bool, typer.Option("--wide", help="every metric, full labels")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
        = False,
    strict: Annotated[bool, typer.Option(
        help="stop at the first admitted-but-unallocatable step (the typed error, exit 2) "
             "instead of counting it")] = False,
    kv_dtype: Annotated[CacheDtype | None, typer.Option(help=KV_DTYPE_HELP)] = None,
    state_dtype: Annotated[CacheDtype | None, typer.Option(help=STATE_DTYPE_HELP)] = None,
    prefix_cache: PrefixCacheOption = None,
    cache_points: CachePointsOption = ResumePolicy.AUTO,
) -> None:
    """Run every memory manager on the same model, GPU, trace and scheduler."""
    console = Console(stderr=as_json)
    try:
        kinds = [ManagerKind(m.strip()) for m in managers.split(",") if m.strip()]
    except ValueError:
        raise typer.BadParameter(f"managers must be among {[str(k) for k in ManagerKind]}, "
                                 f"got {managers!r}") from None
    try:
        if not kinds:
            raise ConfigError("--managers names no manager")
        check_flags(requests=requests, end_s=end_s, rate_scale=rate_scale,
                    block_tokens=block_tokens, mem_fraction=mem_fraction,
                    buffer_bytes=buffer_bytes, page_size=page_size,
                    tp=tp, max_running=max_running, chunk_size=chunk_size, step_ms=step_ms)
        model_spec = load_spec(model, config, spec_file=spec, tp=tp, kv_dtype=kv_dtype,
                               state_dtype=state_dtype)
        gpu_spec = get_gpu(gpu)
        scheduler = SchedulerConfig(max_running=max_running, chunk_size=chunk_size,
                                    max_prefill_tokens=max(chunk_size, 8192), policy=policy,
                                    strict=strict,
                                    reserve=reserve_config(reserve, new_token_ratio))
        tr = load_trace(trace, first=requests, end_s=end_s, rate_scale=rate_scale,
                        block_tokens=block_tokens)
        cfg = SimConfig(model_spec, gpu_spec, tr, mem_fraction=mem_fraction,
                        page_size=page_size, scheduler=scheduler, buffer_bytes=buffer_bytes,
                        clock=clock, step_ms=step_ms, prefix_cache=prefix_cache,
                        cache_points=cache_points)
        cfg_layout = cfg.layout()
        cfg.check_cache(cfg_layout)
        buffer = cfg_layout.buffer_bytes
        if clock is ClockKind.ROOFLINE:
            GPUCostModel(model_spec, gpu_spec)  # a model it cannot price fails here, typed
        prepare_out_dir(out)
    except KVChainError as exc:
        fail(exc)
    warn_buffer(model_spec, gpu_spec, buffer_bytes, spec_file=spec)
    title = f"{model_spec.name} on {gpu_spec.name}, {tr.name} x{len(tr):,}, buffer {buffer:,} B"
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed:,}/{task.total:,} requests"),
                      TimeElapsedColumn(), console=console, transient=True,
                      disable=as_json) as bar:
            tasks = {k: bar.add_task(str(k), total=len(tr)) for k in kinds}
            runs = compare_managers(cfg, kinds, progress=lambda k, done, _total: bar.update(
                tasks[k], completed=done))
    except KVChainError as exc:
        fail(exc)
    data = compare_json(runs)
    written = []
    if out is not None:
        (out / "compare.json").write_text(json.dumps(data, indent=2))
        written = [out / "compare.json", compare_plot(runs, out / "compare.png", title=title)]
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        console.print(comparison_table({str(k): r.summary for k, r in runs.items()},
                                       title=title, wide=wide))
        console.print(METRIC_DEFINITIONS, soft_wrap=False)
        for k, r in runs.items():
            console.print(f"[bold]{k}[/bold]: {r.rule}")
    if as_json:
        return  # stdout is the JSON alone; the files are where --out said
    if written:
        console.print("wrote " + ", ".join(str(p) for p in written))
    hint_text = overload_hint(next(iter(runs.values())).summary, tr)
    if hint_text is not None:
        hint(hint_text)
