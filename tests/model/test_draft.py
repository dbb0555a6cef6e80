"""with_draft: a draft model's cache layers join the target's spec as bands of their own."""

from __future__ import annotations

import pytest

from kvchain.errors import ConfigError, LayoutError
from kvchain.layout import Anchor, plan_layout
from kvchain.model import (
    DRAFT,
    TARGET,
    DraftKind,
    LifetimeClass,
    declare_model,
    declared_layer,
    with_draft,
)
from kvchain.model.spec import ModelSpec

FULL, STATE, WINDOW = LifetimeClass.FULL, LifetimeClass.STATE, LifetimeClass.WINDOW


def _spec(name: str, *layers, ctx: int | None = None, weights: int = 1000) -> ModelSpec:
    return ModelSpec(name, tuple(layers), num_layers=len(layers), hidden_size=64,
                     num_attention_heads=4, total_params=10 * weights, active_params=weights,
                     weight_bytes=weights, max_context_tokens=ctx)


def test_state_full_target_with_full_draft_gets_four_labelled_classes() -> None:
    target = _spec("t", declared_layer(0, STATE, 5000), declared_layer(1, FULL, 200),
                   ctx=4096, weights=10_000)
    draft = _spec("d", declared_layer(0, FULL, 60), declared_layer(1, FULL, 40), ctx=2048)
    joined = with_draft(target, draft)
    assert [c.label for c in joined.classes] == ["state", "full", "draft.full"]
    # Draft layers keep their own indices 0, 1, tagged "draft"; the target's stay "target".
    assert [(x.owner, x.index) for x in joined.layers] == [
        (TARGET, 0), (TARGET, 1), (DRAFT, 0), (DRAFT, 1)]
    # The target's bytes stay the target's; the draft's class sums its layers: 60 + 40.
    assert joined.bytes_per_token(FULL) == 200
    assert joined.bytes_per_token(FULL, DRAFT) == 100
    assert joined.state_bytes == 5000
    assert [c.label for c in joined.draft_bands] == ["draft.full"]
    # Cost facts: the target's on the spec, the draft's on joined.draft.
    assert joined.weight_bytes == 10_000 and joined.draft is draft
    assert joined.draft_kind is DraftKind.MODEL
    # Context capped at the shorter (the draft's 2,048 tokens).
    assert joined.max_context_tokens == 2048
    assert joined.name == "t+d"


def test_draft_with_state_and_window_labels_each_lifetime() -> None:
    target = declare_model("t", full=100, window=100, window_tokens=128)
    draft = _spec("d", declared_layer(0, STATE, 700), declared_layer(1, WINDOW, 30, 64),
                  declared_layer(2, WINDOW, 20, 512), declared_layer(3, FULL, 10))
    joined = with_draft(target, draft)
    assert [c.label for c in joined.draft_bands] == [
        "draft.state", "draft.window64", "draft.window512", "draft.full"]
    # Unknown contexts on both sides stay unknown.
    assert joined.max_context_tokens is None


def test_mtp_shared_adds_no_bands_and_keeps_the_draft_facts() -> None:
    target = _spec("t", declared_layer(0, FULL, 200))
    head = _spec("mtp", declared_layer(0, FULL, 200), weights=77)
    joined = with_draft(target, head, DraftKind.MTP_SHARED)
    assert joined.classes == target.classes and joined.draft_bands == ()
    assert joined.draft is not None and joined.draft.weight_bytes == 77
    # A head without cache layers is fine when it shares the target's KV ...
    bare = _spec("bare")
    assert with_draft(target, bare, DraftKind.MTP_SHARED).draft_bands == ()
    # ... and refused when it claims KV of its own.
    with pytest.raises(ConfigError, match="mtp_shared"):
        with_draft(target, bare, DraftKind.EAGLE)


def test_refusals() -> None:
    target = _spec("t", declared_layer(0, FULL, 200))
    draft = _spec("d", declared_layer(0, FULL, 50))
    joined = with_draft(target, draft)
    with pytest.raises(ConfigError, match="already has a draft"):
        with_draft(joined, draft)
    with pytest.raises(ConfigError, match="a draft of its own"):
        with_draft(target, joined)
    with pytest.raises(ConfigError, match="DraftKind"):
        with_draft(target, draft, "model")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="both or neither"):
        ModelSpec("x", (), 1, 1, 1, 1, 1, 1, draft=draft)


def test_layout_holds_two_full_bands_target_full_at_the_high_end() -> None:
    # Target full E = 200 B/token, draft full E = 100 B/token: the larger is the HIGH END,
    # the draft's full band is the LOW END of a two-band chain.
    target = _spec("t", declared_layer(0, FULL, 200))
    draft = _spec("d", declared_layer(0, FULL, 100))
    layout = plan_layout(with_draft(target, draft).classes, 1_000_000, 16)
    assert layout.shape_name == "draft.full|full"
    assert [b.anchor for b in layout.bands] == [Anchor.LOW, Anchor.HIGH]
    assert layout.index_of(FULL) == 1 and layout.index_of(FULL, DRAFT) == 0
    assert layout.indices_of(FULL) == (0, 1)
    # Each layer finds its band by (owner, lifetime, window).
    joined = with_draft(target, draft)
    assert [layout.band_of(x) for x in joined.layers] == [1, 0]
    with pytest.raises(LayoutError, match="no band"):
        layout.band_of(declared_layer(0, STATE, 10))


def test_layout_of_state_full_target_and_state_window_full_draft() -> None:
    # Order: states (larger slot first: 5,000 B target at the LOW END, then the draft's
    # 700 B), the floating draft full band, the window float, the target full END.
    target = _spec("t", declared_layer(0, STATE, 5000), declared_layer(1, FULL, 200))
    draft = _spec("d", declared_layer(0, STATE, 700), declared_layer(1, WINDOW, 30, 64),
                  declared_layer(2, FULL, 10))
    layout = plan_layout(with_draft(target, draft).classes, 10_000_000, 16)
    assert layout.shape_name == "state|draft.state|draft.full|draft.window|full"
    assert [b.anchor for b in layout.bands] == [
        Anchor.LOW, Anchor.FLOAT, Anchor.FLOAT, Anchor.FLOAT, Anchor.HIGH]
    # The draft's window band reserves its null page like any window band.
    assert [b.reserved_pages for b in layout.bands] == [0, 0, 0, 1, 0]


def test_layout_refuses_two_classes_of_one_key() -> None:
    from kvchain.model.layers import CacheClass

    a = CacheClass.of((declared_layer(0, FULL, 10),))
    with pytest.raises(LayoutError, match="one lifetime and size of one owner"):
        plan_layout([a, a], 100_000, 16)
