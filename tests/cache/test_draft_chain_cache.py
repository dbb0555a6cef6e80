"""The prefix cache on chains with several full-attention bands (round 6): a target's full
band beside a speculative-decoding draft model's (:func:`kvchain.model.with_draft`). Every
radix node keeps one page list per full band; a hit hands every band its pages, eviction
frees every band's pages, and the audit counts every band. Planted sibling: a node that
keeps only the first full band's pages fails the audit. A chain with several *state*
bands is still refused (one checkpoint per resume point)."""

from __future__ import annotations

import pytest

from kvchain.cache.host_cache import HostTier
from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy, cache_refusal
from kvchain.catalog.loader import load_model_source
from kvchain.errors import AuditError, ConfigError, InvalidRequestError
from kvchain.gpu import get_gpu
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model import declare_model, with_draft
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace

# P = 4 tokens per page; the pairs of tests/proof/test_draft_bands.py.
# "state+full | full draft" lays out as state|draft.full|full: bands 0, 1, 2.
SF_STATE, SF_DRAFT, SF_FULL = 0, 1, 2
# "window+full | full draft" (W = 6 tokens) lays out as draft.full|window|full.
WF_DRAFT, WF_WIN, WF_FULL = 0, 1, 2


def state_draft_layout() -> ChainLayout:
    return plan_layout(with_draft(declare_model("t", full=2, state=16),
                                  declare_model("d", full=1)).classes, 4_096, 4)


def window_draft_layout() -> ChainLayout:
    return plan_layout(with_draft(declare_model("t", full=2, window=1, window_tokens=6),
                                  declare_model("d", full=1)).classes, 4_096, 4)


def test_the_layouts_are_the_ones_the_band_indices_name() -> None:
    assert state_draft_layout().shape_name == "state|draft.full|full"
    assert window_draft_layout().shape_name == "draft.full|window|full"
    assert CacheGeometry.of(state_draft_layout()).fulls == (SF_DRAFT, SF_FULL)
    assert CacheGeometry.of(window_draft_layout()).fulls == (WF_DRAFT, WF_FULL)


def state_cache() -> PrefixCache:
    """A 5-page prompt (20 tokens) inserted with checkpoints after 2, 4 and 5 pages
    (interval 8 tokens = 2 pages, ``BLOCKS``: points 2, 4 and the last page 5); the draft's
    full pages 21..25, the target's 11..15."""
    geom = CacheGeometry.of(state_draft_layout())
    c = PrefixCache(geom, interval_tokens=8, policy=ResumePolicy.BLOCKS, audit=True)
    dups = c.insert([1, 2, 3, 4, 5], 0, {SF_DRAFT: [21, 22, 23, 24, 25],
                                         SF_FULL: [11, 12, 13, 14, 15]},
                    {}, {2: 102, 4: 104, 5: 105})
    assert dups == [[], [], []]
    return c


def test_a_state_chain_with_a_full_draft_hits_at_its_checkpoints_in_every_full_band() -> None:
    c = state_cache()
    c.audit([])
    assert c.held_counts == (3, 5, 5)  # 3 checkpoints, 5 pages in each full band
    # [1, 2, 3, 4, 9] in 20 tokens: 4 pages match, cap (20 - 1) // 4 = 4; the deepest
    # checkpoint at or below 4 is 4, so the hit is 4 pages and every full band hands its
    # first 4 pages.
    hit = c.match([1, 2, 3, 4, 9], 20)
    assert (hit.pages, hit.checkpoint, hit.matched) == (4, 104, 4)
    assert hit.full == {SF_DRAFT: (21, 22, 23, 24), SF_FULL: (11, 12, 13, 14)}
    # [1, 2, 3, 9] in 16 tokens: 3 pages match, cap 15 // 4 = 3; checkpoints at or below
    # 3: only 2, so the hit is 2 pages (the checkpoint after 2).
    hit = c.match([1, 2, 3, 9], 16)
    assert (hit.pages, hit.checkpoint, hit.matched) == (2, 102, 3)
    assert hit.full == {SF_DRAFT: (21, 22), SF_FULL: (11, 12)}
    # A lock splits the node at 2 pages; both halves keep both bands' pages.
    handle = c.lock(hit)
    assert handle is not None and handle.full == [[21, 22], [11, 12]]
    c.audit([handle])
    c.unlock(handle)
    # Evicting everything frees every band's pages: the lower node (pages 2..4, its
    # checkpoints 4 and 5) first (a leaf), then its parent (pages 0..1, checkpoint 2).
    order = c.eviction_order()
    assert order.units == 2 and order.freed(2) == (3, 5, 5)
    freed = c.evict(2)
    assert [sorted(ids.tolist()) for ids in freed] == [[102, 104, 105],
                                                       [21, 22, 23, 24, 25],
                                                       [11, 12, 13, 14, 15]]
    assert c.held_counts == (0, 0, 0)
    c.audit([])


def test_a_window_chain_with_a_full_draft_hits_where_the_tails_are() -> None:
    geom = CacheGeometry.of(window_draft_layout())
    # Interval 16 tokens = 4 pages: points 4 and the last page 5. W = 6 tokens: a hit
    # after q pages reads its window's pages from first_page(4q) = max(0, 4q - 5) // 4 =
    # q - 2 (q >= 2), so the tails are pages [2, 4) and [3, 5): pages 2, 3, 4 offered.
    c = PrefixCache(geom, interval_tokens=16, policy=ResumePolicy.BLOCKS, audit=True)
    dups = c.insert([1, 2, 3, 4, 5], 0, {WF_DRAFT: [21, 22, 23, 24, 25],
                                         WF_FULL: [11, 12, 13, 14, 15]},
                    {WF_WIN: {2: 202, 3: 203, 4: 204}}, {})
    assert dups == [[], [], []]
    c.audit([])
    assert c.held_counts == (5, 3, 5)
    # 20 tokens, 4 pages match, cap 4: the tail [2, 4) is present, so the hit is 4.
    hit = c.match([1, 2, 3, 4, 9], 20)
    assert (hit.pages, hit.window, hit.window_first) == (4, {WF_WIN: (202, 203)},
                                                         {WF_WIN: 2})
    assert hit.full == {WF_DRAFT: (21, 22, 23, 24), WF_FULL: (11, 12, 13, 14)}
    # 16 tokens, 3 pages match, cap 3: tails [1, 3), [0, 2), [0, 1) all miss page 1 or
    # 0 (tombstones), so no prefix resumes: a miss that still reports the 3 matched.
    hit = c.match([1, 2, 3, 9], 16)
    assert (hit.pages, hit.matched, dict(hit.full)) == (0, 3, {})
    # A second prompt sharing 4 pages offers its own copies: the cache keeps its own and
    # hands back, per full band, the request's pages past its hit of 0 that it held
    # already (pages 0..3), and its page 4 (keys differ there) is a new node.
    dups = c.insert([1, 2, 3, 4, 7], 0, {WF_DRAFT: [31, 32, 33, 34, 35],
                                         WF_FULL: [41, 42, 43, 44, 45]}, {}, {})
    assert dups == [[31, 32, 33, 34], [], [41, 42, 43, 44]]
    assert c.held_counts == (6, 3, 6)
    c.audit([])


def test_full_pages_must_name_every_full_band() -> None:
    c = state_cache()
    before = c.held_counts
    with pytest.raises(InvalidRequestError, match="2 full-attention bands"):
        c.insert([7, 8], 0, [1, 2], {}, {})
    with pytest.raises(InvalidRequestError, match=r"full pages offered for bands \[2\]"):
        c.insert([7, 8], 0, {SF_FULL: [1, 2]}, {}, {})
    with pytest.raises(InvalidRequestError, match="full band 1: 1 page ids for 2 pages"):
        c.insert([7, 8], 0, {SF_DRAFT: [1], SF_FULL: [1, 2]}, {}, {})
    assert c.held_counts == before
    c.audit([])


def test_planted_a_node_keeping_only_the_first_full_bands_pages_fails_the_audit() -> None:
    c = state_cache()
    c.audit([])
    (node,) = c.root.children.values()
    node.full[1] = []  # the planted defect: the target's pages dropped, the draft's kept
    with pytest.raises(AuditError):
        c.audit([])


def test_several_state_bands_are_still_refused_and_the_host_tier_refuses_two_fulls() -> None:
    two_states = CacheGeometry.of(plan_layout(with_draft(
        declare_model("t", full=2, state=16), declare_model("d", full=1, state=8)).classes,
        4_096, 4))
    assert cache_refusal(two_states) == (
        "the chain has 2 state bands (e.g. a draft model's), and the prefix cache keeps "
        "one state checkpoint per resume point")
    with pytest.raises(ConfigError, match="no prefix cache on this chain: the chain has 2 "
                                          "state bands"):
        PrefixCache(two_states)
    assert cache_refusal(CacheGeometry.of(state_draft_layout())) is None
    with pytest.raises(ConfigError, match="no host tier on this chain: it has 2 "
                                          "full-attention bands"):
        HostTier(state_draft_layout(), 100_000, 8)


# Qwen3-8B with its Qwen3-0.6B draft (both full attention only: chain draft.full|full) on
# the first 40 Mooncake requests in 8 GB, as tests/proof/test_draft_bands.py runs it.
def draft_run_config(draft: bool) -> SimConfig:
    model = load_model_source("Qwen3-8B", draft_model="Qwen3-0.6B" if draft else None)
    return SimConfig(model, get_gpu("h200"), load_trace("mooncake", first=40),
                     buffer_bytes=8_000_000_000, scheduler=SchedulerConfig(strict=False),
                     prefix_cache=True, spec_tokens=3, spec_acceptance=0.7)


def test_a_draft_model_run_with_the_prefix_cache_audited_every_step() -> None:
    result = simulate(draft_run_config(True), audit_every_step=True)
    s = result.summary
    assert result.layout.shape_name == "draft.full|full"
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0
    assert s.requests_finished + s.requests_rejected == 40
    extra = dict(s.extra)
    # The Mooncake prefix shares hit: some prompt tokens come from the cache, and the
    # cache evicted pages of both full bands when memory bound.
    assert extra["prefix_hit_tokens"] > 0
