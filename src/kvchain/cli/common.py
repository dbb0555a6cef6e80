"""Helpers shared by the CLI commands: model loading, band tables, and where messages go.

Streams: results (tables, JSON, "wrote ..." lines) go to stdout; errors, warnings, hints
and notes go to stderr, always through :func:`fail`, :func:`warn`, :func:`hint` and
:func:`note`, so ``kvchain ... --json | jq`` never reads a message as JSON. An error exits 2
(bad input: nothing ran); a run stopped by a typed error exits 1 (``simulate --strict``).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from kvchain.catalog.loader import load_model_source, vocab_size
from kvchain.cli.run_options import DEFAULT_MODEL
from kvchain.errors import ConfigError
from kvchain.gpu import GPUSpec
from kvchain.model.layers import CacheDtype
from kvchain.model.params import WeightFormat
from kvchain.model.spec import ModelSpec
from kvchain.sim.metrics import SimSummary
from kvchain.sim.traces import Trace
from kvchain.unique_fields import user_json


def buffer_warnings(model: ModelSpec, gpu: GPUSpec, buffer_bytes: int | None, *,
                    spec_file: Path | None = None, reads_weights: bool = True) -> list[str]:
    """Warnings for a run that is likely not what the user meant (empty when none).

    * ``--buffer-bytes`` larger than the GPU's memory minus the weights of one rank: the
      run assumes memory the GPU does not have.
    * a spec file without ``weight_bytes``: the model has no weights, so a buffer derived
      from ``--mem-fraction`` takes the whole GPU (but a joined draft's weights), and
      (``reads_weights``: the roofline clock prices the steps) the step times count no
      weight bytes. ``plan`` and the step clock (``--clock steps``) read no weights:
      ``reads_weights=False`` drops that part.
    """
    out = []
    room = gpu.memory_bytes - model.resident_weight_bytes
    if buffer_bytes is not None and buffer_bytes > room:
        out.append(f"--buffer-bytes {buffer_bytes:,} B is more than {gpu.name}'s "
                   f"{gpu.memory_bytes:,} B minus {model.resident_weight_bytes:,} B of weights "
                   f"({room:,} B): the run assumes memory the GPU does not have")
    if spec_file is not None and model.weight_bytes == 0:
        whole = "the KV buffer from --mem-fraction takes the whole GPU"
        if model.draft is not None and model.draft.weight_bytes:  # the draft's stay resident
            whole += (f" but the draft {model.draft.name}'s {model.draft.weight_bytes:,} B "
                      f"of weights")
        why = (([whole] if buffer_bytes is None else [])
               + (["step times count no weight reads"] if reads_weights else []))
        if why:
            out.append(f"spec file {spec_file} declares no weights (weight_bytes): "
                       + "; ".join(why))
    return out


def warn_buffer(model: ModelSpec, gpu: GPUSpec, buffer_bytes: int | None, *,
                spec_file: Path | None = None, reads_weights: bool = True) -> None:
    """Print :func:`buffer_warnings` to stderr, one ``warning:`` line each."""
    for line in buffer_warnings(model, gpu, buffer_bytes, spec_file=spec_file,
                                reads_weights=reads_weights):
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


#: The narrowest console a command prints to, in columns (the tables are laid out for
#: 80): a terminal or ``COLUMNS`` below it (``COLUMNS=0`` printed nothing and exited 0,
#: ``COLUMNS=20`` cut numbers to "…") gets this width, and the terminal wraps the lines.
MIN_COLUMNS = 80


def _at_least_min_width(console: Console) -> Console:
    if console.width < MIN_COLUMNS:
        console.width = MIN_COLUMNS
    return console


def out_console(stderr: bool = False, width: int | None = None) -> Console:
    """A rich console for a command's results: stdout (``stderr``: stderr, for the
    tables a ``--json`` run moves off stdout), ``width`` columns (``None``: the
    terminal's), at least :data:`MIN_COLUMNS`. It reads no markup in what it prints, so
    a model, trace or file name such as ``[/bold]x`` prints as it is (a markup error
    before); styles are given as ``rich.text.Text`` spans."""
    return _at_least_min_width(Console(stderr=stderr, markup=False, width=width))


def stderr_console() -> Console:
    """A rich console on stderr (messages; never results), at least :data:`MIN_COLUMNS`
    wide; :func:`fail`, :func:`warn`, :func:`hint` and :func:`note` escape the message
    after their styled prefix."""
    return _at_least_min_width(Console(stderr=True))


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


def stopped(exc: Exception) -> NoReturn:
    """A run (simulate, compare, sweep) ended by a typed error: a
    :class:`~kvchain.errors.ConfigError` is bad input found as the run sets up (a host
    tier too small for one resume interval, a buffer with an empty fixed pool): ``error:
    <message>`` and exit 2, as for every bad option; any other error stopped the run:
    ``error: stopped: <Type>: <message>`` and exit 1.

    Raises:
        typer.Exit: always.
    """
    if isinstance(exc, ConfigError):
        fail(exc)
    fail(f"stopped: {type(exc).__name__}: {exc}", code=1)


def warn(message: str) -> None:
    """Print ``warning: <message>`` on stderr (wrapped to the terminal): the run goes on."""
    stderr_console().print(f"[yellow]warning:[/yellow] {escape(message)}")


def hint(message: str) -> None:
    """Print ``hint: <message>`` on stderr: what to change for a more telling run."""
    stderr_console().print(f"[yellow]hint:[/yellow] {escape(message)}")


def note(message: str) -> None:
    """Print ``note: <message>`` on stderr: a setting the run chose for the user."""
    stderr_console().print(f"[cyan]note:[/cyan] {escape(message)}")


_FIGURE = re.compile(r"\d[\d,.]*")


def rejection_notes(rejected: Iterable[tuple[int, str]]) -> list[str]:
    """One line per distinct rejection reason: ``N request(s) rejected: <reason> (first:
    request <id>)``, in order of first occurrence (empty when nothing was rejected).

    Reasons that differ only in their figures (bytes, tokens) are one kind: the line quotes
    the first request's reason and says the others' figures differ. E.g. two requests that
    each need more pages than the empty chain holds -> ``2 requests rejected: needs
    4,473,815,040 B of pages at its peak, ... (first: request 97; the others' figures
    differ)``.

    Args:
        rejected: ``(request id, reason)`` of each rejected request, in arrival order.
    """
    kinds: dict[str, list[tuple[int, str]]] = {}
    for rid, reason in rejected:
        kinds.setdefault(_FIGURE.sub("#", reason), []).append((rid, reason))
    lines = []
    for group in kinds.values():
        rid, reason = group[0]
        varied = len({r for _, r in group}) > 1
        lines.append(f"{len(group):,} request{'s' if len(group) != 1 else ''} rejected: "
                     f"{reason} (first: request {rid}"
                     + ("; the others' figures differ)" if varied else ")"))
    return lines


def note_rejections(rejected: Iterable[tuple[int, str]], *, who: str = "") -> None:
    """Print :func:`rejection_notes` on stderr, one ``note:`` line each; ``who`` (a manager
    name) prefixes each line when given."""
    for line in rejection_notes(rejected):
        note(f"{who}: {line}" if who else line)


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

    The fix it suggests follows what bound: when memory refused admission in some step
    (``extra["memory_blocked_steps"]`` > 0) or requests were retracted, more KV memory
    helps; when it never did, the arrivals outran the compute (the GPU's step times), so
    only slower arrivals or more GPUs help, and the hint says memory did not bind.
    """
    span = trace.duration_s
    took = summary.duration_s
    waiting = summary.peak_waiting or 0
    if waiting == 0 or took <= max(OVERLOAD_FACTOR * span, span + OVERLOAD_SLACK_S):
        return None
    head = (f"overloaded: serving took {took:,.1f} s for arrivals spanning {span:,.1f} s "
            f"(up to {waiting:,} requests waiting); ")
    blocked = summary.extra.get("memory_blocked_steps")
    if blocked == 0 and summary.retractions == 0:
        return head + ("the arrival rate is above what the GPU computes (memory never "
                       "refused admission); slow the arrivals (--rate-scale 0.5) or split "
                       "the model over more GPUs (--tp N)")
    return head + ("slow the arrivals (--rate-scale 0.5), give the KV cache more memory "
                   "(--buffer-bytes, --mem-fraction) or split the model over more GPUs "
                   "(--tp N)")


def prepare_out_dir(out: Path | None, writes: Sequence[str] = ()) -> None:
    """Create the output folder before a long run, so a bad path fails at once; ``writes``
    names the files the command will write there (an existing one is replaced).

    Raises:
        ConfigError: the path exists and is not a folder, or cannot be created or written;
            a name of ``writes`` is taken by something other than a file (a folder), which
            would fail the write after the run.
    """
    if out is None:
        return
    for name in writes:
        path = out / name
        if path.exists() and not path.is_file():
            raise ConfigError(f"cannot write {path}: it exists and is not a file")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".kvchain-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write outputs to {out}: {exc.strerror or exc}") from None


@contextmanager
def staged_outputs(out: Path) -> Iterator[Path]:
    """A new folder inside ``out`` (made by :func:`prepare_out_dir`) to write a command's
    outputs into: when the block ends without an error, each file in it is renamed into
    ``out`` (replacing one of the same name) and the folder is removed; on an error it is
    removed with what it holds. ``out`` gets all of a command's files or none of them (a
    failed write, a full disk say, left some files of the new run beside older ones).

    Raises:
        OSError: the folder cannot be made, or a rename fails.
    """
    stage = Path(tempfile.mkdtemp(prefix=".kvchain-partial-", dir=out))
    try:
        yield stage
        for path in sorted(stage.iterdir()):
            path.replace(out / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def load_spec(model: str, config: Path | None, *, spec_file: Path | None = None,
              kv_dtype: CacheDtype | None = None, tp: int = 1,
              state_dtype: CacheDtype | None = None,
              weight_format: WeightFormat | None = None,
              draft_model: str | None = None) -> ModelSpec:
    """The model of a command: :func:`kvchain.catalog.loader.load_model_source` (a spec
    file, a Hugging Face config.json, or a catalog name; with ``draft_model``, joined
    with that bundled draft), after refusing options that name the model twice or that a
    spec file cannot act on (the loader's precedence would drop them silently).

    Raises:
        ConfigError: ``--config`` and ``--spec`` both given; a ``--model`` other than
            the default (:data:`kvchain.cli.run_options.DEFAULT_MODEL`; the default itself
            typed cannot be told from no ``--model``) beside either; and as
            :func:`~kvchain.catalog.loader.load_model_source` (which refuses ``--tp`` other
            than 1 with ``--spec``: a spec file declares one rank's bytes).
    """
    if spec_file is not None and config is not None:
        raise ConfigError("give --config or --spec, not both (each names the model)")
    source = "--spec" if spec_file is not None else "--config" if config is not None else None
    if source is not None and model != DEFAULT_MODEL:
        raise ConfigError(f"give --model or {source}, not both (each names the model)")
    loaded = load_model_source(model, config, spec_file=spec_file, kv_dtype=kv_dtype, tp=tp,
                               state_dtype=state_dtype, weight_format=weight_format,
                               draft_model=draft_model)
    if draft_model is not None:
        check_draft_vocabulary(model, config, spec_file, draft_model)
    return loaded


def _config_vocab(config: Path) -> int | None:
    """``vocab_size`` of a Hugging Face config.json (its text config's for a multimodal
    one), or ``None`` when it gives none (the loader read the file already)."""
    try:
        data = user_json(config.read_text(encoding="utf-8"), unique=False)
    except (OSError, ValueError):  # ConfigError and UnicodeDecodeError included
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    found = data.get("vocab_size") or (text.get("vocab_size") if isinstance(text, dict)
                                       else None)
    return found if type(found) is int and found > 0 else None


def check_draft_vocabulary(model: str, config: Path | None, spec_file: Path | None,
                           draft_model: str) -> None:
    """Refuse a ``--draft-model`` of another model family than the target: a draft
    proposes token ids the target verifies, so both must share one tokenizer; kvchain
    holds no tokenizers, so it compares what the configs give, the vocabulary sizes
    (:func:`~kvchain.catalog.loader.vocab_size`; a target from ``--config``: its
    ``vocab_size``). Different sizes prove different tokenizers (Llama-3.1-8B's 128,256
    tokens against Qwen3-0.6B's 151,936); equal sizes do not prove one, so the check
    cannot catch two tokenizers of one size. A target from ``--spec`` declares no
    vocabulary: not checked.

    Raises:
        ConfigError: both sizes known and different.
    """
    target = (None if spec_file is not None
              else _config_vocab(config) if config is not None else vocab_size(model))
    draft = vocab_size(draft_model)
    if target is not None and draft is not None and target != draft:
        name = config if config is not None else model
        raise ConfigError(f"--draft-model {draft_model}: its vocabulary of {draft:,} tokens "
                          f"is not the target {name}'s ({target:,}): a draft proposes the "
                          f"target's token ids, so it must be of the target's family (one "
                          f"tokenizer), e.g. Qwen3-0.6B for Qwen3-8B")

