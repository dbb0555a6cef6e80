"""A ``--config`` file's bytes that rest on values the file did not set are said
(``ModelSpec.defaulted``): a note on stderr from plan, simulate and compare, and a
``defaulted`` list in ``plan --json``. Before, ``plan --config`` of a gpt-oss config without
its head counts printed bytes computed from the configuration class's defaults (64 query
heads, 8 KV heads) without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvchain
from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()

GPT_OSS_20B = (Path(kvchain.__file__).parent / "catalog" / "data" / "model_configs"
               / "openai--gpt-oss-20b.json")


@pytest.fixture
def headless(tmp_path: Path) -> Path:
    """The published gpt-oss-20b config without its two head counts."""
    cfg = json.loads(GPT_OSS_20B.read_text())
    assert cfg["num_key_value_heads"] == 8 and cfg["num_attention_heads"] == 64
    del cfg["num_key_value_heads"], cfg["num_attention_heads"]
    path = tmp_path / "headless.json"
    path.write_text(json.dumps(cfg))
    return path


def _flat(text: str) -> str:
    return " ".join(text.split())  # the console wraps long lines


def test_plan_says_what_the_config_did_not_set(headless: Path):
    result = runner.invoke(app, ["plan", "--config", str(headless), "--json"])
    assert result.exit_code == 0, result.output
    said = _flat(result.stderr)
    assert "note: headless.json does not set" in said
    assert "num_key_value_heads = 8 (transformers" in said and "GptOssConfig" in said
    assert "num_attention_heads = 64" in said
    report = json.loads(result.stdout)
    fields = {d["field"]: d["value"] for d in report["defaulted"]}
    assert fields["num_key_value_heads"] == "8" and fields["num_attention_heads"] == "64"
    # 12 full layers x 8 KV heads x 64 x (K + V) x 2 B = 24,576 B per token: the bytes
    # rest on the class's 8 heads, which is why they are said.
    full = next(b for b in report["bands"] if b["band"] == "full")
    assert full["bytes_per_token"] == 12 * 8 * 64 * 2 * 2


def test_the_published_file_sets_its_heads(headless: Path):
    result = runner.invoke(app, ["plan", "--config", str(GPT_OSS_20B), "--json"])
    assert result.exit_code == 0, result.output
    assert "num_key_value_heads" not in _flat(result.stderr)
    fields = {d["field"] for d in json.loads(result.stdout)["defaulted"]}
    assert "num_key_value_heads" not in fields


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_runs_say_it_too(headless: Path, command: str):
    args = [command, "--config", str(headless), "--trace", "azure-conv", "--requests", "2",
            "--json", "--clock", "steps"]
    if command == "compare":
        args += ["--managers", "kvchain"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "num_key_value_heads = 8" in _flat(result.stderr)
