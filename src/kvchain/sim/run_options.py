"""One set of run options for ``simulate``, ``compare`` and ``sweep``.

:class:`RunOptions` is the library value behind every knob of a run that is not *what*
runs (model, GPU, tensor parallelism, trace: those are a command's own arguments, or a
sweep's axes): how the trace is cut, how big the KV buffer is, how the scheduler admits,
which clock advances time, the prefix cache's settings. ``kvchain simulate``, ``kvchain
compare`` and ``kvchain sweep`` all build their simulations through
:meth:`kvchain.sim.engine.SimConfig.of`, so the same options mean the same run everywhere, and the
CLI declares each option once, from this class (:mod:`kvchain.cli.run_options`).

Adding an option is a change in this file only:

1. add a field to :class:`RunOptions` with its default and ``metadata=option("help
   text")`` (``option(..., flags="--x/--no-x")`` for a boolean pair, ``axis=True`` when
   ``kvchain sweep`` has an axis of that name instead: ``--rate-scales`` for
   ``rate_scale``);
2. add its rule, if it has one, to :data:`_RULES` or :meth:`RunOptions.__post_init__`;
3. use it in :meth:`RunOptions.scheduler_config`, :meth:`RunOptions.load_trace` or the
   simulator (:class:`~kvchain.sim.engine.SimConfig` is a ``RunOptions`` with the model,
   GPU and trace added: it inherits the new field).

The three commands then take ``--x`` with that help and default, a sweep grid file takes
the key ``x``, and a sweep row carries ``x`` when it differs from its default.

Strictness: every command runs with ``strict=False`` unless ``--strict`` is given: an
admitted-but-unallocatable step (a bug: admission accepted what the allocator then
refused) is counted (``admitted_but_unallocatable`` in every summary and sweep row),
the request retracted, and the run goes on. One default for all three because the same
point must give the same numbers from ``simulate`` and from a sweep; non-strict because a
capacity planner's sweep of many points should finish and report the count (which must
be 0) rather than lose the grid to one event, and because ``simulate`` already worked that
way. ``--strict`` stops at the first such step (exit 1 for ``simulate``, 2 for ``compare``,
the error for a sweep point).

Messages name an option by its command-line flag (field ``rate_scale`` is
``--rate-scale``): the fields are the flags.

The demo: :data:`DEMO` holds the settings of the bundled default run (``kvchain
simulate`` with no ``--trace``); :func:`resolve_run` applies them only when no trace is
given. A trace the user names runs whole and at its own arrival rate unless
``--requests`` / ``--rate-scale`` say otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, get_type_hints

from kvchain.bands.geometry import StateRollback
from kvchain.cache.radix import ResumePolicy
from kvchain.errors import ConfigError
from kvchain.field_types import check_field_types
from kvchain.gpu import DEFAULT_MEM_FRACTION
from kvchain.model.draft import check_draft_drafts
from kvchain.model.layers import CacheDtype
from kvchain.model.params import WeightFormat
from kvchain.sched.admission import ReserveConfig, ReservePolicy, parse_new_token_ratio
from kvchain.sched.retraction import RetractTo
from kvchain.sched.scheduler import QueuePolicy, SchedulerConfig
from kvchain.sim.cost import DEFAULT_STEP_MS, ClockKind
from kvchain.sim.traces import MOONCAKE_BLOCK_TOKENS, Trace, load_trace

PREFILL_TOKENS_FLOOR = 8192
"""Prefill tokens per step (all chunks together) are ``max(chunk_size, 8192)``: at least one
whole chunk, and at least 8,192 tokens, vLLM's default ``max_num_batched_tokens`` for
chunked prefill, so a small ``--chunk-size`` splits prompts into more chunks without
shrinking the step's budget. The one place this rule is written."""

MAX_STEP_MS = 3_600_000.0
"""Largest ``--step-ms``: one hour of trace time per step (a longer tick overflows the
step clock's sums of times to inf in the latency percentiles)."""


def option(help: str, *, flags: str | None = None, axis: bool = False) -> dict[str, Any]:
    """The metadata of a :class:`RunOptions` field: its help text, its flag spelling when
    not the field's name (``"--truncate"``: a plain flag; ``"--x/--no-x"``: a pair), and
    whether ``kvchain sweep`` replaces it by an axis (then the sweep does not declare it)."""
    return {"help": help, "flags": flags, "axis": axis}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How a run goes, validated (see the module doc; every field is a flag of the same
    name: ``rate_scale`` is ``--rate-scale``), keyword-only.

    Units: ``end_s`` seconds of trace time; ``step_ms`` milliseconds of trace time;
    ``buffer_bytes`` bytes; ``page_size``, ``chunk_size``, ``block_tokens`` tokens;
    ``mem_fraction`` a fraction of GPU memory; ``rate_scale`` a multiplier of the trace's
    arrival rate.

    Raises:
        ConfigError: a value of the wrong type (an enum field given its string, a count
            given a float or a bool: names the field), a value out of range (names the
            flag), a ``new_token_ratio`` that does
            not parse or is given with a reservation other than ``sglang``, or a
            ``chunk_size`` smaller than ``page_size``.
    """

    requests: int | None = field(default=None, metadata=option(
        "Keep the first N requests (default: all; simulate and compare without --trace: "
        "the demo's 600)."))
    end_s: float | None = field(default=None, metadata=option(
        "Keep arrivals before this second of the trace (default: all)."))
    rate_scale: float = field(default=1.0, metadata=option(
        "Arrival-rate multiplier (default 1: the trace's own rate; without --trace: the "
        "demo's 0.3).",
        axis=True))
    block_tokens: int = field(default=MOONCAKE_BLOCK_TOKENS, metadata=option(
        "Tokens per hash_ids block of a generic trace."))
    seed: int = field(default=0, metadata=option(
        "Seed of the Poisson arrivals of a length-only trace (sharegpt) and of the "
        "speculative acceptance draws (--spec-acceptance)."))
    truncate: bool = field(default=False, metadata=option(
        "Cut the prompt of a request past the model's context to its first context - "
        "output tokens (counted; the prefix cache keys the head it keeps) instead of "
        "rejecting it.", flags="--truncate"))
    mem_fraction: float = field(default=DEFAULT_MEM_FRACTION, metadata=option(
        "Fraction of GPU memory for weights + KV cache (vLLM's gpu_memory_utilization).",
        axis=True))
    buffer_bytes: int | None = field(default=None, metadata=option(
        "KV buffer bytes (overrides the GPU memory model; small = memory binds)."))
    page_size: int = field(default=16, metadata=option("Tokens per page."))
    kv_dtype: CacheDtype | None = field(default=None, metadata=option(
        "Element type of attention K/V (default: the config's kv_cache_dtype / "
        "quantization_config, else bf16)."))
    state_dtype: CacheDtype | None = field(default=None, metadata=option(
        "Element type of the recurrent state (default: the config's mamba_ssm_dtype / "
        "mamba_ssm_cache_dtype / mamba_cache_dtype, else bf16)."))
    weight_format: WeightFormat | None = field(default=None, metadata=option(
        "How a --config checkpoint stores its weights: bf16, fp8, mxfp4-experts (default: "
        "the config's quantization_config; a config whose quant_method is another, e.g. "
        "compressed-tensors, needs it; refused with --spec or a bundled model)."))
    policy: QueuePolicy = field(default=QueuePolicy.FCFS, metadata=option(
        "Waiting-queue order."))
    max_running: int = field(default=256, metadata=option("Most running requests."))
    chunk_size: int = field(default=8192, metadata=option(
        "Largest prefill chunk of one request, tokens (prefill tokens per step: "
        "max(chunk, 8192))."))
    reserve: ReservePolicy = field(default=ReservePolicy.ADAPTIVE, metadata=option(
        "Reservation for future output: sglang (decaying new-token ratio), adaptive "
        "(learned from finished requests) or full (to each limit)."))
    new_token_ratio: str | None = field(default=None, metadata=option(
        "INIT,FLOOR,DECAY of the sglang new-token ratio (default 0.7,0.098,0.001003); "
        "only with --reserve sglang."))
    clock: ClockKind = field(default=ClockKind.ROOFLINE, metadata=option(
        "roofline: GPU cost model; steps: each scheduler step that computes tokens is one "
        "--step-ms tick (instant compute)."))
    step_ms: float = field(default=DEFAULT_STEP_MS, metadata=option(
        "Tick of --clock steps, ms of trace time."))
    strict: bool = field(default=False, metadata=option(
        "Stop at the first admitted-but-unallocatable step instead of counting it, "
        "retracting the request and going on.", flags="--strict/--no-strict"))
    prefix_cache: bool | None = field(default=None, metadata=option(
        "Serve cached prompt prefixes (default: on when the trace has content keys, e.g. "
        "mooncake's hash_ids). --prefix-cache on a trace without content keys, or on a "
        "chain the cache cannot key (several recurrent-state bands, e.g. a draft model's), "
        "is refused (exit 2); any number of window and chunked-local bands takes it.",
        flags="--prefix-cache/--no-prefix-cache", axis=True))
    cache_points: ResumePolicy = field(default=ResumePolicy.AUTO, metadata=option(
        "Where cached prompts keep window tails and state checkpoints: every content "
        "block (blocks), only the last block boundary and the prompt end (ends), every "
        "K-th block boundary counted back from the last (spaced: a prompt keeps at most "
        "max(2, min(buffer bytes // 64, its own pages' bytes) // checkpoint bytes) "
        "checkpoints, K the least spacing within that; every block where it allows), or "
        "auto: spaced for models with a "
        "recurrent state, blocks otherwise. Ignored while the cache is off."))
    partial_hits: bool = field(default=False, metadata=option(
        "Partial prefix-cache hits on a model with a recurrent state: a hit shares the "
        "cached full-attention (and window) pages as far as they match and resume, and "
        "recomputes the tokens from the deepest state checkpoint below, every layer, "
        "writing no KV there: pages saved, not compute (counted as partial_tokens, not "
        "hits). Off by default: it needs a model runner that can run a forward over cached "
        "positions, which kvchain's real-model runner has not. Ignored while the cache is "
        "off; with the cache on, a model without a recurrent state is refused (exit 2).",
        flags="--partial-hits/--no-partial-hits"))
    fast_forward: bool = field(default=True, metadata=option(
        "Advance runs of decode-only steps between events in one update (the same results "
        "as the per-step loop); --no-fast-forward runs every step through the per-step "
        "loop.", flags="--fast-forward/--no-fast-forward"))
    spec_tokens: int = field(default=0, metadata=option(
        "Speculative decoding: draft tokens k per decode step (0: off). Each decode "
        "computes 1 + k tokens (the verify forward; drafts from a head that costs no "
        "target forward), holds k more state slots and a window of W + k tokens, and "
        "keeps 1 + accepted tokens. Turns fast-forward off."))
    spec_acceptance: float = field(default=0.7, metadata=option(
        "Speculative decoding: probability each draft is accepted given the ones before "
        "it were (seeded by --seed); only with --spec-tokens > 0."))
    draft_model: str | None = field(default=None, metadata=option(
        "Speculative decoding with a separate draft model from the catalog (e.g. "
        "Qwen3-0.6B for Qwen3 targets): its KV joins the chain as bands of its own "
        "(draft.full, ...), its weights take GPU memory, and the cost model charges its k "
        "draft decodes and its prefill; needs --spec-tokens > 0. Without it the drafts are "
        "free (an MTP/EAGLE head). The prefix cache keeps the draft's full pages beside "
        "the target's; it is off where the draft's state band makes a second one beside "
        "the target's (one state band, the target's or the draft's, is cached), and "
        "--host-bytes with the cache on is refused with a draft that has a full band."))
    spec_rollback: StateRollback = field(default=StateRollback.CHECKPOINTS, metadata=option(
        "Speculative decoding on a recurrent state: checkpoints (k more state slots per "
        "request, no recompute) or replay (one more slot; a step with a rejected draft "
        "recomputes its accepted tokens, charged as a whole-model chunk: an upper bound)."))
    host_bytes: int | None = field(default=None, metadata=option(
        "Bytes of a host-memory tier below the prefix cache (default: none): every prompt "
        "the cache inserts is written through to host, and a prompt the host resumes "
        "deeper than the device is loaded back, priced by admission like any demand and "
        "timed at the GPU's host link (docs/host-tier.md). --retract-to host / auto take "
        "their host slots from the same bytes."))
    retract_to: RetractTo = field(default=RetractTo.RECOMPUTE, metadata=option(
        "Where a retracted request's KV goes: recompute (dropped, prefilled again; the "
        "default), host (copied to host memory and loaded back on resume; recompute when "
        "the host is full, counted), or auto (host when the roofline's copy out and back "
        "is faster than the recompute). host and auto need --host-bytes; auto needs "
        "--clock roofline."))

    def __post_init__(self) -> None:
        check_field_types(self)
        check_values(**{f.name: getattr(self, f.name) for f in fields(self)
                        if f.name in _RULES})
        self.reserve_config()  # a ratio that does not parse, or one without sglang
        check_draft_drafts(self.draft_model, self.spec_tokens)
        check_retract_to(self.retract_to, self.host_bytes, self.clock)

    # --- what the run builds -------------------------------------------------------------

    def reserve_config(self) -> ReserveConfig:
        """``reserve`` and ``new_token_ratio`` as a :class:`ReserveConfig`.

        Raises:
            ConfigError: a malformed ratio, or a ratio with a policy other than ``sglang``.
        """
        ratio = (parse_new_token_ratio(self.new_token_ratio)
                 if self.new_token_ratio is not None else None)
        return ReserveConfig(self.reserve, ratio)

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's limits: ``max_running``, ``chunk_size``, prefill tokens per step
        ``max(chunk_size, PREFILL_TOKENS_FLOOR)``, the queue policy, the reservation and
        ``strict``."""
        return SchedulerConfig(max_running=self.max_running, chunk_size=self.chunk_size,
                               max_prefill_tokens=max(self.chunk_size, PREFILL_TOKENS_FLOOR),
                               policy=self.policy, strict=self.strict,
                               reserve=self.reserve_config(), retract_to=self.retract_to,
                               partial_hits=self.partial_hits)

    def load_trace(self, trace: str) -> Trace:
        """``trace`` (a bundled name or a file) cut by ``end_s`` and ``requests``, its
        arrivals divided by ``rate_scale``, Poisson arrivals drawn with ``seed``, generic
        ``hash_ids`` blocks of ``block_tokens`` (:func:`kvchain.sim.traces.load_trace`).

        Raises:
            ConfigError and subclasses: an unknown trace or a malformed file.
        """
        return load_trace(trace, first=self.requests, end_s=self.end_s,
                          rate_scale=self.rate_scale, seed=self.seed,
                          block_tokens=self.block_tokens)

    # --- as data -------------------------------------------------------------------------

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults, field name -> value (enums as their
        values: JSON-ready), in field order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = value.value if isinstance(value, Enum) else value
        return out

    def to_json(self) -> dict[str, Any]:
        """Every field, enums as their values."""
        return {f.name: (v.value if isinstance(v := getattr(self, f.name), Enum) else v)
                for f in fields(self)}

    @staticmethod
    def from_mapping(data: Mapping[str, Any]) -> RunOptions:
        """Options from a mapping of field names (a sweep grid file's keys): enum fields
        take their values (``"full"``), numbers take ints or floats as the field's type,
        ``None`` leaves the default.

        Raises:
            ConfigError: an unknown key, or a value of the wrong type or out of range.
        """
        hints = _field_types()
        unknown = set(data) - set(hints)
        if unknown:
            raise ConfigError(f"unknown run options {sorted(unknown)}; known: "
                              f"{sorted(hints)}")
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if raw is not None:
                values[key] = coerce_value(key, raw, hints[key])
        return RunOptions(**values)


def check_retract_to(mode: RetractTo, host_bytes: int | None, clock: ClockKind) -> None:
    """Refuse a retraction mode the run cannot serve (:class:`RunOptions` asks of its
    ``retract_to``; :class:`~kvchain.sim.engine.SimConfig` of its scheduler's as well).

    Raises:
        ConfigError: ``host`` / ``auto`` without ``host_bytes`` (the host memory its copies
            go to); ``auto`` (it compares the roofline's host-copy and recompute times)
            with a clock other than ``roofline``.
    """
    if mode is not RetractTo.RECOMPUTE and not host_bytes:
        raise ConfigError(f"--retract-to {mode.value} needs --host-bytes (the host memory "
                          f"its copies go to)")
    if mode is RetractTo.AUTO and clock is not ClockKind.ROOFLINE:
        raise ConfigError("--retract-to auto compares the roofline's host-copy and "
                          "recompute times: it needs --clock roofline")


def option_help(name: str) -> str:
    """The help text of :class:`RunOptions` field ``name`` (for a command that declares
    the same option outside the run options, e.g. ``plan --kv-dtype``).

    Raises:
        KeyError: no such field.
    """
    for f in fields(RunOptions):
        if f.name == name:
            return str(f.metadata["help"])
    raise KeyError(name)


def _field_types() -> dict[str, Any]:
    """Field name -> its type with ``None`` removed (``int | None`` -> ``int``)."""
    out: dict[str, Any] = {}
    for name, hint in get_type_hints(RunOptions).items():
        args = [a for a in getattr(hint, "__args__", (hint,)) if a is not type(None)]
        out[name] = args[0] if len(args) == 1 else hint
    return out


def coerce_value(key: str, value: Any, kind: Any) -> Any:
    """``value`` of option or grid key ``key`` as the type ``kind`` (ints accepted for
    floats; bools only for bool fields; enums by value).

    Raises:
        ConfigError: ``key: expected <kind>, got <value>`` (or not one of the enum's values).
    """
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not one of "
                              f"{[m.value for m in kind]}") from None
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not (
            isinstance(value, kind) or (kind is float and isinstance(value, int))):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    return kind(value)


# Value rules, by the option's name (``check_values``): one copy, used by RunOptions and by
# the CLI's other commands (``plan``, ``replay``, ``prefix-bounds``, ``tp``).
_POSITIVE_REAL = ("rate_scale", "end_s", "step_ms")
_FRACTION = ("mem_fraction", "host_fraction")
_NON_NEGATIVE = ("seed", "slots_held", "ops", "spec_tokens")
_PROBABILITY = ("spec_acceptance",)
_AT_LEAST_ONE = ("requests", "page_size", "tp", "max_running", "chunk_size", "prompt",
                 "output", "buffer_bytes", "block_tokens", "host_bytes", "host_interval")
_RULES = frozenset(_POSITIVE_REAL + _FRACTION + _NON_NEGATIVE + _AT_LEAST_ONE + _PROBABILITY)


def check_values(**values: Any) -> None:
    """Validate numeric options, naming each as its flag (``rate_scale`` ->
    ``--rate-scale``); ``None`` (not given) passes.

    Rules: ``rate_scale``, ``end_s``, ``step_ms``: finite and > 0, ``step_ms`` at most
    :data:`MAX_STEP_MS`; ``mem_fraction``, ``host_fraction``: in (0, 1];
    ``spec_acceptance``: in [0, 1]; ``seed``, ``slots_held``, ``ops``, ``spec_tokens``:
    >= 0; ``requests``, ``page_size``, ``tp``, ``max_running``,
    ``chunk_size``, ``prompt``, ``output``, ``buffer_bytes``, ``block_tokens``,
    ``host_bytes``, ``host_interval``, and any other name (a count): >= 1;
    ``chunk_size`` >= ``page_size`` when both are given.

    Raises:
        ConfigError: e.g. ``--requests must be >= 1, got 0``.
    """
    for name, value in values.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name in _POSITIVE_REAL:
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag} must be a finite number > 0, got {value}")
        elif name in _FRACTION:
            if not 0 < value <= 1:
                raise ConfigError(f"{flag} must be in (0, 1], got {value}")
        elif name in _PROBABILITY:
            if not 0 <= value <= 1:
                raise ConfigError(f"{flag} must be in [0, 1], got {value}")
        elif name in _NON_NEGATIVE:
            if value < 0:
                raise ConfigError(f"{flag} must be >= 0, got {value}")
        elif value < 1:  # _AT_LEAST_ONE, and any count not listed
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    step_ms = values.get("step_ms")
    if step_ms is not None and step_ms > MAX_STEP_MS:
        raise ConfigError(f"--step-ms must be at most {MAX_STEP_MS:,.0f} (one hour), got "
                          f"{step_ms:g}")
    page, chunk = values.get("page_size"), values.get("chunk_size")
    if page is not None and chunk is not None and chunk < page:
        # Admission cuts prefill chunks to whole pages: no chunk could ever be admitted.
        raise ConfigError(f"--chunk-size ({chunk}) must be at least --page-size ({page} "
                          f"tokens)")


# --- the demo -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoRun:
    """The bundled default run's settings (README "Quickstart"), applied only when no trace
    is named: gpt-oss-120b on one H200 (the commands' own defaults) serving the first
    ``requests`` of ``trace`` at ``rate_scale`` x its arrival rate.

    Why these: Mooncake's requests carry content keys, so the prefix cache is on; their
    long prompts fill the 67.3 GB buffer within the first 120 simulated seconds, so memory
    binds and the planner evicts; at 0.3x one GPU keeps up (TTFT p50 under 2 s, a short
    queue), and 600 requests take 15-30 s on one core.
    """

    trace: str = "mooncake"
    requests: int = 600
    rate_scale: float = 0.3


DEMO = DemoRun()


@dataclass(frozen=True, slots=True)
class ResolvedRun:
    """A run's trace and options once defaults are chosen.

    Attributes:
        trace: the trace to load (the demo's when none was named).
        options: the validated options.
        demo: True when no trace was named (the demo's settings applied).
        chosen: what the run chose that the user did not say, in words, one item each
            (e.g. ``"trace mooncake (the demo)"``): the commands print it.
    """

    trace: str
    options: RunOptions
    demo: bool
    chosen: tuple[str, ...]


def resolve_run(trace: str | None, given: Mapping[str, Any]) -> ResolvedRun:
    """Choose the trace and options of a ``simulate`` or ``compare`` run.

    Args:
        trace: the trace the user named, or ``None`` (then the demo: :data:`DEMO`'s trace,
            and its ``requests`` and ``rate_scale`` unless given).
        given: the options the user gave, field name -> value (the others take their
            defaults: a named trace runs whole and at its own rate).

    Raises:
        ConfigError: as :class:`RunOptions`.
    """
    values = dict(given)
    chosen: list[str] = []
    demo = trace is None
    if demo:
        trace = DEMO.trace
        chosen.append(f"trace {DEMO.trace} (the demo: --trace names yours)")
        if values.get("requests") is None:
            values["requests"] = DEMO.requests
            chosen.append(f"its first {DEMO.requests:,} requests (--requests)")
        if values.get("rate_scale") is None:
            values["rate_scale"] = DEMO.rate_scale
            chosen.append(f"{DEMO.rate_scale:g}x its arrival rate (--rate-scale)")
    values = {k: v for k, v in values.items() if v is not None}
    assert trace is not None
    return ResolvedRun(trace, RunOptions(**values), demo, tuple(chosen))
