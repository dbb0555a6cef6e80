"""compare.png draws what differs between managers, with a direction on every panel
(kvchain.report.compare)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvchain.baselines import ManagerKind
from kvchain.report.compare import COMPARE_METRICS, compare_plot, metric_spread
from kvchain.sim.compare import BytesPoint, ManagerRun
from kvchain.sim.metrics import MetricsRecorder, Percentiles, summarize
from kvchain.sim.prefix import PrefixCacheStats


def run(kind: ManagerKind, *, ttft_p99: float, tput: float, u_star: float,
        eff: float, retractions: int = 0, waste: int = 0,
        cache: PrefixCacheStats | None = None) -> ManagerRun:
    """A run with the given figures (a summary of an empty run, fields set by hand)."""
    base = summarize(MetricsRecorder())
    summary = replace(base, ttft=Percentiles(1.0, 1.5, ttft_p99, 10),
                      tpot=Percentiles(0.01, 0.02, 0.03, 10), output_tokens_per_s=tput,
                      retractions=retractions)
    series = tuple(BytesPoint(float(t), 100, 100 + waste) for t in range(3))
    return ManagerRun(kind, "rule", summary, u_star, eff, series, 1000, None, cache)


def spreads(runs):
    return {s.metric.label: s for s in metric_spread(runs)}


def test_only_what_differs_is_drawn_and_each_panel_has_a_direction():
    # the case: equal throughput, TTFT p99 2.7 s against 5.2 s for fixed pools
    runs = {ManagerKind.KVCHAIN: run(ManagerKind.KVCHAIN, ttft_p99=2.7, tput=956.0,
                                     u_star=0.64, eff=0.99),
            ManagerKind.FIXED_POOLS: run(ManagerKind.FIXED_POOLS, ttft_p99=5.2, tput=955.0,
                                         u_star=0.32, eff=0.99, waste=50)}
    by = spreads(runs)
    assert by["TTFT p99 (s)"].differs and by["TTFT p99 (s)"].best() == ["kvchain"]
    # 956 vs 955: 0.1 % apart, under the 1 % tolerance: equal, listed under the figure
    assert not by["output throughput (tokens/s)"].differs
    assert not by["allocation efficiency (% needed / held)"].differs
    assert by["U* (% of buffer needed while requests wait)"].best() == ["kvchain"]
    # all-zero series (retractions 0 and 0) and metrics no run has are left out
    assert "retractions" not in by and "memory-blocked U* (%)" not in by
    assert "prefix-cache hit rate (% of prompt tokens)" not in by
    for metric in COMPARE_METRICS:
        assert metric.direction in ("lower is better", "higher is better")
    lower = {m.label for m in COMPARE_METRICS if m.lower_is_better}
    assert lower == {"TTFT p99 (s)", "TTFT p50 (s)", "TPOT p99 (ms)", "retractions"}


def test_ties_are_outlined_together_and_cache_skews_are_not_drawn(tmp_path: Path):
    cache = PrefixCacheStats(interval_tokens=512)
    runs = {k: run(k, ttft_p99=3.0 if k is ManagerKind.FIXED_POOLS else 2.0, tput=100.0,
                   u_star=0.5, eff=0.3 if k is ManagerKind.KVCHAIN else 0.4, cache=cache)
            for k in (ManagerKind.KVCHAIN, ManagerKind.FIXED_POOLS, ManagerKind.IDEAL)}
    by = spreads(runs)
    assert by["TTFT p99 (s)"].best() == ["kvchain", "ideal"]
    # with the prefix cache on, held bytes include cached prefixes: a manager that caches
    # less would look "more efficient", so efficiency is not drawn
    assert "allocation efficiency (% needed / held)" not in by
    path = compare_plot(runs, tmp_path / "c.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
