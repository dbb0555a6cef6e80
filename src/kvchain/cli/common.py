"""Helpers shared by the CLI commands: model loading and band tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvchain.admission import ReserveConfig, ReservePolicy, parse_new_token_ratio
from kvchain.cache.radix import ResumePolicy
from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import GPUSpec
from kvchain.layout import ChainLayout
from kvchain.report.tables import band_table
from kvchain.sim.metrics import SimSummary
from kvchain.sim.traces import Trace
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import CacheDtype
from kvchain.spec.model import ModelSpec
from kvchain.spec.spec_file import load_spec_file


def check_flags(**flags: float | int | None) -> None:
    """Validate numeric command-line flags up front, naming the flag as typed.

    Each keyword is a flag's Python name (``rate_scale`` for ``--rate-scale``); ``None``
    values (flag not given) pass. Rules: ``requests``, ``page_size``, ``tp``,
    ``max_running``, ``chunk_size``, ``prompt``, ``output``, ``buffer_bytes``,
    ``step_ms``: >= 1 (``step_ms`` > 0); ``rate_scale``: finite and > 0; ``end_s``: > 0;
    ``mem_fraction``: in (0, 1]; ``seed``, ``slots_held``, ``ops``: >= 0; ``step_ms`` at most
    :data:`MAX_STEP_MS`; ``chunk_size`` >= ``page_size`` when both are given.

    Raises:
        ConfigError: e.g. ``--requests must be >= 1, got 0``.
    """
    for name, value in flags.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name in ("rate_scale", "end_s", "step_ms"):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag} must be a finite number > 0, got {value}")
        elif name == "mem_fraction":
            if not 0 < value <= 1:
                raise ConfigError(f"{flag} must be in (0, 1], got {value}")
        elif name in ("seed", "slots_held", "ops"):
            if value < 0:
                raise ConfigError(f"{flag} must be >= 0, got {value}")
        elif value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    step_ms = flags.get("step_ms")
    if step_ms is not None and step_ms > MAX_STEP_MS:
        raise ConfigError(f"--step-ms must be at most {MAX_STEP_MS:,.0f} (one hour), got "
                          f"{step_ms:g}")
    page, chunk = flags.get("page_size"), flags.get("chunk_size")
    if page is not None and chunk is not None and chunk < page:
        # Admission cuts prefill chunks to whole pages: no chunk could ever be admitted.
        raise ConfigError(f"--chunk-size ({chunk}) must be at least --page-size ({page} "
                          f"tokens)")


MAX_STEP_MS = 3_600_000.0
"""Largest ``--step-ms``: one hour of trace time per step (a longer tick overflows the
step clock's sums of times to inf in the latency percentiles)."""


def buffer_warnings(model: ModelSpec, gpu: GPUSpec, buffer_bytes: int | None, *,
                    spec_file: Path | None = None) -> list[str]:
    """Warnings for a run that is likely not what the user meant (empty when none).

    * ``--buffer-bytes`` larger than the GPU's memory minus the weights of one rank: the
      run assumes memory the GPU does not have.
    * a spec file without ``weight_bytes``: the model has no weights, so a buffer derived
      from ``--mem-fraction`` takes the whole GPU and the roofline reads no weight bytes.
    """
    out = []
    room = gpu.memory_bytes - model.weight_bytes
    if buffer_bytes is not None and buffer_bytes > room:
        out.append(f"--buffer-bytes {buffer_bytes:,} B is more than {gpu.name}'s "
                   f"{gpu.memory_bytes:,} B minus {model.weight_bytes:,} B of weights "
                   f"({room:,} B): the run assumes memory the GPU does not have")
    if spec_file is not None and model.weight_bytes == 0:
        out.append(f"spec file {spec_file} declares no weights (weight_bytes): "
                   + ("the KV buffer from --mem-fraction takes the whole GPU; "
                      if buffer_bytes is None else "")
                   + "step times count no weight reads")
    return out


def warn_buffer(model: ModelSpec, gpu: GPUSpec, buffer_bytes: int | None, *,
                spec_file: Path | None = None) -> None:
    """Print :func:`buffer_warnings` to stderr, one ``warning:`` line each."""
    console = Console(stderr=True)
    for line in buffer_warnings(model, gpu, buffer_bytes, spec_file=spec_file):
        console.print(f"[yellow]warning:[/yellow] {escape(line)}")


OVERLOAD_FACTOR = 2.0
"""A run is called overloaded when serving lasts more than this many times the trace's
span (its last arrival), and more than :data:`OVERLOAD_SLACK_S` past it, while requests
queued: arrivals outran the simulated GPU."""

OVERLOAD_SLACK_S = 60.0
"""Seconds past the last arrival that never count as overload (one long request alone can
take this long to decode)."""


def overload_hint(summary: SimSummary, trace: Trace) -> str | None:
    """A one-line hint when a run was overloaded (``None`` otherwise).

    Overloaded: the simulated time exceeds :data:`OVERLOAD_FACTOR` x the trace's span and
    the span + :data:`OVERLOAD_SLACK_S`, while requests waited: the queue grew faster than it
    drained, so latencies measure the backlog, not the memory manager. E.g. a 100 s trace
    served in 450 s with 300 requests waiting at the peak.
    """
    span = trace.duration_s
    took = summary.duration_s
    waiting = summary.peak_waiting or 0
    if waiting == 0 or took <= max(OVERLOAD_FACTOR * span, span + OVERLOAD_SLACK_S):
        return None
    return (f"overloaded: serving took {took:,.1f} s for arrivals spanning {span:,.1f} s "
            f"(up to {waiting:,} requests waiting); slow the arrivals (--rate-scale 0.5), "
            f"give the KV cache more memory (--buffer-bytes, --mem-fraction) or split the "
            f"model over more GPUs (--tp N)")


def prepare_out_dir(out: Path | None) -> None:
    """Create the output folder before a long run, so a bad path fails at once.

    Raises:
        ConfigError: the path exists and is not a folder, or cannot be created or written.
    """
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".kvchain-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write outputs to {out}: {exc.strerror or exc}") from None


def load_spec(model: str, config: Path | None, *, spec_file: Path | None = None,
              kv_dtype: CacheDtype | None = None, tp: int = 1,
              state_dtype: CacheDtype | None = None) -> ModelSpec:
    """The model of a command: a spec file, a Hugging Face config.json, or a catalog name
    (in that order of precedence).

    ``kv_dtype`` / ``state_dtype`` (``--kv-dtype`` / ``--state-dtype``) override what the
    config declares (``None``: the config's dtype fields, else bf16; see
    :mod:`kvchain.spec.hf_dtypes`).

    Raises:
        ConfigError and subclasses: unknown model, bad config, bad spec file, or a dtype
            override given with a spec file (its classes are declared in bytes).
    """
    if spec_file is not None:
        if kv_dtype is not None or state_dtype is not None:
            raise ConfigError("--kv-dtype/--state-dtype do not apply to --spec (a spec file "
                              "declares bytes, not tensors)")
        return load_spec_file(spec_file)
    if config is not None:
        return load_hf_config(config, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    return load_model(model, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)


KV_DTYPE_HELP = ("Element type of attention K/V (default: the config's kv_cache_dtype / "
                 "quantization_config, else bf16).")
STATE_DTYPE_HELP = ("Element type of the recurrent state (default: the config's "
                    "mamba_ssm_dtype / mamba_ssm_cache_dtype / mamba_cache_dtype, else bf16).")


PrefixCacheOption = Annotated[bool | None, typer.Option(
    "--prefix-cache/--no-prefix-cache",
    help="Serve cached prompt prefixes (default: on when the trace has content keys, e.g. "
         "mooncake's hash_ids). --prefix-cache on a trace without content keys, or on a "
         "model with two or more window bands, is refused (exit 2).")]
"""``--prefix-cache/--no-prefix-cache`` (``simulate`` and ``compare``): ``None`` when not
given, i.e. on when the trace carries content keys (``SimConfig.prefix_cache``)."""

CachePointsOption = Annotated[ResumePolicy, typer.Option(
    help="Where cached prompts keep window tails and state checkpoints: every content "
         "block (blocks), only the last block boundary and the prompt end (ends), or "
         "auto: ends for models with a recurrent state, blocks otherwise. Ignored while "
         "the cache is off; blocks or ends on a model with two or more window bands (no "
         "prefix cache there) is refused (exit 2).")]
"""``--cache-points`` (``simulate`` and ``compare``): ``SimConfig.cache_points``."""


def render_bands(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer
    (:func:`kvchain.report.tables.band_table`)."""
    return band_table(layout)


def reserve_config(reserve: ReservePolicy, new_token_ratio: str | None) -> ReserveConfig:
    """``--reserve`` and ``--new-token-ratio`` as a :class:`ReserveConfig`.

    Raises:
        ConfigError: a malformed ratio, or a ratio with a policy other than ``sglang``.
    """
    ratio = parse_new_token_ratio(new_token_ratio) if new_token_ratio is not None else None
    return ReserveConfig(reserve, ratio)
