"""PNG plots of a simulation (matplotlib, Agg canvas: no display, no pyplot state).

- :func:`band_chart`: the chain moving. x = simulated time (s), y = byte offset in the KV
  buffer; each band's span ``[lo, hi)`` is a filled area over time (pale = holes), its
  live bytes packed toward the band's anchor (bottom for a LOW END, top for a HIGH END,
  the low edge for the FLOAT band) and split by owner: requests' pages (solid), prefix-
  cache pages locked by a running hit (cross-hatched) and evictable (hatched); white =
  free gaps.
- :func:`utilization_chart`: the KV buffer by owner over time (% of its bytes, stacked; the
  owners of :mod:`kvchain.sim.metrics`, the top of the stack everything held) and the
  running / waiting queues.
- :func:`latency_cdfs`: empirical CDFs of TTFT and TPOT (ms, log x) of finished requests.
- :func:`write_all_plots`: the three of them for a recorder, into a folder.

Every step sample is the state at the end of its step, the interval ``(t_s - duration_s,
t_s]``, so areas and lines are steps drawn ``where="post"`` from each step's start: a
sample's value holds over its own step and then over the idle gap up to the next step's
start (the state a step leaves lasts until the next step runs), never back over the gap
before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator
from numpy.typing import ArrayLike

from kvchain.errors import ConfigError
from kvchain.layout import Anchor
from kvchain.sim.metrics import MetricsRecorder, RequestRecord, StepSample, StepTotals

_BAND_COLORS = {
    "state": "#7b5ea7",
    "window": "#2a9d8f",
    "local": "#e9a23b",
    "full": "#e76f51",
}
_OTHER_COLORS = ("#457b9d", "#8d6e63", "#6a994e", "#bc4749")
_DPI = 120
_MIN_LOG_MS = 1e-3  # TTFT/TPOT below 1 us are drawn at 1 us on the log axis


def _byte_unit(total_bytes: int) -> tuple[float, str]:
    """Divisor and name of a decimal byte unit that keeps the axis between 1 and 1000."""
    for divisor, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if total_bytes >= divisor:
            return divisor, name
    return 1.0, "B"


def _new_figure(width: float, height: float, rows: int = 1) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return figure, list(axes)


def _save(figure: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=_DPI)
    return out


def _empty_note(axes: Axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="gray")


def _step_times(samples: Sequence[StepSample]) -> np.ndarray:
    """Each step's start (``t_s - duration_s``), then the last step's end, for ``"post"``
    drawing: a value holds from its step's start to the next step's start (its step, then
    the idle gap after it, when the step left the GPU idle). E.g. steps ending at 0.2636 s
    (running 0) and 0.5204 s (running 1, 0.01 s long): running is 0 up to 0.5104 s."""
    starts = np.array([s.t_s - s.duration_s for s in samples], dtype=np.float64)
    return np.concatenate((starts, [samples[-1].t_s]))


def _held(values: np.ndarray) -> np.ndarray:
    """``values`` with the last one repeated, to match :func:`_step_times`."""
    return np.concatenate((values, values[-1:]))


_BAND_FIELDS = ("lo", "hi", "live", "request", "locked", "evictable")


def _band_series(
    samples: Sequence[StepSample],
) -> dict[str, dict[str, np.ndarray]]:
    """Per band label: arrays of bytes (NaN where a sample lacks the band): ``lo``, ``hi``,
    ``live``, and the owners of the live bytes: ``request`` (requests' own pages plus the
    null page; ``live - cached`` when a sample did not count requests), ``locked`` (cached,
    locked by a running request: its hit, or its own prompt's pages cached as it prefills) and
    ``evictable`` (cached, unlocked); ``request + locked + evictable == live`` whenever the
    sample's owners add up."""
    labels = list(dict.fromkeys(b.label for s in samples for b in s.bands))
    series = {
        label: {k: np.full(len(samples), np.nan) for k in _BAND_FIELDS} for label in labels
    }
    for i, sample in enumerate(samples):
        for band in sample.bands:
            arrays = series[band.label]
            arrays["lo"][i] = band.lo
            arrays["hi"][i] = band.hi
            arrays["live"][i] = band.live_bytes
            cached = band.cached_bytes
            arrays["request"][i] = max(0, band.live_bytes - cached
                                       if band.request_bytes is None
                                       else band.request_bytes + band.reserved_bytes)
            evictable = min(band.evictable_bytes, cached)  # sources that disagree: clip
            arrays["locked"][i] = cached - evictable
            arrays["evictable"][i] = evictable
    return {label: {k: _held(v) for k, v in arrays.items()} for label, arrays in series.items()}


def _anchor_of(label: str, samples: Sequence[StepSample], buffer_bytes: int) -> Anchor:
    """The band's anchor as sampled, or inferred: LOW if it always starts at byte 0, HIGH if
    it always ends at the buffer's end, FLOAT otherwise."""
    bands = [b for s in samples for b in s.bands if b.label == label]
    for band in bands:
        if band.anchor is not None:
            return band.anchor
    if all(b.lo == 0 for b in bands):
        return Anchor.LOW
    if all(b.hi == buffer_bytes for b in bands):
        return Anchor.HIGH
    return Anchor.FLOAT


def _color(label: str, index: int) -> str:
    return _BAND_COLORS.get(label, _OTHER_COLORS[index % len(_OTHER_COLORS)])


# How each owner of a band's bytes is shaded (alpha, hatch), packed from the band's anchor
# outward in this order; the rest of the span up to the far frontier is holes.
_LAYERS = (
    ("request", 0.92, None, "requests' pages (in use by running requests)"),
    ("locked", 0.62, "xx", "prefix cache, locked (read by running requests)"),
    ("evictable", 0.42, "///", "prefix cache, evictable (unlocked: LRU eviction frees it)"),
)
_HOLE_ALPHA = 0.14


def _shade(color: str, alpha: float, hatch: str | None) -> dict[str, Any]:
    """Fill keywords of one owner's shade (a band chart layer or key, a utilization area):
    ``color`` at ``alpha``, hatched in translucent white, no outline."""
    return {"facecolor": to_rgba(color, alpha), "edgecolor": to_rgba("white", 0.7),
            "hatch": hatch, "linewidth": 0}


def _draw_band(axes: Axes, times: np.ndarray, arrays: Mapping[str, np.ndarray],
               anchor: Anchor, color: str, divisor: float) -> set[str]:
    """Draw one band of :func:`band_chart` (``arrays`` from :func:`_band_series`, bytes;
    drawn in ``divisor`` units): its span pale (holes), its owners' bytes stacked from
    ``anchor`` outward, its frontiers as thin lines. Returns the owner keys it drew."""
    lo, hi = arrays["lo"], arrays["hi"]
    present = ~np.isnan(lo)
    axes.fill_between(
        times, lo / divisor, hi / divisor, where=present, step="post",
        color=color, alpha=_HOLE_ALPHA, linewidth=0,
    )  # fmt: skip
    drawn: set[str] = set()
    done = np.zeros_like(lo)  # bytes stacked so far from the anchor
    for key, alpha, hatch, _ in _LAYERS:
        size = np.nan_to_num(arrays[key])
        if anchor is Anchor.HIGH:
            y0, y1 = hi - done - size, hi - done
        else:
            y0, y1 = lo + done, lo + done + size
        done = done + size
        if not np.any(size > 0):
            continue
        drawn.add(key)
        axes.fill_between(times, y0 / divisor, y1 / divisor, where=present, step="post",
                          **_shade(color, alpha, hatch))
    for edge in (lo, hi):  # frontiers as thin lines, so touching bands stay apart
        axes.step(times, edge / divisor, where="post", color=color, linewidth=0.7)
    return drawn


def _owner_keys(drawn: set[str]) -> list[Artist]:
    """Legend keys of the owner layers in ``drawn``, then the holes' key, in shades of gray
    (each band draws them in its own color)."""
    gray = "#555555"
    keys: list[Artist] = [Patch(**_shade(gray, alpha, hatch), label=text)
                          for key, alpha, hatch, text in _LAYERS if key in drawn]
    keys.append(Patch(facecolor=to_rgba(gray, _HOLE_ALPHA), linewidth=0,
                      label="holes (free pages inside a band's span)"))
    return keys


def _finish_band_axes(axes: Axes, times: np.ndarray, top: float,
                      handles: list[Artist]) -> None:
    """The band chart's frame: lines at 0 and at the buffer's end (``top``, in the y axis's
    unit), x limits from the first step's start to the last step's end (s), the legend
    (``handles``) and the note on shades, outside the axes on the right."""
    axes.axhline(top, color="black", linewidth=0.8)
    axes.axhline(0, color="black", linewidth=0.8)
    start = float(times[0])
    axes.set_xlim(start, float(times[-1]) if times[-1] > start else start + 1)
    axes.margins(x=0)
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                fontsize="small", frameon=False)
    axes.text(
        1.01, 0.0, "white: free gap between bands\nshades (in each band's color) stack\n"
        "byte totals from each band's anchor", transform=axes.transAxes, fontsize="small",
        color="gray", va="bottom",
    )  # fmt: skip
    axes.grid(axis="y", alpha=0.25)


# bands.png's title; ``owners`` names who holds the bytes drawn.
_BAND_TITLE = "KV buffer over time: each band's pages by owner ({owners})"


def band_chart(samples: Sequence[StepSample], buffer_bytes: int, path: str | Path) -> Path:
    """Draw the bands of the chain over time, with who owns their bytes, and save a PNG.

    x = simulated time (s), y = byte offset in the KV buffer. Per band (one color each):
    from the band's anchor outward (the bottom for a LOW END band, the top for a HIGH END
    band, the low edge for the FLOAT band), requests' own pages (solid), the prefix cache's
    pages locked by running requests (their hits and their own prompts' pages, cached
    chunk by chunk as they prefill; cross-hatched), the cache's evictable
    (unlocked) pages (hatched, lighter), then the band's holes up to its far frontier
    (pale); white = free gaps between bands. Pages of the three owners interleave in the
    real band: the chart stacks their byte totals (:class:`~kvchain.sim.metrics.BandSample`
    ``request_bytes``, ``cached_bytes``, ``evictable_bytes``), it does not draw positions.
    Frontiers are thin lines.

    Args:
        samples: step samples in time order (e.g. ``recorder.step_samples``).
        buffer_bytes: bytes of the KV buffer (the y axis runs from 0 to it).
        path: the PNG file to write (folders created).

    Returns:
        ``path`` as a Path.

    Raises:
        ConfigError: ``buffer_bytes <= 0``.
    """
    if buffer_bytes <= 0:
        raise ConfigError(f"buffer_bytes must be > 0, got {buffer_bytes}")
    divisor, unit = _byte_unit(buffer_bytes)
    figure, (axes,) = _new_figure(11, 5.5)
    axes.set_title(_BAND_TITLE.format(owners="requests; no prefix cache in this run"))
    axes.set_xlabel("simulated time (s)")
    axes.set_ylabel(f"byte offset in the KV buffer ({unit})")
    axes.set_ylim(0, buffer_bytes / divisor)
    if not samples:
        _empty_note(axes, "no steps recorded")
        return _save(figure, path)
    times = _step_times(samples)
    handles: list[Artist] = []
    drawn: set[str] = set()  # owner layers with any bytes (a run without a cache: no keys)
    for index, (label, arrays) in enumerate(_band_series(samples).items()):
        color = _color(label, index)
        anchor = _anchor_of(label, samples, buffer_bytes)
        drawn |= _draw_band(axes, times, arrays, anchor, color, divisor)
        handles.append(Patch(facecolor=to_rgba(color, 0.92),
                             label=f"{label} band ({anchor.value} anchored)"))
    if drawn - {"request"}:  # the title names the prefix cache only where it holds bytes
        axes.set_title(_BAND_TITLE.format(owners="requests, prefix cache"))
    handles.extend(_owner_keys(drawn))
    _finish_band_axes(axes, times, buffer_bytes / divisor, handles)
    return _save(figure, path)


def _mean_peak_text(mean: float, peak: float) -> str:
    """``"mean 5.1 %, peak 12.0 %"`` of two fractions of the buffer."""
    return f"mean {100 * mean:.1f} %, peak {100 * peak:.1f} %"


# The owners of the held bytes, stacked from 0 % upward in this order: (StepSample
# attribute, color, hatch, legend text, the StepTotals share behind its mean and peak).
_SHARES = (
    ("request_bytes", "#e76f51", None, "requests' own pages", "requests"),
    ("locked_bytes", "#2a9d8f", "xx", "prefix cache, locked by running requests",
     "cache_locked"),
    ("evictable_bytes", "#8ecae6", "///", "prefix cache, evictable (eviction frees it)",
     "cache_evictable"),
)


def _bytes_axis(axes: Axes, buffer_bytes: int) -> None:
    """The right axis of the utilization panel: its % of the buffer in bytes (a decimal
    unit, :func:`_byte_unit`), labelled with the buffer's size."""
    divisor, unit = _byte_unit(buffer_bytes)
    scale = buffer_bytes / divisor / 100  # % of the buffer -> the byte unit

    def to_bytes(percent: ArrayLike) -> ArrayLike:
        return np.asarray(percent, dtype=np.float64) * scale

    def to_percent(size: ArrayLike) -> ArrayLike:
        return np.asarray(size, dtype=np.float64) / scale

    right = axes.secondary_yaxis("right", functions=(to_bytes, to_percent))
    right.set_ylabel(f"{unit} (buffer {buffer_bytes / divisor:,.2f} {unit})")


def _owner_stack(axes: Axes, times: np.ndarray, samples: Sequence[StepSample],
                 totals: StepTotals | None, cached_run: bool) -> None:
    """The owners of the held bytes as stacked areas (% of the buffer, :data:`_SHARES`
    order; the requests' only when ``cached_run`` is false), each legend entry with its
    share's mean and peak when ``totals`` has them."""
    base = np.zeros(len(times))
    for attribute, color, hatch, text, share in _SHARES:
        if not cached_run and attribute != "request_bytes":
            continue
        part = _held(np.array([100 * getattr(s, attribute) / s.buffer_bytes
                               for s in samples]))
        if totals is not None:
            summary = getattr(totals, share)
            mean = summary.mean(totals)
            if mean is not None and summary.peak is not None:
                text = f"{text}: {_mean_peak_text(mean, summary.peak)}"
        axes.fill_between(times, base, base + part, step="post",
                          **_shade(color, 0.8, hatch), label=text)
        base = base + part


def _held_lines(axes: Axes, times: np.ndarray, samples: Sequence[StepSample],
                totals: StepTotals | None, cached_run: bool) -> None:
    """Every held byte (% of the buffer, black; its mean and peak from ``totals`` when
    given), then the needed bytes (%, dashed) when the samples carry them."""
    held = "held (requests + cache)" if cached_run else "held (requests only)"
    if totals is not None and totals.mean_utilization is not None \
            and totals.peak_utilization is not None:
        held = f"{held}: {_mean_peak_text(totals.mean_utilization, totals.peak_utilization)}"
    axes.step(times, _held(np.array([100 * s.utilization for s in samples])), where="post",
              color="black", linewidth=0.8, label=held)
    if any(s.needed_bytes is not None for s in samples):
        needed = _held(
            np.array(
                [
                    np.nan if s.needed_bytes is None else 100 * s.needed_bytes / s.buffer_bytes
                    for s in samples
                ]
            )
        )
        axes.step(
            times, needed, where="post", color="#264653", linestyle="--",
            label="needed (bytes the live requests need)",
        )  # fmt: skip


def _queue_panel(axes: Axes, times: np.ndarray, samples: Sequence[StepSample]) -> None:
    """The running and waiting requests over time (counts, integer ticks), with a legend."""
    running = _held(np.array([s.running for s in samples]))
    waiting = _held(np.array([s.waiting for s in samples]))
    axes.step(times, running, where="post", color="#2a9d8f", label="running (in the batch)")
    axes.step(times, waiting, where="post", color="#7b5ea7", label="waiting (queued)")
    axes.set_ylim(0, 1.1 * max(1, int(running.max()), int(waiting.max())))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # request counts
    axes.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize="small",
                frameon=False)
    axes.grid(alpha=0.25)


def utilization_chart(samples: Sequence[StepSample], path: str | Path, *,
                      totals: StepTotals | None = None) -> Path:
    """Draw the KV buffer by owner and the queue lengths over time (two panels), save a PNG.

    Top: stacked areas in % of the buffer's bytes (left axis; the right axis in bytes):
    requests' own pages (``StepSample.request_bytes``), the prefix cache's pages locked by
    running requests (``locked_bytes``) and its evictable pages (``evictable_bytes``); the
    top of the stack is every held byte (``used_bytes``, the summary's "KV held"). A run
    without a prefix cache draws the requests' area only and says so. The needed bytes
    (% of the buffer) are a dashed line when the samples carry them. Bottom: running and
    waiting requests.

    Args:
        samples: step samples in time order (the kept ones: they draw the curves).
        path: the PNG file to write.
        totals: the recorder's exact totals over every step: when given, each legend entry
            quotes its share's time-weighted mean and peak (the summary's numbers), and
            ``totals.prefix_cache`` says whether the run had a cache; without them a run
            is drawn as cached when a sample holds cached bytes.

    Returns:
        ``path`` as a Path.
    """
    figure, (top, bottom) = _new_figure(11, 6, rows=2)
    top.set_title("KV buffer by owner, and queues, over time")
    top.set_ylabel("KV buffer held (% of its bytes)")
    bottom.set_ylabel("requests")
    bottom.set_xlabel("simulated time (s)")
    top.set_ylim(0, 105)
    if not samples:
        _empty_note(top, "no steps recorded")
        return _save(figure, path)
    _bytes_axis(top, samples[-1].buffer_bytes)
    cached_run = (totals.prefix_cache if totals is not None
                  else any(s.cached_bytes for s in samples))
    times = _step_times(samples)
    _owner_stack(top, times, samples, totals, cached_run)
    _held_lines(top, times, samples, totals, cached_run)
    top.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize="small", frameon=False)
    if not cached_run:
        top.text(1.08, 0.0, "no prefix cache in this run:\nevery held page is a request's",
                 transform=top.transAxes, fontsize="small", color="gray", va="bottom")
    top.grid(alpha=0.25)
    _queue_panel(bottom, times, samples)
    return _save(figure, path)


def _plain_log_ticks(axes: Axes, low: float, high: float) -> None:
    """Tick labels as plain numbers (20, 50, 100), not 2x10^1; minor ticks at 2 and 5 are
    labelled too when the data spans less than two decades."""
    axes.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    label_minor = high / low < 100

    def minor(value: float, _: int) -> str:
        leading = round(value / 10 ** np.floor(np.log10(value)))
        return f"{value:,.10g}" if label_minor and leading in (2, 5) else ""

    axes.xaxis.set_minor_formatter(FuncFormatter(minor))


def _cdf_panel(axes: Axes, values_s: list[float], name: str) -> None:
    axes.set_title(f"{name} CDF")
    axes.set_xlabel(f"{name} (ms, log scale)")
    axes.set_ylabel("fraction of requests")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.25, which="both")
    if not values_s:
        _empty_note(axes, "no finished requests")
        return
    values_ms = np.maximum(np.sort(np.asarray(values_s)) * 1000, _MIN_LOG_MS)
    fractions = np.arange(1, len(values_ms) + 1) / len(values_ms)
    axes.step(
        values_ms, fractions, where="post", color="#264653", label=f"{len(values_ms)} requests"
    )
    axes.set_xscale("log")
    _plain_log_ticks(axes, float(values_ms[0]), float(values_ms[-1]))
    for q, style in ((50, ":"), (99, "--")):
        x = float(np.percentile(values_ms, q))
        axes.axvline(x, color="#e76f51", linestyle=style, label=f"p{q} = {x:,.1f} ms")
    axes.legend(loc="lower right", fontsize="small")


def latency_cdfs(records: Sequence[RequestRecord], path: str | Path) -> Path:
    """Draw the CDFs of TTFT and TPOT (ms, log x) of finished requests and save a PNG.

    TPOT only counts requests with more than one output token; values below 1 us are drawn
    at 1 us (log axis). p50 and p99 are marked (numpy linear percentiles).

    Args:
        records: request records (unfinished ones are skipped).
        path: the PNG file to write.

    Returns:
        ``path`` as a Path.
    """
    finished = [r for r in records if r.finished_s is not None]
    ttft = [r.ttft_s for r in finished if r.ttft_s is not None]
    tpot = [r.tpot_s for r in finished if r.tpot_s is not None]
    figure = Figure(figsize=(11, 4.5), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    figure.suptitle("Latency of finished requests")
    _cdf_panel(left, ttft, "TTFT")
    _cdf_panel(right, tpot, "TPOT")
    return _save(figure, path)


PLOT_FILES = ("bands.png", "utilization.png", "latency_cdf.png")
"""File names :func:`write_all_plots` writes, in order."""


def write_all_plots(recorder: MetricsRecorder, out_dir: str | Path) -> list[Path]:
    """Write the band chart, the utilization chart and the latency CDFs into ``out_dir``.

    The band and utilization charts need step samples; without any step only the latency
    CDFs are written. The buffer size is taken from the last step sample.

    Returns:
        the written files, in the order of :data:`PLOT_FILES`.
    """
    directory = Path(out_dir)
    samples = recorder.step_samples
    written: list[Path] = []
    if samples:
        written.append(band_chart(samples, samples[-1].buffer_bytes, directory / PLOT_FILES[0]))
        written.append(utilization_chart(samples, directory / PLOT_FILES[1],
                                         totals=recorder.step_totals))
    written.append(latency_cdfs(recorder.records, directory / PLOT_FILES[2]))
    return written


def hit_rate_chart(timeline: Sequence[tuple[float, int, int]], path: str | Path,
                   bounds: Mapping[str, float] | None = None) -> Path:
    """The prefix cache's hit rate over time: cumulative hit tokens / prompt tokens of the
    requests admitted so far (%), against simulated seconds, with the run's bounds as
    dashed lines (``PrefixCacheStats.bounds``: infinite cache, LRU of the buffer).

    Args:
        timeline: ``(t_s, prompt_tokens, hit_tokens)`` cumulative samples
            (:class:`kvchain.sim.prefix.PrefixCacheStats`).
        path: the PNG to write.
        bounds: name -> hit rate (a fraction) of each bound to draw.
    """
    figure, (axes,) = _new_figure(8.0, 3.2)
    if not timeline:
        _empty_note(axes, "no request admitted")
    else:
        t = np.asarray([s[0] for s in timeline])
        prompt = np.asarray([s[1] for s in timeline], dtype=float)
        hit = np.asarray([s[2] for s in timeline], dtype=float)
        axes.step(t, 100 * hit / np.maximum(prompt, 1), where="post", color="#e76f51",
                  label=f"this run ({100 * hit[-1] / max(prompt[-1], 1):.2f}% at the end)")
        for (name, rate), color in zip((bounds or {}).items(), ("#264653", "#2a9d8f"),
                                       strict=False):
            axes.axhline(100 * rate, linestyle="--", color=color,
                         label=f"{name} bound ({100 * rate:.2f}%)")
        axes.set_ylim(bottom=0)
        axes.legend(loc="best", fontsize="small")
    axes.set_xlabel("simulated time (s)")
    axes.set_ylabel("hit rate (% of prompt tokens)")
    axes.set_title("prefix-cache hit rate, cumulative")
    return _save(figure, path)


def host_chart(timeline: Sequence[tuple[float, Sequence[int]]], labels: Sequence[str],
               slot_bytes: Sequence[int], slots: Sequence[int], path: str | Path) -> Path:
    """The host tier's occupancy over time: bytes held per class (stacked), against the
    bytes of every slot of the tier (dashed), per simulated second.

    Args:
        timeline: ``(t_s, slots held per band)`` samples
            (:attr:`kvchain.sim.prefix.PrefixCacheStats.host_timeline`).
        labels: the bands' labels (chain order).
        slot_bytes: bytes of one host slot per band.
        slots: host slots per band (the tier's split).
        path: the PNG to write.
    """
    figure, (axes,) = _new_figure(8.0, 3.2)
    capacity = sum(n * b for n, b in zip(slots, slot_bytes, strict=True))
    scale, unit = _byte_unit(max(capacity, 1))
    if not timeline:
        _empty_note(axes, "the host tier held nothing")
    else:
        t = np.asarray([s[0] for s in timeline])
        held = np.asarray([list(s[1]) for s in timeline], dtype=float)
        layers = [held[:, b] * slot_bytes[b] / scale for b in range(len(labels))]
        axes.stackplot(t, *layers, step="post",
                       labels=[f"{lab} ({n:,} slots)" for lab, n in
                               zip(labels, slots, strict=True)],
                       colors=[_color(lab, i) for i, lab in enumerate(labels)], alpha=0.8)
        axes.axhline(capacity / scale, linestyle="--", color="#264653",
                     label=f"host tier ({capacity / scale:,.1f} {unit})")
        axes.set_ylim(bottom=0)
        axes.legend(loc="best", fontsize="small")
    axes.set_xlabel("simulated time (s)")
    axes.set_ylabel(f"host bytes held ({unit})")
    axes.set_title("host tier occupancy by class")
    return _save(figure, path)
