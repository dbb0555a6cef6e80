"""Fast-forwarded decode runs give the per-step loop's run exactly (the per-step loop,
``SimConfig(fast_forward=False)``, is the oracle): the same steps, per-request times,
retractions, evictions, hit rates, chain counters and step samples, on seeded generated
traces and slices of the bundled traces, on every chain shape (two and three bands,
chunked local, two windows, state), with the prefix cache on and off, memory bound and
not; and a planted fast-forward that skips an event is caught by the same comparison."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.sched.admission import ReserveConfig, ReservePolicy
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim import engine
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimConfig, SimResult, simulate
from kvchain.sim.traces import Trace, TraceRequest, load_trace

H200 = get_gpu("h200")


def differences(fast: SimResult, slow: SimResult) -> list[str]:
    """What differs between two results of one configuration (empty: the same run).
    Exact equality everywhere: both loops do the same float operations in the same order
    (the clock as ``now += d`` step after step, the recorder's sums step by step)."""
    out = []
    if fast.summary != slow.summary:
        a, b = fast.summary.to_json(), slow.summary.to_json()
        out += [f"summary {k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b[k]]
    if fast.recorder.records != slow.recorder.records:
        bad = [(x, y) for x, y in zip(fast.recorder.records, slow.recorder.records,
                                      strict=True) if x != y]
        out.append(f"{len(bad)} request records differ, first {bad[0]}")
    if fast.recorder.step_totals != slow.recorder.step_totals:
        out.append(f"step totals {fast.recorder.step_totals} != {slow.recorder.step_totals}")
    if fast.recorder.step_samples != slow.recorder.step_samples:
        out.append("step samples differ")
    if fast.chain_stats != slow.chain_stats:
        out.append(f"chain stats {fast.chain_stats} != {slow.chain_stats}")
    if len(fast.unallocatable) != len(slow.unallocatable):
        out.append("admitted-but-unallocatable events differ")
    pa, pb = fast.prefix_cache, slow.prefix_cache
    if (pa is None) != (pb is None) or (pa is not None and pb is not None and (
            pa.hit_tokens, pa.prompt_tokens, pa.evicted_pages, pa.timeline,
            pa.cow_state_copies, pa.checkpoints_saved) != (
            pb.hit_tokens, pb.prompt_tokens, pb.evicted_pages, pb.timeline,
            pb.cow_state_copies, pb.checkpoints_saved)):
        out.append("prefix-cache figures differ")
    return out


def both(config: SimConfig, audit: bool = False) -> tuple[SimResult, SimResult]:
    fast = simulate(replace(config, fast_forward=True), audit_every_step=audit)
    slow = simulate(replace(config, fast_forward=False), audit_every_step=audit)
    assert slow.fast_forward_steps == 0
    return fast, slow


def check_same(config: SimConfig, *, min_fast: float = 0.3,
               audit: bool = False) -> tuple[SimResult, SimResult]:
    fast, slow = both(config, audit)
    assert differences(fast, slow) == []
    # The comparison is only worth something if the runs were fast-forwarded.
    assert fast.fast_forward_steps >= min_fast * fast.summary.steps > 0
    return fast, slow


def generated_trace(seed: int, n: int, *, rate: float, prompt: tuple[int, int],
                    output: tuple[int, int], keys: bool = False) -> Trace:
    """A seeded trace: Poisson arrivals at ``rate`` per second, uniform lengths; with
    ``keys``, prompts of 64-token blocks drawn from a few shared conversation prefixes."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for rid in range(n):
        t += rng.expovariate(rate)
        p = rng.randint(*prompt)
        ids = None
        if keys:
            root = rng.randrange(4) * 1_000
            ids = tuple(root + b for b in range(-(-p // 64)))  # one id per started block
        reqs.append(TraceRequest(rid, t, p, rng.randint(*output), ids))
    return Trace(f"seeded-{seed}", tuple(reqs), "generated", "none", block_tokens=64)


def declared(shape: str):
    """Declared models (step clock: no weights needed) of shapes no bundled model has."""
    if shape == "window4x|window|full":
        return declare_model(shape, full=1_000, windows=[(1_000, 48), (1_000, 200)])
    if shape == "local|full":
        return declare_model(shape, full=1_000, local=1_000, chunk_tokens=96)
    if shape == "state|window|full":
        return declare_model(shape, full=1_000, window=1_000, window_tokens=80, state=60_000)
    return declare_model(shape, full=1_000, window=1_000, window_tokens=64)


@pytest.mark.parametrize("shape", ["window|full", "window4x|window|full", "local|full",
                                   "state|window|full"])
@pytest.mark.parametrize("seed", [1, 2])
def test_seeded_traces_every_shape_memory_bound(shape, seed):
    # 1.2 MB at 1 kB per token of each class: about 1,200 tokens of KV per class for all
    # requests together, while one arrival a second brings ~110 prompt and ~150 output
    # tokens that stay for ~15 s (10 ms steps): memory binds, so runs end where pages do
    # not fit and the per-step loop retracts; between bursts the queue empties and runs
    # cover a good part of the steps.
    trace = generated_trace(seed, 60, rate=1.0, prompt=(20, 200), output=(5, 300))
    config = SimConfig(declared(shape), H200, trace, buffer_bytes=1_200_000, page_size=16,
                       clock=ClockKind.STEPS, step_ms=10.0,
                       scheduler=SchedulerConfig(max_prefill_tokens=256, chunk_size=128,
                                                 strict=False,
                                                 reserve=ReserveConfig(ReservePolicy.SGLANG)))
    fast, _ = check_same(config, audit=True, min_fast=0.15)
    assert fast.summary.retractions > 0  # memory bound: the per-step loop retracted


@pytest.mark.parametrize("seed", [3, 4])
def test_seeded_trace_with_prefix_cache_evicting(seed):
    # Four conversation roots, so prompts share prefixes; 1.5 MB holds ~750 tokens of each
    # class, a few prompts: the cache fills at once and every later admission evicts.
    trace = generated_trace(seed, 80, rate=1.0, prompt=(64, 640), output=(5, 200), keys=True)
    config = SimConfig(declared("window|full"), H200, trace, buffer_bytes=1_500_000,
                       clock=ClockKind.STEPS, step_ms=10.0, prefix_cache=True,
                       scheduler=SchedulerConfig(max_prefill_tokens=512, chunk_size=256,
                                                 strict=False))
    fast, _ = check_same(config, audit=True)
    assert fast.prefix_cache is not None
    assert fast.prefix_cache.hit_tokens > 0 and sum(fast.prefix_cache.evicted_pages.values())


@pytest.mark.parametrize(("model", "tp", "trace", "first", "buffer_bytes", "cache"), [
    ("gpt-oss-120b", 1, "azure-conv", 200, None, None),  # two bands, not memory bound
    ("gpt-oss-120b", 1, "azure-code", 80, 3_000_000_000, None),
    ("gpt-oss-120b", 1, "mooncake", 80, 4_000_000_000, True),  # cache on, evicting
    ("gpt-oss-120b", 1, "mooncake", 80, 4_000_000_000, False),
    ("jet-nemotron-2b", 1, "mooncake", 100, 600_000_000, False),  # three bands, moves
    ("jet-nemotron-2b", 1, "mooncake", 100, 900_000_000, True),
    ("llama-4-scout", 4, "mooncake", 40, 6_000_000_000, False),  # chunked local
    ("jamba-v0.1", 1, "sharegpt", 80, 3_000_000_000, None),  # state | full
])
def test_bundled_trace_slices(model, tp, trace, first, buffer_bytes, cache):
    # Mooncake at 0.3x its rate, as the default run: a queue that empties between bursts.
    rate = 0.3 if trace == "mooncake" else 1.0
    config = SimConfig(load_model(model, tp=tp), H200,
                       load_trace(trace, first=first, rate_scale=rate),
                       buffer_bytes=buffer_bytes, prefix_cache=cache,
                       scheduler=SchedulerConfig(strict=False))
    fast, slow = check_same(config)
    if model == "jet-nemotron-2b" and not cache:
        assert slow.chain_stats.pages_copied > 0  # page moves ran (as steps of their own)
    if cache:
        assert fast.prefix_cache is not None and fast.prefix_cache.hit_tokens > 0
        assert sum(fast.prefix_cache.evicted_pages.values()) > 0


def test_retractions_under_the_sglang_reserve():
    # 4x the arrival rate into 1 GB (about 27k tokens of gpt-oss KV): SGLang's decaying
    # ratio under-reserves, so running requests outgrow memory and are retracted.
    config = SimConfig(
        load_model("gpt-oss-120b"), H200, load_trace("azure-conv", first=150, rate_scale=4.0),
        buffer_bytes=1_000_000_000,
        scheduler=SchedulerConfig(strict=False, reserve=ReserveConfig(ReservePolicy.SGLANG)))
    fast, _ = check_same(config, min_fast=0.1)
    assert fast.summary.retractions > 0


def test_planted_fast_forward_that_ignores_arrivals_is_caught(monkeypatch):
    """The sibling of every equality above: a fast-forward that runs on past an arrival
    (as if none came inside the run) gives another run, and the comparison says so."""
    config = SimConfig(load_model("gpt-oss-120b"), H200, load_trace("azure-conv", first=120),
                       scheduler=SchedulerConfig(strict=False))
    honest = engine._decode_run

    def blind(sched, clock, recorder, now, next_arrival, sample):
        return honest(sched, clock, recorder, now, math.inf, sample)

    monkeypatch.setattr(engine, "_decode_run", blind)
    fast, slow = both(config)
    found = differences(fast, slow)
    assert found  # e.g. later admissions: other TTFTs, other step counts
    assert any("request records" in d for d in found)


def test_planted_fast_forward_with_a_frozen_clock_is_caught(monkeypatch):
    """A second sibling: a run whose steps all cost what its first costs (context growth
    ignored in the cost model) shifts every later time; the comparison catches it."""
    config = SimConfig(load_model("gpt-oss-120b"), H200, load_trace("azure-conv", first=60),
                       scheduler=SchedulerConfig(strict=False))
    honest = engine.GPUCostModel.run_times

    def frozen(self, work):
        times = honest(self, work)
        times[:] = times[0]
        return times

    monkeypatch.setattr(engine.GPUCostModel, "run_times", frozen)
    fast, slow = both(config)
    assert any("summary" in d or "records" in d for d in differences(fast, slow))


def test_off_and_with_on_allocated_every_step_is_a_step():
    config = SimConfig(load_model("gpt-oss-120b"), H200, load_trace("azure-conv", first=30))
    assert simulate(replace(config, fast_forward=False)).fast_forward_steps == 0
    seen = []
    result = simulate(config, on_allocated=lambda s, b, t: seen.append(t))
    assert result.fast_forward_steps == 0 and len(seen) == result.summary.steps
