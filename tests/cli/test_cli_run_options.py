"""simulate, compare and sweep take one set of run options (kvchain.sim.run_options), and
the demo's settings apply to the demo only."""

from __future__ import annotations

import json
from dataclasses import fields

import typer
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app
from kvchain.sim.run_options import RunOptions

_load_commands()
runner = CliRunner()


def flags(command: str) -> set[str]:
    group = typer.main.get_command(app)
    cmd = group.commands[command]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def test_the_three_commands_declare_every_run_option():
    """One declaration, three commands: every RunOptions field is a flag of simulate and
    compare, and of sweep unless the sweep has it as an axis. Before, compare lacked --seed
    and --truncate and sweep lacked --reserve, --policy, --clock, --buffer-bytes."""
    every = {"--" + f.name.replace("_", "-") for f in fields(RunOptions)
             if f.name not in ("truncate", "strict", "prefix_cache")}
    every |= {"--truncate", "--strict", "--no-strict", "--prefix-cache", "--no-prefix-cache"}
    axes = {"--rate-scale", "--mem-fraction", "--prefix-cache", "--no-prefix-cache"}
    assert every <= flags("simulate")
    assert every <= flags("compare")
    assert every - axes <= flags("sweep")
    assert {"--seed", "--truncate"} <= flags("compare")
    assert {"--reserve", "--policy", "--clock", "--buffer-bytes"} <= flags("sweep")
    # the what-to-run options, and the sweep's axes, keep their names
    for command in ("simulate", "compare"):
        assert {"--model", "--config", "--spec", "--gpu", "--tp", "--trace", "--out",
                "--json"} <= flags(command)
    assert {"--rate-scales", "--mem-fractions", "--prefix-caches", "--models"} <= flags("sweep")


def generic_trace(tmp_path, count: int = 12):
    """``count`` requests of 100 prompt and 4 output tokens, 0.1 s apart: the trace spans
    (count - 1) x 0.1 s."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{i / 10},100,4\n" for i in range(count)))
    return path


def spec(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "m", "full": 1_000}))
    return path


def test_a_users_trace_runs_whole_at_its_own_rate(tmp_path):
    """Before, simulate stretched every trace to 0.3x its rate (the demo's setting): this
    12-request trace spanning 1.1 s ran as 3.67 s of arrivals, without a word."""
    args = ["--spec", str(spec(tmp_path)), "--trace", str(generic_trace(tmp_path)),
            "--clock", "steps", "--buffer-bytes", "10000000"]
    result = runner.invoke(app, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    assert config["rate_scale"] == 1.0 and config["requests"] == 12 and not config["demo"]
    # what the run chose is said, on stderr
    note = " ".join(result.stderr.split())
    assert "note: chosen for this run:" in note
    assert "all 12 requests of the trace" in note and "its own arrival rate" in note
    # told otherwise, it does as told and does not claim to have chosen
    told = runner.invoke(app, ["simulate", *args, "--json", "--rate-scale", "2",
                               "--requests", "6"])
    config = json.loads(told.stdout)["config"]
    assert config["rate_scale"] == 2.0 and config["requests"] == 6
    assert "own arrival rate" not in " ".join(told.stderr.split())


def test_compare_runs_what_simulate_runs(tmp_path):
    """The same options give the same kvchain run from simulate and from compare (before,
    compare's own defaults differed: 500 requests of azure-conv at rate 1.0)."""
    args = ["--spec", str(spec(tmp_path)), "--trace", str(generic_trace(tmp_path)),
            "--clock", "steps", "--buffer-bytes", "10000000", "--json"]
    sim = json.loads(runner.invoke(app, ["simulate", *args]).stdout)["summary"]
    result = runner.invoke(app, ["compare", *args, "--managers", "kvchain"])
    assert result.exit_code == 0, result.output
    cmp = json.loads(result.stdout)["kvchain"]["summary"]
    for key in ("requests_finished", "steps", "duration_s", "output_tokens_per_s", "ttft"):
        assert cmp[key] == sim[key], key
    assert "note: chosen for this run:" in result.stderr


def test_no_note_when_the_user_said_everything(tmp_path):
    """The note names what the run chose; a run whose settings were all given has none
    (before this check it printed an empty 'chosen for this run:')."""
    args = ["simulate", "--spec", str(spec(tmp_path)), "--trace", str(generic_trace(tmp_path)),
            "--clock", "steps", "--buffer-bytes", "10000000", "--requests", "12",
            "--rate-scale", "1", "--no-prefix-cache", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


def _warnings(args: list[str]) -> list[str]:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stderr.split())  # the console wraps long lines
    return ["warning:" + w.split(" note:")[0] for w in text.split("warning:")[1:]]


def test_options_the_run_cannot_act_on_are_warned_about():
    """An option given that changes nothing is said on stderr, not dropped silently.
    Before, ``--policy cache-aware`` on a trace without content keys ran FCFS (the queue
    falls back without a cache) and ``--step-ms`` under the roofline clock was ignored,
    both without a word. azure-conv has no content keys, so the auto cache is off."""
    cold = ["simulate", "--trace", "azure-conv", "--requests", "2", "--json"]
    said = " ".join(_warnings([*cold, "--policy", "cache-aware", "--step-ms", "10",
                               "--cache-points", "ends"]))
    assert "--policy cache-aware" in said and "order is FCFS" in said
    assert "--step-ms 10 has no effect" in said
    assert "--cache-points ends has no effect" in said
    compare = " ".join(_warnings(["compare", "--trace", "azure-conv", "--requests", "2",
                                  "--managers", "kvchain", "--policy", "cache-aware"]))
    assert "--policy cache-aware" in compare


def test_options_the_run_acts_on_are_not_warned_about():
    # mooncake carries hash_ids (the cache is on), and the step clock uses --step-ms.
    assert _warnings(["simulate", "--trace", "mooncake", "--requests", "2", "--json",
                      "--policy", "cache-aware", "--cache-points", "ends"]) == []
    assert _warnings(["simulate", "--trace", "azure-conv", "--requests", "2", "--json",
                      "--clock", "steps", "--step-ms", "10"]) == []


def _note(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return " ".join(result.stderr.split())


def test_the_note_says_what_the_auto_cache_resolved_to(tmp_path):
    """The note says what the auto prefix cache resolved to: on for a trace with content
    keys on any chain (two window bands included, since issue 22 item 5; they used to turn
    it off), with the cache points auto resolved to; off for a trace without keys."""
    spec = tmp_path / "two.json"
    spec.write_text(json.dumps({"full": 1000, "windows": [{"bytes": 1000, "tokens": 11},
                                                          {"bytes": 700, "tokens": 200}]}))
    common = ["simulate", "--trace", "mooncake", "--requests", "2", "--clock", "steps",
              "--json"]
    two = _note([*common, "--spec", str(spec), "--buffer-bytes", "100000000"])
    assert "prefix cache on (auto: the trace has content keys" in two
    assert "cache points auto: blocks" in two  # no state band
    one = _note(common)  # gpt-oss: one window band, mooncake's hash_ids
    assert "prefix cache on (auto: the trace has content keys" in one
    assert "cache points auto: blocks" in one
    cold = _note(["simulate", "--trace", "azure-conv", "--requests", "2", "--json"])
    assert "prefix cache off (auto: the trace has no content keys" in cold
    assert "cache points auto" not in cold
