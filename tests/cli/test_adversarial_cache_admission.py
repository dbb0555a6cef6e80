"""Defects found by an adversarial pass on the prefix cache and admission (round 7).

Each test states what kvchain should do; each failed on the code of the pass (a strict
xfail then) and passes since its fix: bad --host-bytes values and a baseline's empty pool
are bad input (exit 2, the option or manager named), speculative checkpoint slots are in
the layout's smallest-request check, --truncate keeps the prefix cache (the head is kept,
its keys and bounds follow), a max_tokens past the context is capped at it, and the help
no longer refuses two-window chains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import run


def _trace(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_host_bytes_below_one_resume_interval_is_bad_input() -> None:
    """``--host-bytes 1000000`` on the demo (gpt-oss-120b, mooncake, cache on, blocks of
    512 tokens): one resume interval needs 512 x 46,080 B/token (window + full, per the
    message: 23,592,960 B) of host slots, so the value can never work. That is known from
    the options alone, before anything runs: exit 2, as for every other bad option."""
    result = run("simulate", "--requests", "2", "--host-bytes", "1000000")
    assert result.exit_code == 2, result.stderr
    assert "stopped" not in result.stderr
    assert "--host-bytes" in result.stderr


def test_host_bytes_past_this_machine_is_bad_input() -> None:
    """``--host-bytes 10**18`` on the demo: the host pool of the window band alone would need
    a free list of 339,084,201,384 slot ids (the message's figure), which no machine holds;
    the option is then bad input, refused before anything runs with exit 2 and the option
    named."""
    result = run("simulate", "--requests", "2", "--host-bytes", str(10**18))
    assert result.exit_code == 2, result.stderr
    assert "stopped" not in result.stderr
    assert "--host-bytes" in result.stderr


def test_compare_buffer_too_small_for_a_baseline_pool_is_bad_input() -> None:
    """Jet-Nemotron-2B (S = 14,745,600 B) in 29,869,437 B: ``simulate`` runs (exit 0, every
    request rejected with its reason); ``compare`` must either refuse the buffer as bad
    input (exit 2, naming the manager whose pool is empty) or report that manager's row as
    unable to run. It stops with exit 1 instead."""
    result = run("compare", "--model", "Jet-Nemotron-2B", "--requests", "2",
                 "--buffer-bytes", "29869437")
    assert result.exit_code in (0, 2), result.stderr
    assert "stopped" not in result.stderr
    assert "fixed pools: the state pool of 0 pages" in result.stderr  # names the manager


def test_spec_tokens_buffer_too_small_is_refused_at_the_layout() -> None:
    """Qwen3-Next-80B-A3B, S = 39,518,208 B: ``--spec-tokens 3`` holds 1 + 3 = 4 slots =
    158,072,832 B (the message says 158,466,048 B with the null pages), more than the
    100,000,000 B buffer. Known before anything runs: exit 2 like the layout's own
    'cannot hold the smallest request' refusal (tests/test_layout_smallest.py)."""
    result = run("simulate", "--model", "Qwen3-Next-80B-A3B", "--requests", "2",
                 "--buffer-bytes", "100000000", "--spec-tokens", "3")
    assert result.exit_code == 2, result.stderr
    assert "stopped" not in result.stderr
    assert "none admission" not in result.stderr


def test_truncated_prompts_keep_their_prefix_cache(tmp_path: Path) -> None:
    """Two identical 140,000-token prompts (274 blocks of 512, ids 0..273), 4 output
    tokens, 1,000 s apart, on gpt-oss-120b (context 131,072) with ``--truncate``: each is
    cut to 131,072 - 4 = 131,068 tokens, which keeps its head (the first 256 blocks, whose
    keys are unchanged). The second is then the same prompt as the first: with memory to
    spare (the default H200 buffer, 67 GB; the prompt's pages take 131,068 x 36,864 B x 2
    bands < 10 GB) it hits what the same untruncated 131,068-token pair hits: 131,056
    tokens (8,191 pages of 16: the last page boundary before the prompt's last token), as
    the run without truncation measures (the pair of 131,068-token prompts with 256 ids
    gives hit_tokens 131,056). The infinite-cache bound is over the prompts the run served:
    131,056 / 262,136."""
    trace = _trace(tmp_path, [
        {"arrival_s": t, "prompt_tokens": 140_000, "output_tokens": 4,
         "hash_ids": list(range(274))} for t in (0, 1000)])
    result = run("simulate", "--model", "gpt-oss-120b", "--trace", trace, "--truncate",
                 "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["summary"]["extra"]["requests_truncated"] == 2
    pc = data["prefix_cache"]
    assert pc["prompt_tokens"] == 2 * 131_068
    assert pc["hit_tokens"] == 131_056
    assert pc["infinite_cache_bound"] == pytest.approx(131_056 / 262_136, abs=1e-6)


@pytest.mark.parametrize("reserve", ["adaptive", "full"])
def test_max_tokens_past_the_context_never_leaves_a_request_stuck(
        tmp_path: Path, reserve: str) -> None:
    """gpt-oss-120b (context 131,072; 36,864 B/token full + 36,864 B/token in the 128-token
    window band) in 5,500,000,000 B, one request (2,000 prompt, 10 output, max_tokens
    200,000). Its demand capped at the context is at most 131,072 x 36,864 = 4,831,838,208 B
    of full pages plus a few window pages, which fits the empty chain (the run without
    the cap, max_tokens 200,000: 202,000 x 36,864 = 7.4 GB, cannot). The field rule 'on
    an idle chain any request that fits the empty chain finishes' then says it finishes
    (or, if max_tokens past the context is ruled bad input, it is rejected at once with
    the reason); it must never wait with nothing running."""
    trace = _trace(tmp_path, [{"arrival_s": 0, "prompt_tokens": 2_000, "output_tokens": 10,
                               "max_tokens": 200_000}])
    result = run("simulate", "--model", "gpt-oss-120b", "--trace", trace,
                 "--buffer-bytes", "5500000000", "--reserve", reserve, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["requests_finished"] + summary["requests_rejected"] == 1


def test_help_does_not_claim_two_window_chains_are_refused(tmp_path: Path) -> None:
    """A spec with two window classes (512 and 1,024 tokens) and a full class, on the step
    clock: ``--prefix-cache --cache-points blocks`` runs (exit 0) with a prefix-cache
    record; the help text must then not promise exit 2 for it."""
    spec = tmp_path / "w2.json"
    spec.write_text(json.dumps({"name": "w2", "full": 4_096, "windows": [
        {"bytes": 20_000, "tokens": 512}, {"bytes": 30_000, "tokens": 1_024}]}))
    ran = run("simulate", "--spec", str(spec), "--clock", "steps", "--requests", "3",
              "--buffer-bytes", "3000000000", "--prefix-cache", "--cache-points", "blocks",
              "--json")
    assert ran.exit_code == 0, ran.stderr
    assert json.loads(ran.stdout)["prefix_cache"] is not None
    text = " ".join(run("simulate", "--help", columns=200).stdout.split())
    assert "two or more window bands is refused" not in text
    assert "two or more window bands, is refused" not in text
