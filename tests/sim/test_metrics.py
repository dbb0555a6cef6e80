"""Tests of kvchain.sim.metrics with synthetic records (exact values)."""

from __future__ import annotations

import csv
import enum
import json
from pathlib import Path

import pytest

from kvchain.errors import ConfigError, MetricsError
from kvchain.sim.metrics import (
    REQUEST_CSV_COLUMNS,
    BandSample,
    MetricsRecorder,
    Percentiles,
    SimSummary,
    StepSample,
    band_samples,
    summarize,
    write_outputs,
)

BUFFER = 100


def step(
    t_s: float,
    duration_s: float,
    used: int,
    *,
    running: int = 1,
    waiting: int = 0,
    needed: float | None = None,
) -> StepSample:
    full_live = max(used - 10, 0)
    bands = (
        BandSample("state", 0, 10, 10, 0),
        BandSample("full", max(BUFFER - full_live - 4, 10), BUFFER, full_live, 0),
    )
    return StepSample(
        t_s=t_s,
        duration_s=duration_s,
        prefill_tokens=8,
        decode_tokens=running,
        running=running,
        waiting=waiting,
        bands=bands,
        buffer_bytes=BUFFER,
        used_bytes=used,
        needed_bytes=needed,
    )


def scripted_run() -> MetricsRecorder:
    """Five requests; times are binary fractions so every expected value is exact."""
    rec = MetricsRecorder()
    # r0: TTFT 0.5, 5 tokens, TPOT (2.5 - 0.5) / 4 = 0.5, e2e 2.5, queue 0.25
    rec.on_arrival(0, 0.0, prompt_tokens=100, output_tokens=5)
    rec.on_admitted(0, 0.25, hit_tokens=64)  # 64 of its 100 prompt tokens from the cache
    rec.on_first_token(0, 0.5)
    for t in (1.0, 1.5, 2.0, 2.5):
        rec.on_token(0, t)
    rec.on_finished(0, 2.5)
    # r1: one output token: no TPOT; TTFT 0.5, e2e 0.5, queue 0
    rec.on_arrival(1, 1.0, prompt_tokens=50, output_tokens=1)
    rec.on_admitted(1, 1.0)
    rec.on_first_token(1, 1.5)
    rec.on_finished(1, 1.5)
    # r2: retracted once, re-admitted, recomputed; TTFT 2.0, TPOT (6 - 3) / 2 = 1.5
    rec.on_arrival(2, 1.0, prompt_tokens=30, output_tokens=3)
    rec.on_admitted(2, 2.0, hit_tokens=16)
    rec.on_first_token(2, 3.0)
    rec.on_retracted(2, 3.5)
    rec.on_admitted(2, 4.0)  # the re-admission keeps the first admission's 16 hit tokens
    rec.on_first_token(2, 5.0)  # the recompute prefill emits token 2
    rec.on_token(2, 6.0)
    rec.on_finished(2, 6.0)
    # r3: rejected; r4: still running at the end
    rec.on_arrival(3, 2.0, prompt_tokens=10_000, output_tokens=10)
    rec.on_rejected(3, 2.0, "never fits: needs 4.0 MB, chain has 1.0 MB")
    rec.on_arrival(4, 5.0, prompt_tokens=10, output_tokens=10)
    rec.on_admitted(4, 5.5)
    rec.on_first_token(4, 6.0)
    rec.on_step(step(2.0, 2.0, 25, running=2, waiting=3))
    rec.on_step(step(6.0, 4.0, 50, running=1, waiting=0))
    return rec


def test_percentiles_linear_interpolation() -> None:
    p = Percentiles.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert p is not None
    assert (p.p50_s, p.p90_s, p.count) == (3.0, 4.6, 5)
    assert p.p99_s == pytest.approx(4.96, abs=1e-12)
    assert Percentiles.of([]) is None
    single = Percentiles.of([0.25])
    assert single == Percentiles(0.25, 0.25, 0.25, 1)


def test_record_derived_latencies() -> None:
    rec = scripted_run()
    r0, r1, r2, r3, r4 = rec.records
    assert (r0.ttft_s, r0.tpot_s, r0.e2e_s, r0.queue_s, r0.output_done) == (0.5, 0.5, 2.5, 0.25, 5)
    assert (r1.ttft_s, r1.tpot_s, r1.e2e_s, r1.queue_s) == (0.5, None, 0.5, 0.0)
    assert (r2.admitted_s, r2.first_token_s, r2.retractions, r2.output_done) == (2.0, 3.0, 1, 3)
    assert r2.tpot_s == 1.5
    assert r3.rejected_reason is not None and r3.admitted_s is None
    assert (r4.finished_s, r4.tpot_s, r4.e2e_s, r4.output_done) == (None, None, None, 1)


def test_summary_exact_values() -> None:
    summary = summarize(
        scripted_run(), extra={"admitted_but_unallocatable": 0, "leaked_pages": 2, "moves": 7}
    )
    assert (summary.requests_total, summary.requests_finished, summary.requests_rejected) == (
        5,
        3,
        1,
    )
    assert summary.duration_s == 6.0
    assert summary.input_tokens_per_s == (100 + 50 + 30) / 6.0
    assert summary.output_tokens_per_s == (5 + 1 + 3) / 6.0
    # TTFT of finished requests: [0.5, 0.5, 2.0]
    assert summary.ttft is not None
    assert (summary.ttft.p50_s, summary.ttft.count) == (0.5, 3)
    assert summary.ttft.p90_s == pytest.approx(0.5 + 0.8 * 1.5, abs=1e-12)
    assert summary.ttft.p99_s == pytest.approx(0.5 + 0.98 * 1.5, abs=1e-12)
    # TPOT only for outputs > 1: [0.5, 1.5]
    assert summary.tpot is not None
    assert (summary.tpot.p50_s, summary.tpot.count) == (1.0, 2)
    assert summary.tpot.p90_s == pytest.approx(1.4, abs=1e-12)
    assert summary.e2e is not None and summary.e2e.p50_s == 2.5
    assert summary.queueing is not None and summary.queueing.p50_s == 0.25
    # utilization: 0.25 for 2 s, 0.5 for 4 s -> (0.5 + 2.0) / 6 (time-weighted, not 0.375)
    assert summary.mean_kv_utilization == pytest.approx(2.5 / 6.0, abs=1e-15)
    assert summary.peak_kv_utilization == 0.5
    # nothing cached: requests own every held byte, the (present) cache holds 0
    assert summary.mean_kv_requests == summary.mean_kv_utilization
    assert (summary.mean_kv_cache_locked, summary.peak_kv_cache_evictable) == (0.0, 0.0)
    assert (summary.steps, summary.peak_running, summary.peak_waiting) == (2, 2, 3)
    assert (summary.retractions, summary.retracted_requests) == (1, 1)
    assert (summary.admitted_but_unallocatable, summary.leaked_pages) == (0, 2)
    assert dict(summary.extra) == {"moves": 7}


def test_summary_of_empty_run_and_unreported_counters() -> None:
    summary = summarize(MetricsRecorder())
    assert summary.requests_total == 0
    assert summary.duration_s == 0.0
    assert summary.input_tokens_per_s is None and summary.ttft is None
    assert summary.mean_kv_utilization is None and summary.peak_kv_utilization is None
    assert summary.mean_kv_requests is None and summary.peak_kv_cache_locked is None
    assert summary.admitted_but_unallocatable is None and summary.leaked_pages is None


def test_zero_duration_steps_use_plain_mean() -> None:
    rec = MetricsRecorder()
    rec.on_step(step(0.0, 0.0, 20))
    rec.on_step(step(0.0, 0.0, 60))
    assert summarize(rec).mean_kv_utilization == 0.4


def test_down_sampling_keeps_exact_totals_and_extremes() -> None:
    full = MetricsRecorder(max_step_samples=None)
    sampled = MetricsRecorder(max_step_samples=100)
    t = 0.0
    for i in range(10_001):
        duration = 0.001 * (1 + i % 7)
        t += duration
        used = 10 + (i * 37) % 91  # 10..100, peak 100 first at i = 90
        waiting = 500 if i == 4_321 else i % 5
        sample = step(t, duration, used, running=1 + i % 13, waiting=waiting, needed=used * 0.9)
        full.on_step(sample)
        sampled.on_step(sample)
    assert len(full.step_samples) == 10_001
    kept = sampled.step_samples
    # At most 96 evenly spaced (100 less the 4 extremes), at least half of that, plus
    # the extremes that are not among them.
    assert 48 <= len(kept) <= 100
    assert sampled.step_totals == full.step_totals
    assert summarize(sampled) == summarize(full)
    assert full.step_totals.needed_duration_s == full.step_totals.duration_s
    # extremes kept: the first peak of utilization, the waiting spike, the last step
    assert max(s.used_bytes for s in kept) == 100
    assert max(s.waiting for s in kept) == 500
    assert kept[-1] == full.step_samples[-1]
    assert kept[0] == full.step_samples[0]
    # evenly spaced over time: the first step of every bucket of d seconds, d the same
    # for all (every bucket up to the last step has its sample)
    times = [s.t_s for s in kept]
    assert times == sorted(times)
    d = sampled._bucket_s
    t0 = full.step_samples[0].t_s
    firsts: dict[int, float] = {}
    for s in full.step_samples:
        firsts.setdefault(int((s.t_s - t0) / d), s.t_s)
    assert set(firsts.values()) <= set(times)
    assert len(firsts) <= 96


def test_down_sampling_is_even_in_time_not_in_steps() -> None:
    """1,000 steps of 1 ms, then 1,000 steps of 1 s: a step stride would keep about as many
    samples of the first second as of the next 1,000 s; time buckets keep at most two of the
    first second (buckets of at least 1,001 s / 46 = 21.8 s after the first coarsening)."""
    rec = MetricsRecorder(max_step_samples=100)
    t = 0.0
    for i in range(2_000):
        d = 0.001 if i < 1_000 else 1.0
        t += d
        rec.on_step(step(t, d, 20 + (i % 3)))
    kept = [s for s in rec.step_samples if s.t_s <= 1.0]
    assert len(kept) <= 3  # its bucket's first step, the peak (i = 2) and step 0
    assert len(rec.step_samples) <= 100


def test_record_step_builds_bands_only_for_kept_steps() -> None:
    """The lazy path keeps the same samples as ``on_step`` and calls ``bands()`` once per
    kept step; ``finish_steps`` keeps the last one."""
    eager = MetricsRecorder(max_step_samples=50)
    lazy = MetricsRecorder(max_step_samples=50)
    calls = 0
    t = 0.0
    for i in range(5_000):
        t += 0.01
        sample = step(t, 0.01, 10 + (i * 37) % 91, running=1 + i % 13, waiting=i % 5)

        def bands(sample: StepSample = sample) -> tuple[BandSample, ...]:
            nonlocal calls
            calls += 1
            return sample.bands

        eager.on_step(sample)
        lazy.record_step(t_s=sample.t_s, duration_s=sample.duration_s,
                         prefill_tokens=sample.prefill_tokens,
                         decode_tokens=sample.decode_tokens, running=sample.running,
                         waiting=sample.waiting, buffer_bytes=sample.buffer_bytes,
                         used_bytes=sample.used_bytes, bands=bands)
    lazy.finish_steps(lambda: sample.bands)
    assert lazy.step_samples == eager.step_samples
    assert lazy.step_totals == eager.step_totals
    assert calls < 5_000 // 10  # built for the kept steps only (a few peaks early on)
    with pytest.raises(MetricsError, match="used_bytes"):
        lazy.record_step(t_s=t + 1, duration_s=0.0, prefill_tokens=0, decode_tokens=0,
                         running=0, waiting=0, buffer_bytes=BUFFER, used_bytes=BUFFER + 1,
                         bands=lambda: ())
    assert lazy.step_totals.steps == 5_000


def test_event_errors_leave_recorder_unchanged() -> None:
    rec = MetricsRecorder()
    rec.on_arrival(7, 1.0, prompt_tokens=4, output_tokens=2)
    with pytest.raises(MetricsError, match="repeated request id 7"):
        rec.on_arrival(7, 2.0, prompt_tokens=4, output_tokens=2)
    with pytest.raises(MetricsError, match="unknown request id 8"):
        rec.on_admitted(8, 2.0)
    with pytest.raises(MetricsError, match="before its arrival"):
        rec.on_admitted(7, 0.5)
    with pytest.raises(MetricsError, match="not admitted"):
        rec.on_first_token(7, 2.0)
    with pytest.raises(MetricsError, match="no first token"):
        rec.on_token(7, 2.0)
    with pytest.raises(MetricsError, match="never admitted"):
        rec.on_retracted(7, 2.0)
    with pytest.raises(MetricsError, match=">= 1"):
        rec.on_arrival(9, 2.0, prompt_tokens=0, output_tokens=2)
    for hit in (-1, 5):  # request 7 has 4 prompt tokens: a hit lies in [0, 4]
        with pytest.raises(MetricsError, match=r"hit_tokens=.* outside \[0, 4\]"):
            rec.on_admitted(7, 2.0, hit_tokens=hit)
    record = rec.record(7)
    assert (record.admitted_s, record.output_done, record.retractions) == (None, 0, 0)
    assert record.hit_tokens == 0
    rec.on_admitted(7, 2.0)
    rec.on_first_token(7, 3.0)
    with pytest.raises(MetricsError, match="no first token before"):
        rec.on_finished(7, 2.5)
    rec.on_finished(7, 4.0)
    with pytest.raises(MetricsError, match="already finished"):
        rec.on_finished(7, 5.0)
    with pytest.raises(MetricsError, match="already finished"):
        rec.on_rejected(7, 5.0, "late")
    assert rec.record(7).finished_s == 4.0
    rec.on_step(step(5.0, 1.0, 30))
    with pytest.raises(MetricsError, match="before the previous step"):
        rec.on_step(step(4.0, 1.0, 30))
    assert rec.step_totals.steps == 1
    with pytest.raises(ConfigError):
        MetricsRecorder(max_step_samples=5)  # fewer than the 4 extremes and 2 more


def test_sample_validation() -> None:
    with pytest.raises(MetricsError, match="exceed the span"):
        BandSample("full", 0, 10, 8, 4)
    with pytest.raises(MetricsError, match="lo <= hi"):
        BandSample("full", 10, 5, 0, 0)
    with pytest.raises(MetricsError, match="used_bytes"):
        StepSample(1.0, 1.0, 0, 0, 0, 0, (), BUFFER, BUFFER + 1)
    with pytest.raises(MetricsError, match="duration_s"):
        step(1.0, -1.0, 10)
    with pytest.raises(MetricsError, match="beyond the buffer"):
        StepSample(1.0, 1.0, 0, 0, 0, 0, (BandSample("full", 0, 200, 0, 0),), BUFFER, 0)
    with pytest.raises(ConfigError, match="leaked_pages"):
        summarize(MetricsRecorder(), extra={"leaked_pages": -1})
    with pytest.raises(ConfigError, match="finite"):
        summarize(MetricsRecorder(), extra={"x": float("nan")})


class Manager(enum.Enum):
    CHAIN = "chain"


def test_write_outputs_round_trip(tmp_path: Path) -> None:
    rec = scripted_run()
    summary = summarize(rec, extra={"leaked_pages": 0})
    out = write_outputs(
        tmp_path / "run1",
        rec,
        summary,
        config={"trace": Path("x/azure.csv"), "manager": Manager.CHAIN, "seed": 0},
    )
    data = json.loads(out.metrics_json.read_text())
    assert data["config"] == {"trace": "x/azure.csv", "manager": "chain", "seed": 0}
    assert data["summary"]["ttft"]["p50_s"] == 0.5
    assert data["summary"]["admitted_but_unallocatable"] is None
    assert SimSummary.from_json(data["summary"]) == summary
    with out.requests_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == REQUEST_CSV_COLUMNS
    assert len(rows) == 5
    assert rows[0]["tpot_s"] == "0.5" and rows[0]["output_done"] == "5"
    assert rows[1]["tpot_s"] == ""
    assert rows[2]["retractions"] == "1"
    assert rows[3]["rejected_reason"].startswith("never fits") and rows[3]["ttft_s"] == ""
    # hit tokens as scripted: r0 64, r1 none, r2 16 (its first admission's), r3 never admitted
    assert [row["hit_tokens"] for row in rows] == ["64", "0", "16", "0", "0"]
    with pytest.raises(ConfigError, match="not JSON"):
        write_outputs(tmp_path / "run2", rec, summary, config={"bad": object()})
    assert not (tmp_path / "run2").exists()
    with pytest.raises(ConfigError, match="missing fields"):
        SimSummary.from_json({"steps": 1})


def test_band_samples_from_chain_snapshot() -> None:
    from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot
    from kvchain.layout import Anchor

    snapshot = ChainSnapshot(
        buffer_bytes=1_000,
        bands=(
            BandSnapshot("state", Anchor.LOW, 100, 0, 300, 2, 1, 10),
            BandSnapshot("full", Anchor.HIGH, 40, 800, 1_000, 4, 1, 25),
        ),
    )
    state, full = band_samples(snapshot)
    assert state == BandSample("state", 0, 300, 200, 100, Anchor.LOW)
    assert full == BandSample("full", 800, 1_000, 160, 40, Anchor.HIGH)


# --- KV shares by owner: requests' own bytes apart from the prefix cache's ---------------

E_FULL = 1_000  # bytes per token of the declared full-attention class
PAGE = 16  # tokens per page: a page is 16 x 1,000 = 16,000 B
TINY_BUFFER = 1_600_000  # 100 pages


def two_request_run(*, prefix_cache: bool):  # type: ignore[no-untyped-def]
    """Two requests on a full-attention-only model (step clock: every step 30 ms).

    A (t = 0 s): 40 tokens, content blocks [1, 2, 3] (2 whole pages keyed), 4 output
    tokens; B (t = 10 s, after A finished): 40 tokens, blocks [1, 2, 9], 4 output tokens.
    """
    from kvchain.gpu import get_gpu
    from kvchain.model.declared import declare_model
    from kvchain.sim.cost import ClockKind
    from kvchain.sim.engine import SimConfig, simulate
    from kvchain.sim.traces import Trace, TraceRequest

    trace = Trace("tiny", (TraceRequest(0, 0.0, 40, 4, (1, 2, 3)),
                           TraceRequest(1, 10.0, 40, 4, (1, 2, 9))),
                  "hand-made", "n/a", block_tokens=PAGE)
    return simulate(SimConfig(declare_model("tiny-full", full=E_FULL), get_gpu("h200"), trace,
                              buffer_bytes=TINY_BUFFER, page_size=PAGE, clock=ClockKind.STEPS,
                              prefix_cache=prefix_cache), audit_every_step=True)


def assert_cached_shares_by_hand(summary: SimSummary) -> None:
    """The shares of the cached two-request run, derived by hand.

    Each request runs 4 steps of 30 ms (a 40-token prefill that emits token 1, then 3
    decodes; the 4th step finishes it), 8 equal steps in all, so the time-weighted mean of
    a share is its plain mean over the 8 steps. A page is 16,000 B = 1 % of the buffer.

    - A's first 3 steps: its prefill computes 3 pages; at its end the 2 keyed pages go to
      the cache, locked by A: A owns 1 page (1 %), the cache 2 locked pages (2 %).
    - A's last step frees its own page and unlocks: 0 % own, 2 % cached, all evictable.
    - B hits the 2 cached pages (locked, 2 %) and owns 1 page for tokens 32-47 (1 %) on its
      first 3 steps; its last step again leaves 2 % evictable.

    requests: 6 x 1 % / 8 = 0.75 %, peak 1 %; locked: 6 x 2 % / 8 = 1.5 %, peak 2 %;
    evictable: 2 x 2 % / 8 = 0.5 %, peak 2 %; held = their sum: 2.75 %, peak 3 %.
    """
    assert summary.steps == 8
    assert summary.mean_kv_requests == pytest.approx(0.0075, abs=1e-12)
    assert summary.peak_kv_requests == pytest.approx(0.01, abs=1e-12)
    assert summary.mean_kv_cache_locked == pytest.approx(0.015, abs=1e-12)
    assert summary.peak_kv_cache_locked == pytest.approx(0.02, abs=1e-12)
    assert summary.mean_kv_cache_evictable == pytest.approx(0.005, abs=1e-12)
    assert summary.peak_kv_cache_evictable == pytest.approx(0.02, abs=1e-12)
    assert summary.mean_kv_utilization == pytest.approx(0.0275, abs=1e-12)
    assert summary.peak_kv_utilization == pytest.approx(0.03, abs=1e-12)


def test_kv_shares_of_a_two_request_run_by_hand(tmp_path: Path) -> None:
    result = two_request_run(prefix_cache=True)
    assert result.prefix_cache is not None and result.prefix_cache.hit_tokens == 32
    assert_cached_shares_by_hand(result.summary)
    # The per-step split agrees with the bands' independent request counts (requests'
    # page lists), and the three owners add up to the held bytes on every step.
    for s in result.recorder.step_samples:
        assert s.request_bytes == sum(b.request_bytes or 0 for b in s.bands)
        assert s.request_bytes + s.locked_bytes + s.evictable_bytes == s.used_bytes
    data = json.loads(write_outputs(tmp_path, result.recorder, result.summary)
                      .metrics_json.read_text())
    assert data["summary"]["mean_kv_requests"] == result.summary.mean_kv_requests
    assert data["summary"]["peak_kv_cache_evictable"] == pytest.approx(0.02, abs=1e-12)


def test_cached_bytes_counted_as_request_bytes_fail_the_hand_values(monkeypatch) -> None:
    """Sibling: a recorder that counts the cache's bytes as requests' (the old "KV
    utilization" read as requests' memory) reports requests at the held share, 2.75 %,
    and the hand-derived check above fails."""
    import kvchain.sim.metrics as metrics_module

    monkeypatch.setattr(metrics_module, "_own_bytes", lambda used, cached: used)
    summary = two_request_run(prefix_cache=True).summary
    assert summary.mean_kv_requests == pytest.approx(0.0275, abs=1e-12)
    with pytest.raises(AssertionError):
        assert_cached_shares_by_hand(summary)


def test_kv_shares_without_the_cache_by_hand() -> None:
    """The same two requests without a prefix cache: each owns its 3 pages (3 %) on its
    first 3 steps and 0 on its finishing step: requests = held = 6 x 3 % / 8 = 2.25 %,
    peak 3 %; the cache's shares are None ("no cache"), not 0."""
    summary = two_request_run(prefix_cache=False).summary
    assert summary.mean_kv_requests == pytest.approx(0.0225, abs=1e-12)
    assert summary.mean_kv_utilization == pytest.approx(0.0225, abs=1e-12)
    assert summary.peak_kv_requests == pytest.approx(0.03, abs=1e-12)
    assert (summary.mean_kv_cache_locked, summary.peak_kv_cache_locked,
            summary.mean_kv_cache_evictable, summary.peak_kv_cache_evictable) == (
        None, None, None, None)


def cached_step(t_s: float, duration_s: float, *, request: int, cached: int,
                evictable: int) -> StepSample:
    """A step whose one full band holds ``request`` own bytes and ``cached`` bytes of the
    prefix cache (``evictable`` of them unlocked), out of BUFFER = 100 B."""
    live = request + cached
    band = BandSample("full", BUFFER - live, BUFFER, live, 0, request_bytes=request,
                      cached_bytes=cached, evictable_bytes=evictable)
    return StepSample(t_s, duration_s, 0, 1, 1, 0, (band,), BUFFER, live)


def test_shares_are_time_weighted_over_every_step_not_the_kept_samples() -> None:
    """Requests 10 B + cache 40 B (30 evictable) for 1 s, then requests 30 B + cache 20 B
    (0 evictable) for 3 s: requests (10 x 1 + 30 x 3) / 4 / 100 = 25 %, locked
    (10 x 1 + 20 x 3) / 400 = 17.5 %, evictable 30 / 400 = 7.5 %, held 50 %; then 10,000
    steps of 1 ms with requests 60 B and nothing cached, kept as at most 20 samples: the
    totals stay exact."""
    full = MetricsRecorder(max_step_samples=None)
    sampled = MetricsRecorder(max_step_samples=20)
    for rec in (full, sampled):
        rec.on_step(cached_step(1.0, 1.0, request=10, cached=40, evictable=30))
        rec.on_step(cached_step(4.0, 3.0, request=30, cached=20, evictable=0))
    summary = summarize(full)
    assert summary.mean_kv_requests == pytest.approx(0.25, abs=1e-15)
    assert summary.mean_kv_cache_locked == pytest.approx(0.175, abs=1e-15)
    assert summary.mean_kv_cache_evictable == pytest.approx(0.075, abs=1e-15)
    assert summary.mean_kv_utilization == pytest.approx(0.5, abs=1e-15)
    assert (summary.peak_kv_requests, summary.peak_kv_cache_locked,
            summary.peak_kv_cache_evictable) == (0.3, 0.2, 0.3)
    t = 4.0
    for _ in range(10_000):
        t += 0.001
        for rec in (full, sampled):
            rec.on_step(cached_step(t, 0.001, request=60, cached=0, evictable=0))
    assert len(sampled.step_samples) <= 20
    assert sampled.step_totals == full.step_totals
    # requests: (100 B s + 60 B x 10 s) / 14 s / 100 B = 50 %
    assert summarize(sampled).mean_kv_requests == pytest.approx(0.5, abs=1e-12)


def test_zero_duration_steps_use_plain_mean_of_shares() -> None:
    rec = MetricsRecorder()
    rec.on_step(cached_step(0.0, 0.0, request=10, cached=30, evictable=30))
    rec.on_step(cached_step(0.0, 0.0, request=30, cached=10, evictable=0))
    summary = summarize(rec)
    assert summary.mean_kv_requests == pytest.approx(0.2, abs=1e-15)  # (10 + 30) / 2 / 100
    assert summary.mean_kv_cache_locked == pytest.approx(0.05, abs=1e-15)  # (0 + 10) / 200
    assert summary.mean_kv_cache_evictable == pytest.approx(0.15, abs=1e-15)  # 30 / 200


def test_record_step_takes_the_cache_totals_as_numbers() -> None:
    """The lazy path gives the totals ``on_step`` sums from the bands (bands built only
    for kept steps); negative cache bytes are refused and change nothing."""
    eager, lazy = MetricsRecorder(max_step_samples=10), MetricsRecorder(max_step_samples=10)
    for i in range(200):
        sample = cached_step(0.01 * (i + 1), 0.01, request=i % 7, cached=20 + i % 5,
                             evictable=i % 3)
        eager.on_step(sample)
        lazy.record_step(t_s=sample.t_s, duration_s=sample.duration_s, prefill_tokens=0,
                         decode_tokens=1, running=1, waiting=0, buffer_bytes=BUFFER,
                         used_bytes=sample.used_bytes, bands=lambda s=sample: s.bands,
                         cached_bytes=sample.cached_bytes,
                         evictable_bytes=sample.evictable_bytes)
    assert lazy.step_totals == eager.step_totals
    with pytest.raises(MetricsError, match="cached_bytes and evictable_bytes"):
        lazy.record_step(t_s=3.0, duration_s=0.0, prefill_tokens=0, decode_tokens=0,
                         running=0, waiting=0, buffer_bytes=BUFFER, used_bytes=0,
                         bands=lambda: (), cached_bytes=-1)
    assert lazy.step_totals == eager.step_totals


def test_recorder_without_a_cache_refuses_cached_bytes() -> None:
    rec = MetricsRecorder(prefix_cache=False)
    rec.on_step(cached_step(1.0, 1.0, request=10, cached=0, evictable=0))
    with pytest.raises(MetricsError, match="without one"):
        rec.on_step(cached_step(2.0, 1.0, request=10, cached=5, evictable=5))
    assert rec.step_totals.steps == 1  # unchanged
    assert not rec.prefix_cache and summarize(rec).mean_kv_cache_locked is None
    with pytest.raises(ConfigError, match="prefix_cache"):
        MetricsRecorder(prefix_cache=1)  # type: ignore[arg-type]


def test_events_out_of_order_name_the_time_they_needed():
    """The order checks of the request events (one helper for on_first_token, on_token and
    on_finished): each message names the event, the request, its time and the missing or
    later time. Sibling: the same events in order pass and count 1 + 2 output tokens."""
    rec = MetricsRecorder()
    rec.on_arrival(7, 1.0, prompt_tokens=10, output_tokens=3)
    with pytest.raises(MetricsError, match=r"^on_first_token: request 7 at 2.0 s was not "
                                           r"admitted before \(admitted_s=None\)$"):
        rec.on_first_token(7, 2.0)
    rec.on_admitted(7, 2.0)
    with pytest.raises(MetricsError, match=r"^on_finished: request 7 at 3.0 s has no first "
                                           r"token before \(first_token_s=None\)$"):
        rec.on_finished(7, 3.0)
    rec.on_first_token(7, 4.0)
    with pytest.raises(MetricsError, match=r"^on_token: request 7 at 3.5 s has no first "
                                           r"token before \(first_token_s=4.0\)$"):
        rec.on_token(7, 3.5)
    rec.on_token(7, 5.0, tokens=2)
    rec.on_finished(7, 5.0)
    assert rec.record(7).output_done == 3 and rec.record(7).finished_s == 5.0
