"""End-to-end simulations on slices of every shipped trace: exact request counts, no
admitted-but-unallocatable batch, no leaked page."""

from __future__ import annotations

import pytest

from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace

H200 = get_gpu("h200")


@pytest.mark.parametrize(("model", "tp", "trace", "first", "buffer_bytes"), [
    ("gpt-oss-120b", 1, "azure-conv", 120, 2_000_000_000),
    ("gpt-oss-120b", 1, "azure-code", 80, 3_000_000_000),
    ("qwen3-next-80b-a3b", 2, "azure-conv", 80, 4_000_000_000),
    ("gemma-3-27b", 1, "azure-code", 60, 8_000_000_000),
    ("jet-nemotron-2b", 1, "mooncake", 60, 900_000_000),
    ("jamba-v0.1", 1, "sharegpt", 80, 3_000_000_000),
    ("llama-4-scout", 4, "mooncake", 40, 6_000_000_000),
])
def test_slice_runs_to_completion_with_audits(model, tp, trace, first, buffer_bytes):
    spec = load_model(model, tp=tp)
    tr = load_trace(trace, first=first)
    config = SimConfig(spec, H200, tr, buffer_bytes=buffer_bytes,
                       scheduler=SchedulerConfig(chunk_size=4096, max_prefill_tokens=8192))
    result = simulate(config, audit_every_step=True)
    s = result.summary
    assert s.requests_total == first
    assert s.requests_finished + s.requests_rejected == first
    assert s.admitted_but_unallocatable == 0
    assert s.leaked_pages == 0
    assert all(r.output_done == r.output_tokens for r in result.recorder.records
               if r.finished_s is not None)


def test_memory_bound_three_band_run_moves_the_float():
    spec = load_model("jet-nemotron-2b")
    tr = load_trace("mooncake", first=150)
    result = simulate(SimConfig(spec, H200, tr, buffer_bytes=600_000_000))
    s = result.summary
    assert (s.requests_finished, s.requests_rejected) == (150, 0)
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0
    assert s.peak_kv_utilization > 0.9  # memory binds
    assert result.chain_stats.pages_copied > 0  # the chain moved bytes between bands


def test_requests_that_never_fit_are_rejected_not_queued():
    spec = load_model("jet-nemotron-2b")
    tr = load_trace("mooncake", first=60)
    # 120 MB holds a few thousand tokens: the long Mooncake prompts can never fit.
    result = simulate(SimConfig(spec, H200, tr, buffer_bytes=120_000_000))
    s = result.summary
    assert s.requests_rejected > 0
    assert s.requests_finished + s.requests_rejected == 60
    rejected = [r for r in result.recorder.records if r.rejected_reason]
    assert all("empty chain" in r.rejected_reason for r in rejected)


def test_deterministic():
    spec = load_model("gemma-3-27b")
    tr = load_trace("azure-conv", first=40)
    a = simulate(SimConfig(spec, H200, tr, buffer_bytes=5_000_000_000)).summary
    b = simulate(SimConfig(spec, H200, tr, buffer_bytes=5_000_000_000)).summary
    assert a == b
