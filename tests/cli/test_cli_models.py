"""``kvchain models``: table and JSON output."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

runner = CliRunner()


def invoke(*args: str):
    _load_commands()
    # Typer runs a lone registered command without its name; with several it is a group.
    is_group = hasattr(typer.main.get_command(app), "commands")
    argv = ["models", *args] if is_group else list(args)
    return runner.invoke(app, argv, env={"COLUMNS": "240"})


def test_json_output():
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert len(rows) == 25
    oss = rows["gpt-oss-120b"]
    assert (oss["classes"], oss["e_full"], oss["e_win"], oss["w"], oss["s"]) == (
        "window+full",
        36_864,
        36_864,
        128,
        0,
    )
    assert oss["total_params"] == 116_788_838_400
    jet = rows["Jet-Nemotron-2B"]
    assert (jet["classes"], jet["e_full"], jet["e_win"], jet["w"], jet["s"]) == (
        "state+window+full",
        2_048,
        2_048,
        1_152,
        14_745_600,
    )
    scout = rows["Llama-4-Scout-17B-16E"]
    assert (scout["e_local"], scout["c"], scout["e_win"]) == (147_456, 8_192, 0)
    assert rows["Qwen3-Next-80B-A3B"]["s"] == 39_518_208
    assert all(row["error"] is None for row in rows.values())


def test_json_tp_and_kv_dtype():
    result = invoke("--json", "--tp", "8", "--kv-dtype", "fp8")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["gpt-oss-120b"]["e_full"] == 36_864 // 8 // 2
    assert rows["gpt-oss-120b"]["tp"] == 8
    gemma = rows["gemma-3-1b"]  # 4 query heads cannot split over 8 ranks
    assert gemma["error"] == "tp=8 does not divide num_attention_heads=4"
    assert gemma["e_full"] == 0


def test_table_output():
    result = invoke("--wide")  # every column (the default is narrow: 80 columns)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "(per rank, tp=1, KV bf16)" in out and "S: bytes per request" in out
    line = next(ln for ln in out.splitlines() if "Jet-Nemotron-2B" in ln)
    for cell in ("state+window+full", "2,048 (1,152)", "14,745,600", "2.0B / 2.0B"):
        assert cell in line
    scout = next(ln for ln in out.splitlines() if "Llama-4-Scout-17B-16E" in ln)
    assert "147,456 (8,192)" in scout
    assert "116.8B / 5.1B" in out


def test_wide_table_never_cuts_a_cell_at_80_columns():
    """--wide at an 80-column terminal prints whole cells (lines longer than 80) instead of
    squeezing numbers to "…" (a regression: E_full vanished and S showed "39…")."""
    result = runner.invoke(app, ["models", "--wide"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    jet = next(ln for ln in result.output.splitlines() if "Jet-Nemotron-2B" in ln)
    for cell in ("state+window+full", "2,048 (1,152)", "14,745,600", "2.0B / 2.0B"):
        assert cell in jet


def test_default_table_fits_80_columns_without_cutting_names():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in result.output
    # the longest name whole on one line, with its E_full and S (models.json values)
    row = next(ln for ln in lines if "Nemotron-3-Super-120B-A12B-FP8" in ln).split()
    assert row == ["Nemotron-3-Super-120B-A12B-FP8", "8,192", "-", "170,229,760"]
    jet = next(ln for ln in lines if "Jet-Nemotron-2B" in ln).split()
    assert jet == ["Jet-Nemotron-2B", "2,048", "2,048", "(1,152)", "14,745,600"]


def test_bad_tp_is_refused():
    result = invoke("--tp", "0")
    assert result.exit_code != 0
