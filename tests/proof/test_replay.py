"""Replay streams: format round trip, generated streams replay clean, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import kvchain.cli.replay  # noqa: F401  (registers the command)
from kvchain.cli import app
from kvchain.errors import ConfigError
from kvchain.testing.geometry import SHAPES
from kvchain.testing.replay import (
    StreamSection,
    generate_section,
    read_stream,
    replay_section,
    replay_stream,
    write_stream,
)
from kvchain.testing.streams import ReleaseOp, TakeOp

runner = CliRunner()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    is_group = hasattr(typer.main.get_command(app), "commands")
    argv = ["replay", *args] if is_group else list(args)
    return runner.invoke(app, argv, env={"COLUMNS": "200"})


@pytest.mark.parametrize("shape", SHAPES)
def test_generated_stream_replays_with_no_divergence(shape: str, tmp_path: Path) -> None:
    section = generate_section(shape, 1_000, seed=11)
    path = tmp_path / "ops.jsonl"
    assert write_stream(path, [section]) == len(section.ops)
    (back,) = read_stream(path)
    assert back == section
    report = replay_section(back)
    assert report.shape == shape
    assert report.operations == len(section.ops) >= 1_000
    assert report.decisions > 100
    assert (report.divergences, report.violations) == (0, 0), report.messages


def test_replay_counts_a_divergence_from_the_recorded_outcome(tmp_path: Path) -> None:
    section = generate_section("state|window|full", 200, seed=2)
    first_fit = next(i for i, op in enumerate(section.ops)
                     if isinstance(op, TakeOp) and op.expect == "fit")
    ops = list(section.ops)
    ops[first_fit] = TakeOp(ops[first_fit].pages, "refuse")  # type: ignore[union-attr]
    path = tmp_path / "bad.jsonl"
    write_stream(path, [StreamSection(section.geometry, tuple(ops), 2)])
    (report,) = replay_stream(path)
    assert report.divergences == 1
    (stopped,) = replay_stream(path, fail_fast=True)
    assert stopped.operations == first_fit + 1


def test_replay_counts_a_bad_release_as_violation(tmp_path: Path) -> None:
    section = generate_section("full", 10, seed=0)
    path = tmp_path / "bad.jsonl"
    write_stream(path, [StreamSection(section.geometry,
                                      (*section.ops, ReleaseOp(0, (10_000,))), 0)])
    (report,) = replay_stream(path)
    assert report.violations == 1 and report.divergences == 0


def test_read_stream_rejects_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"op": "take", "pages": [1]}\n')
    with pytest.raises(ConfigError, match="before the header"):
        read_stream(path)
    path.write_text('{"kind": "header", "version": 9}\n')
    with pytest.raises(ConfigError, match="version"):
        read_stream(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="no header"):
        read_stream(path)


def test_cli_generate_then_replay_all_shapes(tmp_path: Path) -> None:
    path = tmp_path / "all.jsonl"
    result = invoke("--generate", "all", "--ops", "300", "--seed", "5", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert "5 shape(s)" in result.output
    result = invoke(str(path), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["shape"] for r in rows] == list(SHAPES)
    assert all(r["operations"] >= 300 and r["divergences"] == 0 and r["violations"] == 0
               for r in rows)
    table = invoke(str(path))
    assert table.exit_code == 0 and "state|window|full" in table.output


def test_cli_exit_status_on_divergence_and_bad_input(tmp_path: Path) -> None:
    section = generate_section("window|full", 50, seed=1)
    ops = [TakeOp(op.pages, "refuse" if op.expect == "fit" else "fit")
           if isinstance(op, TakeOp) else op for op in section.ops]
    path = tmp_path / "bad.jsonl"
    write_stream(path, [StreamSection(section.geometry, tuple(ops), 1)])
    assert invoke(str(path), "--fail-fast").exit_code == 1
    assert invoke(str(tmp_path / "missing.jsonl")).exit_code == 2
    assert invoke("--generate", "nope", "-o", str(path)).exit_code == 2


@pytest.mark.parametrize("shape", SHAPES)
def test_streams_with_a_prefix_cache_round_trip_and_replay_clean(shape: str,
                                                                  tmp_path: Path) -> None:
    section = generate_section(shape, 1_000, seed=5, cache=True)
    kinds = {type(op).__name__ for op in section.ops}
    assert {"CacheInsertOp", "CacheLockOp", "CacheUnlockOp"} <= kinds
    path = tmp_path / "cached.jsonl"
    write_stream(path, [section])
    (back,) = read_stream(path)
    assert back == section
    report = replay_section(back)
    assert (report.divergences, report.violations) == (0, 0), report.messages


def test_replay_counts_a_cache_that_leaks(tmp_path: Path) -> None:
    """Planted defect: the replayed cache hands back one page fewer than its order said;
    the replay counts it (divergence or violation) instead of crashing, and goes on."""
    section = generate_section("state|window|full", 1_000, seed=5, cache=True)
    report = replay_section(section, cache_defect="short")
    assert report.operations == len(section.ops)
    assert report.divergences + report.violations > 0


def test_cli_generates_cache_streams(tmp_path: Path) -> None:
    out = tmp_path / "ops.jsonl"
    result = invoke("--generate", "window|full", "--ops", "300", "--cache", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert '"op":"cache_insert"' in out.read_text()
    assert invoke(str(out)).exit_code == 0
