"""Prefix-cache settings that cannot take effect are refused, typed, before anything runs
(``SimConfig.check_cache``): ``--prefix-cache`` on a trace without content keys (azure-conv
carries no block ids: nothing could hit). Before the check it ran silently with a 0 %
hit rate. (A model with two window bands used to be refused too; the cache now serves
any number of window bands, so those flags run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace

_load_commands()
runner = CliRunner()
FAST = ["--requests", "10", "--end-s", "1e9", "--buffer-bytes", "400000000"]
TWO_WINDOWS = {
    "name": "two-windows", "full": 16_384, "state": 2_097_152,
    "windows": [{"bytes": 16_384, "tokens": 128}, {"bytes": 8_192, "tokens": 1_024}],
    "hidden_size": 4_096, "num_attention_heads": 32, "total_params": 8_000_000_000,
    "active_params": 8_000_000_000, "weight_bytes": 16_000_000_000}


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_prefix_cache_on_a_trace_without_content_keys_is_refused(command: str) -> None:
    result = runner.invoke(app, [command, "--trace", "azure-conv", "--prefix-cache", *FAST])
    assert result.exit_code == 2, result.output
    assert "carries no content keys" in result.output
    # the sibling: the same run with the cache left at its default runs (off, no keys)
    ok = runner.invoke(app, [command, "--trace", "azure-conv", *FAST])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("flags", [["--prefix-cache"], ["--cache-points", "ends"],
                                   ["--cache-points", "blocks"]])
def test_cache_flags_on_a_model_with_two_window_bands_run(
        tmp_path: Path, flags: list[str]) -> None:
    # Regression (issue 22 item 5): these were refused ("at most one window"); every
    # window band now keeps its own tails, so the cache runs on such a chain.
    spec = tmp_path / "two.json"
    spec.write_text(json.dumps(TWO_WINDOWS))
    result = runner.invoke(app, ["simulate", "--spec", str(spec), "--trace", "mooncake",
                                 *flags, *FAST])
    assert result.exit_code == 0, result.output
    assert "at most one window" not in result.output
    assert "prefix-cache hit rate" in result.output


def test_library_simulate_refuses_before_any_step() -> None:
    model, gpu = load_model("gpt-oss-120b"), get_gpu("h200")
    trace = load_trace("azure-conv", first=5)
    config = SimConfig(model, gpu, trace, buffer_bytes=400_000_000, prefix_cache=True)
    with pytest.raises(ConfigError, match="carries no content keys"):
        simulate(config)
    # the sibling: the trace's own default (no keys: the cache stays off) runs
    assert simulate(SimConfig(model, gpu, trace, buffer_bytes=400_000_000)
                    ).prefix_cache is None
