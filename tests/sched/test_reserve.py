"""Reservation policies for future output: knobs, learning, and the retraction storm."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.bands.geometry import RequestGeometry
from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError, InvalidDemandError, InvalidRequestError, TraceError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.model.spec import ModelSpec
from kvchain.requests.demand import HeldPages, request_demand
from kvchain.sched.admission import (
    AdaptiveReserve,
    FullReserve,
    NewTokenRatio,
    ReserveConfig,
    ReservePolicy,
    SGLangReserve,
    parse_new_token_ratio,
)
from kvchain.sched.request import Request
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import ClockKind, SimConfig, simulate
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
    # Two decoding requests holding 100 tokens, 10 and 30 left (page size 1: pages are
    # tokens). Lockstep: at t = 10 both grew by 10 (extra 20); at t = 30 only the second is
    # there, the first freed its 100 tokens (extra 30 - 100 < 0). Peak E = 20 of
    # sum R = 40: fraction 0.5.
    adaptive.begin_step([100, 100], [10, 30], [0, 0], [11, 31])
    assert adaptive.value == 0.5
    # ceil(10 x 20 / 40) = 5 and ceil(30 x 20 / 40) = 15 tokens: sum = E.
    assert (adaptive.tokens(10, 0, 11, held=100), adaptive.tokens(30, 0, 31, held=100)) \
        == (5, 15)
    # A request not in the decoding batch (in prefill, or a candidate) reserves its whole
    # expected output: it is not part of the lockstep peak.
    assert adaptive.tokens(10, 0, 11) == 10
    # Identical requests end together: E = 30 + 30 = sum R, everything is reserved.
    adaptive.begin_step([100, 100], [30, 30], [0, 0], [31, 31])
    assert adaptive.value == 1.0
    assert adaptive.tokens(30, 0, 31, held=100) == 30
    assert adaptive.tokens(0, 31, 31, held=100) == 0


def test_adaptive_peak_is_counted_in_pages() -> None:
    # P = 64. Request a holds 70 tokens (b = 2 pages), 10 left: R = ceil(80 / 64) - 2 = 0.
    # Request b holds 60 tokens (b = 1 page), 40 left: R = ceil(100 / 64) - 1 = 1.
    # Bound at t = 10 (a still there): ceil(10 / 64) x 2 = 2 pages; at t = 40: a freed its
    # 2 pages, 1 x 1 - 2 < 0. E = min(sum R = 1, 2) = 1: b's page is reserved in full.
    adaptive = AdaptiveReserve()
    adaptive.begin_step([70, 60], [10, 40], [0, 0], [11, 41], page_size=64)
    assert (adaptive._peak, adaptive._pages, adaptive.value) == (1, 1, 1.0)
    # b: ceil(1 x 1 / 1) = 1 page more: (1 + 1) x 64 - 60 = 68 tokens, capped at 40.
    assert adaptive.tokens(40, 0, 41, held=60) == 40
    # Two requests at 64 tokens (1 page each), both 64 left: R = 1 each; at t = 64 both
    # are there: ceil(64 / 64) x 2 = 2 = sum R: both reserved (64 tokens = 1 page each).
    adaptive.begin_step([64, 64], [64, 64], [0, 0], [65, 65], page_size=64)
    assert adaptive.value == 1.0
    assert adaptive.tokens(64, 0, 65, held=64) == 64
    # Staggered: 100 pages' worth left (6,400 tokens) beside 1 page (64): at t = 64 both
    # run: 1 x 2 = 2 pages; at t = 6,400 the short one freed its page: 100 - 1 = 99.
    # E = 99 of sum R = 101. The long one gets ceil(100 x 99 / 101) = 99 pages: the tokens
    # they hold beyond its 64, (1 + 99) x 64 - 64 = 6,336; the short one
    # ceil(1 x 99 / 101) = 1 page, (1 + 1) x 64 - 64 = 64 tokens.
    adaptive.begin_step([64, 64], [6_400, 64], [0, 0], [6_401, 65], page_size=64)
    assert (adaptive._peak, adaptive._pages) == (99, 101)
    assert adaptive.tokens(6_400, 0, 6_401, held=64) == 6_336
    assert adaptive.tokens(64, 0, 65, held=64) == 64
    with pytest.raises(ConfigError):
        adaptive.begin_step([1], [1], [0], [2], page_size=0)


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


# --- a batch that runs to its limits: adaptive never retracts (issue: W = 11, P = 64) ---------

# 200 requests at t = 0, each running exactly to its limit (output == max_tokens, 10..400
# tokens; prompts 20..200), on 4 MB chains of 64-token pages whose windows are smaller than
# a page. Why 0 retractions is derived, not measured: AdaptiveReserve reserves, for the
# requests that decode in lockstep, at least the batch's page peak (an upper bound on it:
# the class docstring's step 2), every prefill and candidate in full (step 4) and every
# window's later peak over the whole expected output (step 5); q stays 1 (every output
# reaches its limit), so no request outgrows what was reserved for it, and admission never
# lets the ledger exceed the chain - so every decode fits and none is retracted. On
# c9a1289 (token shares, candidates priced at the batch's ratio, windows priced over the
# share) the same runs retracted 4 (one window) and 3 (two windows) requests.
LIMITS = Trace("limits", tuple(
    TraceRequest(i, 0.0, 20 + (i * 53) % 181, 10 + (i * 37) % 391,
                 max_tokens=10 + (i * 37) % 391) for i in range(200)), "synthetic", "none")


def _limits_run(model: ModelSpec, policy: ReservePolicy = ReservePolicy.ADAPTIVE,
                buffer_bytes: int = 4_000_000) -> tuple[int, int]:
    config = SimConfig(model, get_gpu("h200"), LIMITS, buffer_bytes=buffer_bytes, page_size=64,
                       clock=ClockKind.STEPS,
                       scheduler=SchedulerConfig(reserve=ReserveConfig(policy), strict=False))
    s = simulate(config).summary
    assert s.requests_finished == 200 and s.admitted_but_unallocatable == 0
    return s.retractions, s.steps


W11 = declare_model("w11", full=1_024, window=1_024, window_tokens=11)
W11_TWO = declare_model("w11x2", full=1_024, windows=[(1_024, 11), (512, 5)])


@pytest.mark.parametrize("model", [W11, W11_TWO], ids=["one-window", "two-windows"])
def test_adaptive_does_not_retract_a_batch_that_runs_to_its_limits(model: ModelSpec) -> None:
    adaptive, adaptive_steps = _limits_run(model)
    full, full_steps = _limits_run(model, ReservePolicy.FULL)
    assert (adaptive, full) == (0, 0)
    # And it still fills the batch beyond full reservation (staggered ends: E < sum R).
    assert adaptive_steps < full_steps


class _SharedCandidates(AdaptiveReserve):
    """Planted defect: candidates and prefills priced at the batch's ratio (c9a1289)."""

    def tokens(self, left: int, done: int, limit: int, held: int | None = None) -> int:
        expected = self.expected_left(left, done, limit)
        if held is None and expected > 0:
            return max(1, math.ceil(expected * self.value - 1e-9))
        return AdaptiveReserve.tokens(self, left, done, limit, held)


class _WindowsOverTheShare(AdaptiveReserve):
    """Planted defect: the window's later peak priced over the share only (c9a1289)."""

    def horizon(self, left: int, done: int, limit: int) -> int:
        return 0


@pytest.mark.parametrize(("planted", "model", "buffer_bytes"), [
    # Full attention only: a candidate joining a staggered batch raises its peak by up to
    # its own output, far more than the batch's ratio of it.
    (_SharedCandidates, declare_model("full-only", full=2_048), 4_000_000),
    # Window bytes 16x the full bytes, 2 MB: the window page a decode needs when its 11
    # tokens straddle a page boundary is not covered by the full band's rounding slack.
    (_WindowsOverTheShare, declare_model("window-heavy", full=256, window=4_096,
                                         window_tokens=11), 2_000_000),
], ids=["candidates-at-ratio", "windows-over-share"])
def test_limits_case_retracts_with_a_planted_defect(
        planted: type[AdaptiveReserve], model: ModelSpec, buffer_bytes: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The sibling of the test above: each part of the fix, undone, retracts again.
    assert _limits_run(model, buffer_bytes=buffer_bytes)[0] == 0
    monkeypatch.setattr(ReserveConfig, "build", lambda self: planted())
    assert _limits_run(model, buffer_bytes=buffer_bytes)[0] > 0


def test_window_peak_is_reserved_over_the_horizon() -> None:
    # W = 11, P = 64, a request at 100 tokens holding window page 1 (tokens 64..127) and
    # full pages 0..1, one decode token now (positions 100) and 3 tokens of headroom.
    # Over the headroom alone: window_start(101) = 91 -> page 1; ceil(104 / 64) = 2: 1
    # page, held - nothing more. Over a horizon of 100 tokens: ceil(201 / 64) - 1 = 3,
    # capped at the later peak ceil(1 / 64) + ceil(10 / 64) = 2 pages: 1 more (the decode
    # at 128 needs tokens 118..128, on pages 1 and 2). Full pages follow the headroom
    # only: ceil(104 / 64) - 2 = 0 either way.
    geom = RequestGeometry(64, (WindowPolicy(0, 64, 11), FullPolicy(1, 64)))
    held = HeldPages(((1, 2), (0, 2)))
    assert request_demand(geom, held, 100, 1, 3).pages == (0, 0)
    assert request_demand(geom, held, 100, 1, 3, horizon=100).pages == (1, 0)
    with pytest.raises(InvalidDemandError):
        request_demand(geom, held, 100, 1, 3, horizon=-1)


def test_linear_quantile_by_hand() -> None:
    from kvchain.sched.admission import linear_quantile

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
    from kvchain.sched.admission import linear_quantile

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
