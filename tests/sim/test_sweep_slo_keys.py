"""SLO search keys (``--resume`` of SLO searches) and the finite-number rules of the SLO
flags: targets, tolerance and target rate."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from kvchain.errors import ConfigError
from kvchain.sim.sweep import (
    SLOTask,
    SweepPoint,
    check_search_bounds,
    gpus_needed,
    parse_slo,
    run_slo_search,
)

POINT = SweepPoint("gpt-oss-120b", "h200", 1, "azure-conv", 1.0, 0.9, "kvchain")


def test_slo_task_key_names_targets_range_and_tolerance():
    # Before: SLO rows were keyed on point.config_key() alone, so a resume with other
    # targets, range or tolerance took the old search's row as the answer.
    task = SLOTask(POINT, parse_slo("ttft_p99=2s"), 0.25, 64.0, 0.02)
    assert task.key() == (POINT.config_key() + "|slo='ttft_p99=2.0'|lo=0.25|hi=64.0"
                          "|rel_tol=0.02")
    others = [SLOTask(POINT, parse_slo("ttft_p99=1ms"), 0.25, 64.0, 0.02),
              SLOTask(POINT, parse_slo("ttft_p99=2s"), 0.5, 64.0, 0.02),
              SLOTask(POINT, parse_slo("ttft_p99=2s"), 0.25, 32.0, 0.02),
              SLOTask(POINT, parse_slo("ttft_p99=2s"), 0.25, 64.0, 0.1)]
    keys = {task.key(), *(t.key() for t in others)}
    assert len(keys) == 5 and POINT.config_key() not in keys
    # the same targets in another order are the same search; ints read as floats
    a = SLOTask(POINT, parse_slo("ttft_p99=2s,tpot_p99=50ms"), 1, 4, 0.1)
    b = SLOTask(POINT, parse_slo("tpot_p99=50ms,ttft_p99=2s"), 1.0, 4.0, 0.1)
    assert a.key() == b.key()
    assert a.key().endswith("|slo='tpot_p99=0.05,ttft_p99=2.0'|lo=1.0|hi=4.0|rel_tol=0.1")


def test_slo_search_row_carries_the_task_key():
    task = SLOTask(POINT, parse_slo("ttft_p99=2s"), 1.0, 4.0, 0.1)
    row = run_slo_search(task, lambda p: {"ttft_p99_s": 1.0 if p.rate_scale <= 2 else 3.0,
                                          "offered_rate_rps": 10 * p.rate_scale})
    assert row["key"] == task.key() != POINT.config_key()
    # 1 meets, 4 fails, 2 meets, then 2.83, 2.38, 2.18 fail: 2.18 / 2 <= 1.1
    assert row["max_rate_scale"] == 2.0 and row["evaluations"] == 6


@pytest.mark.parametrize("rate", [math.inf, math.nan, -math.inf, 0.0])
def test_gpus_needed_refuses_a_rate_that_is_not_finite_and_positive(rate):
    # Before: inf passed the check and math.ceil(inf) raised OverflowError after every search.
    with pytest.raises(ConfigError, match="finite number > 0"):
        gpus_needed(rate, 10.0, 1)
    assert gpus_needed(25.0, 10.0, 2) == 6


def test_gpus_needed_of_a_huge_target_over_a_tiny_rate_is_exact():
    """1e308 req/s over replicas of 0.25 req/s: the float quotient is infinite (before,
    math.ceil raised OverflowError after every search); the count is 4e308 replicas
    exactly, rounded up, times tp. 1.0 / 0.1 still needs 10 replicas, not 11."""
    assert gpus_needed(1e308, 0.25, 2) == int(1e308) * 4 * 2
    assert gpus_needed(1e308, 5e-324, 1) == math.ceil(Fraction(1e308) / Fraction(5e-324))
    assert gpus_needed(1.0, 0.1, 1) == 10


@pytest.mark.parametrize("tol", [math.inf, math.nan, 0.0])
def test_search_bounds_refuse_a_tolerance_that_is_not_finite(tol):
    # Before: rel_tol=inf passed and the search stopped after its two end points.
    with pytest.raises(ConfigError, match="finite rel_tol > 0"):
        check_search_bounds(0.25, 64.0, tol)
    check_search_bounds(0.25, 64.0, 1e6)  # a large finite tolerance is a valid search


@pytest.mark.parametrize("text", ["ttft_p99=1e400s", "ttft_p99=1e-400s", "tpot_p99=1e-320us"])
def test_parse_slo_refuses_targets_that_are_not_finite_and_positive(text):
    # Before: 1e400s gave an infinite target (every rate met it).
    with pytest.raises(ConfigError, match="finite number > 0"):
        parse_slo(text)
    assert parse_slo("ttft_p99=1e300s").targets == (("ttft_p99", 1e300),)
