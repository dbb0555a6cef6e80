"""Admission: rules per layout, the new-token ratio, and the reservation ledger."""

from __future__ import annotations

import pytest

from kvchain.admission import (
    AdmissionRules,
    ChainPrefillBudget,
    NewTokenRatio,
    WindowAdmission,
)
from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.errors import ConfigError
from kvchain.layout import plan_layout
from kvchain.spec.declared import declared_class
from kvchain.spec.layers import LifetimeClass as LC


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
