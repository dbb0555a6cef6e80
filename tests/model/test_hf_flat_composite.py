"""Flat configs of composite (multimodal) transformers classes, and the defaulted-fields
report (issue 25, item 1).

A composite class (``Step3p7Config``, ``Qwen3_5Config``, ``Qwen3_5MoeConfig``,
``Gemma4Config``) builds its language model only from a nested ``text_config``; before the
fix a flat config read through it became the text class's defaults (a 4-layer flat
``step3p7`` loaded as ``Step3p7TextConfig``'s 45 full layers with its 128,000-token
context). Each family here is read flat and nested, through transformers and as the raw
dict: all four readings give the bytes derived by hand. On c9a1289 the flat transformers
reading fails for step3p7, qwen3_5, qwen3_5_moe, gemma4 and gemma3; llama4 read right
there already (kept as a case of the same kind).
"""

from __future__ import annotations

import json
import sys
from importlib import resources

import pytest

from kvchain.model import LifetimeClass, load_hf_config
from kvchain.model.hf_layers import read_config

FULL, WINDOW, LOCAL, STATE = (LifetimeClass.FULL, LifetimeClass.WINDOW, LifetimeClass.LOCAL,
                              LifetimeClass.STATE)


@pytest.fixture(params=["transformers", "raw-dict"])
def reader(request, monkeypatch):
    if request.param == "raw-dict":
        monkeypatch.setitem(sys.modules, "transformers", None)
    else:
        pytest.importorskip("transformers", reason="the transformers reader needs transformers")
    return request.param


STEP = {
    "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "vocab_size": 1000, "intermediate_size": 512, "max_position_embeddings": 4096,
}
QWEN35 = {
    "num_hidden_layers": 2, "hidden_size": 2048, "vocab_size": 248320,
    "intermediate_size": 512, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 8192,
}
QWEN35_MOE = {**QWEN35, "num_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64}
GEMMA4 = {
    "num_hidden_layers": 6, "hidden_size": 2816, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "num_global_key_value_heads": 2,
    "global_head_dim": 512, "attention_k_eq_v": True, "sliding_window": 1024,
    "intermediate_size": 2112, "vocab_size": 262144, "max_position_embeddings": 131072,
}

GEMMA3 = {
    "num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 512, "vocab_size": 1000,
    "intermediate_size": 512, "max_position_embeddings": 8192,
}
# Llama 4 Scout's text model: the bundled published config's text_config
LLAMA4 = {k: v for k, v in json.loads(resources.files("kvchain.catalog").joinpath(
    "data", "model_configs", "meta-llama--Llama-4-Scout-17B-16E-Instruct.json").read_text())[
        "text_config"].items() if k != "model_type"}

# model_type -> (text fields, layers, {lifetime: bytes per token or per slot}, window, context)
CASES = {
    # 2 window + 2 full layers, each 2 KV heads x (64 + 64) x 2 B = 512 B
    "step3p7": (STEP, 4, {WINDOW: 2 * 512, FULL: 2 * 512}, 128, 4096),
    # Gated DeltaNet: conv 3 x (2 x 16 x 128 + 32 x 128 = 8,192) x 2 B + recurrent
    # 32 x 128 x 128 x 4 B (mamba_ssm_dtype float32) = 2,146,304 B; full layer
    # 2 KV heads x (256 + 256) x 2 B = 2,048 B
    "qwen3_5": (QWEN35, 2, {STATE: 2_146_304, FULL: 2_048}, None, 8192),
    "qwen3_5_moe": (QWEN35_MOE, 2, {STATE: 2_146_304, FULL: 2_048}, None, 8192),
    # Gemma4TextConfig: layers 0-4 window (8 KV heads x (256 + 256) x 2 B = 8,192 B each),
    # layer 5 full with global_head_dim 512 and 2 global KV heads: 2 x 1,024 x 2 B
    "gemma4": (GEMMA4, 6, {WINDOW: 5 * 8_192, FULL: 4_096}, 1024, 131072),
    # the same kind, two more composite classes: Gemma3Config (layers 0-4 window, 5 full,
    # 2 KV heads x (64 + 64) x 2 B = 512 B each) and Llama4Config (36 chunked-local and
    # 12 NoPE full layers of 8 KV heads x (128 + 128) x 2 B = 4,096 B; chunk 8,192)
    "gemma3": (GEMMA3, 6, {WINDOW: 5 * 512, FULL: 512}, 512, 8192),
    "llama4": (LLAMA4, 48, {LOCAL: 36 * 4_096, FULL: 12 * 4_096}, None, 10_485_760),
}


def _bytes(spec):
    return {c.lifetime: c.bytes_per_slot if c.lifetime is STATE else c.bytes_per_token
            for c in spec.classes}


@pytest.mark.parametrize("model_type", sorted(CASES))
@pytest.mark.parametrize("spelling", ["flat", "nested"])
def test_flat_and_nested_read_the_same(model_type, spelling, reader):
    fields, layers, nbytes, window, context = CASES[model_type]
    config = ({"model_type": model_type, **fields} if spelling == "flat"
              else {"model_type": model_type, "text_config": dict(fields)})
    spec = load_hf_config(config)
    assert spec.num_layers == layers
    assert _bytes(spec) == nbytes
    windows = [c.window for c in spec.classes if c.lifetime is WINDOW]
    assert windows == ([window] if window else [])
    assert spec.max_context_tokens == context


def test_flat_and_nested_give_equal_models(reader):
    """Beyond bytes: parameters, weights and the defaulted-fields report agree too."""
    for model_type, (fields, *_rest) in CASES.items():
        flat = load_hf_config({"model_type": model_type, **fields}, name="m")
        nested = load_hf_config({"model_type": model_type, "text_config": dict(fields)},
                                name="m")
        assert flat.classes == nested.classes, model_type
        assert (flat.total_params, flat.weight_bytes) == (nested.total_params,
                                                          nested.weight_bytes), model_type
        assert flat.defaulted == nested.defaulted, model_type


def test_a_field_the_file_omits_is_reported_with_who_supplied_it():
    """Qwen3_5TextConfig's default context (32,768 tokens) stands in for the absent
    max_position_embeddings: it is listed on the model with the class that gave it."""
    pytest.importorskip("transformers", reason="the class default needs transformers")
    fields = {k: v for k, v in QWEN35.items() if k != "max_position_embeddings"}
    spec = load_hf_config({"model_type": "qwen3_5", **fields})
    assert spec.max_context_tokens == 32_768
    noted = {d.field: d for d in spec.defaulted}
    assert noted["max_position_embeddings"].value == "32768"
    assert noted["max_position_embeddings"].by.endswith("Qwen3_5Config")
    # sibling: the same file with the field set lists no default for it
    assert "max_position_embeddings" not in {
        d.field for d in load_hf_config({"model_type": "qwen3_5", **QWEN35}).defaulted}


def test_a_derived_field_is_not_reported_as_a_default():
    """LlamaConfig derives head_dim = hidden_size / num_attention_heads = 4096 / 32 = 128,
    which is also its default: derived from the file, so not a default."""
    pytest.importorskip("transformers", reason="the class view needs transformers")
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 1000,
             "intermediate_size": 512, "max_position_embeddings": 4096,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    assert load_hf_config(llama).defaulted == ()


def test_kvchain_rule_defaults_are_reported_by_the_raw_reader():
    """Without transformers, a Gemma 3 config without sliding_window_pattern takes the
    rule's 6 (Gemma3TextConfig's default), and without num_key_value_heads the query
    heads (MHA); a config without a 16-bit torch_dtype gets bf16 caches by default."""
    gemma = {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 256,
             "num_attention_heads": 4, "head_dim": 64, "sliding_window": 512,
             "vocab_size": 1000, "intermediate_size": 512}
    spec = load_hf_config(gemma, use_transformers=False)
    noted = {d.field: d.value for d in spec.defaulted}
    assert noted == {"sliding_window_pattern": "6", "num_key_value_heads": "4",
                     "kv_cache_dtype": "bf16"}
    # 5 window layers + 1 full, each 4 KV heads x (64 + 64) x 2 B = 1,024 B
    assert _bytes(spec) == {WINDOW: 5 * 1_024, FULL: 1_024}
    # sibling: the same model with every such field set reports nothing
    full = {**gemma, "sliding_window_pattern": 6, "num_key_value_heads": 4,
            "torch_dtype": "bfloat16"}
    assert load_hf_config(full, use_transformers=False).defaulted == ()


def test_read_config_names_who_supplied_each_field():
    pytest.importorskip("transformers", reason="the class view needs transformers")
    cfg = read_config({"model_type": "step3p7", **{k: v for k, v in STEP.items()
                                                    if k != "max_position_embeddings"}})
    assert cfg.get("max_position_embeddings") == 128_000  # Step3p7TextConfig's default
    assert cfg.supplied["max_position_embeddings"].endswith("Step3p7Config")
    assert "num_hidden_layers" not in cfg.supplied  # the file's own 4
