"""The host tier's split by resume interval and the prefix it holds: hand-derived values."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.buffer import HostBuffer
from kvchain.cache.host_tier import (
    HostClassShare,
    hit_load_bytes,
    host_buffer,
    host_tier_plan,
    per_interval_slots,
)
from kvchain.errors import ConfigError, InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.layers import LayerCache, LifetimeClass, TensorDecl, group_classes

from .host_layout import FP8, FULL, LAYOUT, STATE, WIN  # noqa: F401 (shared)


def test_per_interval_by_hand():
    # K = 16 tokens = 4 pages: state 1 checkpoint; window tail ceil((8 - 1) / 4) = 2 pages
    # (fewer than 4); full 4 pages.
    assert per_interval_slots(LAYOUT, 16) == (1, 2, 4)
    # K = 4 (one page): the 2-page tails of consecutive points overlap, so one page each.
    assert per_interval_slots(LAYOUT, 4) == (1, 1, 1)
    # K = 10 rounds up to 3 pages: window min(3, 2) = 2.
    assert per_interval_slots(LAYOUT, 10) == (1, 2, 3)


def test_plan_by_hand():
    # One interval: 48 + 2 x 8 + 4 x 16 = 128 B. m = 76: state [0, 3,648), window from
    # ceil(3,648 / 256) x 256 = 3,840 to 3,840 + 152 x 8 = 5,056, full from 5,120 to
    # 5,120 + 304 x 16 = 9,984 <= 10,000; m = 77 ends at 10,048 > 10,000.
    plan = host_tier_plan(LAYOUT, 10_000, 16)
    assert (plan.interval_tokens, plan.interval_bytes, plan.intervals) == (16, 128, 76)
    assert plan.resumable_tokens == 76 * 16 == 1_216
    assert plan.used_bytes == 9_984
    assert plan.slots == {"state": 76, "window": 152, "full": 304}
    assert [c.nbytes for c in plan.classes] == [3_648, 1_216, 4_864]
    assert not plan.every_page_resumes
    # The split builds a host buffer of exactly the bytes it says.
    assert HostBuffer(LAYOUT, plan.slots).nbytes == plan.used_bytes
    buf = host_buffer(LAYOUT, 10_000, 16)
    assert buf.nbytes == 9_984 and buf.pool("full").slots == 304
    # 10,048 B is exactly enough for 77.
    assert host_tier_plan(LAYOUT, 10_048, 16).intervals == 77
    assert host_tier_plan(LAYOUT, 127, 16).intervals == 0


def test_small_interval_bytes_still_fit_with_padding():
    # K = 4: interval 48 + 8 + 16 = 72 B. H = 600: m = 5 -> state 240, window 256 + 40 =
    # 296, full 512 + 80 = 592 <= 600; m = 6 -> full 512 + 96 = 608 > 600.
    plan = host_tier_plan(LAYOUT, 600, 4)
    assert (plan.interval_bytes, plan.intervals, plan.used_bytes) == (72, 5, 592)


def test_full_attention_only_resumes_at_every_page():
    layout = plan_layout(group_classes((FULL,)), 1_000, page_size=4)
    plan = host_tier_plan(layout, 1_000, 512)
    # 1,000 // 16 = 62 pages of 4 tokens, whatever the interval.
    assert plan.every_page_resumes
    assert (plan.interval_tokens, plan.intervals, plan.resumable_tokens) == (4, 62, 248)


def test_chunked_local_tail_is_the_longest_over_a_period():
    # Local chunk C = 8 tokens (2 pages), K = 12 tokens (3 pages): points at 12, 24, 36 ...;
    # (12 m) mod 8 = 4, 0, 4, 0: the longest tail is 4 tokens = 1 page.
    local = LayerCache(1, LifetimeClass.LOCAL, "gqa",
                       (TensorDecl("k", (1,), FP8), TensorDecl("v", (1,), FP8)), window=8)
    layout = plan_layout(group_classes((FULL, local)), 1_000, page_size=4)
    assert [b.label for b in layout.bands] == ["local", "full"]
    assert per_interval_slots(layout, 12) == (1, 3)


def test_hit_load_bytes_by_hand():
    # 16 tokens = 4 pages: 4 x 16 + tail pages [ (16 - 8 + 1) // 4 = 2, 4 ) = 2 x 8 + 48.
    assert hit_load_bytes(LAYOUT, 16) == 64 + 16 + 48 == 128
    # 4 tokens: the window tail is clipped at the prompt's start: pages [0, 1).
    assert hit_load_bytes(LAYOUT, 4) == 16 + 8 + 48
    assert hit_load_bytes(LAYOUT, 0) == 0
    with pytest.raises(InvalidRequestError, match="whole pages"):
        hit_load_bytes(LAYOUT, 6)


def test_refusals():
    with pytest.raises(ConfigError):
        host_tier_plan(LAYOUT, -1, 16)
    with pytest.raises(ConfigError):
        host_tier_plan(LAYOUT, 1_000, 0)
    with pytest.raises(ConfigError):
        host_tier_plan(LAYOUT, 1.5, 16)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(host=st.integers(0, 200_000), interval=st.integers(1, 64),
       state_bytes=st.integers(1, 5_000), full_bytes=st.integers(1, 64))
def test_no_split_strands_full_pages(host, interval, state_bytes, full_bytes):
    full = LayerCache(0, LifetimeClass.FULL, "gqa", (TensorDecl("k", (full_bytes,), FP8),))
    state = LayerCache(1, LifetimeClass.STATE, "mamba2", (TensorDecl("s", (state_bytes,), FP8),))
    layout = plan_layout(group_classes((full, state)), 10**7, page_size=4)
    plan = host_tier_plan(layout, host, interval)
    assert plan.stranded_full_pages == 0
    assert plan.used_bytes <= host
    # One more interval would not fit (the split is as large as the bytes allow).
    per = {c.label: c.per_interval for c in plan.classes}
    more = {label: plan.slots[label] + per[label] for label in per}
    assert HostBuffer(layout, more).nbytes > host


def test_a_byte_proportional_split_strands_pages():
    # The planted sibling: the same bytes split by another rule, about 90 % to full pages
    # (562 x 16 = 8,992 B) and 960 B to state (20 checkpoints): 20 checkpoints make
    # 20 x 4 = 80 full pages resumable, so 562 - 80 = 482 are stranded.
    plan = host_tier_plan(LAYOUT, 10_000, 16)
    by = {c.label: c for c in plan.classes}
    bad = replace(plan, classes=(replace(by["state"], slots=20, nbytes=960),
                                 by["window"],
                                 HostClassShare("full", 16, 4, 562, 8_992)))
    assert bad.stranded_full_pages == 562 - 20 * 4 == 482


@pytest.mark.parametrize("interval", [1.5, 16.0, True, "16", None, float("nan")])
def test_interval_that_is_no_whole_number_is_a_config_error(interval):
    # Regression: floats and strings raised a bare TypeError deep in the page arithmetic,
    # and True passed as a 1-token interval.
    with pytest.raises(ConfigError, match="whole number"):
        per_interval_slots(LAYOUT, interval)
    with pytest.raises(ConfigError, match="whole number"):
        host_tier_plan(LAYOUT, 1_000, interval)


@pytest.mark.parametrize("tokens", [16.0, True, "16", float("nan")])
def test_hit_tokens_that_are_no_whole_number_are_refused(tokens):
    # Regression: 16.0 and "16" raised TypeError; True reached the page check as 1 token.
    with pytest.raises(InvalidRequestError, match="whole number"):
        hit_load_bytes(LAYOUT, tokens)


def test_numpy_integers_are_whole_numbers():
    # A numpy integer (e.g. a sum over a slot array) is a byte count like any int: the
    # same plan as test_plan_by_hand (76 intervals of 16 tokens in 10,000 B), plain ints
    # in the plan; the hit of 16 tokens is 128 B (test_hit_load_bytes_by_hand).
    plan = host_tier_plan(LAYOUT, np.int64(10_000), np.int32(16))
    assert (plan.host_bytes, plan.interval_tokens, plan.intervals) == (10_000, 16, 76)
    assert type(plan.host_bytes) is int and type(plan.interval_tokens) is int
    assert per_interval_slots(LAYOUT, np.int64(16)) == (1, 2, 4)
    assert all(type(n) is int for n in per_interval_slots(LAYOUT, np.int64(16)))
    assert hit_load_bytes(LAYOUT, np.int64(16)) == 128


def _local_layout(chunk: int, page: int = 4, full: bool = True):
    local = LayerCache(1, LifetimeClass.LOCAL, "gqa",
                       (TensorDecl("k", (1,), FP8), TensorDecl("v", (1,), FP8)), window=chunk)
    classes = (FULL, local) if full else (local,)
    return plan_layout(group_classes(classes), 10**6, page_size=page)


@settings(max_examples=80, deadline=None)
@given(chunk=st.integers(1, 300), interval=st.integers(1, 80), page=st.integers(1, 8))
def test_chunked_local_tail_equals_the_walk_over_a_period(chunk, interval, page):
    # The closed form against the walk it replaced: the longest tail_pages over the points
    # m K, m = 1 .. C / gcd(K, C), capped at the interval's pages.
    from math import gcd

    from kvchain.cache.radix import CacheGeometry

    layout = _local_layout(chunk, page)
    pages = -(-interval // page)
    policy = CacheGeometry.of(layout).policies[0]  # the band's own tail rule
    k = pages * page
    walk = max(m * pages - policy.resume_start(m * pages)
               for m in range(1, chunk // gcd(k, chunk) + 1))
    assert per_interval_slots(layout, interval) == (min(pages, walk), pages)


def test_a_huge_chunk_is_priced_at_once():
    # Regression: the walk over (m K) mod C took C / gcd(K, C) steps: a 100,000,007-token
    # chunk (odd, so gcd(512, C) = 1) ran for minutes. Closed form: ceil((C - 1) / 16) =
    # 6,250,001 pages, more than the interval's 32, so 32. (No timing: the old walk simply
    # did not come back within the suite's time.)
    layout = _local_layout(100_000_007, page=16)
    assert per_interval_slots(layout, 512) == (32, 32)


def test_a_chain_that_resumes_without_bytes_holds_nothing():
    # Regression: ZeroDivisionError. Local only, C = 64 tokens, K = 512 (= 8 chunks): every
    # resume point is a chunk start, so its tail is empty and an interval costs 0 B.
    layout = _local_layout(64, page=16, full=False)
    assert per_interval_slots(layout, 512) == (0,)
    plan = host_tier_plan(layout, 5_000_000, 512)
    assert plan.resumes_without_bytes
    assert (plan.interval_bytes, plan.intervals, plan.resumable_tokens, plan.used_bytes) == \
        (0, 0, 0, 0)
    # K = 32 (half a chunk): the point at 32 tokens needs its 2 pages; not "without bytes".
    # 2 pages x 16 x 2 B = 64 B an interval; 5,000,000 // 64 = 78,125 intervals.
    plan = host_tier_plan(layout, 5_000_000, 32)
    assert not plan.resumes_without_bytes
    assert (plan.interval_bytes, plan.intervals) == (64, 78_125)
