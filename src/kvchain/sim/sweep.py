"""Capacity-planning sweeps: a grid of simulations and an SLO search over request rate.

The pure pieces of ``kvchain sweep``: expand a grid into points, key them (for ``--resume``),
run one point (one :func:`kvchain.sim.compare.run_manager` simulation) into a flat result
row, parse SLO targets and find, by bisection, the highest rate scale that meets them.
Where the points run (a local process pool or Ray) lives in :mod:`kvchain.sim.sweep_run`.

Grid axes (every combination is one point)::

    models x gpus x tp x traces x rate_scales x mem_fractions x prefix_caches x managers

``prefix_caches``: ``auto`` (the default: the prefix cache on when the trace's requests carry
content keys, as ``kvchain simulate`` does), ``on`` or ``off``.

Fixed per sweep: every other run option (:class:`kvchain.sim.run_options.RunOptions`:
``requests`` (first N of each trace), ``end_s``, ``page_size``, ``max_running``,
``chunk_size``, ``seed``, ``reserve``, ``policy``, ``clock``, ``buffer_bytes``, ...), the
same options with the same defaults as ``kvchain simulate`` (strict included: off, see
that module), so a point gives the numbers ``simulate`` gives for the same settings.

SLO search (one per configuration = a point without its rate scale): the rate scale ``x``
multiplies the trace's own arrival rate (arrival times divided by ``x``). Assuming the
targets hold below some scale and fail above it, :func:`bisect_rate` brackets that
threshold between a meeting scale ``lo`` and a failing scale ``hi`` and halves the bracket
geometrically (``mid = sqrt(lo * hi)``) until ``hi / lo <= 1 + rel_tol``: the answer is
within ``rel_tol`` (relative) below the true threshold. GPUs for a target rate ``R``
(requests/s): ``ceil(R / rate_at_best) x tp`` (independent data-parallel replicas of ``tp``
GPUs each, every replica serving ``rate_at_best``).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvchain.baselines import ManagerKind
from kvchain.catalog.loader import load_model_source
from kvchain.errors import ConfigError
from kvchain.gpu import DEFAULT_MEM_FRACTION, get_gpu
from kvchain.model.layers import CacheDtype
from kvchain.model.params import WeightFormat
from kvchain.model.spec import ModelSpec
from kvchain.sim.compare import run_manager
from kvchain.sim.engine import SimConfig
from kvchain.sim.metrics import Percentiles, SimSummary
from kvchain.sim.run_options import RunOptions, coerce_value
from kvchain.sim.traces import Trace


class SweepConfigError(ConfigError):
    """A bad grid, grid file, SLO string or search range (names the key or text)."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One simulation of a sweep.

    Attributes:
        model: catalog model name or a Hugging Face ``config.json`` path.
        gpu: GPU name (``kvchain.gpu.get_gpu``).
        tp: tensor-parallel size (the simulated GPU is one rank).
        trace: bundled trace name or trace file.
        rate_scale: arrival-rate multiplier (> 0).
        mem_fraction: GPU memory fraction for weights + KV (0..1].
        manager: memory manager (``kvchain``, ``fixed-pools``, ``equal-page``, ``ideal``).
        prefix_cache: ``auto``, ``on`` or ``off`` (:data:`PREFIX_CACHE_MODES`).
        options: the other run options, shared by every point of a sweep (its fields that
            are axes here, ``rate_scale``, ``mem_fraction`` and ``prefix_cache``, are
            ignored: :meth:`run_options`).
    """

    model: str
    gpu: str
    tp: int
    trace: str
    rate_scale: float
    mem_fraction: float
    manager: str
    prefix_cache: str = "auto"
    options: RunOptions = field(default_factory=RunOptions)

    def run_options(self) -> RunOptions:
        """:attr:`options` with this point's axis values.

        Raises:
            SweepConfigError: a ``prefix_cache`` outside :data:`PREFIX_CACHE_MODES`.
        """
        if self.prefix_cache not in PREFIX_CACHE_MODES:
            raise SweepConfigError(f"prefix_cache must be one of {list(PREFIX_CACHE_MODES)}, "
                                   f"got {self.prefix_cache!r}")
        return replace(self.options, rate_scale=self.rate_scale,
                       mem_fraction=self.mem_fraction,
                       prefix_cache=PREFIX_CACHE_MODES[self.prefix_cache])

    def params(self) -> dict[str, Any]:
        """The point's parameters as a flat dict: the axes, then :data:`ROW_OPTIONS` of its
        options (always, the columns rows have always had), ``prefix_cache``, then any other
        option that differs from its default (e.g. ``reserve``), in field order."""
        out: dict[str, Any] = {name: getattr(self, name)
                               for name in ("model", "gpu", "tp", "trace", "rate_scale",
                                            "mem_fraction", "manager")}
        out.update({name: getattr(self.options, name) for name in ROW_OPTIONS})
        out["prefix_cache"] = self.prefix_cache
        changed = self.options.changed()
        out.update({k: v for k, v in changed.items()
                    if k not in ROW_OPTIONS and k not in AXIS_OPTIONS})
        return out

    def key(self) -> str:
        """A stable text key of every parameter (``name=value|...``; floats by ``repr``):
        equal keys mean the same simulation (``--resume`` matches rows on it). The prefix
        cache is left out at its default ``auto``, and options at their defaults are left
        out beyond :data:`ROW_OPTIONS`, so rows written before an option existed keep their
        keys."""
        params = self.params()
        if params["prefix_cache"] == "auto":
            del params["prefix_cache"]
        return "|".join(f"{k}={v!r}" for k, v in params.items())

    def config_key(self) -> str:
        """:meth:`key` without the rate scale: the configuration an SLO search varies."""
        return replace(self, rate_scale=1.0).key().replace("|rate_scale=1.0", "")


AXES: tuple[str, ...] = ("models", "gpus", "tp", "traces", "rate_scales", "mem_fractions",
                         "prefix_caches", "managers")
#: Values of the ``prefix_caches`` axis -> ``SimConfig.prefix_cache`` (None: on when the
#: trace carries content keys).
PREFIX_CACHE_MODES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
#: Run options a sweep replaces by its axes (``rate_scales``, ``mem_fractions``,
#: ``prefix_caches``).
AXIS_OPTIONS: tuple[str, ...] = ("rate_scale", "mem_fraction", "prefix_cache")
#: Run options every row carries as columns, whatever their value (the fixed settings rows
#: had before every run option was a sweep option).
ROW_OPTIONS: tuple[str, ...] = ("requests", "end_s", "page_size", "max_running",
                                "chunk_size", "seed")
#: Grid keys that are not axes: every run option but the axis ones.
FIXED: tuple[str, ...] = tuple(f.name for f in fields(RunOptions)
                               if f.name not in AXIS_OPTIONS)


def upgrade_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A result row read back for ``--resume`` in today's shape: a row written before the
    prefix-cache axis existed has no ``prefix_cache``; its point ran with the default
    ``auto`` (its key has no ``prefix_cache`` either, see :meth:`SweepPoint.key`), so it gets
    ``prefix_cache="auto"`` right after ``seed``, where :meth:`SweepPoint.params` puts it.
    Without this, tables, plots and CSV would split such rows from fresh ``auto`` rows of the
    same configuration (``None`` against ``auto``). Other rows come back unchanged (copied).

    Args:
        row: one sweep or SLO row (``read_rows``).
    """
    if "prefix_cache" in row:
        return dict(row)
    out: dict[str, Any] = {}
    for k, v in row.items():
        out[k] = v
        if k == "seed":
            out["prefix_cache"] = "auto"
    out.setdefault("prefix_cache", "auto")
    return out


@dataclass(frozen=True, slots=True)
class SweepGrid:
    """The axes of a sweep and its fixed run options (see the module doc).

    Every axis is a non-empty tuple of distinct values; :meth:`points` is their product in
    axis order (models outermost, managers innermost).

    Raises:
        SweepConfigError: an empty axis, a value repeated on an axis, an unknown manager,
            or a value out of range.
    """

    models: tuple[str, ...] = ("gpt-oss-120b",)
    gpus: tuple[str, ...] = ("h200",)
    tp: tuple[int, ...] = (1,)
    traces: tuple[str, ...] = ("azure-conv",)
    rate_scales: tuple[float, ...] = (1.0,)
    mem_fractions: tuple[float, ...] = (DEFAULT_MEM_FRACTION,)
    prefix_caches: tuple[str, ...] = ("auto",)
    managers: tuple[str, ...] = tuple(str(k) for k in ManagerKind)
    options: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        for axis in AXES:
            if not getattr(self, axis):
                raise SweepConfigError(f"grid axis {axis!r} is empty")
        for axis in AXES:
            values = getattr(self, axis)
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:
                # A repeated value would run the same points twice (and --resume would
                # count them once): refuse rather than guess.
                raise SweepConfigError(f"grid axis {axis!r} repeats {', '.join(repeated)}")
        known = {str(k) for k in ManagerKind}
        bad = [m for m in self.managers if m not in known]
        if bad:
            raise SweepConfigError(f"unknown managers {', '.join(bad)}; known: "
                                   f"{', '.join(sorted(known))}")
        odd = [m for m in self.prefix_caches if m not in PREFIX_CACHE_MODES]
        if odd:
            raise SweepConfigError(f"unknown prefix_caches {', '.join(map(str, odd))}; known: "
                                   f"{', '.join(PREFIX_CACHE_MODES)}")
        if any(t < 1 for t in self.tp):
            raise SweepConfigError(f"tp must be >= 1, got {list(self.tp)}")
        if any(not (s > 0 and math.isfinite(s)) for s in self.rate_scales):
            raise SweepConfigError(f"rate scales must be finite numbers > 0, got "
                                   f"{list(self.rate_scales)}")
        if any(not 0 < f <= 1 for f in self.mem_fractions):
            raise SweepConfigError(f"memory fractions must be in (0, 1], got "
                                   f"{list(self.mem_fractions)}")

    def points(self) -> list[SweepPoint]:
        """Every combination of the axes, one :class:`SweepPoint` each (product order)."""
        return [SweepPoint(model, gpu, tp, trace, float(scale), float(mem), manager,
                           prefix_cache=cache, options=self.options)
                for model, gpu, tp, trace, scale, mem, cache, manager in itertools.product(
                    self.models, self.gpus, self.tp, self.traces, self.rate_scales,
                    self.mem_fractions, self.prefix_caches, self.managers)]

    @staticmethod
    def from_mapping(data: Mapping[str, Any]) -> SweepGrid:
        """A grid from a mapping (a parsed grid file or CLI options): axis keys take a list
        or a single value; the other keys are run options (:data:`FIXED`, as
        :meth:`RunOptions.from_mapping`: ``reserve = "full"``) and take a single value;
        ``None`` values are ignored. ``prefix_caches`` also takes booleans (``True`` ->
        ``on``, ``False`` -> ``off``: what YAML makes of unquoted ``on`` / ``off``).

        Raises:
            SweepConfigError: an unknown key or a value of the wrong type or out of range.
        """
        unknown = set(data) - set(AXES) - set(FIXED)
        if unknown:
            raise SweepConfigError(f"unknown grid keys {', '.join(sorted(unknown))}; known: "
                                   f"{', '.join(sorted(AXES + FIXED))}")
        kinds: dict[str, type] = {"models": str, "gpus": str, "tp": int, "traces": str,
                                  "rate_scales": float, "mem_fractions": float,
                                  "prefix_caches": str, "managers": str}
        values: dict[str, Any] = {}
        fixed: dict[str, Any] = {}
        for key, raw in data.items():
            if raw is None:
                continue
            if key in AXES:
                items = list(raw) if isinstance(raw, list | tuple) else [raw]
                if key == "prefix_caches":
                    # YAML 1.1 (pyyaml) reads unquoted on / off (and yes / no, true /
                    # false) as booleans: a grid file's `prefix_caches: [on, off]` means
                    # the modes, not a type error
                    items = [("on" if v else "off") if isinstance(v, bool) else v
                             for v in items]
                values[key] = tuple(_typed(key, v, kinds[key]) for v in items)
            else:
                if isinstance(raw, list | tuple):
                    raise SweepConfigError(f"grid key {key!r} takes one value, got {raw!r}")
                fixed[key] = raw
        try:
            options = RunOptions.from_mapping(fixed)
        except SweepConfigError:
            raise
        except ConfigError as exc:
            raise SweepConfigError(f"grid: {exc}") from None
        return SweepGrid(**values, options=options)


def _typed(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (:func:`~kvchain.sim.run_options.coerce_value`), refused as a
    :class:`SweepConfigError` naming the grid key."""
    try:
        return coerce_value(repr(key), value, kind)
    except ConfigError as exc:
        raise SweepConfigError(f"grid key {exc}") from None


def load_grid_file(path: Path) -> dict[str, Any]:
    """Read a grid file: TOML (``.toml``, stdlib ``tomllib``) or YAML (``.yaml``/``.yml``,
    needs the optional ``pyyaml``). Top-level keys as :meth:`SweepGrid.from_mapping`.

    Raises:
        SweepConfigError: unreadable or malformed file, not a mapping, YAML without pyyaml,
            or another extension.
    """
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepConfigError(f"grid file {path}: {exc}") from None
    data: Any
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SweepConfigError(f"grid file {path}: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SweepConfigError(f"grid file {path}: YAML needs pyyaml "
                                   "(pip install pyyaml), or use TOML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SweepConfigError(f"grid file {path}: {exc}") from None
    else:
        raise SweepConfigError(f"grid file {path}: expected .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise SweepConfigError(f"grid file {path}: expected a mapping of grid keys")
    return data


# --- running one point ----------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _base_trace(trace: str, options: RunOptions) -> Trace:
    return options.load_trace(trace)


@functools.lru_cache(maxsize=16)
def _model(model: str, tp: int, kv_dtype: CacheDtype | None, state_dtype: CacheDtype | None,
           weight_format: WeightFormat | None, draft_model: str | None = None) -> ModelSpec:
    config = Path(model) if model.endswith(".json") else None
    return load_model_source(model, config, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype,
                             weight_format=weight_format, draft_model=draft_model)


def point_trace(point: SweepPoint) -> Trace:
    """The point's trace: its cut of the trace with arrival times divided by the rate scale
    (the same arrivals as ``load_trace(..., rate_scale=...)``; the cut at rate 1 is loaded
    once per sweep process and shared by the rate scales)."""
    base = _base_trace(point.trace, replace(point.run_options(), rate_scale=1.0,
                                            mem_fraction=1.0, prefix_cache=None))
    if point.rate_scale == 1.0:
        return base
    scale = point.rate_scale
    return replace(base, requests=tuple(replace(r, arrival_s=r.arrival_s / scale)
                                        for r in base.requests))


def point_config(point: SweepPoint) -> SimConfig:
    """The :class:`SimConfig` of a point: :meth:`SimConfig.of` of its options
    (``kvchain simulate``'s, so the same settings give the same run).

    Raises:
        ConfigError and subclasses: unknown model or GPU, bad trace, a layout that does not
            fit.
    """
    run = point.run_options()
    return SimConfig.of(run, _model(point.model, point.tp, run.kv_dtype, run.state_dtype,
                                    run.weight_format, run.draft_model),
                         get_gpu(point.gpu), point_trace(point))


def summary_row(summary: SimSummary) -> dict[str, Any]:
    """A summary as flat columns: scalar fields by name, percentiles as
    ``<name>_p50_s``/``_p90_s``/``_p99_s``/``_count``, ``extra`` counters by their keys."""
    row: dict[str, Any] = {}
    for f in fields(summary):
        value = getattr(summary, f.name)
        if f.name == "extra":
            row.update(value)
        elif isinstance(value, Percentiles) or (value is None and "Percentiles" in str(f.type)):
            for part in ("p50_s", "p90_s", "p99_s", "count"):
                row[f"{f.name}_{part}"] = getattr(value, part) if value is not None else None
        else:
            row[f.name] = value
    return row


def run_point(point: SweepPoint) -> dict[str, Any]:
    """Simulate one point: its parameters, ``key``, ``offered_rate_rps`` (requests / trace
    seconds at this scale) and every summary metric (:func:`summary_row`), one flat row.

    Deterministic: the same point gives the same row in any process.

    Raises:
        ConfigError and subclasses: as :func:`point_config`.
    """
    config = point_config(point)
    run = run_manager(config, ManagerKind(point.manager), max_points=1)
    duration = config.trace.duration_s
    row: dict[str, Any] = {"key": point.key(), **point.params(),
                           "buffer_bytes": run.buffer_bytes,
                           "offered_rate_rps": len(config.trace) / duration if duration else None}
    row.update(summary_row(run.summary))
    return row


# --- SLO search -----------------------------------------------------------------------------

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
SLO_METRICS: tuple[str, ...] = tuple(f"{m}_{p}" for m in ("ttft", "tpot", "e2e", "queueing")
                                     for p in ("p50", "p90", "p99"))


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets: metric (e.g. ``ttft_p99``) -> most seconds allowed."""

    targets: tuple[tuple[str, float], ...]

    def met_by(self, row: Mapping[str, Any]) -> bool:
        """True when every target metric of a result row (:func:`run_point`) is at most its
        target; a missing metric (no finished request) fails."""
        for metric, limit in self.targets:
            value = row.get(f"{metric}_s")
            if value is None or value > limit:
                return False
        return True

    def text(self) -> str:
        """The targets in milliseconds, e.g. ``ttft_p99<=2000ms,tpot_p99<=50ms``."""
        return ",".join(f"{m}<={v * 1e3:g}ms" for m, v in self.targets)


def parse_slo(text: str) -> SLO:
    """Parse ``"ttft_p99=2s,tpot_p99=50ms"``: comma-separated ``metric=value<unit>`` with a
    metric of :data:`SLO_METRICS` and a unit ``s``, ``ms`` or ``us``.

    Raises:
        SweepConfigError: an empty string, an unknown metric or unit, a target that is not
            a finite number > 0 (e.g. ``1e400s``, or ``1e-400s``, which is 0), or a metric
            given twice.
    """
    targets: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([a-z0-9_]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)",
                         part)
        if m is None:
            raise SweepConfigError(f"SLO {part!r}: expected metric=value<unit>, e.g. "
                                   "ttft_p99=2s")
        metric, value, unit = m.group(1), float(m.group(2)), m.group(3)
        if metric not in SLO_METRICS:
            raise SweepConfigError(f"SLO metric {metric!r} unknown; known: "
                                   f"{', '.join(SLO_METRICS)}")
        if unit not in _UNITS:
            raise SweepConfigError(f"SLO {part!r}: unit must be s, ms or us")
        target = value * _UNITS[unit]
        if not (target > 0 and math.isfinite(target)):
            raise SweepConfigError(f"SLO {part!r}: the target must be a finite number > 0")
        if metric in targets:
            raise SweepConfigError(f"SLO metric {metric!r} given twice")
        targets[metric] = target
    if not targets:
        raise SweepConfigError(f"SLO {text!r}: no target given")
    return SLO(tuple(targets.items()))


@dataclass(frozen=True, slots=True)
class RateSearch:
    """The result of :func:`bisect_rate`.

    Attributes:
        best_scale: highest rate scale seen to meet the targets (None: not even ``lo``).
        fail_scale: lowest rate scale seen to miss them (None: even ``hi`` meets them; the
            answer is then "at least ``hi``").
        evaluations: simulations run.
        best_row: the result row at ``best_scale`` (None with it).
        fail_row: the result row at ``fail_scale`` (None with it): what was measured where
            the targets failed (at ``lo`` when even ``lo`` misses them).
    """

    best_scale: float | None
    fail_scale: float | None
    evaluations: int
    best_row: Mapping[str, Any] | None
    fail_row: Mapping[str, Any] | None = None



def check_search_bounds(lo: float, hi: float, rel_tol: float) -> None:
    """Refuse an SLO search bracket ``[lo, hi]`` (rate scales) or relative tolerance that
    cannot be searched: the rule of the search, checked by the CLI before anything runs.

    Raises:
        SweepConfigError: ``lo <= 0``, ``hi <= lo``, ``hi`` not finite, or ``rel_tol`` not
            a finite number > 0 (NaN and infinity included: an infinite tolerance would stop
            the search after its two end points).
    """
    if not (0 < lo < hi and math.isfinite(hi)) or not (rel_tol > 0 and math.isfinite(rel_tol)):
        raise SweepConfigError(f"SLO search needs 0 < lo < hi and a finite rel_tol > 0, got "
                               f"lo={lo}, hi={hi}, rel_tol={rel_tol}")


def bisect_rate(evaluate: Callable[[float], Mapping[str, Any]], slo: SLO, lo: float, hi: float,
                rel_tol: float = 0.02) -> RateSearch:
    """The highest rate scale in ``[lo, hi]`` whose row meets ``slo``, by geometric bisection.

    Evaluates ``lo`` (if it misses: no answer) and ``hi`` (if it meets: answer ``hi``), then
    ``sqrt(lo * hi)`` of the bracket until ``hi / lo <= 1 + rel_tol``; assumes the targets
    hold below a threshold scale and fail above it. Runs ``2 + ceil(log2(ln(hi / lo) /
    ln(1 + rel_tol)))`` evaluations at most (e.g. ``[1, 16]`` at 1 %: 2 + 9 = 11).

    Args:
        evaluate: rate scale -> result row (:func:`run_point` of the point at that scale).
        slo: the targets.
        lo: lowest scale tried (> 0).
        hi: highest scale tried (> lo).
        rel_tol: relative width at which the search stops (> 0).

    Raises:
        SweepConfigError: ``lo <= 0``, ``hi <= lo`` or ``rel_tol <= 0``.
    """
    check_search_bounds(lo, hi, rel_tol)
    row = evaluate(lo)
    if not slo.met_by(row):
        return RateSearch(None, lo, 1, None, row)
    best, best_row = lo, row
    row = evaluate(hi)
    if slo.met_by(row):
        return RateSearch(hi, None, 2, row)
    fail, fail_row, count = hi, row, 2
    while fail / best > 1 + rel_tol:
        mid = math.sqrt(best * fail)
        row = evaluate(mid)
        count += 1
        if slo.met_by(row):
            best, best_row = mid, row
        else:
            fail, fail_row = mid, row
    return RateSearch(best, fail, count, best_row, fail_row)


def gpus_needed(target_rps: float, rate_rps: float | None, tp: int) -> int | None:
    """GPUs to serve ``target_rps`` requests/s with replicas of ``tp`` GPUs each sustaining
    ``rate_rps``: ``ceil(target / rate) x tp`` (None when no rate meets the targets); a
    quotient past the float range (a huge target over a tiny rate) is taken exactly, so
    every finite target gets a count.

    Raises:
        SweepConfigError: a target rate that is not a finite number > 0 (NaN and infinity
            included: no number of GPUs serves an infinite rate).
    """
    if not (target_rps > 0 and math.isfinite(target_rps)):
        raise SweepConfigError(f"target rate must be a finite number > 0 requests/s, got "
                               f"{target_rps}")
    if rate_rps is None or rate_rps <= 0:
        return None
    replicas = target_rps / rate_rps
    if not math.isfinite(replicas):
        # A huge finite target over a tiny rate overflows the float quotient (1e308 /
        # 0.25): the exact quotient of the two floats, rounded up, is the count.
        return math.ceil(Fraction(target_rps) / Fraction(rate_rps)) * tp
    # 1e-9 absorbs the float quotient's rounding (1.0 / 0.1 = 10.000000000000002)
    return math.ceil(replicas - 1e-9) * tp


@dataclass(frozen=True, slots=True)
class SLOTask:
    """One SLO search: a configuration (a point; its rate scale is ignored), targets and the
    search range."""

    point: SweepPoint
    slo: SLO
    lo: float
    hi: float
    rel_tol: float

    def key(self) -> str:
        """A stable text key of the search (``--resume`` matches SLO rows on it): the
        configuration (:meth:`SweepPoint.config_key`), then the targets (sorted, seconds
        by ``repr``), the searched range and the tolerance, e.g. ``...|slo='ttft_p99=2.0'|
        lo=0.25|hi=64.0|rel_tol=0.02``. Equal keys mean the same search; other targets, range
        or tolerance are another search (a row keyed on the configuration alone, as rows
        were before, matches none)."""
        targets = ",".join(f"{m}={v!r}" for m, v in sorted(self.slo.targets))
        return (f"{self.point.config_key()}|slo={targets!r}|lo={float(self.lo)!r}"
                f"|hi={float(self.hi)!r}|rel_tol={float(self.rel_tol)!r}")


def run_slo_search(task: SLOTask,
                   evaluate: Callable[[SweepPoint], Mapping[str, Any]] = run_point,
                   ) -> dict[str, Any]:
    """Bisect one configuration's rate scale (:func:`bisect_rate` over ``evaluate``) into a
    flat row: ``key`` (:meth:`SLOTask.key`), the configuration's parameters,
    ``max_rate_scale``, ``fail_rate_scale``, ``max_rate_rps`` (offered request rate at the
    best scale), ``evaluations``, the SLO text, the target metrics at the best scale
    prefixed ``at_best_``, and at the lowest failing scale ``fail_rate_rps`` and the target
    metrics prefixed ``at_fail_``: where the targets fail even at the range's low end ("not
    met"), these are what was measured there (``at_best_`` is then empty).

    Raises:
        ConfigError and subclasses: as :func:`bisect_rate` and ``evaluate``.
    """
    result = bisect_rate(lambda s: evaluate(replace(task.point, rate_scale=s)), task.slo,
                         task.lo, task.hi, task.rel_tol)
    params = task.point.params()
    del params["rate_scale"]
    row: dict[str, Any] = {"key": task.key(), **params, "slo": task.slo.text(),
                           "rel_tol": task.rel_tol, "max_rate_scale": result.best_scale,
                           "fail_rate_scale": result.fail_scale,
                           "evaluations": result.evaluations}
    best = result.best_row
    row["max_rate_rps"] = best.get("offered_rate_rps") if best is not None else None
    for metric, _ in task.slo.targets:
        row[f"at_best_{metric}_s"] = best.get(f"{metric}_s") if best is not None else None
    fail = result.fail_row
    row["fail_rate_rps"] = fail.get("offered_rate_rps") if fail is not None else None
    for metric, _ in task.slo.targets:
        row[f"at_fail_{metric}_s"] = fail.get(f"{metric}_s") if fail is not None else None
    return row


def slo_tasks(points: Sequence[SweepPoint], slo: SLO, lo: float, hi: float,
              rel_tol: float) -> list[SLOTask]:
    """One :class:`SLOTask` per distinct configuration of ``points`` (first-seen order)."""
    seen: dict[str, SLOTask] = {}
    for p in points:
        seen.setdefault(p.config_key(), SLOTask(replace(p, rate_scale=1.0), slo, lo, hi,
                                                rel_tol))
    return list(seen.values())
