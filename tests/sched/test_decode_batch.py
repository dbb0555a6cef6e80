"""The batched decode path (``KVManager.decode_demands`` / ``commit_decodes``) gives the
same demands, pages and chain state as the per-request path it replaces, step by step."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.chain import Chain
from kvchain.errors import InvalidDemandError, UnknownRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager

SHAPES = {
    "full": [declared_class(LC.FULL, 1_024)],
    "window|full": [declared_class(LC.WINDOW, 1_024, 40), declared_class(LC.FULL, 1_024)],
    "local|full": [declared_class(LC.LOCAL, 1_024, 32), declared_class(LC.FULL, 1_024)],
    "state|window|full": [declared_class(LC.STATE, 50_000), declared_class(LC.WINDOW, 512, 24),
                          declared_class(LC.FULL, 1_024)],
    "state|window": [declared_class(LC.STATE, 50_000), declared_class(LC.WINDOW, 512, 24)],
}


def _pair(shape: str) -> tuple[KVManager, KVManager]:
    layout = plan_layout(SHAPES[shape], 40_000_000, 4)
    return KVManager(Chain(layout)), KVManager(Chain(layout))


def _prefill(kv: KVManager, prompts: list[int]) -> None:
    batch = list(enumerate(prompts))
    kv.allocate(batch)
    for rid, n in batch:
        kv.commit(rid, n)


@pytest.mark.parametrize("shape", list(SHAPES))
@settings(max_examples=25, deadline=None)
@given(prompts=st.lists(st.integers(1, 90), min_size=1, max_size=12),
       steps=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_batched_decode_equals_per_request_decode(shape, prompts, steps, seed):
    one, batched = _pair(shape)
    _prefill(one, prompts)
    _prefill(batched, prompts)
    rng = random.Random(seed)
    live = list(range(len(prompts)))
    for _ in range(steps):
        rng.shuffle(live)
        want = [one.demand(rid, 1) for rid in live]
        got = batched.decode_demands(live)
        assert list(got) == want
        one.allocate([(rid, 1) for rid in live], want)
        batched.allocate([(rid, 1) for rid in live], got)
        released = sum(one.commit(rid, 1) for rid in live)
        assert batched.commit_decodes(live) == released
        for rid in live:
            assert batched.held(rid) == one.held(rid)
            assert batched.tokens(rid) == one.tokens(rid)
            # virtual ids may differ (one release per step reuses ids in another order);
            # the tables' lengths and released (null) entries may not
            for band in range(one.geom.num_bands):
                a, b = batched.page_table(rid, band), one.page_table(rid, band)
                assert a.shape == b.shape
                if band == one.geom.window and one.held(rid).span(band)[0]:
                    null = one.chain.null_page(band)
                    assert ((a == null) == (b == null)).all()
        assert batched.chain.snapshot() == one.chain.snapshot()
        batched.audit()
        if live and rng.random() < 0.2:  # a request finishes
            rid = live.pop()
            one.free(rid)
            batched.free(rid)


def test_decode_demand_of_a_request_that_holds_nothing_is_refused():
    """A decode extends a held row: an unknown id used to get its first token's demand,
    which ``apply`` turned into a new request (found by a breaker)."""
    kv, _ = _pair("state|window|full")
    assert kv.demand(7, 1).pages == (1, 1, 1)  # nothing held: a first chunk's demand
    with pytest.raises(UnknownRequestError, match="request 7 holds no pages"):
        kv.decode_demands([7])
    assert 7 not in kv and kv.num_requests == 0


def test_commit_decodes_checks_everyone_before_changing_anything():
    kv, _ = _pair("window|full")
    _prefill(kv, [4, 5])  # P = 4: request 0 holds exactly 1 full page, full at 4 tokens
    with pytest.raises(InvalidDemandError):
        kv.commit_decodes([1, 0])  # request 1 is covered (2 pages, 5 tokens); 0 is not
    assert kv.tokens(1) == 5 and kv.tokens(0) == 4
    with pytest.raises(UnknownRequestError):
        kv.commit_decodes([1, 99])
    assert kv.tokens(1) == 5


def test_a_batch_that_needs_no_page_takes_nothing():
    kv, _ = _pair("window|full")
    _prefill(kv, [5])  # P = 4: 2 full pages cover tokens [0, 8); the decode at 5 needs none
    takes, epoch = kv.chain.stats.takes, kv.chain.epoch
    demands = kv.decode_demands([0])
    assert demands[0].is_empty
    assert kv.allocate([(0, 1)], demands).is_empty
    assert kv.chain.stats.takes == takes and kv.chain.epoch == epoch
    with pytest.raises(InvalidDemandError):
        kv.allocate([(0, 1), (1, 0)], demands)  # one demand for two entries
    # a request that computes nothing yet is registered all the same (holds nothing)
    kv.allocate([(5, 0)])
    assert 5 in kv and kv.tokens(5) == 0


def test_a_kept_window_tail_is_honoured_by_the_batched_commit():
    layout = plan_layout(SHAPES["window|full"], 40_000_000, 4)
    kv = KVManager(Chain(layout), keep_window_tail=True)  # never releases at a commit
    _prefill(kv, [60])  # W = 40 < 60: a plain commit_decodes would release window pages
    held = kv.held(0)
    kv.allocate([(0, 1)], kv.decode_demands([0]))
    assert kv.commit_decodes([0]) == 0
    window = kv.geom.window
    assert kv.tokens(0) == 61 and kv.held(0).span(window)[0] == held.span(window)[0]
