"""Helpers shared by the CLI commands: model loading, band tables, and where messages go.

Streams: results (tables, JSON, "wrote ..." lines) go to stdout; errors, warnings, hints
and notes go to stderr, always through :func:`fail`, :func:`warn`, :func:`hint` and
:func:`note`, so ``kvchain ... --json | jq`` never reads a message as JSON. An error exits 2
(bad input: nothing ran); a run stopped by a typed error exits 1 (``simulate --strict``).
"""

from __future__ import annotations

import json
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
from kvchain.spec.declared import declare_model
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import CacheDtype
from kvchain.spec.model import ModelSpec

SPEC_FILE_KEYS = frozenset({"name", "full", "window", "window_tokens", "local", "chunk_tokens",
                            "state", "source", "windows", "locals", "hidden_size",
                            "num_attention_heads", "total_params", "active_params",
                            "weight_bytes"})


def load_declared(path: Path) -> ModelSpec:
    """Read a spec file that declares classes by their bytes.

    Format (JSON, every key optional except one class)::

        {"name": "my-model", "full": 32000, "window": 0, "window_tokens": null,
         "local": 0, "chunk_tokens": null, "state": 50000000}

    ``full``/``window``/``local``: bytes per token of the class (all layers, K and V);
    ``window_tokens``: ``W``; ``chunk_tokens``: ``C``; ``state``: bytes per request of all
    state layers. Optional, for the GPU memory model and the cost model: ``weight_bytes``
    (bytes of the weights on one rank), ``hidden_size``, ``num_attention_heads``,
    ``total_params``, ``active_params``; without them the model has no weights (a buffer
    from ``--mem-fraction`` then takes the whole GPU, and ``warn_buffer`` says so).
    Several window sizes (or chunk sizes): list the classes, each its own band, e.g.
    ``"windows": [{"bytes": 4096, "tokens": 128}, {"bytes": 2048, "tokens": 11}]``
    (``"locals"`` likewise), alone or next to ``window``/``local``.

    Raises:
        ConfigError: unreadable JSON, an unknown key, or invalid bytes (names the key).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"spec file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"spec file {path}: expected a JSON object")
    unknown = set(data) - SPEC_FILE_KEYS
    if unknown:
        raise ConfigError(f"spec file {path}: unknown keys {sorted(unknown)}; "
                          f"known: {sorted(SPEC_FILE_KEYS)}")
    def count(key: str) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if type(value) is not int or value < 0:
            raise ConfigError(f"spec file {path}: {key} must be a non-negative integer, "
                              f"got {value!r}")
        return value

    def classes(key: str) -> list[tuple[int, int]]:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise ConfigError(f"spec file {path}: {key} must be a list of "
                              f'{{"bytes": int, "tokens": int}}, got {value!r}')
        out = []
        for entry in value:
            if not isinstance(entry, dict) or set(entry) != {"bytes", "tokens"} or any(
                    type(entry[k]) is not int or entry[k] <= 0 for k in ("bytes", "tokens")):
                raise ConfigError(f"spec file {path}: each {key} entry needs positive int "
                                  f'"bytes" and "tokens" (and nothing else), got {entry!r}')
            out.append((entry["bytes"], entry["tokens"]))
        return out

    return declare_model(str(data.get("name", Path(path).stem)),
                         windows=classes("windows"), locals_=classes("locals"),
                         full=count("full") or 0, window=count("window") or 0,
                         window_tokens=count("window_tokens"), local=count("local") or 0,
                         chunk_tokens=count("chunk_tokens"), state=count("state") or 0,
                         hidden_size=count("hidden_size") or 0,
                         num_attention_heads=count("num_attention_heads") or 0,
                         total_params=count("total_params") or 0,
                         active_params=count("active_params") or 0,
                         weight_bytes=count("weight_bytes") or 0,
                         source=str(data.get("source", f"declared in {path}")))


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
        return load_declared(spec_file)
    if config is not None:
        return load_hf_config(config, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    return load_model(model, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)


KV_DTYPE_HELP = option_help("kv_dtype")
STATE_DTYPE_HELP = option_help("state_dtype")


def render_bands(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer
    (:func:`kvchain.report.tables.band_table`)."""
    return band_table(layout)
