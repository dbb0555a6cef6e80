"""load_trace's options are typed like RunOptions' (a breaker's finds): before, ``first``
of nan, inf or 1.5 cut nothing or kept 2 requests, ``True`` ran as 1 s or 1x, a string gave
a bare TypeError, ``seed=-1`` a bare ValueError, and ``block_tokens`` of 1.5 or inf was
stored on the trace."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvchain.errors import ConfigError
from kvchain.sim.traces import load_trace

BAD = [
    ("first", "3"), ("first", math.nan), ("first", math.inf), ("first", 1.5),
    ("first", True), ("first", np.uint64(2**64 - 1)), ("first", 0),
    ("start_s", "0"), ("start_s", None), ("start_s", True), ("start_s", -1.0),
    ("end_s", "5"), ("end_s", True), ("end_s", 0),
    ("rate_scale", "2"), ("rate_scale", None), ("rate_scale", True), ("rate_scale", 0.0),
    ("block_tokens", "512"), ("block_tokens", None), ("block_tokens", 1.5),
    ("block_tokens", math.inf), ("block_tokens", np.int64(512)), ("block_tokens", 0),
]
SHAREGPT_BAD = [("rate", "2"), ("rate", True), ("seed", "x"), ("seed", 1.5), ("seed", -1),
                ("seed", None), ("seed", True)]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_cut_option_is_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        load_trace("azure-conv", **{name: value})


@pytest.mark.parametrize(("name", "value"), SHAREGPT_BAD)
def test_a_bad_poisson_option_is_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        load_trace("sharegpt", **{name: value})


def test_the_good_values_of_the_same_options_cut_as_asked():
    """Siblings: the same options with good values are read (by hand: 3 requests; the
    window [10, 20) s moved to 0; twice the rate halves every time)."""
    assert len(load_trace("azure-conv", first=3).requests) == 3
    whole = load_trace("azure-conv", end_s=20.5)
    cut = load_trace("azure-conv", start_s=10, end_s=20.5, rate_scale=2, first=50)
    want = [(r.arrival_s - 10) / 2 for r in whole.requests if 10 <= r.arrival_s < 20.5]
    assert [r.arrival_s for r in cut.requests] == pytest.approx(want[:50])
    a = load_trace("sharegpt", rate=2, seed=3, first=5)
    b = load_trace("sharegpt", rate=2.0, seed=3, first=5)
    assert [r.arrival_s for r in a.requests] == [r.arrival_s for r in b.requests]


def test_a_tiny_rate_scale_names_itself():
    """Before: "request 1: arrival_s must be finite", naming no option."""
    with pytest.raises(ConfigError, match="rate_scale"):
        load_trace("azure-conv", first=3, rate_scale=1e-308)
    assert len(load_trace("azure-conv", first=3, rate_scale=1e-3).requests) == 3


def test_a_digit_separator_in_a_csv_time_is_refused(tmp_path):
    """float() reads "1_0" as 10; a count's "1_000" was already refused."""
    from kvchain.errors import TraceError

    good = tmp_path / "t.csv"
    good.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n10,10,2\n")
    assert [r.arrival_s for r in load_trace(good).requests] == [0.0, 10.0]
    bad = tmp_path / "u.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1_0,10,2\n")
    with pytest.raises(TraceError, match="not a number"):
        load_trace(bad)


def test_a_huge_time_states_the_limit(tmp_path):
    from kvchain.errors import TraceError

    bad = tmp_path / "h.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1e20,10,2\n")
    with pytest.raises(TraceError, match="at most 9,007,199,254,741 seconds"):
        load_trace(bad)
