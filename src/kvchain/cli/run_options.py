"""The run options of ``simulate``, ``compare`` and ``sweep``, declared once.

:func:`run_options` adds one typer option per :class:`kvchain.sim.run_options.RunOptions`
field to a command, from the field's type, default and help (its metadata); the command
receives a :class:`GivenOptions` instead (the values and which of them the user typed).
Adding an option to all three commands is therefore a change to ``RunOptions`` only (see
its module doc). The commands' shared *what to run* options (model, config, spec, GPU,
tensor parallelism, trace) are declared once here too, as ``Annotated`` aliases.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from kvchain.bands.geometry import StateRollback
from kvchain.cache.radix import CacheGeometry, ResumePolicy
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass
from kvchain.sched.queue import QueuePolicy
from kvchain.sim.cost import ClockKind
from kvchain.sim.prefix import default_cache_off_reason
from kvchain.sim.run_options import ResolvedRun, RunOptions
from kvchain.sim.traces import (
    BUNDLED_TRACES,
    DEFAULT_POISSON_RATE_RPS,
    Trace,
    TraceFormat,
    detect_format,
)

DEFAULT_MODEL = "gpt-oss-120b"
DEFAULT_GPU = "h200"

ModelOption = Annotated[str, typer.Option(help="Bundled model name (see `kvchain models`).")]
ConfigOption = Annotated[Path | None, typer.Option(
    help="A Hugging Face config.json instead of --model.")]
SPEC_HELP = ("A JSON file declaring classes by bytes per token (all layers, K and V): full, "
             "window + window_tokens, local + chunk_tokens, state (B per request); several "
             "window sizes as windows / locals: lists of {\"bytes\": B, \"tokens\": T}.")
SpecOption = Annotated[Path | None, typer.Option(help=SPEC_HELP)]
GpuOption = Annotated[str, typer.Option(help="GPU: a100, h100, h200, b200.")]
TpOption = Annotated[int, typer.Option(
    help="Tensor-parallel size (the simulated GPU is one rank).")]
TraceOption = Annotated[str | None, typer.Option(
    help=f"Bundled trace ({', '.join(sorted(BUNDLED_TRACES))}) or a trace file (formats "
         "below). Without it: the demo, the first 600 mooncake requests at 0.3x their "
         "rate; a trace you name runs whole at its own rate unless --requests / "
         "--rate-scale say otherwise.")]

# Options whose command-line default is "not given" (None) rather than the field's default:
# the demo fills them in when no trace is named (kvchain.sim.run_options.resolve_run).
_UNSET_BY_DEFAULT = frozenset({"requests", "rate_scale"})


@dataclass(frozen=True, slots=True)
class GivenOptions:
    """A command's run options as parsed.

    Attributes:
        values: field name -> value (``None`` for ``requests`` / ``rate_scale`` when not
            given; other fields their defaults when not given).
        typed: the fields the user gave on the command line (or by environment).
    """

    values: dict[str, Any]
    typed: frozenset[str]

    def typed_values(self) -> dict[str, Any]:
        """The values of the fields the user gave."""
        return {k: v for k, v in self.values.items() if k in self.typed}


def _parameters(exclude_axes: bool) -> list[inspect.Parameter]:
    hints = get_type_hints(RunOptions)
    out = []
    for f in fields(RunOptions):
        meta = f.metadata
        if exclude_axes and meta.get("axis"):
            continue
        kind = hints[f.name]
        default = f.default
        if f.name in _UNSET_BY_DEFAULT:
            kind, default = kind | None, None
        flags = (meta["flags"],) if meta.get("flags") else ()
        info = typer.Option(*flags, help=meta["help"])
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                     default=default, annotation=Annotated[kind, info]))
    return out


_CTX = "_run_options_context"


def _source(ctx: typer.Context, name: str) -> str:
    """Where parameter ``name``'s value came from (``COMMANDLINE``, ``ENVIRONMENT``,
    ``DEFAULT``, ...), by name: typer carries its own copy of click's enum."""
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else "DEFAULT"


def option_typed(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` of the running command was given on the command line or by
    environment (not left at its default)."""
    return _source(ctx, name) in ("COMMANDLINE", "ENVIRONMENT")


def mem_fraction_unused(mem_fraction: float) -> str:
    """The warning for a ``--mem-fraction`` typed beside ``--buffer-bytes`` (which sets the
    buffer, so the fraction sizes nothing)."""
    return (f"--mem-fraction {mem_fraction:g} has no effect with --buffer-bytes (the buffer "
            f"is the bytes given; the fraction only sizes a buffer from the GPU's memory)")


def run_options(*, sweep: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a typer command so it takes every :class:`RunOptions` option (for
    ``sweep=True`` all but the ones a sweep has as axes) and receives them as its
    keyword argument ``given`` (:class:`GivenOptions`).

    The command's own parameters come first in ``--help``, then the run options.
    """
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.name != "given"]
        extra = _parameters(exclude_axes=sweep)
        names = [p.name for p in extra]

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            ctx = kwargs.pop(_CTX)
            values = {name: kwargs.pop(name) for name in names}
            typed = frozenset(name for name in names if option_typed(ctx, name))
            return fn(given=GivenOptions(values, typed), **kwargs)

        # typer passes its context to a parameter annotated typer.Context
        context = inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY,
                                    annotation=typer.Context)
        params = own + extra + [context]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def chosen_note(resolved: ResolvedRun, given: GivenOptions, trace: Trace,
                layout: ChainLayout) -> str | None:
    """What the run chose that the user did not say, one line (``note:`` on stderr;
    ``None`` when the user said everything that matters): the
    demo's trace and cut, or for a named trace its whole length and own rate (for a trace
    without arrival times, the Poisson rate and seed drawn); the KV buffer from the GPU
    memory model; what the prefix cache's ``auto`` resolves to and why
    (:func:`kvchain.sim.prefix.default_cache_off_reason`), and, with the cache on, the cache points
    ``auto`` resolves to. E.g. ``trace mooncake (the demo: --trace names yours), its first
    600 requests (--requests), 0.3x its arrival rate (--rate-scale), KV buffer
    67,289,933,312 B from the GPU memory model (--mem-fraction 0.9, --buffer-bytes), prefix
    cache on (auto: the trace has content keys; --no-prefix-cache), cache points auto:
    blocks``; for sharegpt ``Poisson arrivals at 5.53 requests/s, seed 0 (the trace has no
    arrival times; --rate-scale, --seed)`` and ``prefix cache off (auto: the trace has no
    content keys)``."""
    run = resolved.options
    items = list(resolved.chosen)
    if not resolved.demo:
        if "requests" not in given.typed and "end_s" not in given.typed:
            items.append(f"all {len(trace):,} requests of the trace (--requests)")
        if _poisson_arrivals(resolved.trace):
            if "rate_scale" not in given.typed or "seed" not in given.typed:
                rate = DEFAULT_POISSON_RATE_RPS * run.rate_scale
                items.append(f"Poisson arrivals at {rate:,.2f} requests/s, seed {run.seed} "
                             "(the trace has no arrival times; --rate-scale, --seed)")
        elif "rate_scale" not in given.typed:
            items.append("its own arrival rate (--rate-scale 1)")
    if ("requests" in given.typed and run.requests is not None
            and len(trace) < run.requests):
        items.append(f"all {len(trace):,} requests of the trace (fewer than --requests "
                     f"{run.requests:,})")
    if run.buffer_bytes is None:
        items.append(f"KV buffer {layout.buffer_bytes:,} B from the GPU memory model "
                     f"(--mem-fraction {run.mem_fraction:g}, --buffer-bytes)")
    off = default_cache_off_reason(trace, layout)
    if run.prefix_cache is None:
        items.append("prefix cache on (auto: the trace has content keys; --no-prefix-cache)"
                     if off is None else f"prefix cache off (auto: {off})")
    cache_on = run.prefix_cache if run.prefix_cache is not None else off is None
    if run.cache_points is ResumePolicy.AUTO and cache_on:
        resolved_points = run.cache_points.resolve(CacheGeometry.of(layout)).value
        items.append(f"cache points auto: {resolved_points}")
    return "chosen for this run: " + ", ".join(items) if items else None


def _poisson_arrivals(trace: str) -> bool:
    """Whether ``trace`` (a bundled name or a file already loaded) has no arrival times, so
    its arrivals are a Poisson process (:func:`kvchain.sim.traces.load_trace`)."""
    bundled = BUNDLED_TRACES.get(trace)
    fmt = bundled.format if bundled is not None else detect_format(Path(trace))
    return fmt is TraceFormat.SHAREGPT_LENGTHS


def inert_warnings(run: RunOptions, given: GivenOptions, cache_on: bool,
                   layout: ChainLayout) -> list[str]:
    """Options the user gave that this run cannot act on, one warning each (``warning:``
    on stderr; the run goes on as it would without them): ``--policy cache-aware`` while
    the prefix cache is off (``cache_on`` False: the order is FCFS), ``--cache-points``
    and ``--partial-hits`` while the cache is off, ``--step-ms`` with ``--clock
    roofline`` (step times come from the cost model), ``--mem-fraction`` with
    ``--buffer-bytes`` (the buffer is given), ``--fast-forward`` with ``--spec-tokens``
    (speculative steps are not fast-forwarded), and the speculative options
    :func:`speculative_warnings` names (on ``layout``'s bands)."""
    out = []
    if run.policy is QueuePolicy.CACHE_AWARE and not cache_on:
        out.append("--policy cache-aware ranks waiting requests by their cached prefix, "
                   "but the prefix cache is off in this run: the order is FCFS")
    if "cache_points" in given.typed and not cache_on:
        out.append(f"--cache-points {run.cache_points.value} has no effect: the prefix "
                   f"cache is off in this run")
    if run.partial_hits and not cache_on:
        out.append("--partial-hits has no effect: the prefix cache is off in this run")
    if "step_ms" in given.typed and run.clock is ClockKind.ROOFLINE:
        out.append(f"--step-ms {run.step_ms:g} has no effect with --clock roofline (step "
                   f"times come from the GPU cost model; --clock steps uses the tick)")
    if "mem_fraction" in given.typed and run.buffer_bytes is not None:
        out.append(mem_fraction_unused(run.mem_fraction))
    if "fast_forward" in given.typed and run.fast_forward and run.spec_tokens:
        out.append("--fast-forward has no effect with --spec-tokens: speculative decode "
                   "steps (random acceptances) run one by one")
    out += speculative_warnings(run.spec_tokens, run.spec_rollback, given.typed, layout)
    return out


def speculative_warnings(spec_tokens: int, rollback: StateRollback, typed: frozenset[str],
                         layout: ChainLayout) -> list[str]:
    """The speculative-decoding options given (``typed``: field names, e.g.
    ``spec_acceptance``) that a run or plan on ``layout`` cannot act on: ``--spec-acceptance``
    or ``--spec-rollback`` without ``--spec-tokens`` (``spec_tokens`` 0: no drafts), and
    ``--spec-rollback replay`` on a chain without a state band (rollback is how a recurrent
    state undoes rejected drafts; window and full bands just free the drafts' tokens).
    One warning each; ``simulate``, ``sweep`` and ``plan`` all ask here."""
    out = []
    for name in ("spec_acceptance", "spec_rollback"):
        if name in typed and spec_tokens == 0:
            out.append(f"--{name.replace('_', '-')} has no effect without --spec-tokens "
                       f"(no drafts in this run)")
    if ("spec_rollback" in typed and spec_tokens > 0 and rollback is StateRollback.REPLAY
            and not layout.indices_of(LifetimeClass.STATE)):
        out.append("--spec-rollback replay has no effect: the model has no recurrent state "
                   "band to roll back (its bands free rejected drafts' tokens)")
    return out
