"""The picture of ``kvchain compare``: what differs between memory managers.

A comparison of managers on one trace mostly agrees (same scheduler, same trace: often the
same throughput); the figure draws only what differs. :func:`metric_spread` sorts the
candidate metrics (:data:`COMPARE_METRICS`) into those whose values differ between the
managers by more than a relative tolerance and those that do not; :func:`compare_plot`
draws one bar panel per differing metric, each titled with its direction ("lower is
better" / "higher is better") and its best bar outlined, lists the equal metrics under the
figure with their common value, and, with the prefix cache off, adds one panel of bytes
held beyond what the requests need over time (lower is better), leaving out managers whose
series is all zero.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvchain.baselines import ManagerKind
from kvchain.sim.compare import ManagerRun

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True, slots=True)
class CompareMetric:
    """One metric a comparison can draw.

    Attributes:
        label: panel title (with its unit), e.g. ``"TTFT p99 (s)"``.
        value: run -> value in that unit (``None`` when the run has none, e.g. no request
            finished).
        lower_is_better: the direction said on the panel.
        fmt: format of a bar's label, e.g. ``"{:,.2f}"``.
        counts_cache: the metric counts prefix-cache pages as held (allocation
            efficiency): with the cache on, a manager that caches less scores better, so
            the metric is not drawn then.
    """

    label: str
    value: Callable[[ManagerRun], float | None]
    lower_is_better: bool
    fmt: str
    counts_cache: bool = False

    @property
    def direction(self) -> str:
        """``"lower is better"`` or ``"higher is better"``."""
        return "lower is better" if self.lower_is_better else "higher is better"


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


COMPARE_METRICS: tuple[CompareMetric, ...] = (
    CompareMetric("TTFT p99 (s)", lambda r: r.summary.ttft.p99_s if r.summary.ttft else None,
                  True, "{:,.2f}"),
    CompareMetric("TTFT p50 (s)", lambda r: r.summary.ttft.p50_s if r.summary.ttft else None,
                  True, "{:,.2f}"),
    CompareMetric("TPOT p99 (ms)",
                  lambda r: 1e3 * r.summary.tpot.p99_s if r.summary.tpot else None,
                  True, "{:,.1f}"),
    CompareMetric("output throughput (tokens/s)", lambda r: r.summary.output_tokens_per_s,
                  False, "{:,.0f}"),
    CompareMetric("U* (% of buffer needed while requests wait)", lambda r: _pct(r.u_star),
                  False, "{:.1f}"),
    CompareMetric("memory-blocked U* (%)", lambda r: _pct(r.u_star_mem), False, "{:.1f}"),
    CompareMetric("allocation efficiency (% needed / held)",
                  lambda r: _pct(r.alloc_efficiency), False, "{:.1f}", counts_cache=True),
    CompareMetric("retractions", lambda r: float(r.summary.retractions), True, "{:,.0f}"),
    CompareMetric("prefix-cache hit rate (% of prompt tokens)",
                  lambda r: _pct(r.prefix_cache.hit_rate) if r.prefix_cache else None,
                  False, "{:.2f}"),
)
"""The metrics :func:`compare_plot` considers, most telling first."""


@dataclass(frozen=True, slots=True)
class MetricSpread:
    """A metric's values across the managers.

    Attributes:
        metric: the metric.
        values: manager -> value (managers without a value left out).
        differs: True when the values spread by more than the tolerance.
    """

    metric: CompareMetric
    values: dict[str, float]
    differs: bool

    def best(self, rel_tol: float = 0.005) -> list[str]:
        """The managers with the best value (lowest or highest by the metric's direction)
        and those within ``rel_tol`` (relative) of it, in run order: ties are outlined
        together."""
        if not self.values:
            return []
        pick = min if self.metric.lower_is_better else max
        top = pick(self.values.values())
        return [k for k, v in self.values.items() if abs(v - top) <= rel_tol * abs(top)]


def metric_spread(runs: Mapping[ManagerKind, ManagerRun], rel_tol: float = 0.01
                  ) -> list[MetricSpread]:
    """Each of :data:`COMPARE_METRICS` across ``runs``: its values and whether they differ.

    A metric differs when ``max - min > rel_tol x max(|max|, |min|)`` (1 % by default:
    below that the bars look equal anyway). Left out: a metric no run has, one that is zero
    for every run (an all-zero series, e.g. retractions), and one that counts cached pages
    as held (:attr:`CompareMetric.counts_cache`) when any run had the prefix cache on.

    Args:
        runs: manager -> its run.
        rel_tol: relative spread below which values count as equal (>= 0).
    """
    cached = any(r.prefix_cache is not None for r in runs.values())
    out = []
    for metric in COMPARE_METRICS:
        if cached and metric.counts_cache:
            continue
        values = {str(k): v for k, r in runs.items() if (v := metric.value(r)) is not None}
        if not values or all(v == 0 for v in values.values()):
            continue
        hi, lo = max(values.values()), min(values.values())
        differs = len(values) > 1 and hi - lo > rel_tol * max(abs(hi), abs(lo))
        out.append(MetricSpread(metric, values, differs))
    return out


def waste_series(run: ManagerRun) -> tuple[list[float], list[float]]:
    """(times in s, GB held beyond what the running requests need) of a run's series:
    ``(held - needed) / 1e9`` per step point."""
    return ([p.t_s for p in run.series],
            [(p.held_bytes - p.needed_bytes) / 1e9 for p in run.series])


def _bar_panel(ax: Axes, spread: MetricSpread, names: list[str],
               colors: Mapping[str, str]) -> None:
    """One metric's bars (in the metric's unit), one per manager that has a value, in run
    order and the manager's color, labelled with their values; the best (and any within
    0.5 % of it) outlined in black; titled with the metric and its direction."""
    shown = [n for n in names if n in spread.values]
    values = [spread.values[n] for n in shown]
    bars = ax.bar(shown, values, color=[colors[n] for n in shown])
    best = spread.best()
    for bar, name in zip(bars, shown, strict=True):
        if name in best:
            bar.set_edgecolor("black")
            bar.set_linewidth(2.0)
    ax.bar_label(bars, labels=[spread.metric.fmt.format(v) for v in values], fontsize=8)
    ax.set_title(f"{spread.metric.label}\n{spread.metric.direction}", fontsize=9)
    ax.set_ylim(0, max(values) * 1.18 if max(values) > 0 else 1)
    ax.tick_params(axis="x", labelsize=8)


def _waste_panel(ax: Axes, drawn: Mapping[str, tuple[list[float], list[float]]],
                 colors: Mapping[str, str]) -> None:
    """Bytes held beyond need (GB, 1e9 B) over simulated time (s), one line per manager of
    ``drawn`` (:func:`waste_series`), in the manager's color."""
    for name, (t, gb) in drawn.items():
        ax.plot(t, gb, color=colors[name], lw=1, label=name)
    ax.set_title("GB held beyond what running requests need\nlower is better",
                 fontsize=9)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GB (1e9 B)")
    ax.legend(fontsize=7, loc="upper left", frameon=False)


def _notes(names: list[str], differing: list[MetricSpread], equal: list[MetricSpread],
           drawn: Mapping[str, object], cached: bool) -> list[str]:
    """The notes under the comparison: that nothing differs (if so), the metrics every
    manager shares with their value, the managers left out of the time panel, what the
    prefix cache leaves undrawn, and how to read the bars."""
    notes = []
    if not differing:
        notes.append("no metric differs by more than 1 % between the managers")
    if equal:
        notes.append("equal for every manager (within 1 %): " + "; ".join(
            f"{s.metric.label} {s.metric.fmt.format(next(iter(s.values.values())))}"
            for s in equal))
    left_out = [n for n in names if n not in drawn]
    if left_out and drawn:
        notes.append(f"held = needed throughout (not drawn): {', '.join(left_out)}")
    if cached:
        notes.append("prefix cache on: bytes held over time and allocation efficiency not "
                     "drawn (held bytes include cached prefixes, which are useful, not "
                     "waste)")
    notes.append("best bar outlined (with any within 0.5 % of it); U* = mean bytes needed "
                 "/ buffer over steps with requests waiting")
    return notes


def _place_notes(fig: Figure, notes: list[str], width: float, title: str) -> None:
    """Write ``notes`` (7 pt, wrapped to the figure's ``width`` in inches) under the panels
    and ``title`` (if any) above them, and lay the panels out in the space between."""
    # notes at 7 pt: about 17 characters per inch of width; wrapped here so the space
    # they take is known and kept clear of the panels' labels
    text = "\n".join(textwrap.fill(n, int(width * 17)) for n in notes)
    height = fig.get_figheight()
    bottom = (text.count("\n") + 1) * 7 * 1.35 / 72 + 0.15  # inches of notes
    # parse_math off: a model or trace name in the title (or a note) may hold "$", which
    # matplotlib would read as mathtext (a name such as "$\\frac$" failed the savefig)
    fig.text(0.01, 0.01, text, fontsize=7, va="bottom", parse_math=False)
    if title:
        fig.suptitle(textwrap.fill(title, int(width * 9)), fontsize=11, parse_math=False)
    top = 1 - (0.55 if title else 0.1) / height
    fig.tight_layout(rect=(0, bottom / height, 1, top))


def compare_plot(runs: Mapping[ManagerKind, ManagerRun], path: Path, *,
                 title: str = "") -> Path:
    """Write the comparison's PNG to ``path`` and return it.

    Panels: one bar chart per metric that differs between managers
    (:func:`metric_spread`), titled with its direction, bars labelled with their values and
    the best one (and any within 0.5 % of it) outlined in black; then, with the prefix
    cache off, bytes held beyond need (GB) over simulated time, one line per manager whose
    series is not all zero (lower is better). Under the figure:
    the metrics every manager shares, with their value, and the managers left out of the
    time panel. Every manager keeps its color in every panel.

    Raises:
        OSError: ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [str(k) for k in runs]
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    spreads = metric_spread(runs)
    differing = [s for s in spreads if s.differs][:6]
    equal = [s for s in spreads if not s.differs]
    cached = any(r.prefix_cache is not None for r in runs.values())
    # with the prefix cache on, held bytes include cached prefixes (useful, not waste)
    waste = {} if cached else {str(k): waste_series(r) for k, r in runs.items()}
    drawn = {k: v for k, v in waste.items() if any(abs(y) > 1e-9 for y in v[1])}
    panels = len(differing) + (1 if drawn else 0)
    cols = min(3, max(1, panels))
    rows = max(1, -(-panels // cols))
    width = max(5.2 * cols, 9.0)  # inches: room for the notes under a single panel
    fig, grid = plt.subplots(rows, cols, figsize=(width, 3.9 * rows + 1.6), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax, spread in zip(axes, differing, strict=False):
        _bar_panel(ax, spread, names, colors)
    if drawn:
        _waste_panel(axes[len(differing)], drawn, colors)
    for ax in axes[panels:]:
        ax.set_visible(False)
    notes = _notes(names, differing, equal, drawn, cached)
    _place_notes(fig, notes, width, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
