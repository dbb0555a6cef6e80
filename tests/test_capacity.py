"""The capacity library (`kvchain.capacity`): what `kvchain plan` prints, tested directly."""

from __future__ import annotations

import pytest

from kvchain.capacity import plan_capacity
from kvchain.catalog.loader import load_model
from kvchain.errors import BufferTooSmallError, ConfigError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model


def test_f10_token_capacity_with_slots_held():
    # Field case F10: (40e9 - 64 x 50e6) / 32,000 = 1,150,000 tokens with 64 slots held.
    model = declare_model("f10", full=32_000, state=50_000_000)
    plan = plan_capacity(model, get_gpu("h200"), buffer_bytes=40_000_000_000,
                         prompt=17_000, output=100, slots_held=64)
    assert plan.budget.given and plan.budget.gpu_memory_bytes is None
    assert plan.chain.full_tokens == 1_150_000 and plan.chain.slots_held == 64
    assert plan.pools.slots_held == 64  # like with like


def test_budget_from_the_reported_memory_per_rank():
    # gpt-oss-120b on an H100: floor(85,520,809,984 x 0.9) = 76,968,728,985
    # - 65,168,179,200 - 3,221,225,472 = 8,579,324,313 -> 8,579,324,160 (256-aligned).
    plan = plan_capacity(load_model("gpt-oss-120b"), get_gpu("h100"))
    b = plan.budget
    assert (b.gpu_memory_bytes, b.mem_fraction, b.weight_bytes, b.reserve_bytes) == (
        85_520_809_984, 0.9, 65_168_179_200, 3 * 2**30)
    assert b.buffer_bytes == plan.layout.buffer_bytes == 8_579_324_160
    # Under --tp 2 the weights are one rank's: the buffer is one rank's too.
    two = plan_capacity(load_model("gpt-oss-120b", tp=2), get_gpu("h100"), tp=2)
    assert two.tp == 2 and two.budget.weight_bytes == load_model("gpt-oss-120b",
                                                                 tp=2).weight_bytes
    assert two.budget.buffer_bytes > b.buffer_bytes


def test_refusals_are_typed():
    model = load_model("gpt-oss-120b")
    with pytest.raises(ConfigError, match="tp must be >= 1"):
        plan_capacity(model, get_gpu("h100"), tp=0)
    with pytest.raises(ConfigError, match="no room for a KV buffer"):
        plan_capacity(model, get_gpu("h100"), mem_fraction=0.5)
    with pytest.raises(BufferTooSmallError):
        plan_capacity(model, get_gpu("h100"), buffer_bytes=1_000)


def test_a_baseline_that_holds_no_request_does_not_abort_the_plan() -> None:
    # Chain: 100,000,000 B - one 50,000,000 B slot = 50,000,000 B = 97 pages of 512,000 B
    # (32,000 B a token x 16): a lone request of up to 97 x 16 = 1,552 tokens fits; the
    # pools' state share 100e6 x 0.9 / 1.9 = 47,368,421 B holds no 50e6 B slot.
    model = declare_model("f10", full=32_000, state=50_000_000)
    plan = plan_capacity(model, get_gpu("h200"), buffer_bytes=100_000_000, prompt=1_000,
                         output=100)
    assert plan.chain.concurrent_requests == 1
    assert plan.pools.concurrent_requests == 0
    assert plan.chain.longest_request_tokens == 1_552 and plan.chain.holds_none is None
    # Both sides at the only slot count both hold (0): the chain's whole buffer is full
    # pages, floor(100e6 / 512,000) = 195 pages x 16 = 3,120 tokens; the pools hold none.
    assert plan.chain.full_tokens == 3_120 and plan.chain.slots_held == 0
    assert (plan.pools.longest_request_tokens, plan.pools.full_tokens) == (0, 0)
    assert plan.pools_longest.tokens == 0
    reason = plan.pools.holds_none
    assert reason == ("the fixed state pool of 47,368,421 B (its share of the 100,000,000 B "
                      "buffer) cannot hold one smallest request: it needs 50,000,000 B")
    assert "buffer of 47,368,421" not in reason  # the pool's bytes are not "the buffer"


def test_the_fixed_pool_refusal_names_the_pool_not_the_buffer() -> None:
    from kvchain.capacity import fixed_pool_layouts, pools_capacity
    from kvchain.layout import plan_layout

    model = declare_model("f10", full=32_000, state=50_000_000)
    layout = plan_layout(model.classes, 100_000_000, 16)
    with pytest.raises(BufferTooSmallError, match="fixed state pool of 47,368,421 B") as info:
        fixed_pool_layouts(layout)
    assert (info.value.needed_bytes, info.value.available_bytes) == (50_000_000, 47_368_421)
    alone = pools_capacity(layout, 1_000, 100, None)
    assert alone.concurrent_requests == 0 and alone.holds_none == str(info.value)


def test_speculative_concurrency_by_hand():
    """k = 3 drafts per decode (issue 24): the chain holds exactly the declared extra slots,
    the fixed pools the same slots per request in their fixed state share. Derivation (no
    null pages on this layout): a (1,000, 100) request holds ceil((1,099 + k) / 16) = 69
    full pages of 16,000 B and 1 + extra slots of 50e6 B; the chain fits
    floor(1e9 / bytes) of them, the pools floor(9 slots / slots per request)."""
    from kvchain.bands.geometry import StateRollback
    from kvchain.capacity import speculative_capacity
    from kvchain.layout import plan_layout

    layout = plan_layout(declare_model("m", full=1_000, state=50_000_000).classes, 10**9, 16)
    plain_bytes = 69 * 16_000 + 50_000_000  # 51,104,000 B
    got = speculative_capacity(layout, 1_000, 100, 3)
    assert (got.chain_plain, got.pools_plain) == (10**9 // plain_bytes, 9) == (19, 9)
    assert (got.chain_concurrent, got.pools_concurrent) == (
        10**9 // (69 * 16_000 + 4 * 50_000_000), 9 // 4) == (4, 2)
    replay = speculative_capacity(layout, 1_000, 100, 3, StateRollback.REPLAY)
    assert (replay.chain_concurrent, replay.pools_concurrent) == (
        10**9 // (69 * 16_000 + 2 * 50_000_000), 9 // 2) == (9, 4)
    # k = 0 is the plain concurrency
    zero = speculative_capacity(layout, 1_000, 100, 0)
    assert (zero.chain_concurrent, zero.pools_concurrent) == (19, 9)
