"""`kvchain plan --host-bytes / --host-fraction`: the host tier's resumable prefix, in text
and JSON, with hand-derived numbers; bad input exits 2."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import kvchain.cli.plan as plan_cli
from kvchain.cli import _load_commands, app
from kvchain.gpu import local_host_memory_bytes

_load_commands()
runner = CliRunner()


def run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def spec(tmp_path):
    # E_full = 1,000 B per token (16,000 B pages at P = 16), S = 100,000 B, no weights.
    path = tmp_path / "hyb.json"
    path.write_text(json.dumps({"name": "hyb", "full": 1_000, "state": 100_000}))
    return str(path)


def test_host_tier_of_a_state_hybrid_by_hand(spec):
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-bytes", "10000000", "--json"))["host_tier"]
    # Interval 512 tokens (the default: Mooncake's content block) = 32 full pages
    # (512,000 B) + 1 checkpoint (100,000 B) = 612,000 B.
    # m = 16: state [0, 1,600,000), full [1,600,000, 1,600,000 + 16 x 512,000 = 9,792,000);
    # m = 17: full would start at 1,700,096 and end at 10,404,096 > 10,000,000.
    assert (d["interval_tokens"], d["interval_bytes"], d["intervals"]) == (512, 612_000, 16)
    assert d["resumable_tokens"] == 16 * 512 == 8_192
    assert d["used_bytes"] == 9_792_000
    assert d["classes"] == [
        {"band": "state", "page_bytes": 100_000, "per_interval": 1, "slots": 16,
         "bytes": 1_600_000},
        {"band": "full", "page_bytes": 16_000, "per_interval": 32, "slots": 512,
         "bytes": 8_192_000}]
    # The mix's 2,048-token prompt: last resume point before its last token 1,536 = 96
    # pages: 96 x 16,000 + 100,000 = 1,636,000 B; a spec without weights cannot be timed.
    hit = d["hit"]
    assert (hit["tokens"], hit["load_bytes"], hit["saved_s"]) == (1_536, 1_636_000, None)
    assert "weights" in hit["why_unpriced"]
    # A coarser spacing buys fewer checkpoints: K = 2,048: 128 x 16,000 + 100,000 =
    # 2,148,000 B; m = 4 (full from 400,128 to 8,592,128); 8,192 tokens again.
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-bytes", "10000000", "--host-interval", "2048",
                       "--json"))["host_tier"]
    assert (d["interval_bytes"], d["intervals"], d["used_bytes"]) == (2_148_000, 4, 8_592_128)


def test_host_hit_priced_on_gpt_oss(monkeypatch):
    d = json.loads(run("plan", "--host-bytes", "274877906944", "--json"))["host_tier"]
    # window|full, both 589,824 B pages; interval 32 full + min(32, ceil(127 / 16)) = 8
    # window pages = 40 x 589,824 = 23,592,960 B; 256 GiB holds 11,650 intervals.
    assert (d["interval_bytes"], d["intervals"]) == (23_592_960, 11_650)
    assert d["resumable_tokens"] == 11_650 * 512 == 5_964_800
    hit = d["hit"]
    # 1,536 tokens x 36,864 B + 8 window pages x 589,824 B = 61,341,696 B, over PCIe 5.0
    # x16 at 0.8 x 64e9 B/s: 1.19808 ms.
    assert hit["load_bytes"] == 61_341_696
    assert hit["load_s"] == pytest.approx(61_341_696 / 51.2e9)
    assert hit["saved_s"] == pytest.approx(hit["recompute_s"] - hit["with_hit_s"])
    assert hit["saved_s"] > 0 and hit["why_unpriced"] is None
    text = " ".join(run("plan", "--host-bytes", "274877906944").split())
    assert "5,964,800 tokens of resumable prefix" in text
    assert "host tier by class" in text and "not simulated" not in text
    assert "a host hit of 1,536 tokens loads 61,341,696 B in 1.2 ms" in text


def test_host_fraction_of_this_machine(monkeypatch, spec):
    monkeypatch.setattr(plan_cli, "local_host_memory_bytes", lambda: 1_000_000_000)
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-fraction", "0.01", "--json"))["host_tier"]
    assert d["host_bytes"] == 10_000_000 and d["intervals"] == 16
    assert d["given"] == "--host-fraction 0.01 of this machine's 1,000,000,000 B"
    assert json.loads(run("plan", "--json"))["host_tier"] is None


def test_local_host_memory():
    assert local_host_memory_bytes() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize(("args", "words"), [
    (["--host-bytes", "5", "--host-fraction", "0.5"], "not both"),
    (["--host-fraction", "1.5"], "--host-fraction must be in (0, 1], got 1.5"),
    (["--host-fraction", "0"], "--host-fraction must be in (0, 1], got 0"),
    (["--host-bytes", "0"], "--host-bytes must be >= 1, got 0"),
    (["--host-bytes", "10", "--host-interval", "0"], "--host-interval must be >= 1, got 0"),
])
def test_bad_host_options_exit_2(args, words):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2
    assert words in " ".join(result.output.split())


def test_host_hit_is_at_most_what_the_tier_holds(spec):
    # Regression: the hit was priced from the prompt alone (1,536 tokens), even for a tier
    # that holds one interval or none.
    # 1,000,000 B: one interval (612,000 B: state [0, 100,000), full from 100,096 to
    # 612,096); two would need full to end at 200,192 + 1,024,000 > 1,000,000. The tier
    # holds 512 tokens, so the 2,048-token prompt's hit is 512 tokens: 32 full pages x
    # 16,000 B + one 100,000 B checkpoint = 612,000 B.
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-bytes", "1000000", "--json"))["host_tier"]
    assert (d["intervals"], d["resumable_tokens"]) == (1, 512)
    hit = d["hit"]
    assert (hit["tokens"], hit["limited_by_tier"], hit["load_bytes"]) == (512, True, 612_000)
    # 600,000 B holds no interval: nothing to hit, and the reason says so.
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-bytes", "600000", "--json"))["host_tier"]
    assert (d["intervals"], d["resumable_tokens"]) == (0, 0)
    hit = d["hit"]
    assert (hit["tokens"], hit["load_bytes"], hit["load_s"]) == (0, 0, None)
    assert "holds no resume interval (one needs 612,000 B" in hit["why_unpriced"]
    text = " ".join(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                        "--host-bytes", "600000").split())
    assert "host hit not priced: the host tier holds no resume interval" in text
    # A tier that holds the whole prefix is not limited: 10,000,000 B hold 8,192 tokens.
    d = json.loads(run("plan", "--spec", spec, "--buffer-bytes", "1000000000",
                       "--host-bytes", "10000000", "--json"))["host_tier"]
    assert (d["hit"]["tokens"], d["hit"]["limited_by_tier"]) == (1_536, False)


def test_host_hit_on_a_small_tier_is_timed_on_its_content():
    # gpt-oss-120b: an interval is 23,592,960 B (test above); 30,000,000 B hold one
    # (window [0, 8 x 589,824 = 4,718,592), full from 4,718,592 to 23,592,960 + ... =
    # 23,592,960 B in all), so the hit is 512 tokens: 512 x 36,864 B of full pages + the
    # 8-page window tail 4,718,592 B = 23,592,960 B.
    d = json.loads(run("plan", "--host-bytes", "30000000", "--json"))["host_tier"]
    assert (d["intervals"], d["hit"]["tokens"]) == (1, 512)
    assert d["hit"]["load_bytes"] == 512 * 36_864 + 8 * 589_824 == 23_592_960
    assert d["hit"]["limited_by_tier"] is True and d["hit"]["saved_s"] is not None
    text = " ".join(run("plan", "--host-bytes", "30000000").split())
    assert "a host hit of 512 tokens (all the tier holds) loads 23,592,960 B" in text


def test_host_tier_of_a_model_that_resumes_without_bytes(tmp_path):
    # Regression: ZeroDivisionError traceback. Chunked local only, C = 64 tokens: the
    # default interval (512 tokens) always resumes at a chunk start, which needs no KV.
    path = tmp_path / "lo.json"
    path.write_text(json.dumps({"name": "lo", "local": 1_000, "chunk_tokens": 64}))
    d = json.loads(run("plan", "--spec", str(path), "--buffer-bytes", "100000000",
                       "--host-bytes", "5000000", "--json"))["host_tier"]
    assert (d["interval_bytes"], d["intervals"], d["resumable_tokens"]) == (0, 0, 0)
    assert d["hit"]["tokens"] == 0
    assert "needs no KV bytes" in d["hit"]["why_unpriced"]
