"""Count arguments of the layout, the capacity plan, the GPU memory model, the fixed pools
and SGLang's new-token ratio must be whole numbers (finite numbers for the ratio): a
breaker found each of these accepted and running on.

Before the fix: ``plan_layout(classes, nan, 16)`` laid out a chain of ``nan`` bytes,
``plan_layout(..., page_size=16.0)`` a chain of 16,000.0-byte float pages, ``True`` counted
as 1 page token or slot, a class of NaN bytes per token passed ``<= 0``;
``kv_buffer_bytes(gpu, nan)`` returned ``nan``; ``plan_capacity(tp=1.5)`` planned "per rank
of 1.5"; ``fixed_pool_bytes(classes, -1)`` returned pools ``(0, -1)``;
``longest_request(100, 0)`` a longest request of -1 tokens; ``NewTokenRatio(decay=nan)``
dropped the ratio to its floor at the first step. Each is now a typed error, and the valid
neighbour of each refused value (the same count as an int, or as a NumPy integer) still
gives the same answer as before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvchain.capacity import longest_request, plan_capacity
from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError, LayoutError
from kvchain.field_types import is_whole
from kvchain.gpu import get_gpu, kv_buffer_bytes
from kvchain.layout import plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.pool_split import fixed_pool_bytes
from kvchain.sched.admission import NewTokenRatio, ReserveConfig, ReservePolicy

FULL = CacheClass(LifetimeClass.FULL, 1_000, 0, None, ())
WINDOW = CacheClass(LifetimeClass.WINDOW, 1_000, 0, 128, ())
STATE = CacheClass(LifetimeClass.STATE, 0, 100_000, None, ())
NAN = float("nan")


def test_is_whole_takes_ints_and_numpy_integers_only() -> None:
    assert is_whole(0) and is_whole(16) and is_whole(np.int64(16)) and is_whole(-3)
    for bad in (True, False, 16.0, NAN, math.inf, "16", None):
        assert not is_whole(bad)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"page_size": True}, "page_size must be a whole number >= 1, got True"),
    ({"page_size": 16.0}, "page_size must be a whole number >= 1, got 16.0"),
    ({"page_size": 0}, "page_size must be a whole number >= 1, got 0"),
    ({"buffer_bytes": NAN}, "buffer_bytes must be a whole number >= 1, got nan"),
    ({"buffer_bytes": math.inf}, "buffer_bytes must be a whole number >= 1, got inf"),
    ({"buffer_bytes": 1e7}, "buffer_bytes must be a whole number >= 1, got 10000000.0"),
    ({"buffer_bytes": True}, "buffer_bytes must be a whole number >= 1, got True"),
    ({"state_slots_per_request": 2.5}, "state_slots_per_request must be a whole number"),
    ({"state_slots_per_request": True}, "state_slots_per_request must be a whole number"),
    ({"null_pages": None}, "null_pages must be True or False, got None"),
    ({"null_pages": "no"}, "null_pages must be True or False, got 'no'"),
])
def test_plan_layout_refuses_counts_that_are_not_whole(kwargs: dict[str, object],
                                                       needle: str) -> None:
    args: dict[str, object] = {"buffer_bytes": 10_000_000, "page_size": 16, **kwargs}
    with pytest.raises(LayoutError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        plan_layout([FULL, WINDOW, STATE], **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("lifetime", "per_token", "per_slot", "window"), [
    (LifetimeClass.FULL, NAN, 0, None), (LifetimeClass.FULL, 1_000.5, 0, None),
    (LifetimeClass.FULL, True, 0, None), (LifetimeClass.FULL, -1, 0, None),
    (LifetimeClass.WINDOW, 1_000, 0, NAN), (LifetimeClass.WINDOW, 1_000, 0, 1.5),
    (LifetimeClass.WINDOW, 1_000, 0, True), (LifetimeClass.WINDOW, 1_000, 0, 0),
    (LifetimeClass.STATE, 0, NAN, None), (LifetimeClass.STATE, 0, 2.5, None),
])
def test_a_cache_class_of_sizes_that_are_not_whole_is_refused(
        lifetime: LifetimeClass, per_token: object, per_slot: object, window: object) -> None:
    """The class itself refuses them (it was built, and only plan_layout refused it; any
    other reader of its sizes ran on NaN), so no layout, pool or cost model sees one."""
    with pytest.raises(ConfigError, match="whole number"):
        CacheClass(lifetime, per_token, per_slot, window, ())  # type: ignore[arg-type]


def test_a_cache_class_of_numpy_sizes_is_built() -> None:
    """The sibling: NumPy integers are sizes (a config read into arrays)."""
    c = CacheClass(LifetimeClass.WINDOW, np.int64(1_000), 0, np.int64(128), ())
    assert c.bytes_per_token == 1_000 and c.window == 128


def test_plan_layout_refuses_a_zero_size_class() -> None:
    """What the layout still checks beyond the class: sizes >= 1 (a class may say 0 bytes
    per token only as a state class)."""
    with pytest.raises(LayoutError, match="a whole number > 0, got 0"):
        plan_layout([CacheClass(LifetimeClass.FULL, 0, 0, None, ()), STATE], 10_000_000, 16)


def test_plan_layout_numpy_counts_give_the_int_layout() -> None:
    # the valid neighbour: NumPy integers are counts too, and lay out the same chain
    ints = plan_layout([FULL, WINDOW, STATE], 10_000_000, 16, state_slots_per_request=2)
    nps = plan_layout([FULL, WINDOW, STATE], np.int64(10_000_000), np.int64(16),
                      state_slots_per_request=np.int64(2))
    assert nps == ints and type(nps.buffer_bytes) is int and type(nps.page_size) is int


def test_gpu_memory_model_refuses_nan_bool_and_fractional_bytes() -> None:
    h200 = get_gpu("h200")
    for weights in (NAN, True, 1.5):
        with pytest.raises(ConfigError, match="whole numbers of bytes"):
            kv_buffer_bytes(h200, weights)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="whole numbers of bytes"):
        kv_buffer_bytes(h200, 0, activation_reserve_bytes=NAN)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mem_fraction must be a number"):
        kv_buffer_bytes(h200, 0, mem_fraction=True)
    # the docstring's worked example still holds: 16e9 B of weights on an H200
    assert kv_buffer_bytes(h200, 16_000_000_000) == 116_458_112_512


def test_plan_capacity_refuses_a_tp_that_is_not_whole() -> None:
    model, h200 = load_model("gpt-oss-120b"), get_gpu("h200")
    for tp in (True, 1.5):
        with pytest.raises(ConfigError, match="tp must be >= 1"):
            plan_capacity(model, h200, tp=tp)  # type: ignore[arg-type]
    # the README's plan: 67,289,933,312 B of KV buffer on one H200
    assert plan_capacity(model, h200, tp=1).budget.buffer_bytes == 67_289_933_312


def test_fixed_pool_bytes_refuses_negative_fractional_and_empty() -> None:
    for bad in (-1, 1_000.5, True, NAN):
        with pytest.raises(ConfigError, match="buffer_bytes must be a whole number"):
            fixed_pool_bytes([FULL, WINDOW], bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one cache class"):
        fixed_pool_bytes([], 1_000)
    # the valid neighbour: the pools sum to B exactly
    assert sum(fixed_pool_bytes([FULL, WINDOW], 1_000)) == 1_000


def test_longest_request_refuses_a_context_below_two_tokens() -> None:
    for context in (0, 1, -5, 1.5, True):
        with pytest.raises(ConfigError, match="context length must be a whole number"):
            longest_request(100, context)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="KV-bytes bound"):
        longest_request(-1, None)
    # context 2: one prompt token and one output token
    assert longest_request(100, 2).tokens == 1
    assert longest_request(100, 32_768).bound == "kv_bytes"


@pytest.mark.parametrize("ratio", [(0.7, 0.1, NAN), (0.7, 0.1, math.inf), (NAN, 0.1, 0.0),
                                   (True, 0.1, 0.0), (0.7, 0.1, "0.001")])
def test_new_token_ratio_refuses_values_that_are_not_finite_numbers(
        ratio: tuple[float, float, float]) -> None:
    with pytest.raises(ConfigError, match="new_token_ratio needs finite numbers"):
        NewTokenRatio(*ratio)
    with pytest.raises(ConfigError, match="new_token_ratio needs finite numbers"):
        ReserveConfig(ReservePolicy.SGLANG, ratio=ratio)


def test_new_token_ratio_decays_by_its_decay() -> None:
    # the valid neighbour: 0.7 - 0.1 = 0.6 after one step, then the floor 0.5
    ratio = NewTokenRatio(0.7, 0.5, 0.1)
    ratio.step()
    assert ratio.value == pytest.approx(0.6)
    ratio.step()
    ratio.step()
    assert ratio.value == 0.5


def test_host_tier_takes_numpy_counts_as_its_plan_does() -> None:
    # HostTier refused np.int64 host bytes that host_tier_plan (its own split) takes; both
    # now read counts alike: the same plan, and bools or floats refused by both
    from kvchain.cache.host_cache import HostTier
    from kvchain.cache.host_tier import host_tier_plan

    layout = plan_layout([FULL, WINDOW], 10_000_000, 16)
    tier = HostTier(layout, np.int64(2_000_000), np.int64(64))
    assert tier.plan == host_tier_plan(layout, 2_000_000, 64)
    for bad in (True, 2e6):
        with pytest.raises(ConfigError, match="host bytes must be a whole number"):
            HostTier(layout, bad, 64)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="host bytes must be a whole number"):
            host_tier_plan(layout, bad, 64)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resume interval"):
        HostTier(layout, 2_000_000, 64.0)  # type: ignore[arg-type]
