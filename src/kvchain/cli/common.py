"""Helpers shared by the CLI commands: model loading, band tables, and where messages go.

Streams: results (tables, JSON, "wrote ..." lines) go to stdout; errors, warnings, hints
and notes go to stderr, always through :func:`fail`, :func:`warn`, :func:`hint` and
:func:`note`, so ``kvchain ... --json | jq`` never reads a message as JSON. An error exits 2
(bad input: nothing ran); a run stopped by a typed error exits 1 (``simulate --strict``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import GPUSpec
from kvchain.layout import ChainLayout
from kvchain.report.tables import band_table
from kvchain.sim.metrics import SimSummary
from kvchain.sim.run_options import check_values, option_help
from kvchain.sim.traces import Trace
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import CacheDtype
from kvchain.spec.model import ModelSpec
from kvchain.spec.spec_file import load_spec_file


def check_flags(**flags: float | int | None) -> None:
    """Validate numeric command-line flags up front, naming the flag as typed (each keyword
    is a flag's Python name: ``rate_scale`` for ``--rate-scale``; ``None`` passes): the
    rules of :func:`kvchain.sim.run_options.check_values`, written there once.

    Raises:
        ConfigError: e.g. ``--requests must be >= 1, got 0``.
    """
    check_values(**flags)


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
    for line in buffer_warnings(model, gpu, buffer_bytes, spec_file=spec_file):
        warn(line)


def defaults_note(model: ModelSpec, config: Path | None) -> str | None:
    """What a ``--config`` file did not set that the model's bytes, weights or context rest
    on (``ModelSpec.defaulted``: field, the value used, who supplied it), as one note; or
    ``None`` (no ``--config``, or the file set everything). A bundled model's defaults are
    recorded in the catalog and listed by ``kvchain models``, so they are not repeated."""
    if config is None or not model.defaulted:
        return None
    items = "; ".join(f"{d.field} = {d.value} ({d.by})" for d in model.defaulted)
    return f"{config.name} does not set: {items}. The model's bytes rest on these defaults"


def note_defaults(model: ModelSpec, config: Path | None) -> None:
    """Print :func:`defaults_note` on stderr (``note:``), if any."""
    text = defaults_note(model, config)
    if text is not None:
        note(text)


def stderr_console() -> Console:
    """A rich console on stderr (messages; never results)."""
    return Console(stderr=True)


def fail(message: object, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` on stderr (unwrapped) and exit with ``code``.

    Args:
        message: the error (an exception prints as its text).
        code: exit status: 2 for bad input (the default), 1 for a run stopped by a typed
            error.

    Raises:
        typer.Exit: always.
    """
    stderr_console().print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: <message>`` on stderr (wrapped to the terminal): the run goes on."""
    stderr_console().print(f"[yellow]warning:[/yellow] {escape(message)}")


def hint(message: str) -> None:
    """Print ``hint: <message>`` on stderr: what to change for a more telling run."""
    stderr_console().print(f"[yellow]hint:[/yellow] {escape(message)}")


def note(message: str) -> None:
    """Print ``note: <message>`` on stderr: a setting the run chose for the user."""
    stderr_console().print(f"[cyan]note:[/cyan] {escape(message)}")


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


KV_DTYPE_HELP = option_help("kv_dtype")
STATE_DTYPE_HELP = option_help("state_dtype")


def render_bands(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer
    (:func:`kvchain.report.tables.band_table`)."""
    return band_table(layout)
