"""Models declared by bytes."""

from __future__ import annotations

import pytest

from kvchain.errors import ConfigError
from kvchain.spec import LifetimeClass, declare_model, declared_class
from kvchain.spec.layers import CacheClass, CacheDtype, LayerCache, TensorDecl


def test_three_band_declaration():
    spec = declare_model(
        "jet-like", full=2_048, window=2_048, window_tokens=1_152, state=14_745_600
    )
    assert [c.lifetime for c in spec.classes] == [
        LifetimeClass.STATE,
        LifetimeClass.WINDOW,
        LifetimeClass.FULL,
    ]
    assert spec.state_bytes == 14_745_600
    assert spec.bytes_per_token(LifetimeClass.WINDOW) == 2_048
    assert spec.cache_class(LifetimeClass.WINDOW).window == 1_152
    assert spec.bytes_per_token(LifetimeClass.FULL) == 2_048
    assert (spec.total_params, spec.weight_bytes, spec.source) == (0, 0, "declared")


def test_local_class_and_single_class():
    spec = declare_model("scout-like", full=49_152, local=147_456, chunk_tokens=8_192)
    assert spec.cache_class(LifetimeClass.LOCAL).window == 8_192
    assert spec.bytes_per_token(LifetimeClass.LOCAL) == 147_456
    cls = declared_class(LifetimeClass.STATE, 1_000)
    assert (cls.bytes_per_slot, cls.bytes_per_token, cls.window) == (1_000, 0, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"full": -1}, "full must be >= 0"),
        ({"window": 10}, "window bytes and window_tokens together"),
        ({"full": 10, "window_tokens": 5}, "window bytes and window_tokens together"),
        ({"local": 10}, "local bytes and chunk_tokens together"),
        ({}, "has no class"),
        ({"window": 10, "window_tokens": 0}, "needs a positive window"),
    ],
)
def test_bad_declarations(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        declare_model("bad", **kwargs)


def test_declared_class_errors():
    with pytest.raises(ConfigError, match="must be positive"):
        declared_class(LifetimeClass.FULL, 0)
    with pytest.raises(ConfigError, match="takes no window"):
        declared_class(LifetimeClass.FULL, 10, window=4)



def test_a_class_mixing_a_window_and_none_is_a_config_error() -> None:
    """Found by mypy: the message sorted {None, 128}, which raised TypeError."""
    t = (TensorDecl("k", (8,), CacheDtype.BF16),)
    layers = (LayerCache(0, LifetimeClass.WINDOW, "gqa", t, 128),
              LayerCache(1, LifetimeClass.WINDOW, "gqa", t, None))
    with pytest.raises(ConfigError, match=r"different windows \[None, 128\]"):
        CacheClass.of(layers)
