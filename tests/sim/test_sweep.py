"""Sweep grids, point keys, SLO parsing and the rate bisection (hand-computed answers)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sim.cost import GPUCostModel
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.run_options import RunOptions
from kvchain.sim.sweep import (
    SLO,
    SweepConfigError,
    SweepGrid,
    SweepPoint,
    bisect_rate,
    gpus_needed,
    load_grid_file,
    parse_slo,
    point_trace,
    run_point,
    run_slo_search,
    slo_tasks,
    summary_row,
    upgrade_row,
)
from kvchain.sim.sweep_run import run_local, run_serial
from kvchain.sim.traces import Trace, TraceRequest


def test_grid_expands_to_the_product_in_axis_order():
    grid = SweepGrid(models=("gpt-oss-120b", "gemma-3-27b"), rate_scales=(1.0, 2.0),
                     managers=("kvchain", "ideal"), options=RunOptions(requests=50))
    points = grid.points()
    # 2 models x 1 gpu x 1 tp x 1 trace x 2 scales x 1 fraction x 2 managers = 8
    assert len(points) == 8
    assert [(p.model, p.rate_scale, p.manager) for p in points[:4]] == [
        ("gpt-oss-120b", 1.0, "kvchain"), ("gpt-oss-120b", 1.0, "ideal"),
        ("gpt-oss-120b", 2.0, "kvchain"), ("gpt-oss-120b", 2.0, "ideal")]
    assert all(p.options.requests == 50 for p in points)
    assert len({p.key() for p in points}) == 8
    # the configuration key drops the rate scale only: 2 models x 2 managers
    assert len({p.config_key() for p in points}) == 4


def test_point_key_is_stable_and_names_every_parameter():
    p = SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 2.0, 0.9, "kvchain",
                   options=RunOptions(requests=10))
    assert p.key() == ("model='gpt-oss-120b'|gpu='h200'|tp=1|trace='azure-conv'|"
                       "rate_scale=2.0|mem_fraction=0.9|manager='kvchain'|requests=10|"
                       "end_s=None|page_size=16|max_running=256|chunk_size=8192|seed=0")
    assert "rate_scale" not in p.config_key()


@pytest.mark.parametrize(("data", "needle"), [
    ({"managers": ["kvchain", "vllm"]}, "unknown managers"),
    ({"rate_scales": [0]}, "rate scales"),
    ({"mem_fractions": [1.5]}, "memory fractions"),
    ({"tp": [0]}, "tp"),
    ({"models": []}, "empty"),
    ({"colour": "red"}, "unknown grid keys"),
    ({"requests": [1, 2]}, "one value"),
    ({"tp": ["two"]}, "expected int"),
    ({"rate_scales": [True]}, "expected float"),
    # 1 and 1.0 are the same rate scale: the points would run twice.
    ({"rate_scales": [1, 2, 1.0]}, "'rate_scales' repeats 1.0"),
    ({"managers": ["kvchain", "kvchain"]}, "'managers' repeats kvchain"),
])
def test_bad_grids_raise_a_typed_error(data, needle):
    with pytest.raises(SweepConfigError, match=needle):
        SweepGrid.from_mapping(data)


def test_grid_files_toml_and_yaml(tmp_path):
    toml = tmp_path / "g.toml"
    toml.write_text('models = "gpt-oss-120b"\nrate_scales = [1, 2.5]\nrequests = 20\n')
    grid = SweepGrid.from_mapping(load_grid_file(toml))
    assert grid.models == ("gpt-oss-120b",) and grid.rate_scales == (1.0, 2.5)
    assert grid.options.requests == 20
    yaml_file = tmp_path / "g.yaml"
    yaml_file.write_text("managers: [kvchain, ideal]\ntp: 2\n")
    pytest.importorskip("yaml")
    grid = SweepGrid.from_mapping(load_grid_file(yaml_file))
    assert grid.managers == ("kvchain", "ideal") and grid.tp == (2,)
    bad = tmp_path / "g.json"
    bad.write_text("{}")
    with pytest.raises(SweepConfigError, match=r"\.toml"):
        load_grid_file(bad)
    broken = tmp_path / "b.toml"
    broken.write_text("models = [")
    with pytest.raises(SweepConfigError, match=r"b\.toml"):
        load_grid_file(broken)


def test_parse_slo_units_and_errors():
    slo = parse_slo("ttft_p99=2s, tpot_p99=50ms,e2e_p50=1500us")
    assert slo.targets == (("ttft_p99", 2.0), ("tpot_p99", 0.05), ("e2e_p50", 0.0015))
    for text, needle in [("", "no target"), ("ttft_p98=1s", "unknown"), ("ttft_p99=1h", "unit"),
                         ("ttft_p99=0s", "> 0"), ("ttft_p99=1s,ttft_p99=2s", "twice"),
                         ("ttft_p99", "metric=value")]:
        with pytest.raises(SweepConfigError, match=needle):
            parse_slo(text)


def test_slo_met_by_rows():
    slo = parse_slo("ttft_p99=2s,tpot_p99=50ms")
    assert slo.met_by({"ttft_p99_s": 2.0, "tpot_p99_s": 0.05})  # at the target: met
    assert not slo.met_by({"ttft_p99_s": 2.01, "tpot_p99_s": 0.01})
    assert not slo.met_by({"ttft_p99_s": None, "tpot_p99_s": 0.01})  # nothing finished


def _threshold(limit: float, calls: list[float]):
    """A fake simulation: TTFT p99 = scale seconds, so ``ttft_p99 <= limit`` holds exactly
    up to scale ``limit``."""
    def evaluate(scale: float) -> dict[str, float]:
        calls.append(scale)
        return {"ttft_p99_s": scale, "offered_rate_rps": 2.0 * scale}
    return evaluate


def test_bisection_finds_a_hand_known_threshold():
    calls: list[float] = []
    slo = SLO((("ttft_p99", 3.0),))
    result = bisect_rate(_threshold(3.0, calls), slo, 1.0, 16.0, rel_tol=0.01)
    # bracket [1, 16] halves geometrically: width 16^(1/2^k) <= 1.01 needs
    # 2^k >= ln 16 / ln 1.01 = 278.6, k = 9; plus the two ends: 11 simulations
    assert result.evaluations == len(calls) == 11
    assert calls[:3] == [1.0, 16.0, 4.0]  # sqrt(1 * 16) = 4
    assert result.best_scale is not None and result.fail_scale is not None
    assert result.best_scale <= 3.0 < result.fail_scale
    assert result.fail_scale / result.best_scale <= 1.01
    assert result.best_row == {"ttft_p99_s": result.best_scale,
                               "offered_rate_rps": 2.0 * result.best_scale}


def test_bisection_edges():
    slo = SLO((("ttft_p99", 3.0),))
    none = bisect_rate(_threshold(3.0, []), slo, 4.0, 8.0)
    assert none.best_scale is None and none.fail_scale == 4.0 and none.evaluations == 1
    capped = bisect_rate(_threshold(3.0, []), slo, 0.5, 2.0)
    assert capped.best_scale == 2.0 and capped.fail_scale is None and capped.evaluations == 2
    for lo, hi, tol in [(0.0, 1.0, 0.1), (2.0, 1.0, 0.1), (1.0, 2.0, 0.0)]:
        with pytest.raises(SweepConfigError):
            bisect_rate(_threshold(3.0, []), slo, lo, hi, tol)


def test_gpus_needed():
    # 45 req/s at 10 req/s per replica of 2 GPUs: ceil(4.5) = 5 replicas = 10 GPUs
    assert gpus_needed(45.0, 10.0, 2) == 10
    assert gpus_needed(40.0, 10.0, 1) == 4  # exactly 4 replicas
    assert gpus_needed(40.0, None, 1) is None
    with pytest.raises(SweepConfigError):
        gpus_needed(0.0, 10.0, 1)


def test_bisection_on_a_real_two_request_simulation():
    """Request A (1,000-token prompt, 1 output token) arrives at 0 and finishes in its one
    prefill step of ``d`` seconds; request B arrives at ``T / x``. B waits in the queue iff
    it arrives before A's step ends: ``T / x < d``, i.e. above the scale ``x* = T / d``.
    With a queueing-p99 target of 1 us the answer is ``x*`` (to the tolerance)."""
    model, gpu = load_model("gpt-oss-120b"), get_gpu("h200")
    cost = GPUCostModel(model, gpu)
    builder = cost.builder()
    builder.add_prefill(1000, 0)
    d = cost.step_time(builder.build())
    t_b = 10.0
    trace = Trace("two", (TraceRequest(0, 0.0, 1000, 1), TraceRequest(1, t_b, 1000, 1)),
                  "test", "none")

    def evaluate(scale: float) -> dict[str, object]:
        scaled = Trace("two", (trace.requests[0], TraceRequest(1, t_b / scale, 1000, 1)),
                       "test", "none")
        return summary_row(simulate(SimConfig(model, gpu, scaled,
                                              buffer_bytes=2_000_000_000)).summary)

    x_star = t_b / d
    result = bisect_rate(evaluate, parse_slo("queueing_p99=1us"), 1.0, 10 * x_star,
                         rel_tol=0.01)
    assert result.best_scale is not None and result.fail_scale is not None
    # 1 us of queueing shifts the threshold by a relative 1e-6 / d (d is milliseconds)
    assert result.best_scale <= x_star * (1 + 1e-3)
    assert result.fail_scale >= x_star * (1 - 1e-3)
    assert result.fail_scale / result.best_scale <= 1.01


def test_point_trace_scales_arrivals_like_load_trace():
    from kvchain.sim.traces import load_trace

    p = SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 3.0, 0.9, "kvchain",
                   options=RunOptions(requests=30))
    assert point_trace(p) == load_trace("azure-conv", first=30, rate_scale=3.0)


def test_run_point_row_has_parameters_and_metrics():
    p = SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 1.0, 0.9, "kvchain",
                   options=RunOptions(requests=20))
    row = run_point(p)
    assert row["key"] == p.key() and row["manager"] == "kvchain" and row["requests"] == 20
    assert row["requests_total"] == 20 and row["requests_finished"] == 20
    assert row["admitted_but_unallocatable"] == 0 and row["leaked_pages"] == 0
    for col in ("ttft_p99_s", "tpot_p99_s", "output_tokens_per_s", "offered_rate_rps"):
        assert isinstance(row[col], float)
    # offered rate = 20 requests / the 20th arrival's second
    assert row["offered_rate_rps"] == pytest.approx(20 / point_trace(p).duration_s)
    assert run_point(p) == row  # deterministic


def test_run_slo_search_row_and_tasks():
    grid = SweepGrid(rate_scales=(1.0, 2.0), managers=("kvchain", "ideal"),
                     options=RunOptions(requests=10))
    tasks = slo_tasks(grid.points(), parse_slo("ttft_p99=3s"), 1.0, 16.0, 0.01)
    assert len(tasks) == 2 and [t.point.manager for t in tasks] == ["kvchain", "ideal"]

    def fake(point: SweepPoint) -> dict[str, float]:
        return {"ttft_p99_s": point.rate_scale, "offered_rate_rps": 2.0 * point.rate_scale}

    row = run_slo_search(tasks[0], fake)
    assert row["evaluations"] == 11 and row["manager"] == "kvchain"
    assert row["max_rate_scale"] <= 3.0 < row["fail_rate_scale"]
    assert row["max_rate_rps"] == pytest.approx(2.0 * row["max_rate_scale"])
    assert "rate_scale" not in row


def test_local_pool_rows_equal_serial_rows():
    points = SweepGrid(rate_scales=(1.0, 4.0), managers=("kvchain", "fixed-pools"),
                       options=RunOptions(requests=15)).points()
    assert run_local(run_point, points, 2) == run_serial(run_point, points)
    with pytest.raises(ConfigError):
        run_local(run_point, points, 0)


def test_ray_rows_equal_local_rows():
    """A real local Ray cluster (2 CPUs) runs the same points with the same rows."""
    ray = pytest.importorskip("ray")
    from kvchain.sim.sweep_run import run_ray

    points = SweepGrid(rate_scales=(1.0, 4.0), managers=("kvchain", "equal-page"),
                       options=RunOptions(requests=15)).points()
    local = run_serial(run_point, points)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        seen: list[int] = []
        rows = run_ray(run_point, points, on_done=lambda i, _r: seen.append(i))
    finally:
        ray.shutdown()
    assert rows == local
    assert sorted(seen) == [0, 1, 2, 3]
    assert not math.isnan(rows[0]["ttft_p99_s"])


def test_summary_row_of_a_run_where_nothing_finished():
    from kvchain.sim.metrics import MetricsRecorder, summarize

    row = summary_row(summarize(MetricsRecorder()))
    # no finished request: every percentile column is there, empty
    assert [row[f"ttft_{p}"] for p in ("p50_s", "p90_s", "p99_s", "count")] == [None] * 4
    assert not parse_slo("ttft_p99=1s").met_by(row)


def test_a_grid_with_chunks_below_the_page_size_is_refused():
    """chunk_size 8,192 < page_size 16,384: every point would stop at its start (chunks are
    cut to whole pages); equal sizes are the sibling that builds."""
    with pytest.raises(ConfigError, match=r"--chunk-size \(8192\) must be at least"):
        SweepGrid(options=RunOptions(page_size=16_384, chunk_size=8_192))
    with pytest.raises(SweepConfigError, match=r"--chunk-size \(8192\) must be at least"):
        SweepGrid.from_mapping({"page_size": 16_384, "chunk_size": 8_192})
    assert SweepGrid(options=RunOptions(page_size=8_192, chunk_size=8_192)).options.page_size \
        == 8_192


def test_prefix_cache_axis_points_and_keys():
    grid = SweepGrid.from_mapping({"traces": "mooncake", "prefix_caches": ["on", "off"],
                                   "managers": ["kvchain", "ideal"], "requests": 5})
    points = grid.points()
    # 2 cache modes x 2 managers, managers innermost
    assert [(p.prefix_cache, p.manager) for p in points] == [
        ("on", "kvchain"), ("on", "ideal"), ("off", "kvchain"), ("off", "ideal")]
    # a mode other than the default is part of the key (and the configuration key); the
    # default "auto" is left out, so keys written before the axis existed still match
    assert points[0].key().endswith("|seed=0|prefix_cache='on'")
    assert "prefix_cache" in points[0].config_key()
    assert "prefix_cache" not in replace(points[0], prefix_cache="auto").key()
    assert len({p.config_key() for p in points}) == 4
    with pytest.raises(SweepConfigError, match="unknown prefix_caches"):
        SweepGrid.from_mapping({"prefix_caches": ["yes"]})
    with pytest.raises(SweepConfigError, match="'prefix_caches' repeats off"):
        SweepGrid.from_mapping({"prefix_caches": ["off", "off"]})


def test_prefix_cache_axis_runs_the_cache_as_simulate_does():
    base = SweepPoint("gpt-oss-120b", "h200", 1, "mooncake", 1.0, 0.9, "kvchain",
                      options=RunOptions(requests=12))
    on, off, auto = (run_point(replace(base, prefix_cache=m)) for m in ("on", "off", "auto"))
    # the same run as simulate with the cache on (auto: Mooncake carries content keys)
    direct = simulate(SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                                point_trace(base), mem_fraction=0.9, prefix_cache=True))
    assert direct.prefix_cache is not None and direct.prefix_cache.hit_tokens > 0
    assert on["prefix_hit_tokens"] == direct.prefix_cache.hit_tokens
    assert auto["prefix_hit_tokens"] == on["prefix_hit_tokens"] and auto["prefix_cache"] == "auto"
    assert off.get("prefix_hit_tokens", 0) == 0 and off["prefix_cache"] == "off"
    # the cache on a trace without content keys is refused, typed, before anything runs
    with pytest.raises(ConfigError, match="content keys"):
        run_point(replace(base, trace="azure-conv", prefix_cache="on"))


def test_upgrade_row_gives_old_rows_the_default_prefix_cache():
    # an old row (no prefix_cache) gets "auto" right after seed, where params() puts it
    old = {"key": "k", "manager": "kvchain", "seed": 0, "finished": 3}
    new = upgrade_row(old)
    assert list(new) == ["key", "manager", "seed", "prefix_cache", "finished"]
    assert new["prefix_cache"] == "auto" and "prefix_cache" not in old
    # a row with the axis is returned as it is (a copy); one without seed gets it at the end
    assert upgrade_row({"seed": 0, "prefix_cache": "off"}) == {"seed": 0, "prefix_cache": "off"}
    assert list(upgrade_row({"key": "k"})) == ["key", "prefix_cache"]
    # a fresh auto row of a point already has every key in the same order
    point = SweepGrid.from_mapping({"managers": "kvchain"}).points()[0]
    row = {"key": point.key(), **point.params()}
    assert upgrade_row(row) == row and list(upgrade_row(row)) == list(row)


def test_yaml_on_off_prefix_caches_are_the_modes(tmp_path):
    # pyyaml (YAML 1.1) reads unquoted on / off as True / False: a grid file written with
    # the documented values was refused ("expected str, got True"); booleans now map to
    # the modes, in the order given, and anything else is still refused by type
    pytest.importorskip("yaml")
    path = tmp_path / "grid.yaml"
    path.write_text("traces: mooncake\nmanagers: kvchain\nprefix_caches: [on, off]\n")
    data = load_grid_file(path)
    assert data["prefix_caches"] == [True, False]  # what YAML makes of them
    grid = SweepGrid.from_mapping(data)
    assert grid.prefix_caches == ("on", "off")
    assert SweepGrid.from_mapping({"prefix_caches": False}).prefix_caches == ("off",)
    # yes / no are booleans too; a repeated mode after mapping is still a repeat
    with pytest.raises(SweepConfigError, match="'prefix_caches' repeats on"):
        SweepGrid.from_mapping({"prefix_caches": [True, "on"]})
    with pytest.raises(SweepConfigError, match="expected str, got 1"):
        SweepGrid.from_mapping({"prefix_caches": [1]})
    # other axes still refuse booleans
    with pytest.raises(SweepConfigError, match="expected int, got True"):
        SweepGrid.from_mapping({"tp": [True]})


def test_slo_not_met_keeps_what_was_measured_at_the_lowest_rate():
    """Before, a configuration that failed its SLO at the lowest rate scale wrote empty
    latency columns; the row now carries the metrics measured there (at_fail_*)."""
    task = slo_tasks([SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 1.0, 0.9,
                                 "kvchain")], parse_slo("ttft_p99=2s,tpot_p99=50ms"),
                     0.5, 8.0, 0.05)[0]

    def fake(point: SweepPoint) -> dict[str, float]:
        # TTFT p99 = 3 s x scale: 1.5 s at the lowest scale 0.5 -> meets ttft; TPOT p99 =
        # 120 ms at every scale -> fails at 0.5 already
        return {"ttft_p99_s": 3.0 * point.rate_scale, "tpot_p99_s": 0.12,
                "offered_rate_rps": 4.0 * point.rate_scale}

    row = run_slo_search(task, fake)
    assert row["max_rate_scale"] is None and row["fail_rate_scale"] == 0.5
    assert row["evaluations"] == 1
    assert row["at_best_ttft_p99_s"] is None
    # measured at scale 0.5: ttft 3 x 0.5 = 1.5 s, tpot 0.12 s, offered 4 x 0.5 = 2 req/s
    assert row["at_fail_ttft_p99_s"] == 1.5 and row["at_fail_tpot_p99_s"] == 0.12
    assert row["fail_rate_rps"] == 2.0

    def meets_below_two(point: SweepPoint) -> dict[str, float]:
        return {"ttft_p99_s": point.rate_scale, "tpot_p99_s": 0.01,
                "offered_rate_rps": point.rate_scale}

    found = run_slo_search(task, meets_below_two)
    # met: at_best_ is the best scale's, at_fail_ the lowest failing scale's (> 2 s there)
    assert found["at_best_ttft_p99_s"] == found["max_rate_scale"] <= 2.0
    assert found["at_fail_ttft_p99_s"] == found["fail_rate_scale"] > 2.0
