"""Malformed trace files raise TraceError naming the file and line: never a traceback, a
hang or wrong numbers (bugs found by an adversarial tester)."""

from __future__ import annotations

import json
import re

import pytest

from kvchain.errors import TraceError
from kvchain.sim.traces import load_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
SHAREGPT_HEADER = "num_prefill_tokens,num_decode_tokens\n"


def _moon(**fields: object) -> str:
    row = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}
    row.update(fields)
    return json.dumps(row) + "\n"


def _where(path, line: int) -> str:
    return re.escape(f"{path}: line {line}")


def test_invalid_utf8_in_csv_names_file_and_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes((AZURE_HEADER + AZURE_ROW * 3).encode() + b"2023-11-16 18:15:47,\xff3,4\n")
    with pytest.raises(TraceError, match=_where(path, 5)):
        load_trace(path)


def test_invalid_utf8_in_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(_moon().encode() + b'{"timestamp": "\xfe"}\n')
    with pytest.raises(TraceError, match=_where(path, 2)):
        load_trace(path)


def test_invalid_utf8_in_header_is_a_trace_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xffTIMESTAMP,ContextTokens,GeneratedTokens\n" + AZURE_ROW.encode())
    with pytest.raises(TraceError, match=_where(path, 1)):
        load_trace(path)


def test_csv_field_over_the_csv_limit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER + AZURE_ROW + '2023-11-16 18:15:47,"' + "1" * 200_000 + '",4\n')
    with pytest.raises(TraceError, match=_where(path, 3)):
        load_trace(path)


@pytest.mark.parametrize("header", [AZURE_HEADER, SHAREGPT_HEADER])
def test_integer_with_too_many_digits(tmp_path, header):
    path = tmp_path / "t.csv"
    if header == AZURE_HEADER:
        row = "2023-11-16 18:15:47," + "9" * 5000 + ",4\n"
    else:
        row = "9" * 5000 + ",4\n"
    path.write_text(header + row)
    with pytest.raises(TraceError, match=_where(path, 2)):
        load_trace(path)


def test_jsonl_integer_with_too_many_digits(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_moon() + '{"timestamp": 1, "input_length": ' + "9" * 5000 + "}\n")
    with pytest.raises(TraceError, match=_where(path, 2)):
        load_trace(path)


def test_deeply_nested_json(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_moon() + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TraceError, match=_where(path, 2)):
        load_trace(path)


@pytest.mark.parametrize("stamp", [1e308, 10**400, 2.0**60])
def test_mooncake_absurd_timestamp(tmp_path, stamp):
    path = tmp_path / "t.jsonl"
    path.write_text(_moon() + _moon(timestamp=stamp))
    with pytest.raises(TraceError, match=_where(path, 2) + ".*timestamp"):
        load_trace(path)


def test_absurd_token_counts(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(SHAREGPT_HEADER + "10,4\n" + str(10**30) + ",4\n")
    with pytest.raises(TraceError, match=_where(path, 3) + ".*num_prefill_tokens"):
        load_trace(path)
    moon = tmp_path / "t.jsonl"
    moon.write_text(_moon(output_length=10**30))
    with pytest.raises(TraceError, match=_where(moon, 1) + ".*output_length"):
        load_trace(moon)


def test_csv_with_utf8_bom_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (AZURE_HEADER + AZURE_ROW + AZURE_ROW).encode())
    trace = load_trace(path)
    assert len(trace) == 2
    assert (trace.requests[0].prompt_tokens, trace.requests[0].output_tokens) == (374, 44)
    share = tmp_path / "s.csv"
    share.write_bytes(b"\xef\xbb\xbf" + (SHAREGPT_HEADER + "12,3\n").encode())
    assert load_trace(share).requests[0].prompt_tokens == 12


def test_jsonl_with_utf8_bom_is_read(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _moon().encode())
    assert load_trace(path).requests[0].prompt_tokens == 10


def test_directory_named_like_a_trace(tmp_path):
    folder = tmp_path / "dir.csv"
    folder.mkdir()
    with pytest.raises(TraceError, match=re.escape(str(folder))):
        load_trace(folder)


def test_bundled_trace_numbers_unchanged():
    trace = load_trace("azure-conv")
    assert len(trace) == 19_366
    assert (trace.requests[0].prompt_tokens, trace.requests[0].output_tokens) == (374, 44)
    assert round(trace.duration_s, 2) == 3501.72
    moon = load_trace("mooncake")
    assert len(moon) == 12_031


@pytest.mark.parametrize("row", [
    '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, "arrival_s": 3}',
    '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], '
    '"input_length": 20}',
])
def test_a_field_given_twice_in_a_jsonl_row_names_file_and_line(tmp_path, row):
    path = tmp_path / "t.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(TraceError, match=_where(path, 1) + ".*given twice"):
        load_trace(path)


def test_a_field_given_twice_on_a_later_line_names_that_line_and_field(tmp_path):
    # line 1 is fine; line 3 (after a blank line) sets prompt_tokens twice (10, then 20).
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n\n'
                    '{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 5, '
                    '"prompt_tokens": 20}\n')
    with pytest.raises(TraceError, match=_where(path, 3) + re.escape(
            ", field 'prompt_tokens': given twice in one object (10, then 20)")):
        load_trace(path)


def test_a_column_named_twice_in_a_csv_header_names_the_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,arrival_s,prompt_tokens,output_tokens\n0,7,10,5\n")
    with pytest.raises(TraceError, match=re.escape(
            f"{path}: line 1, field 'arrival_s': column named twice in the header "
            "(columns 1 and 2)")):
        load_trace(path)


@pytest.mark.parametrize("header,row", [
    # Azure 2023: the reader took the first TIMESTAMP column, silently
    ("TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP", "2023-11-16 18:15:46.6805900,374,44,x"),
    # ShareGPT lengths
    ("num_prefill_tokens,num_decode_tokens,num_decode_tokens", "10,5,6"),
])
def test_a_column_named_twice_in_any_csv_trace_header_is_refused(tmp_path, header, row):
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(TraceError, match=_where(path, 1) + ".*column named twice"):
        load_trace(path)


def test_trailing_commas_in_a_csv_header_are_not_a_repeated_column(tmp_path):
    # Two empty header names (a spreadsheet's trailing commas) are no fields: still read.
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,,\n0,10,5,,\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(path)] == [(10, 5)]
