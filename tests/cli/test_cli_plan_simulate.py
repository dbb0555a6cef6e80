"""`kvchain plan` and `kvchain simulate` through the real CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()


def run_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_gpt_oss_on_h200_bytes_match_models_json():
    d = run_json("plan", "--model", "gpt-oss-120b", "--gpu", "h200")
    assert d["chain"] == "window|full"
    bands = {b["band"]: b for b in d["bands"]}
    assert bands["full"]["bytes_per_token"] == 36_864
    assert bands["window"]["bytes_per_token"] == 36_864 and bands["window"]["window"] == 128
    assert bands["full"]["page_bytes"] == 16 * 36_864
    # floor(143,771 MiB = 150,754,820,096 B x 0.9) = 135,679,338,086, - 65,168,179,200 B
    # of weights - 3 GiB reserve = 67,289,933,414, down to a multiple of 256 (- 102)
    assert d["buffer_bytes"] == 135_679_338_086 - 65_168_179_200 - 3 * 2**30 - 102
    assert d["gpu_memory_bytes"] == 143_771 * 2**20 and d["scope"] == "per rank"
    assert d["tp"] == 1 and d["engine_reserve_bytes"] == 3 * 2**30


@pytest.mark.parametrize(("model", "tp", "classes"), [
    ("qwen3-next-80b-a3b", 2, {"state": (0, 39_518_208 // 2), "full": (24_576 // 2, 0)}),
    ("gemma-3-27b", 1, {"window": (425_984, 0), "full": (81_920, 0)}),
    ("jamba-v0.1", 1, {"state": (0, 8_716_288), "full": (16_384, 0)}),
])
def test_plan_other_models(model, tp, classes):
    d = run_json("plan", "--model", model, "--tp", str(tp))
    got = {b["band"]: (b["bytes_per_token"], b["bytes_per_slot"]) for b in d["bands"]}
    assert got == classes
    assert d["chain_capacity"]["concurrent_requests"] >= d["fixed_pools_capacity"][
        "concurrent_requests"]


def test_plan_reports_fixed_pools_that_hold_no_request(tmp_path):
    # 100e6 B: the chain holds one request (1,552 tokens: 97 full pages of 512,000 B after
    # one 50e6 B slot); the fixed state pool (100e6 x 0.9 / 1.9 = 47,368,421 B) holds no
    # slot. The plan succeeds and says why the pools hold none (tests/test_capacity.py).
    spec = tmp_path / "f10.json"
    spec.write_text(json.dumps({"name": "f10", "full": 32_000, "state": 50_000_000}))
    args = ("plan", "--spec", str(spec), "--buffer-bytes", "100000000", "--prompt", "1000",
            "--output", "100")
    d = run_json(*args)
    chain, pools = d["chain_capacity"], d["fixed_pools_capacity"]
    assert (chain["concurrent_requests"], chain["holds_none"]) == (1, None)
    assert pools["concurrent_requests"] == 0
    assert pools["holds_none"].startswith("the fixed state pool of 47,368,421 B")
    text = runner.invoke(app, list(args))
    assert text.exit_code == 0, text.output
    assert "fixed pools hold no request (0 concurrent): the fixed state pool" in " ".join(
        text.stdout.split())


def test_plan_f10_capacity_from_a_spec_file(tmp_path):
    """Field case F10: (40e9 - 64 x 50e6) / 32,000 = 1,150,000 tokens with 64 slots held."""
    spec = tmp_path / "f10.json"
    spec.write_text(json.dumps({"name": "f10", "full": 32_000, "state": 50_000_000}))
    d = run_json("plan", "--spec", str(spec), "--buffer-bytes", "40000000000",
                 "--prompt", "17000", "--output", "100", "--slots-held", "64")
    assert d["chain_capacity"]["full_tokens"] == 1_150_000
    assert d["chain_capacity"]["slots_held"] == 64
    # 64 requests of (17,000, 100) run concurrently: each 1,069 pages of 512,000 B + 1 slot.
    assert d["chain_capacity"]["concurrent_requests"] >= 64


def refused(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())  # rich wraps long lines


def test_plan_errors_are_typed_and_exit_2(tmp_path):
    assert "no-such-model" in refused("plan", "--model", "no-such-model")
    assert "--mem-fraction must be in (0, 1], got -0.5" in refused("plan", "--mem-fraction",
                                                                   "-0.5")
    assert "cannot hold one smallest request" in refused("plan", "--buffer-bytes", "1000")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fulll": 1}))
    assert "unknown field 'fulll' (did you mean 'full'?)" in refused(
        "plan", "--spec", str(bad), "--buffer-bytes", "10000000")


def test_simulate_json_and_outputs(tmp_path):
    out = tmp_path / "run"
    d = run_json("simulate", "--requests", "40", "--out", str(out))
    s = d["summary"]
    assert s["requests_total"] == 40 and s["requests_finished"] == 40
    assert s["admitted_but_unallocatable"] == 0 and s["leaked_pages"] == 0
    assert d["config"]["model"] == "gpt-oss-120b" and d["config"]["chain"] == "window|full"
    for name in ("metrics.json", "requests.csv", "bands.png", "utilization.png",
                 "latency_cdf.png"):
        assert (out / name).stat().st_size > 0
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == 41


def test_simulate_table_output_and_bad_trace():
    result = runner.invoke(app, ["simulate", "--model", "jet-nemotron-2b", "--trace",
                                 "mooncake", "--requests", "20", "--buffer-bytes", "900000000"])
    assert result.exit_code == 0, result.output
    assert "state|window|full" in result.output and "20 / 20" in result.output
    result = runner.invoke(app, ["simulate", "--trace", "/no/such/file.csv"])
    assert result.exit_code == 2


def test_plan_and_simulate_a_model_with_two_window_sizes(tmp_path):
    spec = tmp_path / "two.json"
    spec.write_text(json.dumps({
        "name": "two-windows", "full": 16_384, "state": 2_097_152,
        "windows": [{"bytes": 16_384, "tokens": 128}, {"bytes": 8_192, "tokens": 1_024}],
        "hidden_size": 4_096, "num_attention_heads": 32, "total_params": 8_000_000_000,
        "active_params": 8_000_000_000, "weight_bytes": 16_000_000_000}))
    d = run_json("plan", "--spec", str(spec), "--buffer-bytes", "2000000000")
    assert d["chain"] == "state|window1024|window128|full"
    assert [b["anchor"] for b in d["bands"]] == ["low", "float", "float", "high"]
    # The fixed pools get one pool per class: the chain holds more.
    assert (d["chain_capacity"]["concurrent_requests"]
            >= d["fixed_pools_capacity"]["concurrent_requests"])
    s = run_json("simulate", "--spec", str(spec), "--trace", "azure-conv", "--requests", "60",
                 "--rate-scale", "4", "--buffer-bytes", "400000000")
    assert s["config"]["chain"] == "state|window1024|window128|full"
    summary = s["summary"]
    assert summary["requests_finished"] == 60
    assert summary["admitted_but_unallocatable"] == 0 and summary["leaked_pages"] == 0


def test_plan_window_only_model_is_unbounded_by_kv_and_names_the_context_length():
    # Mistral-7B-v0.1: every layer windowed (W = 4,096), so no request length is bounded
    # by the KV cache; its config says max_position_embeddings = 32,768.
    # The longest request is then the context's: 32,767 prompt tokens + 1 output token.
    d = run_json("plan", "--model", "mistral-7b")
    for side in ("chain_capacity", "fixed_pools_capacity"):
        assert d[side]["longest_request_tokens_kv_bound"] is None
        assert d[side]["longest_request_tokens"] == 32_767
        assert d[side]["longest_request_bound"] == "context"
    assert d["max_context_tokens"] == 32_768
    output = runner.invoke(app, ["plan", "--model", "mistral-7b"]).output
    row = next(line for line in output.splitlines() if "longest request (tokens)" in line)
    # not the buffer's 109,195,842,816 bytes (the old search bound printed as an answer)
    assert "32,767 (context)" in row and "109,195" not in row
    text = " ".join(output.split())
    assert "unbounded (KV)" in text
    assert "32,768 tokens (max_position_embeddings)" in text


def test_plan_state_model_compares_like_with_like(tmp_path):
    """F10's classes (E_full = 32,000 B, S = 50e6 B, B = 40e9 B), requests (17,000, 100).

    By hand: a request holds ceil(17,099 / 16) = 1,069 full pages of 512,000 B + 1 slot =
    597,328,000 B, so the chain runs floor(40e9 / 597,328,000) = 66. Fixed pools: state
    pool int(40e9 x 0.9 / 1.9) = 18,947,368,421 B, full pool 21,052,631,579 B = 41,118
    pages = 657,888 tokens, 41,118 // 1,069 = 38 requests. Both sides hold min(66, 38) = 38
    slots: chain (40e9 - 38 x 50e6) / 512,000 = 74,414 pages = 1,190,624 tokens.
    """
    spec = tmp_path / "f10.json"
    spec.write_text(json.dumps({"name": "f10", "full": 32_000, "state": 50_000_000}))
    args = ("plan", "--spec", str(spec), "--buffer-bytes", "40000000000",
            "--prompt", "17000", "--output", "100")
    d = run_json(*args)
    chain, pools = d["chain_capacity"], d["fixed_pools_capacity"]
    assert (chain["concurrent_requests"], pools["concurrent_requests"]) == (66, 38)
    assert chain["slots_held"] == pools["slots_held"] == 38
    assert (chain["full_tokens"], pools["full_tokens"]) == (1_190_624, 657_888)
    text = " ".join(runner.invoke(app, list(args)).output.split())
    assert "full-attn tokens, both 38 slots" in text and "1.81x" in text


@pytest.mark.parametrize("cmd", [["sweep", "--no-plots"], ["plan"]])
def test_error_text_in_brackets_is_printed_verbatim(tmp_path, cmd):
    """Error messages quote user input; rich must not read "[nan]" or "[bold]" in them as
    markup (it swallowed them: "got " instead of "got [nan]"). Sweep: a grid with a NaN
    rate scale; plan: a config whose model_type is "[bold]x[/bold]"."""
    if cmd[0] == "sweep":
        grid = tmp_path / "g.toml"
        grid.write_text('models = ["gpt-oss-120b"]\nrate_scales = [nan]\n')
        args, expected = ["--grid", str(grid), "--out", str(tmp_path / "out")], "got [nan]"
    else:
        cfg = tmp_path / "c.json"
        cfg.write_text('{"model_type": "[bold]x[/bold]"}')
        args, expected = ["--config", str(cfg)], "model_type=[bold]x[/bold]"
    result = runner.invoke(app, [*cmd, *args])
    assert result.exit_code == 2
    assert expected in " ".join(result.output.split())


@pytest.mark.parametrize("args,needle", [
    (["--page-size", "32", "--chunk-size", "16"],
     "--chunk-size (16) must be at least --page-size (32 tokens)"),
    (["--clock", "steps", "--step-ms", "1e308"], "--step-ms must be at most 3,600,000"),
])
def test_simulate_refuses_unrunnable_flags_before_the_run(args, needle):
    """A chunk below the page size could never be admitted (chunks are cut to whole pages):
    it was a 'stopped' run with exit 1 after the band table; a step of 1e308 ms summed to
    inf latencies. Both are now refused up front, exit 2."""
    assert needle in refused("simulate", "--requests", "5", *args)


def test_simulate_accepts_the_edges_of_those_bounds():
    """Sibling: chunk == page size (32) and a one-hour step run (exit 0)."""
    result = runner.invoke(app, ["simulate", "--requests", "2", "--page-size", "32",
                                 "--chunk-size", "32", "--clock", "steps", "--step-ms",
                                 "3600000", "--json"])
    assert result.exit_code == 0, result.output


# --- GPU memory as the device reports it, per rank, --gpu local, --weight-format ---------


def test_plan_gpt_oss_on_h100_gets_the_buffer_an_engine_would():
    # floor(81,559 MiB = 85,520,809,984 B x 0.9) = 76,968,728,985; minus 65,168,179,200 B
    # of weights and the 3 GiB reserve: 8,579,324,313, down to 256 B: 8,579,324,160.
    # On c9a1289 the datasheet's 80e9 B gave 72e9 - 65,168,179,200 - 3 GiB = 3.6 GB.
    d = run_json("plan", "--model", "gpt-oss-120b", "--gpu", "h100")
    assert d["gpu_memory_bytes"] == 85_520_809_984
    assert d["buffer_bytes"] == 8_579_324_160
    text = " ".join(runner.invoke(app, ["plan", "--gpu", "h100"]).output.split())
    assert ("KV buffer 8,579,324,160 B = floor(85,520,809,984 B reported x 0.9) - weights "
            "65,168,179,200 - engine reserve 3,221,225,472 (activations, CUDA context, NCCL; "
            "CUDA graphs in the other 0.1)") in text


def test_plan_says_its_figures_are_per_rank_under_tp():
    d = run_json("plan", "--model", "qwen3-next-80b-a3b", "--tp", "2")
    assert (d["tp"], d["scope"]) == (2, "per rank")
    result = runner.invoke(app, ["plan", "--model", "qwen3-next-80b-a3b", "--tp", "2"])
    text = " ".join(result.output.split())
    assert "per rank of --tp 2 (every figure below is one GPU's)" in text
    assert "requests, per rank (tp 2)" in text
    one = " ".join(runner.invoke(app, ["plan"]).output.split())
    assert "on H200-SXM-141GB, one GPU:" in one and "per rank" not in one
    help_text = " ".join(runner.invoke(app, ["plan", "--help"]).output.split())
    assert "every figure printed is one rank's" in help_text
    assert "nvidia-smi memory.total" in help_text and "CUDA graphs" in help_text


def test_plan_gpu_local_reads_cuda_or_exits_2():
    torch = pytest.importorskip("torch")
    result = runner.invoke(app, ["plan", "--gpu", "local", "--json"])
    if torch.cuda.is_available():
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["gpu_memory_bytes"] == torch.cuda.mem_get_info(0)[1]
    else:
        assert result.exit_code == 2 and result.stdout == ""
        assert "--gpu local needs a CUDA GPU visible to torch" in result.stderr


def _compressed_tensors_config(tmp_path):
    from kvchain.catalog.loader import read_bundled_config

    cfg = read_bundled_config("model_configs/Qwen--Qwen3-8B.json")
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(cfg))
    quant = tmp_path / "quant.json"
    quant.write_text(json.dumps({**cfg, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized"}}))
    return plain, quant


def test_plan_weight_format_reads_a_compressed_tensors_config(tmp_path):
    plain, quant = _compressed_tensors_config(tmp_path)
    # Without it the format is unknown: refused, naming the option.
    result = runner.invoke(app, ["plan", "--config", str(quant), "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    message = " ".join(result.stderr.split())
    assert "quant_method='compressed-tensors' is not supported" in message
    assert "--weight-format" in message
    # With it, the weights are those of the same model read as bf16 (the unquantized file).
    as_bf16 = run_json("plan", "--config", str(quant), "--weight-format", "bf16")
    assert as_bf16["weight_bytes"] == run_json("plan", "--config", str(plain))["weight_bytes"]
    fp8 = run_json("plan", "--config", str(quant), "--weight-format", "fp8")
    assert fp8["weight_bytes"] < as_bf16["weight_bytes"]
    # Not with a bundled model or a spec file (their weights are given).
    assert "applies to --config files" in refused("plan", "--weight-format", "fp8")
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "s", "full": 32_000}))
    assert "does not apply to --spec" in refused("plan", "--spec", str(spec),
                                                 "--weight-format", "fp8")


def test_weight_format_is_one_run_option_of_simulate_compare_and_sweep(tmp_path):
    # The same option and the same loader as `plan`: a compressed-tensors config is refused
    # without it (naming the option) and served with it; a bundled model refuses it.
    from kvchain.model.params import WeightFormat
    from kvchain.sim.run_options import RunOptions
    from kvchain.sim.sweep import SweepPoint, point_config

    plain, quant = _compressed_tensors_config(tmp_path)
    run = ["--requests", "2", "--clock", "steps", "--json"]
    for command in ("simulate", "compare"):
        result = runner.invoke(app, [command, "--config", str(quant), *run])
        assert result.exit_code == 2 and result.stdout == "", (command, result.output)
        assert "--weight-format" in " ".join(result.stderr.split())
        assert "applies to --config files" in refused(command, "--weight-format", "fp8", *run)
    served = runner.invoke(app, ["simulate", "--config", str(quant), "--weight-format",
                                 "bf16", *run])
    assert served.exit_code == 0, served.output
    # A sweep point with the option gets the model plan reads (bf16 = the unquantized file).
    fields = {"model": str(quant), "gpu": "h200", "tp": 1, "trace": "azure-conv",
              "rate_scale": 1.0, "mem_fraction": 0.9, "manager": "kvchain"}
    point = SweepPoint(**fields, options=RunOptions(requests=2,
                                                    weight_format=WeightFormat.BF16))
    assert (point_config(point).model.weight_bytes
            == run_json("plan", "--config", str(plain))["weight_bytes"])


def test_plan_reports_concurrency_with_speculative_drafts(tmp_path):
    """plan --spec-tokens 3 prints and --json carries the concurrency with and without the
    drafts, on the chain and the fixed pools: the figures of
    kvchain.capacity.speculative_capacity (derived by hand in tests/test_capacity.py), here
    on a spec file of 1,000 B per full token and a 50,000,000 B state slot, 1e9 B."""
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"name": "m", "full": 1_000, "state": 50_000_000}))
    args = ["plan", "--spec", str(spec), "--buffer-bytes", "1000000000", "--prompt", "1000",
            "--output", "100"]
    result = runner.invoke(app, [*args, "--spec-tokens", "3", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)["speculative"]
    assert (got["chain_concurrent"], got["chain_concurrent_k0"], got["pools_concurrent"],
            got["pools_concurrent_k0"]) == (4, 19, 2, 9)
    text = " ".join(runner.invoke(app, [*args, "--spec-tokens", "3"],
                                  env={"COLUMNS": "80"}).stdout.split())
    assert "concurrent requests 4 on the chain (k = 0: 19), 2 in the fixed pools" in text
    plain = runner.invoke(app, [*args, "--json"])
    assert json.loads(plain.stdout)["speculative"] is None  # without --spec-tokens
