"""The generic trace format (arrival_s, prompt_tokens, output_tokens, optional hash_ids
and max_tokens): CSV and JSON lines, read and written, with typed errors."""

from __future__ import annotations

import json

import pytest

from kvchain.errors import ConfigError, TraceError
from kvchain.sim.traces import (
    TRACE_FORMATS_HELP,
    TraceFormat,
    TraceRequest,
    detect_format,
    load_trace,
    write_trace,
)


def test_csv_by_hand_with_blocks_and_caps(tmp_path):
    path = tmp_path / "mine.csv"
    # Blocks of 4 tokens: ceil(10 / 4) = 3 ids, ceil(4 / 4) = 1 id; the third row has none.
    path.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids,max_tokens\n"
                    "2.5,10,3,1 2 3,8\n"
                    "2.0,4,0,1,\n"
                    "3.25,7,5,,\n")
    assert detect_format(path) is TraceFormat.GENERIC
    trace = load_trace(path, block_tokens=4)
    assert trace.block_tokens == 4
    # sorted by arrival; the earliest (2.0 s) becomes 0; output 0 is clamped to 1
    assert trace.requests == (
        TraceRequest(1, 0.0, 4, 1, (1,), None),
        TraceRequest(0, 0.5, 10, 3, (1, 2, 3), 8),
        TraceRequest(2, 1.25, 7, 5, None, None),
    )
    assert trace.zero_output_rows == 1


def test_semicolon_separated_ids_and_default_block(tmp_path):
    path = tmp_path / "semi.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,1025,2,5;6;7\n")
    trace = load_trace(path)  # 512-token blocks: ceil(1,025 / 512) = 3 ids
    assert trace.requests[0].prefix_block_ids == (5, 6, 7)
    assert trace.block_tokens == 512


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    source = tmp_path / f"src{suffix}"
    rows = [{"arrival_s": 0.0, "prompt_tokens": 33, "output_tokens": 4,
             "hash_ids": [9, 10, 11], "max_tokens": 16},
            {"arrival_s": 0.125, "prompt_tokens": 16, "output_tokens": 2,
             "hash_ids": [9]},
            {"arrival_s": 1.5, "prompt_tokens": 1, "output_tokens": 1, "hash_ids": [40]}]
    if suffix == ".jsonl":
        source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        source.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids,max_tokens\n" + "".join(
            f"{r['arrival_s']},{r['prompt_tokens']},{r['output_tokens']},"
            f"{' '.join(map(str, r['hash_ids']))},{r.get('max_tokens', '')}\n" for r in rows))
    first = load_trace(source, block_tokens=16)
    again = load_trace(write_trace(first, tmp_path / f"out{suffix}"), block_tokens=16)
    assert again.requests == first.requests
    assert [r.max_tokens for r in again.requests] == [16, None, None]
    assert again.requests[0].prefix_block_ids == (9, 10, 11)  # ceil(33 / 16) = 3


def test_bundled_trace_written_generic_reads_back(tmp_path):
    mooncake = load_trace("mooncake", first=20)
    again = load_trace(write_trace(mooncake, tmp_path / "m.csv"))
    assert again.requests == mooncake.requests


@pytest.mark.parametrize(("body", "field"), [
    ("arrival_s,prompt_tokens,output_tokens\nsoon,10,3\n", "arrival_s"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,3\n", "arrival_s"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,3\n", "prompt_tokens"),
    ("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,10,3,1 2\n", "hash_ids"),
    ("arrival_s,prompt_tokens,output_tokens,max_tokens\n0,10,3,0\n", "max_tokens"),
    ("arrival_s,prompt_tokens\n0,10\n", "output_tokens"),
])
def test_malformed_rows_name_the_field(tmp_path, body, field):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=field):
        load_trace(path, block_tokens=4)


def test_block_tokens_is_checked(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,3\n")
    with pytest.raises(ConfigError, match="block_tokens"):
        load_trace(path, block_tokens=0)
    with pytest.raises(ConfigError, match="512"):
        load_trace("mooncake", first=2, block_tokens=256)


def test_jsonl_hash_ids_must_be_a_list_not_the_csv_text_form(tmp_path):
    """JSONL ``hash_ids`` is a JSON list (README): the CSV text form "12" is refused with
    the line and field named; the list [12] is the sibling that loads (100 prompt tokens
    need ceil(100 / 512) = 1 id)."""
    bad = tmp_path / "s.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 10, '
                   '"hash_ids": "12"}\n')
    with pytest.raises(TraceError, match=r"line 1, field 'hash_ids'"):
        load_trace(bad)
    good = tmp_path / "l.jsonl"
    good.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 10, '
                    '"hash_ids": [12]}\n')
    assert load_trace(good).requests[0].prefix_block_ids == (12,)


@pytest.mark.parametrize("suffix,text", [
    (".csv", "arrival_s,prompt_tokens,output_tokens,max_tokens\n0,100,10,5\n"),
    (".jsonl", '{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 10, '
               '"max_tokens": 5}\n'),
])
def test_a_cap_below_the_output_names_the_file_line_and_field(tmp_path, suffix, text):
    """max_tokens 5 < output_tokens 10: a TraceError that names where (not a bare message
    about 'request 0' from deep in the loader)."""
    path = tmp_path / f"cap{suffix}"
    path.write_text(text)
    with pytest.raises(TraceError, match=r"line \d, field 'max_tokens': 5 is below"):
        load_trace(path)


@pytest.mark.parametrize(("name", "body", "field"), [
    # A misspelt max_tokens column / key was dropped: the requests ran uncapped.
    ("typo.csv", "arrival_s,prompt_tokens,output_tokens,max_token\n0,10,3,8\n", "max_token"),
    ("typo.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 3, '
                   '"hashids": [1]}\n', "hashids"),
])
def test_unknown_fields_are_refused(tmp_path, name, body, field):
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert f"field {field!r}: unknown field" in str(info.value)
    assert "max_tokens" in str(info.value)  # the known fields are listed


def test_a_trailing_comma_in_the_header_is_not_a_field(tmp_path):
    path = tmp_path / "sheet.csv"  # a spreadsheet export: an empty last column
    path.write_text("arrival_s,prompt_tokens,output_tokens,\n0,10,3,\n")
    assert load_trace(path).requests[0].prompt_tokens == 10


def test_csv_block_ids_follow_the_json_rule(tmp_path):
    """A block id is a name, not a token count: CSV and JSONL accept the same ids. Before,
    the CSV reader parsed ids as token counts: -1 was "negative token count -1" and an id
    above the token-count cap (a hash, say) was refused in CSV but taken in JSONL."""
    big = 10**15  # above any token count, a plausible hash
    csv_path, jsonl_path = tmp_path / "ids.csv", tmp_path / "ids.jsonl"
    csv_path.write_text(f"arrival_s,prompt_tokens,output_tokens,hash_ids\n0,600,3,{big} 7\n")
    jsonl_path.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 600,
                                      "output_tokens": 3, "hash_ids": [big, 7]}) + "\n")
    # 600 tokens in blocks of 512: ceil(600 / 512) = 2 ids
    assert load_trace(csv_path).requests[0].prefix_block_ids == (big, 7)
    assert load_trace(jsonl_path).requests[0].prefix_block_ids == (big, 7)
    csv_path.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,600,3,-1 7\n")
    with pytest.raises(TraceError, match="must be a list of non-negative integers, got '-1'"):
        load_trace(csv_path)


@pytest.mark.parametrize("value", ['"0"', '"2.5"', "true", "false", '"nan"'])
def test_jsonl_arrival_s_must_be_a_json_number(tmp_path, value):
    """JSON lines give ``arrival_s`` as a number, like the counts (``"prompt_tokens": true``
    and ``100.0`` are refused): a string ("0") or a bool is refused naming the line and the
    field; the sibling rows with the numbers 0 and 2.5 load, the earliest becoming 0."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 3}\n'
                   f'{{"arrival_s": {value}, "prompt_tokens": 10, "output_tokens": 3}}\n')
    with pytest.raises(TraceError, match=r"line 2, field 'arrival_s': not a number"):
        load_trace(bad)
    good = tmp_path / "good.jsonl"
    good.write_text('{"arrival_s": 2.5, "prompt_tokens": 10, "output_tokens": 3}\n'
                    '{"arrival_s": 0, "prompt_tokens": 12, "output_tokens": 4}\n')
    assert load_trace(good).requests == (TraceRequest(1, 0.0, 12, 4, None, None),
                                         TraceRequest(0, 2.5, 10, 3, None, None))


def test_csv_arrival_s_text_is_parsed_and_a_negative_time_refused(tmp_path):
    """In a CSV every field is text, so ``arrival_s`` "2.5" is the number 2.5; the help
    (TRACE_FORMATS_HELP) says what the reader does with times: finite and >= 0, the
    earliest becoming 0 (a -5 is refused, not shifted)."""
    bad = tmp_path / "neg.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,3\n-5,10,3\n")
    with pytest.raises(TraceError, match=r"line 3, field 'arrival_s': must be finite, >= 0 "
                                         r"and at most 9,007,199,254,741 seconds, got -5.0"):
        load_trace(bad)
    good = tmp_path / "late.csv"
    good.write_text("arrival_s,prompt_tokens,output_tokens\n7.5,10,3\n5,11,3\n")
    assert load_trace(good).requests == (TraceRequest(1, 0.0, 11, 3, None, None),
                                         TraceRequest(0, 2.5, 10, 3, None, None))


def test_the_help_states_the_arrival_rule_the_reader_applies():
    """The --help text (TRACE_FORMATS_HELP) no longer says "any origin" for arrival_s: it
    states the >= 0 rule the reader enforces and that JSONL times are numbers."""
    text = " ".join(TRACE_FORMATS_HELP.split())
    assert "any origin" not in text
    assert "arrival_s: seconds, finite and >= 0 (the earliest is taken as 0" in text
    assert "a negative time is refused); in JSONL a number, not a string" in text


@pytest.mark.parametrize("ids", ["[true, 7]", "[7, false]", "[-1, 7]", "[7, 2.0]", '[7, "8"]',
                                 "[7, null]", '"7 8"'])
def test_jsonl_hash_ids_refuse_a_bool_a_negative_or_a_non_int(tmp_path, ids):
    """Each of 600 tokens' 2 block ids (blocks of 512) must be a JSON integer >= 0: a bool
    (an int in Python), -1, 2.0, a string or null names line 1 and the field; [7, 8]
    loads."""
    path = tmp_path / "ids.jsonl"
    row = '{{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 3, "hash_ids": {}}}\n'
    path.write_text(row.format(ids))
    with pytest.raises(TraceError, match=r"line 1, field 'hash_ids': must be a list of "
                                         r"non-negative integers"):
        load_trace(path)
    path.write_text(row.format("[7, 8]"))
    assert load_trace(path).requests[0].prefix_block_ids == (7, 8)
