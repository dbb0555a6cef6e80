"""The model's context length: simulate never serves a request past it silently (it is
rejected with a counted "context" reason, or truncated with --truncate), and plan caps
the longest request at it and says which bound binds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app
from kvchain.cli.plan import longest_request
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.model import ModelSpec, declare_model
from kvchain.report.tables import EXTRA_LABELS, summary_table
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

_load_commands()
H200 = get_gpu("h200")
runner = CliRunner()


def model(context: int | None) -> ModelSpec:
    spec = declare_model("ctx", full=1_000, window=1_000, window_tokens=64, hidden_size=256,
                         num_attention_heads=4, total_params=10_000_000,
                         active_params=10_000_000, weight_bytes=20_000_000)
    return replace(spec, max_context_tokens=context)


def trace(*lengths: tuple[int, int]) -> Trace:
    reqs = tuple(TraceRequest(i, 0.01 * i, p, o) for i, (p, o) in enumerate(lengths))
    return Trace("ctx", reqs, "test", "none")


# prompt + output: 900 + 100 = 1,000 fits a 1,000-token context exactly; 950 + 100 and
# 2,000 + 10 exceed it; 100 + 1,000 exceeds it with the output alone at the context.
LENGTHS = ((900, 100), (950, 100), (2_000, 10), (100, 1_000), (10, 10))


def run(context: int | None, truncate: bool):
    config = SimConfig(model(context), H200, trace(*LENGTHS), buffer_bytes=100_000_000,
                       truncate=truncate)
    return simulate(config, audit_every_step=True)


def test_requests_past_the_context_are_rejected_and_counted():
    result = run(1_000, truncate=False)
    s = result.summary
    # requests 1, 2 and 3 exceed 1,000 tokens: rejected, never served
    assert (s.requests_finished, s.requests_rejected) == (2, 3)
    assert s.extra["requests_rejected_context"] == 3
    assert s.extra["requests_truncated"] == 0
    reasons = {r.request_id: r.rejected_reason for r in result.recorder.records}
    assert [i for i, why in reasons.items() if why] == [1, 2, 3]
    assert all(reasons[i].startswith("context:") for i in (1, 2, 3))
    assert "1,050" not in reasons[1] and "950 prompt + 100 output" in reasons[1]
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0


def test_without_a_context_nothing_is_rejected():
    # sibling of the test above: the same trace with no context limit serves everything,
    # so the rejections there come from the context check
    s = run(None, truncate=False).summary
    assert (s.requests_finished, s.requests_rejected) == (5, 0)
    assert s.extra["requests_rejected_context"] == 0


def test_truncate_cuts_the_prompt_to_fit():
    result = run(1_000, truncate=True)
    s = result.summary
    # 1 and 2 are cut to 1,000 - output prompt tokens; 3's output alone fills the context
    assert (s.requests_finished, s.requests_rejected) == (4, 1)
    assert s.extra["requests_truncated"] == 2
    assert s.extra["requests_rejected_context"] == 1
    records = {r.request_id: r for r in result.recorder.records}
    assert (records[1].prompt_tokens, records[2].prompt_tokens) == (900, 990)
    assert records[0].prompt_tokens == 900  # fit already: untouched
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0


def test_summary_table_labels_the_context_counters():
    """The summary table shows the context counters under readable labels, not their
    ``extra`` keys (a newcomer saw ``requests_rejected_context`` as a row label).

    Values by hand as in test_truncate_cuts_the_prompt_to_fit: with --truncate, requests
    1 and 2 are truncated and request 3 (output alone at the context) is rejected.
    """
    s = run(1_000, truncate=True).summary
    assert set(s.extra) <= set(EXTRA_LABELS) | {"admitted_but_unallocatable", "leaked_pages"}
    console = Console(record=True, width=120, color_system=None)
    console.print(summary_table(s, title="t"))
    text = console.export_text()
    assert "requests_rejected_context" not in text and "requests_truncated" not in text
    rows = {line.strip("│ ").split("│")[0].strip(): line.strip("│ ").split("│")[-1].strip()
            for line in text.splitlines() if "│" in line}
    assert rows["requests rejected past the context"] == "1"
    assert rows["requests truncated to the context"] == "2"


def test_scheduler_limit_is_validated():
    with pytest.raises(ConfigError, match="max_context_tokens"):
        SchedulerConfig(max_context_tokens=0)
    with pytest.raises(ConfigError, match="max_context_tokens"):
        model(0)


def test_longest_request_says_which_bound_binds():
    # prompt tokens with 1 output token: at most context - 1
    assert longest_request(37_700_000, 32_768).bound == "context"
    assert longest_request(37_700_000, 32_768).tokens == 32_767
    assert longest_request(10_000, 32_768).bound == "kv_bytes"
    assert longest_request(10_000, 32_768).tokens == 10_000
    assert longest_request(10_000, None).bound == "kv_bytes"


SMALL_CONTEXT = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
}


def test_plan_caps_the_longest_request_at_the_context(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_CONTEXT))
    result = runner.invoke(app, ["plan", "--config", str(path), "--buffer-bytes",
                                 "100000000", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    chain = data["chain_capacity"]
    # 100 MB / (2 layers x 2 heads x 128 x 2 B = 1,024 B per token) is ~97k tokens: the
    # 4,096-token context binds
    assert chain["longest_request_tokens_kv_bound"] > 90_000
    assert (chain["longest_request_tokens"], chain["longest_request_bound"]) == (4_095, "context")
    assert data["max_context_tokens"] == 4_096
    # a buffer too small for the context: the KV bytes bind (the sibling of the cap)
    result = runner.invoke(app, ["plan", "--config", str(path), "--buffer-bytes",
                                 "2000000", "--page-size", "16", "--json"])
    chain = json.loads(result.stdout)["chain_capacity"]
    assert chain["longest_request_bound"] == "kv_bytes"
    assert chain["longest_request_tokens"] == chain["longest_request_tokens_kv_bound"] < 4_095


def test_simulate_cli_truncate_flag(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL_CONTEXT, "max_position_embeddings": 512}))
    args = ["simulate", "--config", str(path), "--trace", "azure-conv", "--requests", "20",
            "--buffer-bytes", "200000000", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)["summary"]
    cut = json.loads(runner.invoke(app, [*args, "--truncate"]).stdout)["summary"]
    # azure-conv prompts run to thousands of tokens: past a 512-token context
    assert plain["extra"]["requests_rejected_context"] > 0
    assert plain["requests_rejected"] >= plain["extra"]["requests_rejected_context"]
    assert cut["extra"]["requests_truncated"] == plain["extra"]["requests_rejected_context"] \
        - cut["extra"]["requests_rejected_context"]
    assert cut["requests_finished"] > plain["requests_finished"]


def test_dtype_flags_change_the_bytes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_CONTEXT))
    base = ["plan", "--config", str(path), "--buffer-bytes", "100000000", "--json"]
    bf16 = json.loads(runner.invoke(app, base).stdout)["bands"][0]["bytes_per_token"]
    fp8 = json.loads(runner.invoke(app, [*base, "--kv-dtype", "fp8"]).stdout)
    assert (bf16, fp8["bands"][0]["bytes_per_token"]) == (2 * 2 * 128 * 2, 2 * 2 * 128)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"full": 1000}))
    refused = runner.invoke(app, ["plan", "--spec", str(spec), "--kv-dtype", "fp8"])
    assert refused.exit_code == 2 and "--kv-dtype" in refused.output
