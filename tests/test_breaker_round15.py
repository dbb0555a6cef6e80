"""A breaker's finds of round 15 at the CLI's entry points (``plan``, ``compare``,
``models``, ``prefix-bounds``) and the readers under them, each refused with a typed
error that changes nothing, beside a sibling where the good input works."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError, DuplicateFieldError
from kvchain.model.spec_file import load_spec_file
from kvchain.report.sweep import numbered_rows
from kvchain.unique_fields import user_json

runner = CliRunner()
_load_commands()

DEEP = "[" * 100_000 + "]" * 100_000  # past the json module's recursion limit


# --- every reader of a user's JSON: one parser, one kind of error ----------------------------

@pytest.mark.parametrize(("text", "match"), [
    (DEEP, "unusable JSON: maximum recursion depth"),
    ('{"a": ' + "9" * 5_000 + "}", "unusable JSON: Exceeds the limit"),
    ("{not json", "invalid JSON: Expecting property name"),
])
def test_user_json_refuses_every_bad_text_as_a_config_error(text, match):
    with pytest.raises(ConfigError, match=match):
        user_json(text)


def test_user_json_reads_and_refuses_a_field_named_twice():
    assert user_json('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    with pytest.raises(DuplicateFieldError):
        user_json('{"a": 1, "a": 2}')
    assert user_json('{"a": 1, "a": 2}', unique=False) == {"a": 2}  # json's own rule


def test_a_deeply_nested_spec_file_is_a_config_error(tmp_path):
    """Before: RecursionError escaped ``load_spec_file`` (a traceback, exit 1)."""
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(ConfigError, match=r"spec file .*deep\.json: unusable JSON"):
        load_spec_file(path)
    result = runner.invoke(app, ["plan", "--spec", str(path)])
    assert result.exit_code == 2
    assert "unusable JSON" in result.stderr and not result.stdout


def test_a_spec_file_reads(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"full": 32_000, "name": "tiny"}))
    assert load_spec_file(path).name == "tiny"


def test_a_deeply_nested_resume_row_is_a_config_error(tmp_path):
    """Before: a RecursionError from the ``--resume`` file's row (not a ValueError)."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"key": "a"}\n' + DEEP + "\n" + '{"key": "b"}\n')
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: not a JSON row"):
        numbered_rows(path)
    path.write_text('{"key": "a"}\n{"key": "b"}\n')
    assert [n for n, _ in numbered_rows(path)] == [1, 2]


def test_a_deeply_nested_replay_line_is_a_config_error(tmp_path):
    """Before: RecursionError (deep nesting) and ValueError (a 5,000-digit int) escaped
    ``read_stream``, which caught only a JSONDecodeError."""
    from kvchain.testing.replay import generate_section, read_stream, write_stream

    path = tmp_path / "ops.jsonl"
    write_stream(path, [generate_section("window|full", 20, seed=1)])
    assert len(read_stream(path)[0].ops) == 20
    good = path.read_text()
    for bad, why in ((DEEP, "maximum recursion depth"), ("9" * 5_000, "Exceeds the limit")):
        path.write_text(good + bad + "\n")
        with pytest.raises(ConfigError, match=f"ops\\.jsonl:22: not JSON: unusable JSON: {why}"):
            read_stream(path)


# --- what the commands print: names as they are, at a width that shows them ----------------

MARKUP_NAME = "[/bold]x $\\frac$"  # rich markup and matplotlib mathtext, both unbalanced


def _markup_spec(tmp_path):
    path = tmp_path / "mk.json"
    path.write_text(json.dumps({"full": 32_000, "name": MARKUP_NAME,
                                "weight_bytes": 10**9, "total_params": 1_000,
                                "active_params": 1_000}))
    return path


@pytest.mark.parametrize("command", [["plan"], ["simulate", "--requests", "3"],
                                     ["compare", "--requests", "3", "--managers", "kvchain"]])
def test_a_name_with_markup_prints_as_it_is(tmp_path, command):
    """Before: compare's and simulate's table titles read the model name as rich markup
    (MarkupError after the run: exit 1, a traceback); plan escaped it by hand."""
    result = runner.invoke(app, [*command, "--spec", str(_markup_spec(tmp_path))],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert MARKUP_NAME in result.stdout
    assert "\\[" not in result.stdout  # no escape left over


def test_compare_plots_a_name_with_mathtext(tmp_path):
    """Before: the PNG's title read "$\\frac$" as mathtext, and savefig failed after
    compare.json was written."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["compare", "--requests", "3", "--managers", "kvchain",
                                 "--spec", str(_markup_spec(tmp_path)), "--out", str(out),
                                 "--json"])
    assert result.exit_code == 0, result.stderr
    assert (out / "compare.png").stat().st_size > 0
    assert json.loads((out / "compare.json").read_text())["kvchain"]["summary"]


@pytest.mark.parametrize("columns", ["0", "1", "20"])
def test_a_tiny_terminal_width_still_shows_the_table(columns):
    """Before: ``COLUMNS=0`` printed nothing and exited 0; 20 cut numbers to "…"."""
    result = runner.invoke(app, ["models"], env={"COLUMNS": columns})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["gpt-oss-120b", "36,864"] for line in lines if line.strip())
    assert "…" not in result.stdout
    assert max(map(len, lines)) <= 80


def test_an_80_column_terminal_is_kept():
    wide = runner.invoke(app, ["models"], env={"COLUMNS": "80"}).stdout
    assert wide == runner.invoke(app, ["models"], env={"COLUMNS": "0"}).stdout


class _FullDisk:
    """A standard output on a full disk (``> /dev/full``)."""

    encoding = "utf-8"

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def isatty(self):
        return False


@pytest.mark.parametrize("command", [["models", "--json"], ["plan"]])
def test_a_full_stdout_is_an_error_not_a_traceback(monkeypatch, capsys, command):
    """Before: OSError ENOSPC escaped ``main`` (a traceback, exit 1)."""
    from kvchain.cli import main

    monkeypatch.setattr("sys.argv", ["kvchain", *command])
    monkeypatch.setattr("sys.stdout", _FullDisk())
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 1
    assert "error: cannot write: [Errno 28] No space left on device" in capsys.readouterr().err


def test_main_runs_a_command(monkeypatch, capsys):
    from kvchain.cli import main

    monkeypatch.setattr("sys.argv", ["kvchain", "models", "--json"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "gpt-oss-120b"


# --- plan: options that would print a capacity that is not there ---------------------------

def test_most_state_slots_by_hand():
    from kvchain.capacity import most_state_slots
    from kvchain.layout import plan_layout
    from kvchain.model.declared import declare_model

    # 20 slots of 50,000,000 B fill the 1e9 B buffer; 19 leave room for a 16,000 B page;
    # 18 x 5e7 + 16,000 B is all a 950,015,999 B buffer holds
    model = declare_model("f", full=1_000, state=50_000_000)
    assert most_state_slots(plan_layout(model.classes, 10**9, 16)) == 19
    assert most_state_slots(plan_layout(model.classes, 950_016_000, 16)) == 19
    assert most_state_slots(plan_layout(model.classes, 950_015_999, 16)) == 18
    assert most_state_slots(plan_layout(declare_model("g", full=1_000).classes, 10**9,
                                        16)) is None


def test_plan_refuses_more_slots_held_than_the_buffer_holds(tmp_path):
    """Before: past the slots the chain holds, the token-capacity row vanished from the
    table (0 on both sides) and the JSON said 0 tokens, with nothing on stderr."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "s", "full": 1_000, "state": 50_000_000}))
    args = ["plan", "--spec", str(spec), "--buffer-bytes", str(10**9), "--json"]
    held = json.loads(runner.invoke(app, [*args, "--slots-held", "19"]).stdout)
    # 19 slots leave 50,000,000 B: 3,125 pages of 16,000 B, 50,000 tokens
    assert held["chain_capacity"]["slots_held"] == 19
    assert held["chain_capacity"]["full_tokens"] == 50_000
    result = runner.invoke(app, [*args, "--slots-held", "20"])
    assert result.exit_code == 2 and not result.stdout
    assert "--slots-held 20 passes the 19 state slots" in result.stderr


def test_plan_warns_of_slots_held_without_a_state_band():
    result = runner.invoke(app, ["plan", "--slots-held", "5", "--json"])
    assert result.exit_code == 0
    assert "changes nothing: gpt-oss-120b has no state band" in result.stderr


def test_plan_notes_a_draft_without_spec_tokens():
    """plan prices a draft's weights and KV at any k (a planner's question); without
    --spec-tokens it now says that its drafts are not priced (compare refuses the run)."""
    result = runner.invoke(app, ["plan", "--model", "Qwen3-8B", "--draft-model",
                                 "Qwen3-0.6B", "--json"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert "without --spec-tokens: the figures price the draft's weights and KV" in \
        result.stderr
    priced = runner.invoke(app, ["plan", "--model", "Qwen3-8B", "--draft-model",
                                 "Qwen3-0.6B", "--spec-tokens", "3", "--json"])
    assert "without --spec-tokens" not in priced.stderr


# --- traces: a rate scale that moves arrivals past the times a trace may hold ---------------

@pytest.mark.parametrize("scale", [1e-10, 1e-13, 1e-300])
def test_a_rate_scale_past_the_time_limit_is_refused(tmp_path, scale):
    """Before: arrivals at 1e13 s and later lost the milliseconds of a step (the second of
    two identical requests got a TTFT of 0 from 1e-13 down), exit 0 without a word."""
    from kvchain.sim.traces import load_trace

    path = tmp_path / "two.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,1000,50\n1000,1000,50\n")
    with pytest.raises(ConfigError, match="past the 9,007,199,254,741 s limit"):
        load_trace(path, rate_scale=scale)


def test_a_rate_scale_to_the_time_limit_loads(tmp_path):
    from kvchain.sim.traces import load_trace

    path = tmp_path / "two.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,1000,50\n1000,1000,50\n")
    # 1,000 s / (1,000 / 9,007,199,254.741) = the limit itself, 2**53 ms
    trace = load_trace(path, rate_scale=1000 / (2**53 / 1000))
    assert trace.requests[1].arrival_s == pytest.approx(2**53 / 1000, rel=1e-15)


# --- compare: a run that stops leaves stdout empty and names the manager --------------------

def test_a_stopped_compare_prints_nothing_on_stdout():
    """Before: the progress bar wrote a newline to stdout before the error."""
    result = runner.invoke(app, ["compare", "--requests", "3", "--managers",
                                 "kvchain,fixed-pools", "--buffer-bytes", "6488064"])
    assert result.exit_code == 2
    assert result.stdout == ""
    # the fixed pools fail (the window pool's share holds no request), not the chain
    assert "error: fixed-pools: the buffer (window|full, 6,488,064 B) cannot hold" in \
        " ".join(result.stderr.split())


def test_the_chain_alone_runs_on_that_buffer():
    result = runner.invoke(app, ["compare", "--requests", "3", "--managers", "kvchain",
                                 "--buffer-bytes", "6488064", "--json"])
    assert result.exit_code == 0, result.stderr
    assert set(json.loads(result.stdout)) == {"kvchain"}


# --- Hugging Face configs: fields read as something they cannot be -------------------------

_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 32,
          "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 512,
          "vocab_size": 1000}


@pytest.mark.parametrize("kv_heads", [64, 3, 12])
def test_kv_heads_that_do_not_divide_the_query_heads_are_refused(kv_heads):
    """Before: 64 KV heads of 32 query heads priced 2x the bytes of multi-head attention,
    3 of 32 (no whole group) a fraction of a group, both accepted."""
    from kvchain.model import load_hf_config

    with pytest.raises(ConfigError, match=f"'num_key_value_heads' \\({kv_heads}\\) must "
                                          f"divide 'num_attention_heads' \\(32\\)"):
        load_hf_config({**_LLAMA, "num_key_value_heads": kv_heads})


@pytest.mark.parametrize(("kv_heads", "per_token"), [(32, 2 * 2 * 32 * 64 * 2),
                                                     (8, 2 * 2 * 8 * 64 * 2),
                                                     (1, 2 * 2 * 1 * 64 * 2)])
def test_kv_heads_that_divide_the_query_heads_load(kv_heads, per_token):
    from kvchain.model import load_hf_config

    # 2 layers x (K + V) x heads x 64 dims x 2 B (bf16)
    model = load_hf_config({**_LLAMA, "num_key_value_heads": kv_heads})
    assert sum(c.bytes_per_token for c in model.classes) == per_token


@pytest.mark.parametrize(("field", "value"), [("text_config", 5), ("text_config", []),
                                              ("quantization_config", 5),
                                              ("quantization_config", "fp8")])
def test_a_config_object_field_of_another_type_is_refused(field, value):
    """Before: ignored (exit 0), while a bad ``layer_types`` was refused."""
    from kvchain.model import load_hf_config

    with pytest.raises(ConfigError, match=f"config field '{field}' must be a JSON object"):
        load_hf_config({**_LLAMA, field: value})
    assert load_hf_config({**_LLAMA, field: None}).classes  # null: not given


# --- prefix-bounds: a trace whose keys would not fit in memory ------------------------------

def _keyed_request(rid, tokens):
    from kvchain.sim.traces import TraceRequest

    return TraceRequest(request_id=rid, arrival_s=0.0, prompt_tokens=tokens,
                        output_tokens=1, prefix_block_ids=tuple(range(-(-tokens // 512))))


def test_keyed_prompts_refuses_more_pages_than_it_keys(monkeypatch):
    """Before: one 2**31-token prompt at P = 1 passed every check and then built 2.1e9 keys
    (about 170 GB). The limit is checked from the token counts, before any key."""
    from kvchain.sim import prefix_bounds

    monkeypatch.setattr(prefix_bounds, "MAX_KEYED_PAGES", 100)
    # 1,000 + 615 tokens at P = 16: 62 + 38 = 100 whole pages: keyed
    keyed = prefix_bounds.keyed_prompts([_keyed_request(0, 1_000), _keyed_request(1, 615)], 16)
    assert [len(keys) for _, keys in keyed] == [62, 38]
    # 1,000 + 624 tokens: 62 + 39 = 101
    with pytest.raises(ConfigError, match="make 101 pages of 16 tokens, past the 100"):
        prefix_bounds.keyed_prompts([_keyed_request(0, 1_000), _keyed_request(1, 624)], 16)


def test_prefix_bounds_refuses_a_trace_past_the_key_limit(tmp_path):
    from kvchain.sim.prefix_bounds import MAX_KEYED_PAGES

    # two prompts of 2**24 + 1 tokens at P = 1: 2**25 + 2 pages
    path = tmp_path / "big.jsonl"
    tokens = 2**24 + 1
    row = {"timestamp": 0, "input_length": tokens, "output_length": 1,
           "hash_ids": list(range(-(-tokens // 512)))}
    path.write_text((json.dumps(row) + "\n") * 2)
    result = runner.invoke(app, ["prefix-bounds", "--trace", str(path), "--page-size", "1"])
    assert result.exit_code == 2 and not result.stdout
    assert f"make {2 * tokens:,} pages of 1 tokens, past the {MAX_KEYED_PAGES:,}" in \
        " ".join(result.stderr.split())
    ok = runner.invoke(app, ["prefix-bounds", "--trace", str(path), "--page-size", "16",
                             "--json"])
    assert ok.exit_code == 0, ok.stderr


def test_a_trace_that_is_a_folder_or_empty_is_named_so(tmp_path):
    """Before: a folder read "no such trace file", an empty name ".: no such trace file"."""
    from kvchain.errors import TraceError
    from kvchain.sim.traces import load_trace

    with pytest.raises(TraceError, match="is a folder, not a trace file"):
        load_trace(tmp_path)
    with pytest.raises(TraceError, match="got an empty name"):
        load_trace("")
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.csv")
    assert len(load_trace("mooncake", first=3).requests) == 3


def test_prefix_bounds_notes_pages_no_prompt_fills():
    """Before: 0.00% with no word of why."""
    args = ["prefix-bounds", "--requests", "20", "--json"]
    big = runner.invoke(app, [*args, "--page-size", "1000000"], env={"COLUMNS": "200"})
    assert big.exit_code == 0
    assert json.loads(big.stdout)[0]["hit_tokens"] == 0
    assert "no prompt fills a page of 1,000,000 tokens" in big.stderr
    assert "no prompt fills" not in runner.invoke(app, args).stderr


def test_models_warns_that_wide_changes_nothing_with_json():
    result = runner.invoke(app, ["models", "--wide", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)
    assert "--wide changes nothing with --json" in result.stderr
    assert not runner.invoke(app, ["models", "--json"]).stderr


def test_compare_checks_every_manager_before_the_first_run(monkeypatch):
    """Before: kvchain's whole run went first, then the fixed pools failed their set-up."""
    from kvchain.sim import compare

    ran = []
    real = compare.run_manager
    monkeypatch.setattr(compare, "run_manager",
                        lambda config, kind, **kw: ran.append(kind) or real(config, kind, **kw))
    args = ["compare", "--requests", "3", "--buffer-bytes", "6488064", "--json"]
    result = runner.invoke(app, [*args, "--managers", "kvchain,fixed-pools"])
    assert result.exit_code == 2 and ran == []
    ok = runner.invoke(app, [*args, "--managers", "kvchain"])
    assert ok.exit_code == 0 and [str(k) for k in ran] == ["kvchain"]


def test_compare_writes_both_outputs_or_neither(monkeypatch, tmp_path, capsys):
    """Before: compare.json was written, then the PNG's write failed: half the output and a
    traceback."""
    from kvchain.cli import compare as compare_cli
    from kvchain.cli import main

    def full_disk(runs, path, title=""):
        path.write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    out = tmp_path / "out"
    argv = ["kvchain", "compare", "--requests", "3", "--managers", "kvchain", "--out",
            str(out), "--json"]
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setattr(compare_cli, "compare_plot", full_disk)
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 1
    assert "error: cannot write: [Errno 28] No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == []  # the folder made, nothing in it
    monkeypatch.undo()
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.png"]


def test_simulate_writes_all_outputs_or_none(monkeypatch, tmp_path):
    """The same kind in simulate: metrics.json and requests.csv were written before the
    plots, and stayed when a plot's write failed."""
    from kvchain.cli import simulate as simulate_cli

    def full_disk(recorder, out_dir):
        (out_dir / "bands.png").write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    out = tmp_path / "out"
    args = ["simulate", "--requests", "3", "--out", str(out), "--json"]
    monkeypatch.setattr(simulate_cli, "write_all_plots", full_disk)
    result = runner.invoke(app, args)
    assert isinstance(result.exception, OSError)  # main() reports it: "cannot write"
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    assert runner.invoke(app, args).exit_code == 0
    names = sorted(p.name for p in out.iterdir())
    assert {"metrics.json", "requests.csv", "bands.png"} <= set(names)
    assert not [n for n in names if n.startswith(".kvchain-partial")]


# --- sweep --resume: a torn last row ------------------------------------------------------

def test_drop_torn_row_by_hand(tmp_path):
    from kvchain.report.sweep import drop_torn_row

    path = tmp_path / "rows.jsonl"
    assert not drop_torn_row(path)  # no file
    for whole in ('{"key": "a"}\n', '{"key": "a"}\n{"key": "b"}\n', '{"key": "a"}'):
        path.write_text(whole)
        assert not drop_torn_row(path) and path.read_text() == whole
    for torn in ('{"key": broken\n', '{"key": brok', '{"key": broken\n\n'):
        path.write_text('{"key": "a"}\n' + torn)
        assert drop_torn_row(path)
        assert path.read_text() == '{"key": "a"}\n'
    path.write_text('{"key": tor')
    assert drop_torn_row(path) and path.read_text() == ""


def test_sweep_resume_after_a_torn_row_resumes_again(tmp_path):
    """Before: the next row was appended after the torn line (exit 0), and the resume after
    it was refused: "sweep.jsonl:3: not a JSON row" (exit 2)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i * 0.5},{200 + 10 * i},8\n" for i in range(5)))
    out = tmp_path / "r"
    base = ["sweep", "--models", "Jet-Nemotron-2B", "--traces", str(trace), "--requests",
            "5", "--workers", "1", "--no-plots", "--managers", "kvchain", "--out", str(out)]
    assert runner.invoke(app, [*base, "--rate-scales", "1,2"]).exit_code == 0
    rows = out / "sweep.jsonl"
    with rows.open("a") as fh:
        fh.write('{"key": broken\n')
    third = runner.invoke(app, [*base, "--resume", "--rate-scales", "1,2,3"])
    assert third.exit_code == 0, third.stderr
    assert "torn last line (an interrupted write) is dropped" in " ".join(third.stderr.split())
    fourth = runner.invoke(app, [*base, "--resume", "--rate-scales", "1,2,3,4"])
    assert fourth.exit_code == 0, fourth.stderr
    assert "4 points, 1 to run (3 already in sweep.jsonl)" in fourth.stdout
    assert len(rows.read_text().splitlines()) == 4


def test_simulate_prints_no_header_before_a_set_up_error():
    """Before: the model line and the band table were on stdout before the host tier's
    refusal (exit 2)."""
    args = ["simulate", "--model", "Jet-Nemotron-2B", "--requests", "3"]
    refused = runner.invoke(app, [*args, "--host-bytes", "1"])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "the host tier holds no resume interval" in " ".join(refused.stderr.split())
    ran = runner.invoke(app, args, env={"COLUMNS": "120"})
    assert ran.exit_code == 0 and ran.stdout.startswith("Jet-Nemotron-2B on H200")


def test_fast_forward_with_spec_tokens_is_warned_of():
    """Speculative steps are never fast-forwarded (sim.engine: ``not self.spec``); typing
    --fast-forward beside --spec-tokens said nothing."""
    args = ["simulate", "--requests", "3", "--spec-tokens", "2", "--json"]
    typed = runner.invoke(app, [*args, "--fast-forward"], env={"COLUMNS": "200"})
    assert typed.exit_code == 0
    assert "--fast-forward has no effect with --spec-tokens" in typed.stderr
    assert "--fast-forward" not in runner.invoke(app, args).stderr


def test_more_requests_than_the_trace_holds_is_noted(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i * 0.5},{200 + 10 * i},8\n" for i in range(5)))
    args = ["simulate", "--trace", str(trace), "--json"]
    many = runner.invoke(app, [*args, "--requests", "100"], env={"COLUMNS": "300"})
    assert many.exit_code == 0
    assert "all 5 requests of the trace (fewer than --requests 100)" in many.stderr
    assert "fewer than" not in runner.invoke(app, [*args, "--requests", "5"],
                                             env={"COLUMNS": "300"}).stderr


def test_the_draft_model_help_says_when_the_cache_is_off():
    text = " ".join(runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "400"})
                    .stdout.split())
    assert "off where the draft's state band makes a second one beside the target's" in text


def test_a_stream_op_without_a_field_names_it():
    """Before: the bare KeyError text, "bad operation {...}: 'pages'"."""
    from kvchain.testing.streams import op_from_json

    with pytest.raises(ConfigError, match="it lacks the field 'pages'"):
        op_from_json({"op": "take"})
    assert op_from_json({"op": "take", "pages": [1, 0]}).pages == (1, 0)


def test_a_sweep_rate_scale_of_inf_says_finite():
    from kvchain.sim.sweep import SweepConfigError, SweepGrid

    with pytest.raises(SweepConfigError, match=r"finite numbers > 0, got \[inf\]"):
        SweepGrid(rate_scales=(float("inf"),))


# --- partial hits: a prompt cached whole keeps its checkpoint ------------------------------

FOUR = ("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,1150,2,0 1 2\n"
        "10,1644,2,0 1 2 1010\n20,1459,2,0 1 2\n30,1487,2,0 1 2\n")


@pytest.mark.parametrize(("partial", "gap_tokens"), [(False, None), (True, 19 * 16)])
def test_a_partial_hit_of_a_prompt_cached_whole_saves_its_checkpoint(tmp_path, partial,
                                                                     gap_tokens):
    """By hand, 16-token pages, checkpoints at prompt ends (``--cache-points ends``):
    r0 (1,150 tokens, 71 keyed pages) checkpoints at 71; r1 (1,644, 102 pages) hits 71
    (1,136 tokens) and caches pages to 102; r2 (1,459, 91 pages, all of them r1's) resumes
    at 71 (1,136) and checkpoints at 91 (its end); r3 (1,487, 92 pages) hits 91 (1,456):
    3,728 hit tokens. Before, r2's partial hit shared all 91 pages, so its prompt was
    cached whole, nothing was inserted and the checkpoint at 91 was never saved: r3 too
    resumed at 71 (3,408 hit tokens, 656 recomputed). Now the partial hit stops one page
    short (90: a gap of 19 pages from 71) and the prefill's insert saves it."""
    trace = tmp_path / "four.csv"
    trace.write_text(FOUR)
    args = ["simulate", "--trace", str(trace), "--model", "Jet-Nemotron-2B",
            "--cache-points", "ends", "--json"] + (["--partial-hits"] if partial else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    extra = json.loads(result.stdout)["summary"]["extra"]
    assert extra["prefix_hit_tokens"] == 1_136 + 1_136 + 1_456
    assert extra.get("partial_tokens") == gap_tokens
