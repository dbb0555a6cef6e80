"""Fixed-pool shares of a chain whose every class is a state class: a pure recurrent
target (a Mamba-like model, one state class) with a pure recurrent draft of its own.

Each state pool holds one slot per request, so the pools must split the buffer by slot
bytes (each then holds the same count of slots), as they do beside a full class. The old
rule fell through to the split "by bytes per token" with ``max(0, 1)`` for every state
class: equal halves whatever the slot sizes.
"""

from __future__ import annotations

import pytest

from kvchain.capacity import fixed_pool_layouts, pools_capacity
from kvchain.layout import plan_layout
from kvchain.model import declare_model, with_draft
from kvchain.model.spec import ModelSpec
from kvchain.pool_split import fixed_pool_bytes, fixed_pool_shares


def _joined() -> ModelSpec:
    # target slot 3,000,000 B, draft slot 1,000,000 B; no token classes on either side
    return with_draft(declare_model("t", state=3_000_000), declare_model("d", state=1_000_000))


def test_state_only_pools_split_by_slot_bytes() -> None:
    shares = fixed_pool_shares(_joined().classes)
    # band order: largest slot first (the LOW END), then the draft's: 3 : 1 of the buffer
    assert shares == pytest.approx((0.75, 0.25))


def test_state_only_pools_hold_the_same_slot_count() -> None:
    classes = _joined().classes
    b = 40_000_000
    # 40e6 B x 3/4 = 30e6 B = 10 slots of 3e6; 40e6 x 1/4 = 10e6 B = 10 slots of 1e6
    assert fixed_pool_bytes(classes, b) == (30_000_000, 10_000_000)
    layout = plan_layout(classes, b, 16)
    assert [p.bands[0].cap for p in fixed_pool_layouts(layout)] == [10, 10]
    # a request holds one slot of each pool: 10 concurrent, as many as the one buffer
    # holds whole (40e6 / 4e6 = 10); equal halves gave 20e6 / 3e6 = 6
    assert pools_capacity(layout, 256, 16, None).concurrent_requests == 10


def test_one_state_class_alone_takes_the_buffer() -> None:
    assert fixed_pool_shares(declare_model("t", state=3_000_000).classes) == (1.0,)
