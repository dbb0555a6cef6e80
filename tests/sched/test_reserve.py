"""Reservation policies for future output: knobs, learning, and the retraction storm."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.admission import (
    AdaptiveReserve,
    FullReserve,
    NewTokenRatio,
    ReserveConfig,
    ReservePolicy,
    SGLangReserve,
    parse_new_token_ratio,
)
from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError, InvalidRequestError, TraceError
from kvchain.gpu import get_gpu
from kvchain.sched.request import Request
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

# --- knobs ---------------------------------------------------------------------------------


def test_parse_new_token_ratio() -> None:
    assert parse_new_token_ratio("0.7, 0.098,0.001") == (0.7, 0.098, 0.001)
    for bad in ("0.7,0.1", "a,b,c", "0.5,0.7,0.1", "1.5,1,0", "0.7,0.1,-1", "nan,0,0"):
        with pytest.raises(ConfigError):
            parse_new_token_ratio(bad)


def test_reserve_config_builds_each_policy_and_checks_knobs() -> None:
    assert isinstance(ReserveConfig().build(), AdaptiveReserve)  # the default
    assert isinstance(ReserveConfig(ReservePolicy.FULL).build(), FullReserve)
    sglang = ReserveConfig(ReservePolicy.SGLANG, (1.0, 0.5, 0.25)).build()
    assert isinstance(sglang, SGLangReserve)
    assert (sglang.ratio.init, sglang.ratio.floor, sglang.ratio.decay) == (1.0, 0.5, 0.25)
    for kwargs in ({"policy": ReservePolicy.FULL, "ratio": (1.0, 1.0, 0.0)},
                   {"policy": ReservePolicy.SGLANG, "ratio": (0.5, 0.7, 0.0)},
                   {"quantile": 0.0}, {"quantile": 1.5}, {"warmup": 0}):
        with pytest.raises(ConfigError):
            ReserveConfig(**kwargs)  # type: ignore[arg-type]


def test_max_tokens_is_checked_on_requests_and_traces() -> None:
    assert Request(0, 10, 5, max_tokens=8).output_left == 8
    assert Request(0, 10, 5).output_limit == 5
    with pytest.raises(InvalidRequestError):
        Request(0, 10, 5, max_tokens=4)
    with pytest.raises(TraceError):
        TraceRequest(0, 0.0, 10, 5, max_tokens=4)


# --- the policies by hand ----------------------------------------------------------------


def test_full_and_sglang_tokens() -> None:
    assert FullReserve().tokens(99, 0, 100) == 99
    sglang = SGLangReserve(NewTokenRatio())
    assert sglang.tokens(99, 0, 100) == 70  # ceil(99 x 0.7) = ceil(69.3)
    sglang.on_step()
    assert sglang.ratio.value < 0.7
    sglang.on_retract()
    assert sglang.ratio.value == 0.7


def test_adaptive_peak_of_staggered_and_identical_batches() -> None:
    adaptive = AdaptiveReserve(quantile=0.9, warmup=20)
    # Two requests holding 100 tokens, 10 and 30 left. Lockstep: at t = 10 both grew by 10
    # (extra 20); at t = 30 only the second is there, the first freed its 100 + 10 tokens
    # (extra 30 - 100 < 0). Peak P = 20 of sum r = 40: fraction 0.5.
    adaptive.begin_step([100, 100], [10, 30], [0, 0], [11, 31])
    assert adaptive.value == 0.5
    assert (adaptive.tokens(10, 0, 11), adaptive.tokens(30, 0, 31)) == (5, 15)  # sum = P
    # Identical requests end together: P = 30 + 30 = sum r, everything is reserved.
    adaptive.begin_step([100, 100], [30, 30], [0, 0], [31, 31])
    assert adaptive.value == 1.0
    assert adaptive.tokens(30, 0, 31) == 30
    assert adaptive.tokens(0, 31, 31) == 0


def test_adaptive_learns_output_over_limit_after_warmup() -> None:
    adaptive = AdaptiveReserve(quantile=0.9, warmup=20)
    for _ in range(19):
        adaptive.on_finish(50, 100)
    # Warm-up (19 < 20 finished): expected to run to the limit.
    assert adaptive.learned_fraction == 1.0
    assert adaptive.expected_left(99, 0, 100) == 99
    adaptive.on_finish(50, 100)
    assert adaptive.learned_fraction == 0.5  # every request used half its limit
    # ceil(0.5 x 100) = 50 output tokens expected: 49 KV tokens after the first.
    assert adaptive.expected_left(99, 0, 100) == 49
    assert adaptive.expected_left(79, 20, 100) == 29
    # Past its expected length (done 60 > 50): expected to run to its limit.
    assert adaptive.expected_left(39, 60, 100) == 39
    # A retraction changes nothing (lengths, not a decaying guess).
    adaptive.on_retract()
    assert adaptive.learned_fraction == 0.5


# --- the retraction storm ------------------------------------------------------------------

# gemma-3-27b on one H200, 24 requests of (125 prompt, 500 output) tokens at t = 0, 2.5 GB
# of KV buffer: the scaled-down storm of docs/benchmarks.md (400 x (500, 2,000) in 20 GB).
# A request at its end holds 624 KV tokens (~317 MB ideal: 624 x 81,920 B full + 624 x
# 425,984 B window); admission fits 6 whole lives at once (page rounding, one more page of
# decode headroom and the layout's split of the buffer leave no room for a 7th).
STORM = Trace("storm", tuple(TraceRequest(i, 0.0, 125, 500) for i in range(24)),
              "synthetic", "none")


def _storm(policy: ReservePolicy) -> tuple[int, int, int]:
    config = SimConfig(load_model("gemma-3-27b"), get_gpu("h200"), STORM,
                       buffer_bytes=2_500_000_000,
                       scheduler=SchedulerConfig(reserve=ReserveConfig(policy)))
    s = simulate(config).summary
    assert s.requests_finished == 24
    return s.retractions, int(s.extra["recomputed_tokens"]), s.steps


def test_storm_adaptive_does_not_retract() -> None:
    retractions, recomputed, steps = _storm(ReservePolicy.ADAPTIVE)
    assert retractions <= 5
    # Identical requests: the peak is their whole output, so each wave of 6 is reserved in
    # full and never retracts; 24 / 6 = 4 waves x 500 steps (1 prefill + 499 decodes) -
    # the same as the full policy.
    assert (retractions, recomputed, steps) == (0, 0, 2_000)
    assert _storm(ReservePolicy.FULL) == (0, 0, 2_000)


def test_storm_sglang_retracts() -> None:
    # The sibling: the decaying ratio over-admits identical long outputs and retracts.
    retractions, recomputed, _ = _storm(ReservePolicy.SGLANG)
    assert retractions > 5 and recomputed > 0


def test_adaptive_fills_the_batch_when_outputs_end_at_half_their_limit() -> None:
    # 60 requests ask for max_tokens 400 and stop at 200. Full reservation reserves 400
    # each; adaptive learns output / limit = 0.5 after 20 finished and reserves half.
    trace = Trace("half", tuple(TraceRequest(i, 0.0, 125, 200, max_tokens=400)
                                for i in range(60)), "synthetic", "none")

    def steps(policy: ReservePolicy) -> int:
        config = SimConfig(load_model("gemma-3-27b"), get_gpu("h200"), trace,
                           buffer_bytes=2_500_000_000,
                           scheduler=SchedulerConfig(reserve=ReserveConfig(policy)))
        s = simulate(config).summary
        assert s.requests_finished == 60 and s.retractions == 0
        return s.steps

    assert steps(ReservePolicy.ADAPTIVE) < steps(ReservePolicy.FULL)


def test_linear_quantile_by_hand() -> None:
    from kvchain.admission import linear_quantile

    # n = 5: virtual index (5 - 1) x 0.9 = 3.6, between 0.4 and 1.0 with weight 0.6 >= 0.5:
    # 1.0 - (1.0 - 0.4) x 0.4 = 0.76 (numpy's arithmetic, so up to its rounding)
    assert abs(linear_quantile([0.1, 0.2, 0.3, 0.4, 1.0], 0.9) - 0.76) < 1e-12
    assert linear_quantile([0.5], 0.9) == 0.5
    assert linear_quantile([0.2, 0.4], 1.0) == 0.4  # the top: the largest value
    assert linear_quantile([0.2, 0.4], 0.0) == 0.2
    for values, q in (([], 0.5), ([0.2], 1.5), ([0.2], -0.1), ([0.2], float("nan"))):
        with pytest.raises(ConfigError, match="quantile"):
            linear_quantile(values, q)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
       q=st.floats(0.0, 1.0))
def test_linear_quantile_equals_numpy_bit_for_bit(values: list[float], q: float) -> None:
    from kvchain.admission import linear_quantile

    assert linear_quantile(sorted(values), q) == float(np.quantile(values, q))


class _SmallWindow(AdaptiveReserve):
    WINDOW = 5


@settings(max_examples=60, deadline=None)
@given(outs=st.lists(st.tuples(st.integers(0, 120), st.integers(-1, 100)), max_size=40))
def test_adaptive_quantile_follows_the_window_like_numpy(outs: list[tuple[int, int]]) -> None:
    # The sorted window kept incrementally equals numpy's quantile of the last WINDOW
    # fractions after every finish (the old code: np.quantile of the deque).
    adaptive = _SmallWindow(quantile=0.9, warmup=3)
    seen: list[float] = []
    for out, limit in outs:
        adaptive.on_finish(out, limit)
        if limit > 0:
            seen.append(min(1.0, out / limit))
        window = seen[-5:]
        want = float(np.quantile(window, 0.9)) if len(window) >= 3 else 1.0
        assert adaptive.learned_fraction == want
        assert adaptive._sorted == sorted(window)
