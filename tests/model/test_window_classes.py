"""Several window sizes in one model: one class (one band) per (lifetime, window), with
unique labels; declared spec files with several window classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvchain.errors import ConfigError, LayoutError
from kvchain.layout import Anchor, plan_layout
from kvchain.model.declared import declare_model, declared_class, declared_layer
from kvchain.model.layers import LifetimeClass as LC
from kvchain.model.layers import group_classes
from kvchain.model.spec_file import load_spec_file


def test_group_classes_splits_windows_by_size_with_unique_labels() -> None:
    # Layers 0, 2: window 128; layer 1: window 11; layer 3: full. Bytes 10 / 20 / 30 per
    # token per layer, so window128 = 10 + 10 = 20 B per token.
    layers = (declared_layer(0, LC.WINDOW, 10, 128), declared_layer(1, LC.WINDOW, 20, 11),
              declared_layer(2, LC.WINDOW, 10, 128), declared_layer(3, LC.FULL, 30))
    classes = group_classes(layers)
    assert [(c.label, c.window, c.bytes_per_token) for c in classes] == [
        ("window11", 11, 20), ("window128", 128, 20), ("full", None, 30)]
    assert [x.index for x in classes[1].layers] == [0, 2]


def test_one_class_per_lifetime_keeps_the_plain_label() -> None:
    m = declare_model("m", full=30, window=20, window_tokens=128, state=1_000)
    assert [c.label for c in m.classes] == ["state", "window", "full"]
    assert m.cache_class(LC.WINDOW) is not None and m.cache_class(LC.WINDOW).window == 128


def test_model_with_two_window_sizes() -> None:
    m = declare_model("m", full=30, windows=[(20, 128), (8, 11)], local=4, chunk_tokens=64)
    assert [c.label for c in m.classes] == ["window11", "window128", "local", "full"]
    assert m.bytes_per_token(LC.WINDOW) == 28  # 20 + 8
    assert [c.window for c in m.cache_classes(LC.WINDOW)] == [11, 128]
    with pytest.raises(ConfigError, match="cache_classes"):
        m.cache_class(LC.WINDOW)
    layout = plan_layout(m.classes, 1 << 20, 16)
    # Floats by bytes per request, largest first: window128 128 x 20 = 2,560 B, local
    # 64 x 4 = 256 B, window11 11 x 8 = 88 B (next to the full END).
    assert layout.shape_name == "window128|local|window11|full"
    assert [b.anchor for b in layout.bands] == [Anchor.LOW, Anchor.FLOAT, Anchor.FLOAT,
                                                Anchor.HIGH]


def test_declared_errors() -> None:
    with pytest.raises(ConfigError, match="one lifetime and size"):
        declare_model("m", full=1, window=2, window_tokens=128, windows=[(3, 128)])
    with pytest.raises(ConfigError, match="positive int"):
        declare_model("m", full=1, windows=[(0, 128)])
    with pytest.raises(LayoutError, match="one lifetime and size"):
        plan_layout([declared_class(LC.WINDOW, 1, 8), declared_class(LC.WINDOW, 2, 8)],
                    1 << 16, 4)
    with pytest.raises(LayoutError, match="one lifetime and size"):
        plan_layout([declared_class(LC.FULL, 1), declared_class(LC.FULL, 2)], 1 << 16, 4)


def test_spec_file_with_several_window_classes(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"full": 30, "windows": [{"bytes": 20, "tokens": 128},
                                                         {"bytes": 8, "tokens": 11}]}))
    m = load_spec_file(path)
    assert [c.label for c in m.classes] == ["window11", "window128", "full"]
    for bad in ({"full": 1, "windows": {"bytes": 1, "tokens": 2}},
                {"full": 1, "windows": [{"bytes": 1}]},
                {"full": 1, "locals": [{"bytes": 1, "tokens": -2}]},
                {"full": 1, "windows": [{"bytes": 1, "tokens": 2, "x": 0}]}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match="spec file"):
            load_spec_file(path)
