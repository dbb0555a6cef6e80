"""The step plan (``KVManager.plan`` / ``apply``): one immutable value per take, built and
validated once, applied as it is; a stale or foreign plan is a typed error that changes
nothing."""

from __future__ import annotations

import dataclasses

import pytest

from kvchain.alloc import Demand
from kvchain.alloc.chain import Chain
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import InvalidDemandError, StalePlanError
from kvchain.layout import plan_layout
from kvchain.requests.batch import DecodeBatch
from kvchain.requests.manager import KVManager
from kvchain.requests.plan import StepPlan

from .window_full import WINDOW_FULL, prefilled, state

DECODES = [(0, 1), (1, 1), (2, 1)]


def test_the_plan_by_hand() -> None:
    # P = 4, W = 40. Request 0 holds 4 tokens (1 page): its token 4 starts page 1 in both
    # bands, (1, 1); request 1 holds 5 (2 pages): token 5 is on page 1, (0, 0); request
    # 2 holds 8 (2 pages): token 8 starts page 2, (1, 1). Total (2, 2), priced once.
    kv = prefilled([4, 5, 8])
    plan = kv.plan(DECODES)
    assert isinstance(plan, StepPlan) and DecodeBatch is StepPlan  # one kind of value
    assert plan.rids == (0, 1, 2) and plan.tokens == (1, 1, 1)
    assert plan.matrix.tolist() == [[1, 1], [0, 0], [1, 1]] and plan.nonzero == (0, 2)
    assert plan.total == plan.taken == Demand((2, 2))
    assert plan.quote is not None and plan.quote.fits and plan.quote.demand == plan.taken
    assert plan.at is not None and plan.at.tolist() == [4, 5, 8]
    with pytest.raises(ValueError):
        plan.at[0] = 0  # read-only, as the matrix
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.total = Demand((0, 0))  # type: ignore[misc]
    takes = kv.chain.stats.takes
    assert kv.apply(plan) == Demand((2, 2))
    assert kv.chain.stats.takes == takes + 1  # one take
    assert [kv.held(rid).span(kv.geom.full)[1] for rid in (0, 1, 2)] == [2, 2, 3]


def test_a_plan_after_a_commit_is_stale_and_changes_nothing() -> None:
    kv = prefilled([4, 5, 8])
    plan = kv.plan(DECODES)
    kv.commit(1, 1)  # request 1: 5 -> 6 tokens (its page 1 covers them: no take)
    before = state(kv, range(5))
    with pytest.raises(StalePlanError):
        kv.apply(plan)
    assert state(kv, range(5)) == before


def test_a_plan_whose_rows_took_pages_since_is_stale() -> None:
    # Request 0 takes its page for token 4 on its own: its tokens stay 4, but its demand
    # for token 4 is now (0, 0), not the plan's (1, 1) (the chain's epoch moved, so the
    # rows' demands are checked again). Applied twice, a plan is stale the same way.
    kv = prefilled([4, 5, 8])
    plan = kv.plan(DECODES)
    kv.allocate([(0, 1)])
    before = state(kv, range(5))
    with pytest.raises(StalePlanError):
        kv.apply(plan)
    assert state(kv, range(5)) == before
    again = kv.plan(DECODES)  # now (0, 0) + (0, 0) + (1, 1)
    assert again.total == Demand((1, 1))
    assert kv.apply(again) == Demand((1, 1))
    before = state(kv, range(5))
    with pytest.raises(StalePlanError):
        kv.apply(again)
    assert state(kv, range(5)) == before


def test_a_moved_epoch_that_leaves_the_rows_alone_is_repriced() -> None:
    # Request 3 (not a row) takes 4 tokens: the epoch moves, the plan's quote is stale,
    # the rows' demands are as planned: the take prices again and realizes (2, 2).
    kv = prefilled([4, 5, 8])
    plan = kv.plan(DECODES)
    kv.allocate([(3, 4)])
    assert plan.quote is not None and plan.quote.before.epoch != kv.chain.epoch
    assert kv.apply(plan) == Demand((2, 2))


def test_a_foreign_or_copied_plan_is_refused() -> None:
    a, b = prefilled([4, 5, 8]), prefilled([4, 5, 8])
    theirs = b.plan(DECODES)
    mine = a.plan(DECODES)
    copied = dataclasses.replace(mine, demands=(Demand((0, 0)),) * 3)
    before = state(a, range(5))
    for bad in (theirs, copied, dataclasses.replace(theirs, owner=a), "plan"):
        with pytest.raises(StalePlanError):
            a.apply(bad)  # type: ignore[arg-type]
        assert state(a, range(5)) == before
    assert issubclass(StalePlanError, InvalidDemandError)
    assert a.apply(mine) == Demand((2, 2))


def test_a_plan_validates_at_its_boundary_and_changes_nothing() -> None:
    kv = prefilled([4, 5, 8])
    before = state(kv, range(5))
    for batch, demands in (([(0, 1), (0, 1)], None), ([(0, -1)], None),
                           ([(0, 1)], [Demand((1, 1, 1))]), ([(0, 1)], [])):
        with pytest.raises(InvalidDemandError):
            kv.plan(batch, demands)
        assert state(kv, range(5)) == before


def test_a_decode_batch_is_reused_by_the_plan_not_recomputed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kv = prefilled([4, 5, 8])
    batch = kv.decode_demands([0, 1, 2])
    calls = []
    monkeypatch.setattr(kv, "demand", lambda *a, **k: calls.append(a))  # no demand
    plan = kv.plan(DECODES, batch)
    assert plan.demands is batch.demands and plan.total == Demand((2, 2))
    assert not calls


def test_a_plan_priced_with_a_prefix_cache_is_applied_without_recomputing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: with a prefix cache, the plan's own price builds the epoch's snapshot
    (a new epoch), so a plan that recorded the epoch before its price read as stale at
    its apply and recomputed every row's demand (each decode step of 256: 1.29 ms against
    0.25 ms without the cache). Its epoch is read after the price: the apply trusts it."""
    layout = plan_layout(WINDOW_FULL, 40_000_000, 4)
    kv = KVManager(Chain(layout), PrefixCache(CacheGeometry.of(layout)))
    prompts = [4, 5, 8]
    for rid, n in enumerate(prompts):
        kv.attach(rid, [rid * 1_000 + i for i in range(n // 4)], n)
    kv.allocate(list(enumerate(prompts)))
    for rid, n in enumerate(prompts):
        kv.commit(rid, n)
    batch = kv.decode_demands([0, 1, 2])
    plan = kv.plan(DECODES, batch)
    assert plan.epoch == kv.chain.epoch
    calls = []
    monkeypatch.setattr(kv, "demand", lambda *a, **k: calls.append(a))
    # as by hand above: (1, 1) + (0, 0) + (1, 1)
    assert kv.apply(plan) == Demand((2, 2)) and not calls


def test_a_stale_epoch_plan_recomputes_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # the sibling: the same plan with the epoch of before (as the defect built it) is
    # checked row by row at its apply (three demands computed), then realized
    kv = prefilled([4, 5, 8])
    plan = kv.plan(DECODES)
    stale = kv.steps._issue(dataclasses.replace(plan, epoch=plan.epoch - 1))
    real, calls = kv.demand, []

    def counted(*a: object, **k: object) -> Demand:
        calls.append(a)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(kv, "demand", counted)
    assert kv.apply(stale) == Demand((2, 2)) and len(calls) == 3


def test_a_decode_batch_reused_after_its_rows_moved_gives_a_stale_plan() -> None:
    # The batch was computed at tokens (4, 5, 8); request 1 commits a token (5 -> 6, on
    # its page 1: no take) before the plan reuses the batch: the plan keeps the batch's
    # tokens, so its apply finds row 1 moved and refuses, changing nothing.
    kv = prefilled([4, 5, 8])
    batch = kv.decode_demands([0, 1, 2])
    kv.commit(1, 1)
    plan = kv.plan(DECODES, batch)
    assert plan.at is not None and plan.at.tolist() == [4, 5, 8]
    before = state(kv, range(5))
    with pytest.raises(StalePlanError):
        kv.apply(plan)
    assert state(kv, range(5)) == before


def test_a_decode_batch_is_its_own_plan_checked_once() -> None:
    # plan(batch) of a fresh issued decode batch: its rows, priced once: (2, 2) by hand
    kv = prefilled([4, 5, 8])
    plan = kv.plan(kv.decode_demands([0, 1, 2]))
    assert plan.rids == (0, 1, 2) and plan.taken == Demand((2, 2))
    assert plan.quote is not None and plan.quote.demand == Demand((2, 2))
    assert kv.apply(plan) == Demand((2, 2))
    # a batch naming a request twice, or a stale one, is read as its pairs and refused
    # (twice) or found stale at its apply (a commit since), changing nothing
    before = state(kv, range(5))
    with pytest.raises(InvalidDemandError):
        kv.plan(kv.decode_demands([0, 0]))
    assert state(kv, range(5)) == before
    batch = kv.decode_demands([0, 1, 2])
    kv.commit(0, 1)
    before = state(kv, range(5))
    with pytest.raises(StalePlanError):
        kv.apply(kv.plan(batch))
    assert state(kv, range(5)) == before
