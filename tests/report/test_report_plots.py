"""Tests of kvchain.report.plots: PNG files of a small synthetic run."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kvchain.errors import ConfigError
from kvchain.layout import Anchor
from kvchain.report.plots import PLOT_FILES, band_chart, latency_cdfs, write_all_plots
from kvchain.sim.metrics import BandSample, MetricsRecorder, StepSample

BUFFER = 8 * 10**9
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def small_run() -> MetricsRecorder:
    rec = MetricsRecorder(max_step_samples=16)
    for rid in range(6):
        rec.on_arrival(rid, 0.1 * rid, prompt_tokens=100, output_tokens=4)
    t = 0.0
    for i in range(40):
        t += 0.05
        state_hi = 10**9 + i * 10**7
        full_lo = 6 * 10**9 - i * 5 * 10**7
        bands = (
            BandSample("state", 0, state_hi, state_hi // 2, state_hi // 4, Anchor.LOW),
            BandSample("window", state_hi + 10**8, state_hi + 6 * 10**8, 4 * 10**8, 0),
            BandSample("full", full_lo, BUFFER, (BUFFER - full_lo) // 2, 0, Anchor.HIGH),
        )
        used = state_hi // 2 + 4 * 10**8 + (BUFFER - full_lo) // 2
        rec.on_step(StepSample(t, 0.05, 64, 6, 6, max(0, 5 - i), bands, BUFFER, used))
    for rid in range(6):
        rec.on_admitted(rid, 0.1 * rid + 0.01)
        rec.on_first_token(rid, 0.1 * rid + 0.05 * (rid + 1))
        rec.on_token(rid, 1.5, 3)
        rec.on_finished(rid, 1.5 + 0.01 * rid)
    return rec


def test_write_all_plots_creates_pngs(tmp_path: Path) -> None:
    written = write_all_plots(small_run(), tmp_path / "plots")
    assert [p.name for p in written] == list(PLOT_FILES)
    for path in written:
        assert path.stat().st_size > 10_000  # axes, text and areas, not a blank canvas
    # 120 dpi: bands 11 x 5.5 in, utilization 11 x 6 in, CDFs 11 x 4.5 in
    assert [png_size(p) for p in written] == [(1320, 660), (1320, 720), (1320, 540)]


def test_plots_without_steps_or_finished_requests(tmp_path: Path) -> None:
    rec = MetricsRecorder()
    rec.on_arrival(0, 0.0, prompt_tokens=5, output_tokens=5)
    written = write_all_plots(rec, tmp_path)
    assert [p.name for p in written] == ["latency_cdf.png"]
    assert png_size(written[0]) == (1320, 540)
    empty = band_chart([], 1_000, tmp_path / "empty_bands.png")
    assert empty.stat().st_size > 0
    assert latency_cdfs([], tmp_path / "sub" / "cdf.png").is_file()
    with pytest.raises(ConfigError, match="buffer_bytes"):
        band_chart([], 0, tmp_path / "x.png")


def _legend_of_band_chart(samples, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    import kvchain.report.plots as plots

    seen = {}
    real = plots._save

    def keep(figure, path):  # type: ignore[no-untyped-def]
        seen["figure"] = figure
        return real(figure, path)

    monkeypatch.setattr(plots, "_save", keep)
    band_chart(samples, BUFFER, tmp_path / "bands.png")
    (axes,) = seen["figure"].axes
    seen_title.append(axes.get_title())
    return [t.get_text() for t in axes.get_legend().get_texts()]


seen_title: list[str] = []  # the titles _legend_of_band_chart drew, in order


def _all_cached_evictable(samples):  # type: ignore[no-untyped-def]
    """The same steps with every live byte the prefix cache's, evictable."""
    return [StepSample(s.t_s, s.duration_s, s.prefill_tokens, s.decode_tokens, s.running,
                       s.waiting, tuple(
                           BandSample(b.label, b.lo, b.hi, b.live_bytes, b.hole_bytes,
                                      b.anchor, cached_bytes=b.live_bytes,
                                      evictable_bytes=b.live_bytes, request_bytes=0)
                           for b in s.bands), s.buffer_bytes, s.used_bytes)
            for s in samples]


def test_band_chart_keys_only_the_owners_it_draws(monkeypatch, tmp_path: Path) -> None:
    """A run without a prefix cache (no cached bytes) lists no prefix-cache keys (a newcomer
    read "prefix cache, locked" on a --no-prefix-cache chart); one with evictable cached
    pages lists that key and still not the locked one it never drew."""
    samples = small_run().step_samples
    texts = _legend_of_band_chart(samples, monkeypatch, tmp_path)
    assert not any("prefix cache" in t for t in texts)
    assert any(t.startswith("holes") for t in texts)
    cached = _all_cached_evictable(samples)
    texts = _legend_of_band_chart(cached, monkeypatch, tmp_path)
    assert any(t.startswith("prefix cache, evictable") for t in texts)
    assert not any(t.startswith("prefix cache, locked") for t in texts)


def test_band_chart_title_names_the_prefix_cache_only_when_it_holds_bytes(
        monkeypatch, tmp_path: Path) -> None:
    """The title said "(requests, prefix cache)" on a run without a cache."""
    seen_title.clear()
    samples = small_run().step_samples
    _legend_of_band_chart(samples, monkeypatch, tmp_path)
    cached = _all_cached_evictable(samples)
    _legend_of_band_chart(cached, monkeypatch, tmp_path)
    assert seen_title == [
        "KV buffer over time: each band's pages by owner (requests; no prefix cache in this run)",
        "KV buffer over time: each band's pages by owner (requests, prefix cache)"]


def _utilization_figure(monkeypatch: pytest.MonkeyPatch, draw):  # type: ignore[no-untyped-def]
    import kvchain.report.plots as plots

    seen = {}
    real = plots._save

    def keep(figure, path):  # type: ignore[no-untyped-def]
        seen["figure"] = figure
        return real(figure, path)

    monkeypatch.setattr(plots, "_save", keep)
    draw()
    return seen["figure"]


def owner_steps(cached: bool) -> MetricsRecorder:
    """Two steps in a 100 B buffer: requests 10 B + cache 40 B (30 evictable) for 1 s, then
    requests 30 B + cache 20 B (locked) for 3 s; without the cache every held byte is the
    requests'. Exact shares (time-weighted): requests (10 + 90) / 400 = 25 %, locked
    (10 + 60) / 400 = 17.5 %, evictable 30 / 400 = 7.5 %, held 50 %."""
    rec = MetricsRecorder(prefix_cache=cached)
    for t, d, request, held, evictable in ((1.0, 1.0, 10, 50, 30), (4.0, 3.0, 30, 50, 0)):
        own = request if cached else held
        band = BandSample("full", 50, 100, held, 0, Anchor.HIGH, request_bytes=own,
                          cached_bytes=held - own, evictable_bytes=evictable if cached else 0)
        rec.on_step(StepSample(t, d, 0, 1, 1, 0, (band,), 100, held))
    return rec


def test_utilization_chart_stacks_requests_apart_from_the_cache(monkeypatch,
                                                                tmp_path: Path) -> None:
    from kvchain.report.plots import utilization_chart

    rec = owner_steps(cached=True)
    figure = _utilization_figure(monkeypatch, lambda: utilization_chart(
        rec.step_samples, tmp_path / "u.png", totals=rec.step_totals))
    top = figure.axes[0]
    texts = [t.get_text() for t in top.get_legend().get_texts()]
    assert texts == [
        "requests' own pages: mean 25.0 %, peak 30.0 %",
        "prefix cache, locked by running requests: mean 17.5 %, peak 20.0 %",
        "prefix cache, evictable (eviction frees it): mean 7.5 %, peak 30.0 %",
        "held (requests + cache): mean 50.0 %, peak 50.0 %",
    ]
    assert top.get_ylabel() == "KV buffer held (% of its bytes)"
    # the stack's layers end at requests, requests + locked, requests + locked + evictable:
    # the second step (its value held over (1, 4] s) reaches 30, 50 and 50 %
    tops = [float(np.max(c.get_paths()[0].vertices[:, 1])) for c in top.collections]
    assert tops == pytest.approx([30.0, 50.0, 50.0])


def test_utilization_chart_without_a_cache_says_so(monkeypatch, tmp_path: Path) -> None:
    from kvchain.report.plots import utilization_chart

    rec = owner_steps(cached=False)
    figure = _utilization_figure(monkeypatch, lambda: utilization_chart(
        rec.step_samples, tmp_path / "u.png", totals=rec.step_totals))
    top = figure.axes[0]
    texts = [t.get_text() for t in top.get_legend().get_texts()]
    assert texts == ["requests' own pages: mean 50.0 %, peak 50.0 %",
                     "held (requests only): mean 50.0 %, peak 50.0 %"]
    assert any("no prefix cache in this run" in t.get_text() for t in top.texts)


def _value_at(line, x: float) -> float:  # type: ignore[no-untyped-def]
    """The value a step line (``where="post"``) draws at ``x``."""
    assert line.get_drawstyle() == "steps-post"
    xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    return float(ys[np.searchsorted(xs, x, side="right") - 1])


def test_idle_gaps_are_drawn_idle(monkeypatch, tmp_path: Path) -> None:
    """A step (0.2536, 0.2636] s that ends with nothing running (its request finished), the
    GPU idle until the next arrival, then a step (0.5104, 0.5204] s that ends with one
    running. Each sample is the state at the end of its step, and that state lasts until the
    next step starts: running is 0 over the idle gap (0.2636, 0.5104) and 1 over the second
    step. Before, each value was held back to the previous sample's end, drawing one running
    request (and its 40 % of the buffer) across the whole gap."""
    from kvchain.report.plots import utilization_chart

    rec = MetricsRecorder()
    for t, running, held in ((0.2636, 0, 0), (0.5204, 1, 40)):
        band = BandSample("full", 0, 100, held, 0, Anchor.LOW, request_bytes=held)
        rec.on_step(StepSample(t, 0.01, 0, running, running, 0, (band,), 100, held))
    figure = _utilization_figure(monkeypatch, lambda: utilization_chart(
        rec.step_samples, tmp_path / "u.png", totals=rec.step_totals))
    top, bottom = figure.axes[0], figure.axes[1]
    running_line = next(line for line in bottom.get_lines()
                        if line.get_label().startswith("running"))
    assert _value_at(running_line, 0.26) == 0   # the first step
    assert _value_at(running_line, 0.40) == 0   # the idle gap
    assert _value_at(running_line, 0.515) == 1  # the second step
    held_line = next(line for line in top.get_lines() if line.get_label().startswith("held"))
    assert _value_at(held_line, 0.40) == 0 and _value_at(held_line, 0.515) == 40
    assert float(running_line.get_xdata()[0]) == pytest.approx(0.2536)  # the first start
    assert float(running_line.get_xdata()[-1]) == pytest.approx(0.5204)  # the last end
