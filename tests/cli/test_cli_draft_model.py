"""--draft-model: a catalog draft's KV as bands of its own, from plan and simulate (declared
once, in RunOptions); bad input exits 2 with the message on stderr."""

from __future__ import annotations

import json

from kvchain.sim.run_options import option_help

from .helpers import flat, run

QWEN3_8B_E = 36 * 8 * (128 + 128) * 2  # 147,456 B per token (bf16)
QWEN3_06B_E = 28 * 8 * (128 + 128) * 2  # 114,688 B per token (bf16)
QWEN3_06B_WEIGHTS = 1_191_968_768  # 595,984,384 bf16 parameters (tied embeddings)


def test_plan_reports_the_draft_bands_and_concurrency_with_and_without() -> None:
    result = run("plan", "--model", "Qwen3-8B", "--draft-model", "Qwen3-0.6B", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    draft = doc["draft"]
    assert doc["chain"] == "draft.full|full"
    assert draft["bands"] == [{"band": "draft.full", "bytes_per_token": QWEN3_06B_E,
                               "bytes_per_slot": 0}]
    assert (draft["name"], draft["kind"]) == ("Qwen3-0.6B", "model")
    assert draft["weight_bytes"] == QWEN3_06B_WEIGHTS
    # The draft's weights come out of the KV buffer.
    assert draft["buffer_bytes_alone"] - draft["buffer_bytes"] == QWEN3_06B_WEIGHTS
    # Two ENDs (no float): a (2,048 + 512)-token request holds 160 pages of 16 tokens in
    # each band: 160 x 16 x (147,456 + 114,688) = 671,088,640 B with the draft, 160 x 16 x
    # 147,456 = 377,487,360 B alone. floor(114,885,289,472 / 671,088,640) = 171 and
    # floor(116,077,258,240 / 377,487,360) = 307.
    assert (draft["buffer_bytes"], draft["buffer_bytes_alone"]) == (114_885_289_472,
                                                                    116_077_258_240)
    assert (draft["chain_concurrent"], draft["chain_concurrent_alone"]) == (171, 307)
    # The fixed pools give the draft its own pool of the target's token count: the same.
    assert (draft["pools_concurrent"], draft["pools_concurrent_alone"]) == (171, 307)
    text = flat(run("plan", "--model", "Qwen3-8B", "--draft-model", "Qwen3-0.6B",
                    columns=200).stdout)
    assert (f"draft model Qwen3-0.6B (model; --draft-model): draft.full {QWEN3_06B_E:,} "
            "B/token") in text
    assert "concurrent requests 171 on the chain (target alone: 307)" in text


def test_plan_without_a_draft_has_none() -> None:
    result = run("plan", "--model", "Qwen3-8B", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["draft"] is None


def test_bad_draft_input_exits_2_with_the_message() -> None:
    unknown = run("plan", "--model", "Qwen3-8B", "--draft-model", "nope")
    assert unknown.exit_code == 2
    assert "--draft-model: no bundled model named 'nope'" in flat(unknown.stderr)
    no_k = run("simulate", "--model", "Qwen3-8B", "--draft-model", "Qwen3-0.6B",
               "--requests", "5")
    assert no_k.exit_code == 2
    assert "--draft-model Qwen3-0.6B drafts nothing without --spec-tokens > 0" in flat(
        no_k.stderr)


def test_the_prefix_cache_runs_on_draft_bands_and_the_host_tier_is_refused() -> None:
    # Qwen3-8B with Qwen3-0.6B: chain draft.full|full, two full bands, each kept per radix
    # node; auto turns the cache on (the trace has content keys).
    base = ("simulate", "--model", "Qwen3-8B", "--draft-model", "Qwen3-0.6B",
            "--spec-tokens", "3", "--trace", "mooncake", "--requests", "5")
    asked = run(*base, "--prefix-cache", "--json")
    assert asked.exit_code == 0, asked.output
    auto = run(*base, "--json")
    assert auto.exit_code == 0, auto.output
    assert "prefix cache off" not in flat(auto.stderr)
    for result in (asked, auto):
        extra = json.loads(result.stdout)["summary"]["extra"]
        assert "prefix_hit_tokens" in extra
        assert extra["draft_peak_bytes"] > 0 and extra["draft_forward_s"] > 0
    host = run(*base, "--prefix-cache", "--host-bytes", "1000000000")
    assert host.exit_code == 2
    assert ("--host-bytes: no host tier on this chain: it has 2 full-attention bands (e.g. a draft "
            "model's)" in flat(host.stderr))
    # With the cache off the host bytes serve retraction by host copy alone, as before.
    alone = run(*base, "--no-prefix-cache", "--host-bytes", "1000000000", "--retract-to",
                "host", "--json")
    assert alone.exit_code == 0, alone.output


def test_draft_model_is_declared_once() -> None:
    # simulate, compare and sweep take it from RunOptions; plan declares it with that help.
    for command in ("simulate", "compare", "sweep", "plan"):
        text = flat(run(command, "--help", columns=400).stdout)
        assert "--draft-model" in text, command
    assert flat(option_help("draft_model")).startswith(
        "Speculative decoding with a separate draft model from the catalog")
