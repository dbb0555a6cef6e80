"""Every models.json model: the built spec reproduces the file's derived bf16 numbers.

Both ways of building are checked: the catalog's choice (the verbatim config.json when one
is bundled) and the models.json entry itself. models.json's "window" numbers hold the
chunked-local layers of Llama 4 (window_tokens 8192 = the chunk); kvchain keeps them in
the LOCAL class.
"""

from __future__ import annotations

import pytest

from kvchain.catalog import load_model, load_models_json_entry, read_models_json
from kvchain.model import CacheDtype, LifetimeClass, ModelSpec

ENTRIES = {str(e["name"]): e for e in read_models_json()}
KEYS = (
    "full_attention_kv_bytes_per_token_bf16",
    "window_kv_bytes_per_token_bf16",
    "window_tokens",
    "state_bytes_per_request_bf16",
    "num_full_attention_layers",
    "num_window_layers",
    "num_state_layers",
)


def token_window_class(spec: ModelSpec):
    return spec.cache_class(LifetimeClass.WINDOW) or spec.cache_class(LifetimeClass.LOCAL)


def derived_of(spec: ModelSpec) -> dict:
    window = token_window_class(spec)
    state = spec.cache_class(LifetimeClass.STATE)
    full = spec.cache_class(LifetimeClass.FULL)
    return {
        "full_attention_kv_bytes_per_token_bf16": spec.bytes_per_token(LifetimeClass.FULL),
        "window_kv_bytes_per_token_bf16": window.bytes_per_token if window else 0,
        "window_tokens": window.window if window else None,
        "state_bytes_per_request_bf16": spec.state_bytes,
        "num_full_attention_layers": len(full.layers) if full else 0,
        "num_window_layers": len(window.layers) if window else 0,
        "num_state_layers": len(state.layers) if state else 0,
    }


def file_numbers(entry: dict) -> dict:
    derived = entry["derived"]
    return {key: derived[key] for key in KEYS}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_derived_bytes_match_models_json(name):
    entry = ENTRIES[name]
    expected = file_numbers(entry)
    # models.json states all-bf16 numbers ("_bf16"); transformers' NemotronHConfig
    # defaults mamba_ssm_cache_dtype to float32, so the state dtype is pinned to compare.
    from_catalog = load_model(name, state_dtype=CacheDtype.BF16)
    from_entry = load_models_json_entry(name, state_dtype=CacheDtype.BF16)
    assert derived_of(from_catalog) == expected
    assert derived_of(from_entry) == expected
    assert from_entry.total_params == from_catalog.total_params
    # the file's totals: bytes(L) = E_full * L + E_win * min(L, W) + S
    d = entry["derived"]
    for tokens, key in ((8_192, "8k"), (32_768, "32k"), (131_072, "128k")):
        window = min(tokens, d["window_tokens"]) if d["window_tokens"] else 0
        total = (
            expected["full_attention_kv_bytes_per_token_bf16"] * tokens
            + expected["window_kv_bytes_per_token_bf16"] * window
            + expected["state_bytes_per_request_bf16"]
        )
        assert total == d[f"total_cache_bytes_per_request_bf16_at_{key}"]


STATE_SHAPE_KEYS = (
    "conv_state_shape_per_layer",
    "ssm_state_shape_per_layer",
    "recurrent_state_shape_per_layer",
    "state_shape_per_layer",
)


@pytest.mark.parametrize(
    "name", sorted(n for n, e in ENTRIES.items() if e.get("recurrent_state"))
)
def test_state_shapes_match_models_json(name):
    rs = ENTRIES[name]["recurrent_state"]
    shapes = {tuple(rs[k]) for k in STATE_SHAPE_KEYS if k in rs}
    for spec in (load_model(name, state_dtype=CacheDtype.BF16),
                 load_models_json_entry(name, state_dtype=CacheDtype.BF16)):
        layer = spec.cache_class(LifetimeClass.STATE).layers[0]
        assert {t.shape for t in layer.tensors} == shapes
        assert layer.nbytes == rs["bytes_per_layer_bf16"]


def test_chunked_local_is_its_own_class():
    scout = load_model("llama-4-scout")
    assert [c.lifetime for c in scout.classes] == [LifetimeClass.LOCAL, LifetimeClass.FULL]
    assert scout.cache_class(LifetimeClass.LOCAL).window == 8_192


def test_falcon_h1_layers_hold_attention_and_state():
    falcon = load_model("falcon-h1-7b")
    full = [layer.index for layer in falcon.cache_class(LifetimeClass.FULL).layers]
    state = [layer.index for layer in falcon.cache_class(LifetimeClass.STATE).layers]
    assert full == state == list(range(44))


def test_jamba_attention_layers():
    jamba = load_model("jamba-v0.1")
    assert [layer.index for layer in jamba.cache_class(LifetimeClass.FULL).layers] == [
        4,
        12,
        20,
        28,
    ]


def test_tp2_halves_kv_through_the_catalog():
    one = load_model("gemma-3-27b")
    two = load_model("gemma-3-27b", tp=2)
    assert two.bytes_per_token(LifetimeClass.FULL) * 2 == one.bytes_per_token(LifetimeClass.FULL)
    assert two.bytes_per_token(LifetimeClass.WINDOW) == 425_984 // 2
    jamba2 = load_model("jamba-v0.1", tp=2)
    assert jamba2.state_bytes == 8_716_288 // 2
