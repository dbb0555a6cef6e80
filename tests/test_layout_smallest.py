"""The one smallest-request formula (layout.smallest_request_pages), used by the layout's
minimum check and by the scheduler's construction check."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.errors import BufferTooSmallError
from kvchain.layout import plan_layout, smallest_request_bytes, smallest_request_pages
from kvchain.model.declared import declare_model
from kvchain.requests.manager import KVManager
from kvchain.sched.scheduler import Scheduler


def test_window_only_smallest_request_is_one_window_plus_a_page():
    # Mistral-7B-like: W = 4,096, P = 16 -> ceil(4,095 / 16) + 1 = 257 window pages.
    model = declare_model("m", window=131_072, window_tokens=4_096)
    layout = plan_layout(model.classes, 10**12, 16)
    assert smallest_request_pages(layout.bands, 1) == (257,)
    assert smallest_request_bytes(layout.bands, 1) == 257 * 16 * 131_072


def test_three_bands_with_checkpoint_slots():
    # state | window | full; W = 128, P = 256 (F1's window): 3 slots, 2 window, 1 full.
    model = declare_model("m", full=1_000, window=1_000, window_tokens=128, state=5_000)
    layout = plan_layout(model.classes, 10**9, 256, state_slots_per_request=3)
    assert smallest_request_pages(layout.bands, 3) == (3, 2, 1)
    assert smallest_request_bytes(layout.bands, 3) == 3 * 5_000 + 2 * 256_000 + 256_000


def test_layout_and_scheduler_agree_at_the_boundary():
    """Without null pages the smallest request is exactly 1 full + 2 window pages of
    256,000 B: the scheduler constructs on that layout, and one byte less is refused
    naming 768,000 B."""
    model = declare_model("m", full=1_000, window=1_000, window_tokens=128)
    ok = plan_layout(model.classes, 3 * 256_000, 256, null_pages=False)
    Scheduler(KVManager(Chain(ok)))  # exactly the smallest request: constructs
    with pytest.raises(BufferTooSmallError) as info:
        plan_layout(model.classes, 3 * 256_000 - 1, 256, null_pages=False)
    assert info.value.needed_bytes == 3 * 256_000


def test_grid_minimum_agrees_with_the_planner_on_random_chains(monkeypatch):
    """On chains of 1 full END, 1-3 window floats and maybe a state END, at buffers around
    the grid minimum (:func:`smallest_request_reach`), the planner places the smallest
    request on the empty chain exactly when the buffer reaches it (layouts built with the
    check switched off, so those below it exist to be priced)."""
    import random

    import kvchain.layout as layout_mod
    from kvchain.alloc.snapshot import Demand
    from kvchain.layout import smallest_request_reach
    from kvchain.model.declared import declared_class
    from kvchain.model.layers import LifetimeClass as LC

    rng = random.Random(24)
    checked = binding = 0
    for _ in range(25):
        classes = [declared_class(LC.FULL, rng.randint(1, 50))]
        classes += [declared_class(LC.WINDOW, rng.randint(1, 50), window=w)
                    for w in rng.sample(range(5, 200), rng.randint(1, 3))]
        if rng.random() < 0.5:
            classes.append(declared_class(LC.STATE, rng.randint(100, 5_000)))
        base = plan_layout(classes, 10**9, 16)
        need = smallest_request_bytes(base.bands, 1) + base.reserved_bytes
        reach = smallest_request_reach(base.bands, 1)
        binding += reach > need
        for b in {need, reach - 1, reach, reach + 1,
                  *(rng.randint(need, reach + 64) for _ in range(6))}:
            if b < need:
                continue
            with monkeypatch.context() as m:
                m.setattr(layout_mod, "smallest_request_reach", lambda *a, **k: 0)
                lay = plan_layout(classes, b, 16)
            fits = Chain(lay).price(Demand(smallest_request_pages(lay.bands, 1))).fits
            assert fits == (b >= reach), (lay.shape_name, b, reach)
            checked += 1
            if b < reach:  # and the checked layout refuses it
                with pytest.raises(BufferTooSmallError):
                    plan_layout(classes, b, 16)
    assert checked > 100 and binding > 10  # the grid binds on most of these chains
