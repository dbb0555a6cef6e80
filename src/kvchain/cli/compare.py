"""``kvchain compare``: every memory manager on the same model, GPU, trace and scheduler.

Managers: kvchain, fixed-pools, equal-page, ideal (:mod:`kvchain.baselines.managers`).
Prints a rich table (``comparison_table``: throughput, TTFT/TPOT, retractions, peak
running, plus U* and allocation efficiency in percent) or ``--json``; with ``--out DIR``
writes ``compare.json`` and ``compare.png`` (throughput and U* per manager; bytes needed
and held over time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kvchain.baselines import ManagerKind
from kvchain.cli import app
from kvchain.cli.common import KV_DTYPE_HELP, STATE_DTYPE_HELP, load_spec, prepare_out_dir
from kvchain.errors import ConfigError, KVChainError
from kvchain.gpu import get_gpu
from kvchain.report.tables import comparison_table
from kvchain.sched.scheduler import QueuePolicy, SchedulerConfig
from kvchain.sim.compare import ManagerRun, compare_managers
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import load_trace
from kvchain.spec.layers import CacheDtype


def compare_json(runs: dict[ManagerKind, ManagerRun]) -> dict[str, object]:
    """The runs as JSON: manager -> rule, U*, allocation efficiency, buffer bytes and the
    summary (``SimSummary.to_json``)."""
    return {
        str(k): {"rule": r.rule, "u_star": r.u_star, "alloc_efficiency": r.alloc_efficiency,
                 "buffer_bytes": r.buffer_bytes, "summary": r.summary.to_json()}
        for k, r in runs.items()
    }


def compare_plot(runs: dict[ManagerKind, ManagerRun], path: Path) -> Path:
    """PNG: output throughput (tok/s) and U* (%) per manager; bytes needed (dashed) and
    held (solid) over simulated time, GB (1e9 B)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    names = [str(k) for k in runs]
    tput = [r.summary.output_tokens_per_s or 0.0 for r in runs.values()]
    ustar = [100 * (r.u_star or 0.0) for r in runs.values()]
    axes[0].bar(names, tput, color="tab:blue")
    axes[0].set_ylabel("output tokens / s")
    axes[0].set_title("throughput")
    axes[1].bar(names, ustar, color="tab:green")
    axes[1].set_ylabel("U* (%)")
    axes[1].set_ylim(0, 105)
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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@app.command("compare")
def compare(
    model: Annotated[str, typer.Option(help="catalog model name")] = "gpt-oss-120b",
    config: Annotated[Path | None, typer.Option(help="a Hugging Face config.json instead of "
                                                     "--model")] = None,
    gpu: Annotated[str, typer.Option(help="GPU name (h100, h200, ...)")] = "h200",
    trace: Annotated[str, typer.Option(help="bundled trace name or trace file")] = "azure-conv",
    requests: Annotated[int | None, typer.Option(help="first N requests")] = 500,
    rate_scale: Annotated[float, typer.Option(help="arrival-rate multiplier")] = 1.0,
    mem_fraction: Annotated[float, typer.Option(help="GPU memory fraction")] = 0.9,
    buffer_bytes: Annotated[int | None, typer.Option(
        help="KV buffer bytes (overrides the GPU-derived size; small = memory binds)")] = None,
    page_size: Annotated[int, typer.Option(help="tokens per page")] = 16,
    tp: Annotated[int, typer.Option(help="tensor-parallel ranks")] = 1,
    policy: Annotated[QueuePolicy, typer.Option(help="waiting-queue order")] = QueuePolicy.FCFS,
    max_running: Annotated[int, typer.Option(help="most running requests")] = 256,
    chunk_size: Annotated[int, typer.Option(help="prefill chunk tokens")] = 8192,
    managers: Annotated[str, typer.Option(
        help="comma-separated managers: kvchain,fixed-pools,equal-page,ideal")] =
        "kvchain,fixed-pools,equal-page,ideal",
    out: Annotated[Path | None, typer.Option(help="write compare.json and compare.png here")]
        = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
        = False,
    kv_dtype: Annotated[CacheDtype | None, typer.Option(help=KV_DTYPE_HELP)] = None,
    state_dtype: Annotated[CacheDtype | None, typer.Option(help=STATE_DTYPE_HELP)] = None,
) -> None:
    """Run every memory manager on the same model, GPU, trace and scheduler."""
    try:
        kinds = [ManagerKind(m.strip()) for m in managers.split(",") if m.strip()]
    except ValueError:
        raise typer.BadParameter(f"managers must be among {[str(k) for k in ManagerKind]}, "
                                 f"got {managers!r}") from None
    try:
        if not kinds:
            raise ConfigError("no manager given")
        spec = load_spec(model, config, tp=tp, kv_dtype=kv_dtype, state_dtype=state_dtype)
        scheduler = SchedulerConfig(max_running=max_running, chunk_size=chunk_size,
                                    max_prefill_tokens=max(chunk_size, 8192), policy=policy)
        cfg = SimConfig(spec, get_gpu(gpu), load_trace(trace, first=requests,
                                                       rate_scale=rate_scale),
                        mem_fraction=mem_fraction, page_size=page_size,
                        scheduler=scheduler, buffer_bytes=buffer_bytes)
        prepare_out_dir(out)
        runs = compare_managers(cfg, kinds)
    except KVChainError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    data = compare_json(runs)
    if out is not None:
        (out / "compare.json").write_text(json.dumps(data, indent=2))
        compare_plot(runs, out / "compare.png")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = Console(width=160)
    title = (f"{spec.name} on {gpu}, {trace} x{len(cfg.trace)} requests, buffer "
             f"{next(iter(runs.values())).buffer_bytes:,} B")
    console.print(comparison_table({str(k): r.summary for k, r in runs.items()}, title=title))
    for k, r in runs.items():
        console.print(f"[bold]{k}[/bold]: {r.rule}")
