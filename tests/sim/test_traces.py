"""Tests of kvchain.sim.traces: bundled traces, cuts, Poisson arrivals, malformed files."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from kvchain.errors import ConfigError, KVChainError, TraceError
from kvchain.sim.traces import (
    BUNDLED_TRACES,
    DEFAULT_POISSON_RATE_RPS,
    Trace,
    TraceFormat,
    TraceRequest,
    detect_format,
    load_trace,
    poisson_arrivals_s,
)

# SHA-256 of the published files (kvchain/sim/data/SOURCES.md).
SHA256 = {
    "azure2023_code.csv": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "azure2023_conv.csv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    "mooncake_fast25_conversation_trace.jsonl": (
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
    ),
    "sharegpt_8k_filtered_stats_llama2_tokenizer.csv": (
        "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f"
    ),
}


@pytest.fixture(scope="module")
def azure_conv() -> Trace:
    return load_trace("azure-conv")


def test_bundled_files_are_byte_exact_copies() -> None:
    data = resources.files("kvchain.sim").joinpath("data")
    for bundled in BUNDLED_TRACES.values():
        digest = hashlib.sha256(data.joinpath(bundled.filename).read_bytes()).hexdigest()
        assert digest == SHA256[bundled.filename]
    assert "CC-BY 4.0" in data.joinpath("SOURCES.md").read_text()


@pytest.mark.parametrize(
    ("name", "rows"),
    [("azure-code", 8_819), ("azure-conv", 19_366), ("mooncake", 12_031), ("sharegpt", 30_731)],
)
def test_bundled_row_counts(name: str, rows: int) -> None:
    trace = load_trace(name)
    assert len(trace) == rows == BUNDLED_TRACES[name].rows
    assert trace.name == name
    assert trace.zero_output_rows == 0
    assert trace.license == BUNDLED_TRACES[name].license
    # ids are file rows; every bundled trace is already in time order
    assert [r.request_id for r in trace.requests[:3]] == [0, 1, 2]
    assert trace.requests[-1].request_id == rows - 1


def test_azure_conv_first_rows_exact(azure_conv: Trace) -> None:
    first, second, third = azure_conv.requests[:3]
    # 18:15:46.6805900, 18:15:50.9951690, 18:15:51.2224670 (7 fractional digits, exact)
    assert first == TraceRequest(0, 0.0, 374, 44, None)
    assert second == TraceRequest(1, 4.314579, 396, 109, None)
    assert third == TraceRequest(2, 4.541877, 879, 55, None)
    # last row 19:14:08.4025270
    assert azure_conv.requests[-1] == TraceRequest(19_365, 3501.721937, 197, 183, None)
    assert azure_conv.duration_s == 3501.721937


def test_azure_code_and_mooncake_and_sharegpt_first_rows() -> None:
    code = load_trace("azure-code", first=2)
    assert code.requests == (
        TraceRequest(0, 0.0, 4808, 10, None),
        TraceRequest(1, 0.052, 3180, 8, None),
    )
    moon = load_trace("mooncake", first=3)
    assert moon.requests[0] == TraceRequest(0, 0.0, 6758, 500, tuple(range(14)))
    assert moon.requests[1].prefix_block_ids == (0, *range(14, 28))  # shares block 0
    assert moon.requests[1].prompt_tokens == 7322
    assert moon.requests[2].output_tokens == 794
    assert load_trace("mooncake").duration_s == 3536.999
    share = load_trace("sharegpt", first=2)
    assert [(r.prompt_tokens, r.output_tokens) for r in share] == [(74, 918), (290, 905)]
    assert share.requests[0].arrival_s == 0.0


def test_time_windows_of_azure_conv() -> None:
    # the whole trace spans 3,501.7 s, so the first hour is all of it
    assert len(load_trace("azure-conv", end_s=3600)) == 19_366
    assert len(load_trace("azure-conv", end_s=600)) == 2_867
    window = load_trace("azure-conv", start_s=600, end_s=1200)
    assert len(window) == 3_118
    # first request of the window: row 2867 at 600.197636 s, re-based to the window start
    assert window.requests[0].request_id == 2_867
    assert window.requests[0].arrival_s == pytest.approx(0.197636, abs=1e-9)
    assert (window.requests[0].prompt_tokens, window.requests[0].output_tokens) == (958, 89)
    assert window.duration_s < 600


def test_first_n_after_window_then_rate_scale(azure_conv: Trace) -> None:
    cut = load_trace("azure-conv", start_s=600, first=5)
    assert [r.request_id for r in cut] == [2867, 2868, 2869, 2870, 2871]
    doubled = load_trace("azure-conv", first=100, rate_scale=2.0)
    assert len(doubled) == 100
    for original, fast in zip(azure_conv.requests[:100], doubled.requests, strict=True):
        assert fast.arrival_s == original.arrival_s / 2.0
        assert fast.prompt_tokens == original.prompt_tokens
    # the window is in trace seconds, before scaling
    assert len(load_trace("azure-conv", end_s=600, rate_scale=4.0)) == 2_867


def test_poisson_arrivals_deterministic_by_seed() -> None:
    a = load_trace("sharegpt", first=1000, rate=2.0, seed=7)
    b = load_trace("sharegpt", first=1000, rate=2.0, seed=7)
    c = load_trace("sharegpt", first=1000, rate=2.0, seed=8)
    assert a == b
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]
    # lengths come from the file, whatever the seed
    assert [r.prompt_tokens for r in a] == [r.prompt_tokens for r in c]
    # 999 exponential gaps of mean 0.5 s: the span is within 10% of 499.5 s
    assert 0.9 * 499.5 < a.duration_s < 1.1 * 499.5
    arrivals = poisson_arrivals_s(5, rate=1.0, seed=3)
    assert arrivals[0] == 0.0
    assert np.all(np.diff(arrivals) > 0)
    # a longer draw with the same seed starts with the same arrivals
    assert np.array_equal(poisson_arrivals_s(10, rate=1.0, seed=3)[:5], arrivals)


def test_poisson_default_rate_and_rate_scale() -> None:
    base = load_trace("sharegpt", first=50)
    explicit = load_trace("sharegpt", first=50, rate=DEFAULT_POISSON_RATE_RPS)
    assert base == explicit
    scaled = load_trace("sharegpt", first=50, rate_scale=2.0)
    assert [r.arrival_s for r in scaled] == [r.arrival_s / 2.0 for r in base]


def test_option_errors() -> None:
    with pytest.raises(ConfigError, match="rate applies only"):
        load_trace("azure-conv", rate=3.0)
    with pytest.raises(ConfigError, match="holds no request"):
        load_trace("azure-conv", start_s=4000)
    with pytest.raises(ConfigError, match="first"):
        load_trace("azure-conv", first=0)
    with pytest.raises(ConfigError, match="rate_scale"):
        load_trace("azure-conv", rate_scale=0.0)
    with pytest.raises(ConfigError, match="end_s"):
        load_trace("azure-conv", start_s=10, end_s=10)
    with pytest.raises(ConfigError, match="rate"):
        load_trace("sharegpt", rate=-1.0)
    with pytest.raises(TraceError, match="not a bundled trace name"):
        load_trace("azure-chat")


# --- user files and malformed files ------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_user_azure_file_sorted_stably_and_zero_output_clamped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "mine.csv",
        AZURE_HEADER
        + "2023-11-16 10:00:01.5000000,10,5\n"
        + "2023-11-16 10:00:00.0000001,20,0\n"  # earlier: moves first; output 0 -> 1
        + "2023-11-16 10:00:01.5000000,30,7\n"  # tie with row 0: keeps file order
        + "2023-11-17 00:00:00.25,40,8\n",  # next day, 2 fractional digits
    )
    trace = load_trace(path)
    assert trace.name == "mine"
    assert trace.zero_output_rows == 1
    assert trace.license == "unknown (user file)"
    assert [r.request_id for r in trace] == [1, 0, 2, 3]
    assert [r.output_tokens for r in trace] == [1, 5, 7, 8]
    assert trace.requests[1].arrival_s == 1.4999999
    assert trace.requests[3].arrival_s == 50_400.2499999  # 14 h + 0.25 s - 100 ns, exact


@pytest.mark.parametrize(
    ("row", "line_field", "what"),
    [
        ("2023-11-16 10:00:01.5,12x,5", "line 3, field 'ContextTokens'", "not an integer"),
        ("2023-11-16 10:00:01.5,12,-4", "line 3, field 'GeneratedTokens'", "negative"),
        ("2023-11-16 10:00:01.5,0,4", "line 3, field 'ContextTokens'", "at least 1"),
        ("16/11/2023 10:00:01,12,4", "line 3, field 'TIMESTAMP'", "unparsable"),
        ("2023-02-30 10:00:01.5,12,4", "line 3, field 'TIMESTAMP'", "invalid date"),
        ("2023-11-16 25:00:01.5,12,4", "line 3, field 'TIMESTAMP'", "invalid time"),
        ("2023-11-16 10:00:01.5,12", "line 3, field 'GeneratedTokens'", "expected 3 fields"),
        ("2023-11-16 10:00:01.5,12,4,9", "line 3, field '#4 (past the header)'",
         "expected 3 fields"),
    ],
)
def test_malformed_azure_rows(tmp_path: Path, row: str, line_field: str, what: str) -> None:
    path = write(tmp_path, "bad.csv", AZURE_HEADER + "2023-11-16 10:00:00.0,1,1\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message
    assert line_field in message
    assert what in message
    assert isinstance(info.value, KVChainError)


def test_missing_column_and_unknown_format(tmp_path: Path) -> None:
    path = write(tmp_path, "cols.csv", "TIMESTAMP,ContextTokens\n2023-11-16 10:00:00,1\n")
    with pytest.raises(TraceError, match=r"line 1, field 'GeneratedTokens': missing column"):
        load_trace(path)
    path = write(tmp_path, "other.csv", "a,b\n1,2\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(path)
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "absent.csv")
    empty = write(tmp_path, "empty.csv", AZURE_HEADER)
    with pytest.raises(TraceError, match="no data rows"):
        load_trace(empty)


def test_sharegpt_file_rows_and_errors(tmp_path: Path) -> None:
    header = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
    path = write(tmp_path, "lengths.csv", header + "5,7,12,0.7\n3,1,4,3.0\n")
    assert detect_format(path) is TraceFormat.SHAREGPT_LENGTHS
    trace = load_trace(path, rate=10.0, seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == [(5, 7), (3, 1)]
    bad = write(tmp_path, "lengths_bad.csv", header + "5,7,12,0.7\n\n3,x,4,3.0\n")
    with pytest.raises(TraceError, match=r"line 4, field 'num_decode_tokens'"):
        load_trace(bad)


def test_mooncake_file_rows_and_errors(tmp_path: Path) -> None:
    good = (
        '{"timestamp": 1500, "input_length": 513, "output_length": 2, "hash_ids": [0, 1]}\n'
        '{"timestamp": 250.5, "input_length": 10, "output_length": 3}\n'
    )
    trace = load_trace(write(tmp_path, "m.jsonl", good))
    assert [r.request_id for r in trace] == [1, 0]
    assert trace.requests[0].prefix_block_ids is None
    assert trace.requests[1] == TraceRequest(0, 1.2495, 513, 2, (0, 1))
    cases = [
        ('{"timestamp": 0, "input_length": 10}', "line 2, field 'output_length': missing"),
        ('{"timestamp": 0, "input_length": "10", "output_length": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": -1}', "negative"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1}', "'timestamp'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1', "invalid JSON"),
        ("[1, 2]", "JSON object"),
        (
            '{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
            "expected ceil(1025 / 512) = 3",
        ),
    ]
    first_line = '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'
    for index, (line, expected) in enumerate(cases):
        path = write(tmp_path, f"bad{index}.jsonl", first_line + line + "\n")
        with pytest.raises(TraceError, match="line 2") as info:
            load_trace(path)
        assert expected in str(info.value)


def test_value_objects_validate() -> None:
    with pytest.raises(TraceError, match="must be >= 1"):
        TraceRequest(0, 0.0, 0, 1)
    with pytest.raises(TraceError, match="arrival_s"):
        TraceRequest(0, float("nan"), 1, 1)
    unsorted = (TraceRequest(0, 2.0, 1, 1), TraceRequest(1, 1.0, 1, 1))
    with pytest.raises(TraceError, match="not sorted"):
        Trace("t", unsorted, "test", "none")
    with pytest.raises(TraceError, match="unique"):
        Trace("t", (TraceRequest(0, 1.0, 1, 1), TraceRequest(0, 2.0, 1, 1)), "test", "none")


def test_sharegpt_total_must_be_prefill_plus_decode(tmp_path: Path) -> None:
    """``num_total_tokens`` is read where the header has it: a row whose total (5) is not
    prefill + decode (74 + 918 = 992) is refused naming the file, line and field - its
    lengths cannot all be right. The sibling file with the right total (992) loads, and a
    file without the column (the total is optional) loads the same lengths."""
    header = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
    bad = write(tmp_path, "total_bad.csv", header + "5,7,12,0.7\n74,918,5,0.08\n")
    with pytest.raises(TraceError, match=(
            r"total_bad\.csv: line 3, field 'num_total_tokens': 5 is not num_prefill_tokens "
            r"\+ num_decode_tokens \(74 \+ 918 = 992\)")):
        load_trace(bad)
    good = write(tmp_path, "total_good.csv", header + "5,7,12,0.7\n74,918,992,0.08\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(good, seed=1)] == [
        (5, 7), (74, 918)]
    no_total = write(tmp_path, "no_total.csv",
                     "num_prefill_tokens,num_decode_tokens\n5,7\n74,918\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(no_total, seed=1)] == [
        (5, 7), (74, 918)]


def test_sharegpt_total_counts_the_raw_decode_and_must_be_a_count(tmp_path: Path) -> None:
    """The total is checked against the file's own decode count, before a 0 output is
    clamped to 1 (3 + 0 = 3 loads as (3, 1)); a total that is not an integer is refused
    like any count."""
    header = "num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
    good = write(tmp_path, "zero.csv", header + "3,0,3\n")
    trace = load_trace(good, seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == [(3, 1)]
    assert trace.zero_output_rows == 1
    bad = write(tmp_path, "text.csv", header + "3,0,three\n")
    with pytest.raises(TraceError, match=r"line 2, field 'num_total_tokens': not an integer"):
        load_trace(bad)
