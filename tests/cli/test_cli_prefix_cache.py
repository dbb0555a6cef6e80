"""``kvchain simulate --prefix-cache/--no-prefix-cache`` on a Mooncake slice."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvchain.cache.keys import page_keys_from_blocks
from kvchain.cli import _load_commands, app
from kvchain.sim.traces import load_trace

_load_commands()
runner = CliRunner()
ARGS = ["simulate", "--trace", "mooncake", "--requests", "30", "--tp", "8", "--json"]


def infinite_cache_hits(n: int) -> tuple[int, int]:
    """Prompt tokens of the first ``n`` requests, and the tokens an infinite cache could
    serve: a page hits when its whole key chain was in an earlier prompt."""
    seen: set[int] = set()
    prompt = hit = 0
    for r in load_trace("mooncake", first=n).requests:
        keys = page_keys_from_blocks(r.prefix_block_ids, 512, r.prompt_tokens, 16)
        m = 0
        while m < len(keys) and keys[m] in seen:
            m += 1
        prompt += r.prompt_tokens
        hit += m * 16
        seen.update(keys)
    return prompt, hit


def test_prefix_cache_is_on_by_default_with_content_keys(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*ARGS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    pc = d["prefix_cache"]
    prompt, limit = infinite_cache_hits(30)
    assert pc["prompt_tokens"] == prompt
    assert 0 < pc["hit_tokens"] <= limit
    assert pc["hit_rate"] == round(pc["hit_tokens"] / prompt, 6)
    assert d["summary"]["leaked_pages"] == 0 and d["summary"]["admitted_but_unallocatable"] == 0
    assert json.loads((out / "metrics.json").read_text())["prefix_cache"] == pc
    assert (out / "hit_rate.png").stat().st_size > 0


def test_no_prefix_cache_turns_it_off():
    result = runner.invoke(app, [*ARGS, "--no-prefix-cache"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert "prefix_cache" not in d and d["config"]["prefix_cache"] is False
