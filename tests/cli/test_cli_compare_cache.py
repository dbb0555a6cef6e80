"""``kvchain compare`` with the prefix cache: the same settings as ``simulate`` for every
manager, the hit figures in the table and the JSON, and bad flags refused, typed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()
TRACE = ["--trace", "mooncake", "--requests", "30", "--tp", "8"]
MANAGERS = ["--managers", "kvchain,equal-page"]


def test_compare_gives_every_manager_the_cache_simulate_gives_kvchain():
    sim = runner.invoke(app, ["simulate", *TRACE, "--rate-scale", "1", "--json"])
    assert sim.exit_code == 0, sim.output
    expected = json.loads(sim.stdout)["prefix_cache"]
    result = runner.invoke(app, ["compare", *TRACE, *MANAGERS, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # gpt-oss-120b has equal bytes per token in both classes: the equal-page pool keeps
    # 16-token pages, so both managers cache the same pages and hit the same tokens as
    # `simulate` (on by default: the trace has content keys).
    for name in ("kvchain", "equal-page"):
        pc = data[name]["prefix_cache"]
        assert (pc["prompt_tokens"], pc["hit_tokens"]) == (expected["prompt_tokens"],
                                                           expected["hit_tokens"])
        assert expected["hit_tokens"] > 0
        extra = data[name]["summary"]["extra"]
        assert extra["prefix_hit_tokens"] == expected["hit_tokens"]
        summary = data[name]["summary"]
        assert summary["admitted_but_unallocatable"] == 0 and summary["leaked_pages"] == 0
    off = runner.invoke(app, ["compare", *TRACE, *MANAGERS, "--no-prefix-cache", "--json"])
    assert off.exit_code == 0, off.output
    assert all(v["prefix_cache"] is None for v in json.loads(off.stdout).values())


def test_compare_table_shows_hit_rows_and_refuses_bad_cache_flags():
    result = runner.invoke(app, ["compare", *TRACE, "--managers", "kvchain",
                                 "--cache-points", "ends"])
    assert result.exit_code == 0, result.output
    for row in ("hit rate (%)", "hit tokens", "evicted pages", "leaked pages (=0)"):
        assert row in result.output
    bad = runner.invoke(app, ["compare", *TRACE, "--cache-points", "everywhere"])
    assert bad.exit_code == 2
    bad = runner.invoke(app, ["compare", *TRACE, "--end-s", "0"])
    assert bad.exit_code == 2 and "--end-s must be a finite number > 0" in bad.output
