"""Admission: rules per layout, the new-token ratio, and the reservation ledger."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.errors import ConfigError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.sched.admission import (
    AdmissionRules,
    ChainPrefillBudget,
    NewTokenRatio,
    WindowAdmission,
)


def two_end_chain():
    """window (E = 32 B, W = 8) | full (E = 32 B), P = 1, 64 pages of buffer, no null page."""
    layout = plan_layout([declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
                         64 * 32, 1, null_pages=False)
    return Chain(layout)


def test_rules_follow_the_layout():
    chain = two_end_chain()
    assert AdmissionRules.for_layout(chain.layout).window is WindowAdmission.JOINT
    split = AdmissionRules.for_layout(chain.layout, WindowAdmission.SPLIT)
    assert split.window is WindowAdmission.SPLIT
    with pytest.raises(ConfigError):
        AdmissionRules.for_layout(chain.layout, WindowAdmission.NONE)
    full_only = plan_layout([declared_class(LC.FULL, 32)], 1024, 1)
    assert AdmissionRules.for_layout(full_only).window is WindowAdmission.NONE


def test_new_token_ratio_sglang_defaults():
    r = NewTokenRatio()
    assert r.value == 0.7
    assert r.floor == pytest.approx(0.098)
    r.step()
    assert r.value == pytest.approx(0.7 - 0.602 / 600)
    for _ in range(1000):
        r.step()
    assert r.value == pytest.approx(0.098)
    assert r.tokens(100) == 10  # ceil(100 x 0.098)
    assert r.tokens(1) == 1 and r.tokens(0) == 0
    r.reset()
    assert r.value == 0.7
    with pytest.raises(ConfigError):
        NewTokenRatio(init=0.5, floor=0.6)


def test_joint_budget_shares_the_gap_and_reserves():
    chain = two_end_chain()
    budget = ChainPrefillBudget(chain.snapshot(), AdmissionRules.for_layout(chain.layout))
    assert budget.admit(Demand((20, 20)))
    assert budget.admit(Demand((12, 12)))
    assert not budget.admit(Demand((1, 0)))  # 64 pages reserved: nothing left
    assert budget.reserved == Demand((32, 32))
    assert chain.snapshot().live_bytes == 0  # pricing never allocates
    assert budget.decisions == 3


def test_split_budget_is_conservative_half_gaps():
    chain = two_end_chain()
    budget = ChainPrefillBudget(chain.snapshot(),
                                AdmissionRules.for_layout(chain.layout, WindowAdmission.SPLIT))
    assert not budget.fits(Demand((40, 0)))  # joint would fit: 40 <= 64
    assert budget.fits(Demand((32, 32)))
    assert budget.admit(Demand((32, 0)))
    assert not budget.admit(Demand((1, 0)))  # the window's half is used up
    assert budget.admit(Demand((0, 32)))


def test_largest_chunk_is_page_aligned_with_the_tail():
    chain = two_end_chain()
    budget = ChainPrefillBudget(chain.snapshot(), AdmissionRules.for_layout(chain.layout))
    # demand of t tokens = t full pages + t window pages (P = 1): 32 fit
    assert budget.largest(lambda t: Demand((t, t)), 100, step=8) == 32
    assert budget.largest(lambda t: Demand((t, t)), 30, step=8) == 30  # unaligned tail
    assert budget.largest(lambda t: Demand((t, t)), 0, step=8) == 0


# --- a SPLIT refusal names the share that binds -------------------------------------------

def _split_layout(buffer_bytes: int):
    """window (E = 100 B, W = 40) | full (E = 8 B), P = 16: window pages of 1,600 B (one
    null page), full pages of 128 B."""
    return plan_layout([declared_class(LC.WINDOW, 100, 40), declared_class(LC.FULL, 8)],
                       buffer_bytes, 16)


def test_split_refusal_of_the_smallest_request_names_the_window_share():
    from kvchain.errors import BufferTooSmallError
    from kvchain.requests.manager import KVManager
    from kvchain.sched.scheduler import Scheduler, SchedulerConfig

    # 8,784 B: the window band (LOW END) holds its null page (1,600 B), the gap is
    # 8,784 - 1,600 = 7,184 B. SPLIT gives the window half of it: 3,592 // 1,600 = 2
    # pages; the smallest request's window spans ceil(39 / 16) + 1 = 4 pages (6,400 B).
    # Its bytes, 4 x 1,600 + 1 x 128 + the null page 1,600 = 8,128 B, are fewer than the
    # chain's 8,784 B: the share binds, not the bytes, and the message says so.
    layout = _split_layout(8_784)
    config = SchedulerConfig(window_admission=WindowAdmission.SPLIT, chunk_size=16,
                             max_prefill_tokens=16)
    with pytest.raises(BufferTooSmallError) as err:
        Scheduler(KVManager(Chain(layout)), config)
    message = str(err.value)
    assert "(8,128 B of pages with null pages)" in message
    assert ("split admission gives the window band a share of 2 pages (3,200 B" in message
            and "needs 4 pages (6,400 B); joint admission (the default) fits it" in message)
    # The default (joint) admission fits it.
    Scheduler(KVManager(Chain(layout)), SchedulerConfig(chunk_size=16, max_prefill_tokens=16))


def test_split_rejection_of_a_request_names_the_band_share():
    from kvchain.requests.manager import KVManager
    from kvchain.sched.request import EventKind, Request
    from kvchain.sched.scheduler import Scheduler, SchedulerConfig

    # window (E = 8 B, W = 40) | full (E = 8 B), P = 16, 6,784 B: pages of 128 B, one
    # window null page, a gap of 6,784 - 128 = 6,656 B. SPLIT shares: the window half of
    # it, the full band (HIGH END, no gap above) the other half: 3,328 // 128 = 26 pages
    # each. A (500, 10) request's full pages, ceil(509 / 16) = 32 (4,096 B), exceed the
    # full share; with its 4 window pages (ceil(16 / 16) + ceil(39 / 16)) it needs
    # 36 x 128 = 4,608 B of the 6,656 B free, yet SPLIT can never admit it.
    layout = plan_layout([declared_class(LC.WINDOW, 8, 40), declared_class(LC.FULL, 8)],
                         6_784, 16)
    scheduler = Scheduler(KVManager(Chain(layout)), SchedulerConfig(
        window_admission=WindowAdmission.SPLIT, chunk_size=16, max_prefill_tokens=16))
    assert not scheduler.add(Request(0, 500, 10), 0.0)
    [rejected] = [e for e in scheduler.drain_events() if e.kind is EventKind.REJECTED]
    assert "needs 4,608 B of pages at its peak" in rejected.detail
    assert "(6,656 B free)" in rejected.detail
    assert ("gives the full band a share of 26 pages (3,328 B" in rejected.detail
            and "needs 32 pages (4,096 B); joint admission (the default) fits it"
            in rejected.detail)


def test_refusal_without_split_names_bytes():
    chain = two_end_chain()
    budget = ChainPrefillBudget(chain.snapshot(), AdmissionRules.for_layout(chain.layout))
    # 64 pages of 32 B free; 40 + 30 pages ask for 2,240 B.
    assert budget.refusal(Demand((40, 30))) == ("it needs 2,240 B of pages and joint "
                                                "admission fits at most the 2,048 B free")


def test_refusal_on_a_chain_without_window_band_names_no_window_rule():
    # A state | full chain has no window rule (WindowAdmission.NONE): the message read
    # "... and none admission fits at most ...".
    from kvchain.alloc.chain import Chain
    from kvchain.layout import plan_layout
    from kvchain.model.declared import declared_class
    from kvchain.model.layers import LifetimeClass as LC

    layout = plan_layout([declared_class(LC.STATE, 1_000), declared_class(LC.FULL, 100)],
                         100_000, 4)
    chain = Chain(layout)
    budget = ChainPrefillBudget(chain.snapshot(), AdmissionRules.for_layout(chain.layout))
    # 2,000 full pages of 400 B ask for 800,000 B of the 100,000 B buffer.
    text = budget.refusal(Demand((0, 2_000)))
    assert text == "it needs 800,000 B of pages and admission fits at most the 100,000 B free"
