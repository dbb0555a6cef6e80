"""What a run says about its prefix cache: its hit rate next to the infinite-cache and LRU
bounds of the same requests (summary, metrics.json, hit_rate.png), and a default that
turned the cache off says why (never a silent 0). Values derived by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError, TraceError
from kvchain.gpu import get_gpu
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.report.plots import hit_rate_chart
from kvchain.report.tables import EXTRA_LABELS
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.prefix import PrefixCacheStats, default_cache_off_reason, warm_cold_trace
from kvchain.sim.prefix_bounds import lru_capacity_pages
from kvchain.sim.traces import Trace, TraceRequest


def three_prompts() -> Trace:
    # Blocks of 512 tokens. Request 0: blocks (1, 2) = 1,024 tokens; request 1: (1, 2, 3)
    # = 1,536 tokens; request 2: (1, 9) = 1,024 tokens. Pages of 16 tokens.
    return Trace("hand", (TraceRequest(0, 0.0, 1024, 2, prefix_block_ids=(1, 2)),
                          TraceRequest(1, 50.0, 1536, 2, prefix_block_ids=(1, 2, 3)),
                          TraceRequest(2, 100.0, 1024, 2, prefix_block_ids=(1, 9))),
                 "hand", "-")


def test_bounds_of_the_same_requests_by_hand():
    # Infinite cache: request 1 finds blocks 1, 2 (64 pages = 1,024 tokens), request 2
    # block 1 (32 pages = 512 tokens): (1,024 + 512) / (1,024 + 1,536 + 1,024) = 1,536 /
    # 3,584 = 42.857 %. LRU: a buffer of 16 GiB of gpt-oss full pages (36,864 B a token,
    # 589,824 B a page) holds 29,127 pages, far more than the 96 pages these prompts
    # have: the same 42.857 %.
    model = load_model("gpt-oss-120b")
    layout = plan_layout(model.classes, 17_179_869_184, 16)
    stats = PrefixCacheStats()
    extra = stats.add_bounds(three_prompts(), layout)
    assert extra == {"prefix_infinite_bound_pct": 42.86, "prefix_lru_bound_pct": 42.86}
    assert stats.lru_capacity_pages == 29_127
    assert stats.to_json()["infinite_cache_bound"] == round(1536 / 3584, 6)
    assert list(stats.bounds()) == ["infinite cache", "LRU of the buffer (29,127 pages)"]


def test_lru_capacity_by_hand_and_refusals():
    assert lru_capacity_pages(17_179_869_184, 36_864, 16) == 29_127  # 2^34 // 589,824
    assert lru_capacity_pages(10, 36_864, 16) == 1  # never below one page
    with pytest.raises(ConfigError):
        lru_capacity_pages(0, 36_864, 16)


def test_a_run_reports_its_bounds_and_its_rate(tmp_path: Path):
    # gpt-oss (window hybrid, blocks every 512 tokens): request 1 hits 1,024 (blocks 1,
    # 2), request 2 hits 512 (block 1): the run reaches the infinite-cache bound.
    config = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"), three_prompts(),
                       buffer_bytes=17_179_869_184)
    result = simulate(config)
    extra = result.summary.extra
    assert extra["prefix_hit_tokens"] == 1536
    # the same hits per request (requests.csv's hit_tokens): 0, 1,024 and 512
    assert [r.hit_tokens for r in result.recorder.records] == [0, 1024, 512]
    assert extra["prefix_infinite_bound_pct"] == extra["prefix_lru_bound_pct"] == 42.86
    assert extra["prefix_hit_rate_pct"] == 42.86
    assert "prefix_cache_off_window_bands" not in extra
    pc = result.prefix_cache
    assert pc is not None
    path = hit_rate_chart(pc.timeline, tmp_path / "hit_rate.png", pc.bounds())
    assert path.stat().st_size > 0
    assert EXTRA_LABELS["prefix_lru_bound_pct"].startswith("LRU")


TWO_WINDOWS = [declared_class(LC.FULL, 1_000), declared_class(LC.WINDOW, 1_000, 128),
               declared_class(LC.WINDOW, 500, 1_024)]


def test_the_default_turns_the_cache_on_for_two_window_bands():
    # Issue 22 item 5: every window band keeps its own tails, so a chain with two window
    # bands takes the cache by default like any other (off only without content keys).
    layout = plan_layout(TWO_WINDOWS, 4_000_000, 16)
    assert default_cache_off_reason(three_prompts(), layout) is None
    no_keys = Trace("nokeys", (TraceRequest(0, 0.0, 100, 2),), "hand", "-")
    assert default_cache_off_reason(no_keys, layout) == "the trace has no content keys"


def test_a_two_window_run_reports_its_cache(tmp_path: Path):
    from typer.testing import CliRunner

    from kvchain.cli import _load_commands, app

    _load_commands()
    spec = tmp_path / "two.json"
    spec.write_text(json.dumps({
        "name": "two-windows", "full": 16_384, "state": 2_097_152,
        "windows": [{"bytes": 16_384, "tokens": 128}, {"bytes": 8_192, "tokens": 1_024}],
        "hidden_size": 4_096, "num_attention_heads": 32, "total_params": 8_000_000_000,
        "active_params": 8_000_000_000, "weight_bytes": 16_000_000_000}))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["simulate", "--spec", str(spec), "--trace", "mooncake",
                                      "--requests", "10", "--end-s", "1e9", "--buffer-bytes",
                                      "400000000", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "prefix cache on (auto" in " ".join(result.output.split())
    metrics = json.loads((out / "metrics.json").read_text())
    extra = metrics["summary"]["extra"]
    assert "prefix_cache_off_window_bands" not in extra
    assert "prefix_hit_rate_pct" in extra and metrics["prefix_cache"] is not None
    assert (metrics["summary"]["admitted_but_unallocatable"], metrics["summary"]["leaked_pages"]) \
        == (0, 0)


def test_warm_cold_trace_by_hand():
    t = warm_cold_trace(4, documents=2, document_tokens=1024, query_tokens=100,
                        cold_tokens=600)
    # Documents: ids 1-2 (doc 0) and 3-4 (doc 1); then own blocks from 5 on.
    assert [(r.prompt_tokens, r.prefix_block_ids) for r in t.requests] == [
        (1124, (1, 2, 5)), (600, (6, 7)), (1124, (3, 4, 8)), (600, (9, 10))]
    arrivals = [r.arrival_s for r in t.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    with pytest.raises(TraceError):
        warm_cold_trace(4, document_tokens=1000)
    with pytest.raises(TraceError):
        warm_cold_trace(0)
