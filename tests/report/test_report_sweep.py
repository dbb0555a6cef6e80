"""Tests of kvchain.report.sweep: the sweep's PNGs say which way is better and keep equal
lines apart."""

from __future__ import annotations

from pathlib import Path

import pytest


def _rows() -> list[dict[str, object]]:
    """Two managers with identical results at two rates (one configuration): their lines
    lie on each other."""
    rows: list[dict[str, object]] = []
    for manager in ("kvchain", "fixed-pools"):
        for rate in (1.0, 2.0):
            rows.append({"model": "m", "gpu": "h100", "tp": 1, "trace": "t",
                         "mem_fraction": 0.9, "manager": manager, "offered_rate_rps": rate,
                         "output_tokens_per_s": 100 * rate, "ttft_p99_s": 0.5,
                         "tpot_p99_s": 0.02})
    return rows


def test_sweep_plot_says_which_way_is_better_and_styles_each_manager(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before: every axis said only its unit, and every manager was drawn with the same
    "o" markers and solid line, so the second of two equal lines hid the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvchain.report.sweep import plot_rows

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    paths = plot_rows(_rows(), tmp_path)
    assert [p.name for p in paths] == ["sweep-1.png"] and paths[0].stat().st_size > 10_000
    (figure,) = kept
    throughput, ttft, tpot = figure.axes[:3]
    assert throughput.get_ylabel() == "output tokens / s (higher is better)"
    assert ttft.get_ylabel() == "ms (lower is better)"
    assert tpot.get_ylabel() == "ms (lower is better)"
    for ax in (throughput, ttft, tpot):
        styles = [(line.get_label(), line.get_marker(), line.get_linestyle())
                  for line in ax.get_lines()]
        assert styles == [("kvchain", "o", "-"), ("fixed-pools", "s", "--")]
    plt.close(figure)
