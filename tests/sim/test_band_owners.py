"""Who owns each band's live pages in the step samples: requests' own pages, the prefix
cache's pages (locked or evictable) and the null page; derived by hand on a tiny run, the
sum identity on every sample of a memory-bound cached run, and planted defects (a cache
that miscounts, a request counter that double counts) that break it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvchain.cache.radix import PrefixCache
from kvchain.catalog.loader import load_model
from kvchain.errors import MetricsError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim import engine as engine_module
from kvchain.sim import metrics as metrics_module
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimConfig, SimResult, simulate
from kvchain.sim.metrics import BandSample, MetricsRecorder, summarize, write_outputs
from kvchain.sim.traces import Trace, TraceRequest, load_trace

H200 = get_gpu("h200")
E_FULL = 1_000  # bytes per token of the declared full class
PAGE = 16  # tokens per page: a full page is 16 x 1,000 = 16,000 B


def tiny_run() -> SimResult:
    """Two requests on a full-attention-only model, one content block per page (16 tokens).

    A (t = 0 s): 40 tokens, blocks [1, 2, 3] -> 2 whole pages keyed (40 // 16), output 4.
    B (t = 10 s, after A finished): 40 tokens, blocks [1, 2, 9]: its first 2 pages have A's
    keys; a hit covers at most (40 - 1) // 16 = 2 pages, so B hits both (32 tokens).
    """
    model = declare_model("tiny-full", full=E_FULL)
    trace = Trace("tiny", (TraceRequest(0, 0.0, 40, 4, (1, 2, 3)),
                           TraceRequest(1, 10.0, 40, 4, (1, 2, 9))),
                  "hand-made", "n/a", block_tokens=PAGE)
    return simulate(SimConfig(model, H200, trace, buffer_bytes=1_600_000, page_size=PAGE,
                              clock=ClockKind.STEPS), audit_every_step=True)


def full_band(sample_bands: tuple[BandSample, ...]) -> BandSample:
    (band,) = [b for b in sample_bands if b.label == "full"]
    return band


def test_tiny_run_cached_pages_by_hand():
    result = tiny_run()
    assert result.prefix_cache is not None
    assert (result.prefix_cache.hit_tokens, result.prefix_cache.prompt_tokens) == (32, 80)
    samples = result.recorder.step_samples  # 2 requests x 4 steps: every sample kept
    page_b = PAGE * E_FULL
    rows = [(s.t_s, full_band(s.bands)) for s in samples]
    # A alone (t < 10): its prefill step computes 40 tokens into ceil(40 / 16) = 3 pages
    # and emits token 1; the commit that completes the prompt inserts its 2 keyed pages
    # into the cache under A's prompt lock (insert at the prefill end): A owns only its
    # third, partial page (16,000 B), the cache holds 2 pages = 32,000 B, none evictable.
    # Decodes add tokens 41-43 (positions 40-42), still page 2. The step that finishes A
    # frees it (its partial page is released) and unlocks: 2 cached pages, all evictable.
    a_rows = [b for t, b in rows if t < 10]
    assert [(b.request_bytes, b.cached_bytes, b.evictable_bytes) for b in a_rows[:-1]] == [
        (1 * page_b, 2 * page_b, 0)] * (len(a_rows) - 1)
    last_a = a_rows[-1]
    assert (last_a.request_bytes, last_a.cached_bytes, last_a.evictable_bytes) == (
        0, 2 * page_b, 2 * page_b)
    # B running (t > 10): it locks the 2 cached pages (cached 2, evictable 0) and owns one
    # page, tokens [32, 48) (its 8 computed prompt tokens and up to 3 fed-back tokens).
    b_rows = [b for t, b in rows if t > 10]
    for b in b_rows[:-1]:
        assert (b.request_bytes, b.cached_bytes, b.evictable_bytes) == (
            1 * page_b, 2 * page_b, 0)
    # B finished: its 2 keyed pages are the cache's already (nothing new is inserted), its
    # own page is released: 2 cached pages, evictable again.
    last_b = b_rows[-1]
    assert (last_b.request_bytes, last_b.cached_bytes, last_b.evictable_bytes) == (
        0, 2 * page_b, 2 * page_b)
    for _, b in rows:  # the null page (if any) + requests' + cached pages = live pages
        assert b.unowned_bytes == 0


def binding_run() -> SimResult:
    # gpt-oss-120b (window 128 | full) on 40 Mooncake requests in 1.5 GB: the cached
    # prefixes fill the buffer and admission evicts them.
    config = SimConfig(load_model("gpt-oss-120b"), H200, load_trace("mooncake", first=40),
                       buffer_bytes=1_500_000_000, clock=ClockKind.STEPS,
                       scheduler=SchedulerConfig(chunk_size=4096, max_prefill_tokens=8192))
    return simulate(config)


@pytest.fixture(scope="module")
def bound() -> SimResult:
    return binding_run()


def test_owners_add_up_on_every_sample_of_a_binding_run(bound):
    result = bound
    assert result.prefix_cache is not None
    assert sum(result.prefix_cache.evicted_pages.values()) > 0  # memory binds: evictions
    samples = result.recorder.step_samples
    bands = [b for s in samples for b in s.bands]
    assert {b.label for b in bands} == {"window", "full"}
    for b in bands:
        assert b.unowned_bytes == 0, b
        assert b.evictable_bytes <= b.cached_bytes, b
    # The run shows all three owners at some point, and locked cached pages (hits running).
    assert any(b.request_bytes for b in bands)
    assert any(b.evictable_bytes for b in bands)
    assert any(b.cached_bytes > b.evictable_bytes for b in bands)


def test_metrics_json_carries_the_owner_columns(bound, tmp_path: Path):
    result = bound
    write_outputs(tmp_path, result.recorder, result.summary)
    data = json.loads((tmp_path / "metrics.json").read_text())
    steps = data["step_samples"]
    n = steps["count"]
    assert n == len(result.recorder.step_samples) and len(steps["t_s"]) == n
    for band in steps["bands"]:
        for i in range(n):
            assert (band["reserved_bytes"][i] + band["request_bytes"][i]
                    + band["cached_bytes"][i]) == band["live_bytes"][i]
            assert band["evictable_bytes"][i] <= band["cached_bytes"][i]


class OffByOneCache(PrefixCache):
    """Planted defect: its counters report one full page fewer than the tree holds
    whenever it holds any."""

    @property
    def held_counts(self) -> tuple[int, ...]:
        counts = list(super().held_counts)
        full = self.geom.full
        assert full is not None
        if counts[full]:
            counts[full] -= 1
        return tuple(counts)


def test_planted_miscounting_cache_breaks_the_identity(monkeypatch):
    monkeypatch.setattr(engine_module, "PrefixCache", OffByOneCache)
    samples = binding_run().recorder.step_samples
    full = [full_band(s.bands) for s in samples]
    # Every sample where the cache holds full pages shows the one uncounted page as
    # unowned: a gpt-oss-120b full page is 16 tokens x 36,864 B (18 full-attention layers x
    # 8 KV heads x 64 dims x K and V x 2 B of bf16) = 589,824 B.
    assert {b.unowned_bytes for b in full if b.cached_bytes} == {589_824}
    assert any(b.evictable_bytes > b.cached_bytes for b in full)  # and evictable > cached
    assert all(b.unowned_bytes == 0 for b in full if not b.cached_bytes)


def test_planted_miscounting_cache_is_caught_by_the_cache_audit(monkeypatch):
    monkeypatch.setattr(engine_module, "PrefixCache", OffByOneCache)
    from kvchain.errors import AuditError

    with pytest.raises(AuditError, match="held page counters"):
        tiny_run()


def test_planted_double_counting_requests_break_the_identity(monkeypatch):
    real = metrics_module.request_owned_pages

    def twice(kv, rids):  # type: ignore[no-untyped-def]
        return tuple(2 * n for n in real(kv, rids))

    monkeypatch.setattr(engine_module, "request_owned_pages", twice)
    samples = tiny_run().recorder.step_samples
    # A's 1 own page (the partial third; its 2 keyed pages are the cache's from its
    # prefill end) counted as 2: 1 page (16,000 B) too many on its steps.
    assert -1 * PAGE * E_FULL in {full_band(s.bands).unowned_bytes for s in samples}


def test_band_sample_owner_checks():
    BandSample("full", 0, 100, 60, 40, reserved_bytes=10, request_bytes=20, cached_bytes=30,
               evictable_bytes=30)
    # Sources that disagree are recorded, not refused: the identity shows it.
    assert BandSample("full", 0, 100, 60, 40, request_bytes=10, cached_bytes=51,
                      evictable_bytes=52).unowned_bytes == -1
    with pytest.raises(MetricsError, match=">= 0"):
        BandSample("full", 0, 100, 60, 40, request_bytes=-1)
    assert BandSample("full", 0, 100, 60, 40).unowned_bytes is None  # not counted


def test_step_samples_section_of_an_empty_recorder(tmp_path: Path):
    rec = MetricsRecorder()
    write_outputs(tmp_path, rec, summarize(rec))
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["step_samples"] == {"count": 0, "buffer_bytes": None, "t_s": [],
                                    "duration_s": [], "prefill_tokens": [],
                                    "decode_tokens": [], "running": [], "waiting": [],
                                    "used_bytes": [], "bands": []}


def uncached_run() -> SimResult:
    # The same 40 requests in 1.5 GB without the cache: requests own every live page but
    # the window band's null page (counted by Reads.held_per_band from the arrays).
    config = SimConfig(load_model("gpt-oss-120b"), H200, load_trace("mooncake", first=40),
                       buffer_bytes=1_500_000_000, clock=ClockKind.STEPS, prefix_cache=False,
                       scheduler=SchedulerConfig(chunk_size=4096, max_prefill_tokens=8192))
    return simulate(config)


def test_owners_add_up_without_the_cache():
    samples = uncached_run().recorder.step_samples
    bands = [b for s in samples for b in s.bands]
    assert all(b.unowned_bytes == 0 and b.cached_bytes == 0 for b in bands)
    assert any(b.request_bytes for b in bands)


def test_planted_stale_window_start_breaks_the_uncached_identity(monkeypatch):
    # Sibling: held_per_band counting one window page too many per request (a window start
    # one page late in the arrays' sum) shows up as negative unowned bytes.
    from kvchain.requests.reads import Reads

    real = Reads.held_per_band

    def stale(self, rids):  # type: ignore[no-untyped-def]
        ids = tuple(rids)
        counts = list(real(self, ids))
        counts[self._geom.window] += len([r for r in ids if r in self._rows])
        return tuple(counts)

    monkeypatch.setattr(Reads, "held_per_band", stale)
    window = [b for s in uncached_run().recorder.step_samples for b in s.bands
              if b.label == "window"]
    # a gpt-oss-120b window page: 16 tokens x 36,864 B (18 sliding-window layers x 8 KV
    # heads x 64 dims x K and V x 2 B) = 589,824 B, one per running request
    assert any(b.unowned_bytes and b.unowned_bytes % 589_824 == 0 and b.unowned_bytes < 0
               for b in window)
