"""Every command's error path: the message on stderr, nothing on stdout, exit 2.

Results go to stdout and messages to stderr (``kvchain.cli.common``), so ``--json`` output
piped to a JSON reader is JSON or nothing. Before, ``plan --json``, ``simulate``,
``compare``, ``replay``, ``sweep`` and ``prefix-bounds`` printed ``error: ...`` on stdout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()

# One bad input per command (and the --json form where the command has one); each is refused
# before anything runs.
CASES: list[tuple[str, list[str], str]] = [
    ("plan", ["plan", "--model", "no-such-model"], "no-such-model"),
    ("plan --json", ["plan", "--model", "no-such-model", "--json"], "no-such-model"),
    ("models", ["models", "--tp", "0"], "--tp"),
    ("simulate", ["simulate", "--model", "no-such-model"], "no-such-model"),
    ("simulate --json", ["simulate", "--requests", "0", "--json"], "--requests"),
    ("compare", ["compare", "--model", "no-such-model"], "no-such-model"),
    ("compare --json", ["compare", "--rate-scale", "0", "--json"], "--rate-scale"),
    ("compare --managers", ["compare", "--managers", "nope"], "nope"),
    ("compare --managers twice", ["compare", "--managers", "kvchain,kvchain"],
     "kvchain named twice"),
    ("replay", ["replay"], "stream"),
    ("replay --json", ["replay", "missing-stream.jsonl", "--json"], "missing-stream"),
    # Generator options given to a replay were ignored; a stream given with --generate too.
    ("replay --ops", ["replay", "recorded.jsonl", "--ops", "5", "--seed", "3"],
     "--ops, --seed apply only with --generate"),
    ("replay --cache", ["replay", "recorded.jsonl", "--cache"],
     "--cache applies only with --generate"),
    ("replay --generate and a stream", ["replay", "recorded.jsonl", "--generate", "full",
                                        "-o", "OUT"], "give one or the other"),
    ("sweep", ["sweep", "--out", "OUT", "--models", "no-such-model"], "no-such-model"),
    ("sweep --slo", ["sweep", "--out", "OUT", "--slo", "ttft_p99=2parsecs"], "ttft_p99"),
    ("prefix-bounds", ["prefix-bounds", "--trace", "missing-trace.jsonl"], "missing-trace"),
]


@pytest.mark.parametrize(("name", "args", "named"), CASES, ids=[c[0] for c in CASES])
def test_error_goes_to_stderr_with_exit_2(name: str, args: list[str], named: str,
                                          tmp_path: Path) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (name, result.output)
    assert result.stdout == "", f"{name}: stdout must be empty, got {result.stdout!r}"
    assert "error" in result.stderr.lower() or "invalid" in result.stderr.lower(), name
    assert named in result.stderr, (name, result.stderr)


def test_every_command_has_an_error_case() -> None:
    """A new command gets a case here (the list above covers every registered one)."""
    commands = {c.name for c in app.registered_commands}
    assert commands == {name.split()[0] for name, _, _ in CASES}


@pytest.mark.parametrize("args", [["simulate", "--trace", "azure-conv", "--requests", "2"],
                                  ["plan"], ["models"]], ids=["simulate", "plan", "models"])
def test_bad_audit_switch_is_bad_input(args: list[str], monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    """``KVCHAIN_AUDIT=maybe`` is refused before anything runs, by every command: exit 2,
    the variable named on stderr, nothing on stdout. Before, ``simulate`` printed its
    header and band table, ran until the first chain was built, and stopped with exit 1
    ("stopped: ConfigError")."""
    monkeypatch.setenv("KVCHAIN_AUDIT", "maybe")
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "KVCHAIN_AUDIT" in result.stderr


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_run_stopped_by_an_error_exits_1_and_says_stopped(
        command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typed error raised once the run is under way is no bad input: exit 1 and
    ``error: stopped: <Type>: ...`` on stderr. ``compare`` printed the bare message with
    exit 2 (the bad-input code), so a planner took an internal error for a wrong flag."""
    from kvchain.errors import PlanMismatchError
    from kvchain.sched.scheduler import Scheduler

    def broken(self, now):  # type: ignore[no-untyped-def]
        raise PlanMismatchError("planted")

    monkeypatch.setattr(Scheduler, "step", broken)
    args = [command, "--requests", "3", "--managers", "kvchain"] if command == "compare" \
        else [command, "--requests", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "error: stopped: PlanMismatchError: planted" in result.stderr
