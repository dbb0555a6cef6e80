"""Round-10 breaker findings in the CLI: each exited 0 (or named the wrong thing) on input
it should refuse. Every refusal is one ``error:`` line on stderr, exit 2, no traceback
(:func:`kvchain.cli.common.fail`), and has a sibling where the good input runs."""

from __future__ import annotations

import json

import pytest

from .helpers import flat, run


def refused(*args: str) -> str:
    """Run ``kvchain ARGS``; assert a clean refusal; return stderr flattened."""
    result = run(*args, columns=200)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    err = flat(result.stderr)
    assert err.startswith("error: "), err
    return err


# --- models --tp 7 -----------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_models_at_a_tp_that_splits_no_model_is_an_error(as_json: bool) -> None:
    """Was: exit 0 with a table of ``-`` rows. 7 is prime and no bundled model has 7 or
    a multiple of 7 heads (gpt-oss-120b: 64 attention heads)."""
    err = refused("models", "--tp", "7", *(["--json"] if as_json else []))
    assert "--tp 7 splits no bundled model" in err
    assert "gpt-oss-120b: tp=7 does not divide num_attention_heads=64" in err


def test_models_at_a_tp_that_splits_some_models_lists_them() -> None:
    """The sibling: at tp = 2 every row has bytes (gpt-oss-120b: 64 heads / 2), so the
    table is shown, exit 0."""
    result = run("models", "--tp", "2", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    gpt = next(r for r in rows if r["name"] == "gpt-oss-120b")
    assert gpt["error"] is None and gpt["tp"] == 2


# --- prefix-bounds --capacity-bytes 1 -------------------------------------------------------


def test_prefix_bounds_refuses_a_capacity_under_one_page() -> None:
    """Was: 1 B became one page. gpt-oss-20b's full attention: 12 full layers x 8 KV heads
    x 64 dims x 2 (K, V) x 2 B = 24,576 B per token; a 16-token page is 393,216 B."""
    for capacity in ("1", "393215"):
        err = refused("prefix-bounds", "--requests", "5", "--model", "gpt-oss-20b",
                      "--capacity-bytes", capacity)
        assert f"--capacity-bytes {int(capacity):,} is less than one page" in err
        assert "16 tokens x 24,576 B of full attention per token = 393,216 B" in err


def test_prefix_bounds_at_one_page_and_just_under_two() -> None:
    """The siblings: 393,216 B is 1 page; 786,431 B is still floor(786,431 / 393,216) = 1."""
    for capacity in ("393216", "786431"):
        result = run("prefix-bounds", "--requests", "5", "--model", "gpt-oss-20b",
                     "--capacity-bytes", capacity, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)[1]["capacity_pages"] == 1


# --- a CSV trace row of the wrong length ---------------------------------------------------


@pytest.mark.parametrize(("row", "field"), [("0.0,100", "output_tokens"),
                                            ("0.0", "prompt_tokens"),
                                            ("0.0,100,5,7", "#4 (past the header)")])
def test_a_short_csv_row_names_the_first_missing_field(tmp_path, row: str, field: str) -> None:
    """Was: every short row blamed the first column (``arrival_s``), which is there."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,5\n" + row + "\n")
    err = refused("simulate", "--trace", str(trace))
    assert f"line 3, field '{field}': expected 3 fields, got {len(row.split(','))}" in err


# --- replay: unknown keys and ops their header makes impossible ----------------------------


def _stream(tmp_path, *ops: str) -> str:
    """A one-band stream (``full``: 1 band) with ``ops`` after a generated header."""
    path = tmp_path / "s.jsonl"
    assert run("replay", "--generate", "full", "--ops", "2", "-o", str(path)).exit_code == 0
    header = path.read_text().splitlines()[0]
    path.write_text("\n".join([header, *ops]) + "\n")
    return str(path)


@pytest.mark.parametrize(("op", "message"), [
    ('{"op": "take", "pages": [1], "expcet": "fit"}', "unknown key(s) ['expcet'] for op 'take'"),
    ('{"op": "fence_hold", "x": 1}', "unknown key(s) ['x'] for op 'fence_hold'"),
    ('{"op": "take", "pages": [1, 2, 3]}', "3 page counts for a chain of 1 bands"),
    ('{"op": "release", "band": 5, "vids": [1]}', "band 5 of a chain of 1 bands"),
    ('{"op": "cache_insert", "pages": [[1], [2]]}', "2 id lists for a chain of 1 bands"),
    ('{"op": "take", "pages": [-1]}', "expected an integer >= 0, got -1"),
    ('{"op": "host_load", "entry": 0}', "a host operation in a section whose header gives "
                                        "no host_slots"),
])
def test_replay_refuses_unknown_keys_and_inconsistent_ops(tmp_path, op: str,
                                                          message: str) -> None:
    """Was: an unknown key ignored (a misspelt ``expect`` dropped its check) and an op the
    header makes impossible replayed, then counted as a chain violation (exit 1)."""
    err = refused("replay", _stream(tmp_path, op))
    assert "s.jsonl:2:" in err and message in err


def test_replay_refuses_a_header_with_an_unknown_key_or_the_wrong_shape(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    run("replay", "--generate", "full", "--ops", "2", "-o", str(path))
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    for change, message in (({"colour": 1}, "unknown header key(s) ['colour']"),
                            ({"shape": "window|full"}, "the header's shape 'window|full' is "
                                                       "not its classes' ('full')")):
        path.write_text("\n".join([json.dumps(header | change), *lines[1:]]) + "\n")
        assert message in refused("replay", str(path))


def test_replay_of_consistent_ops_runs(tmp_path) -> None:
    """The sibling: a take of 1 page of the one band, expected to fit, replays (exit 0)."""
    result = run("replay", _stream(tmp_path, '{"op": "take", "pages": [1], "expect": "fit"}'),
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["ok"] is True


# --- a draft of another model family ----------------------------------------------------------


@pytest.mark.parametrize("command", [["plan"], ["simulate", "--spec-tokens", "2",
                                                "--requests", "3"]])
def test_a_draft_of_another_family_is_refused(command: list[str]) -> None:
    """Was: accepted. Llama-3.1-8B's vocabulary is 128,256 tokens, Qwen3-0.6B's 151,936
    (their bundled config.json files): a draft proposes the target's token ids."""
    err = refused(*command, "--model", "Llama-3.1-8B", "--draft-model", "Qwen3-0.6B")
    assert ("--draft-model Qwen3-0.6B: its vocabulary of 151,936 tokens is not the target "
            "Llama-3.1-8B's (128,256)") in err


def test_a_draft_of_the_target_family_is_accepted() -> None:
    """The sibling: gemma-3-1b drafts for gemma-3-27b (262,144 tokens each)."""
    result = run("plan", "--model", "gemma-3-27b", "--draft-model", "gemma-3-1b", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["draft"]["name"] == "gemma-3-1b"


def test_a_draft_of_another_family_is_refused_beside_a_config_file(tmp_path) -> None:
    """A ``--config`` target's vocabulary is its config's ``vocab_size``."""
    from kvchain.catalog.loader import read_bundled_config

    config = tmp_path / "config.json"
    config.write_text(json.dumps(read_bundled_config("model_configs/meta-llama--"
                                                     "Meta-Llama-3.1-8B.json")))
    err = refused("plan", "--config", str(config), "--draft-model", "Qwen3-0.6B")
    assert "its vocabulary of 151,936 tokens is not the target" in err and "(128,256)" in err


# --- plan --prompt past the context --------------------------------------------------------


def test_plan_refuses_a_mix_past_the_models_context() -> None:
    """Was: silent (every concurrency 0). gpt-oss-120b's context is 131,072 tokens
    (max_position_embeddings): 130,561 + 512 = 131,073 passes it by one."""
    err = refused("plan", "--prompt", "130561")
    assert ("--prompt 130,561 + --output 512 tokens pass the model's context 131,072 "
            "tokens") in err


def test_plan_of_a_mix_that_fills_the_context_exactly() -> None:
    """The sibling: 130,560 + 512 = 131,072 tokens, the context itself, is planned."""
    result = run("plan", "--prompt", "130560", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["request"] == {"prompt": 130_560, "output": 512}
