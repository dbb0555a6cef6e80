"""What the CLI tests share: the real app through typer's runner at a given width, and the
small files a newcomer would write (a spec file)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()


def run(*args: str, columns: int = 80):
    """``kvchain ARGS`` on a terminal ``columns`` wide (the result: exit code, stdout,
    stderr)."""
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def flat(text: str) -> str:
    """``text`` with every run of white space (rich's wrapping) made one space."""
    return " ".join(text.split())


def spec_file(tmp_path, **extra):
    """A spec file ``m.json``: 1,000 B per token in the full band and in the 64-token
    sliding-window band, plus ``extra`` fields."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "m", "full": 1_000, "window": 1_000,
                                "window_tokens": 64, **extra}))
    return path
