"""Issue-13 families and readings, each byte count derived by hand from the architecture.

Every config runs through both readers: transformers' configuration class (when the
installed transformers knows the model_type) and the raw dict (transformers made
unimportable), and both must give the same bytes unless a test says why not.
Sources of the shapes: transformers 5.24 modeling files named per test; vLLM
MambaStateShapeCalculator conventions for conv states (K-1 columns).
"""

from __future__ import annotations

import sys

import pytest

from kvchain.errors import ConfigError
from kvchain.model import CacheDtype, LifetimeClass, load_hf_config
from kvchain.model.hf_layers import read_config

FULL, WINDOW, LOCAL, STATE = (
    LifetimeClass.FULL,
    LifetimeClass.WINDOW,
    LifetimeClass.LOCAL,
    LifetimeClass.STATE,
)


@pytest.fixture(params=["transformers", "raw-dict"])
def reader(request, monkeypatch):
    if request.param == "raw-dict":
        monkeypatch.setitem(sys.modules, "transformers", None)
    else:  # transformers' configuration classes: only where transformers is installed
        pytest.importorskip("transformers", reason="the transformers reader needs transformers")
    return request.param


def shape(spec):
    """(lifetime, window, layer indices, bytes per token or per slot) of each class."""
    return [
        (c.lifetime, c.window, [x.index for x in c.layers],
         c.bytes_per_token if c.is_token_class else c.bytes_per_slot)
        for c in spec.classes
    ]


# --- item 1: the minimal configs -------------------------------------------------

QWEN35 = {
    "model_type": "qwen3_5_text", "num_hidden_layers": 2, "hidden_size": 2048,
    "vocab_size": 248320, "intermediate_size": 512,
    "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
}


def test_qwen35_state_honours_mamba_ssm_dtype(reader):
    spec = load_hf_config(QWEN35)
    # conv (3, 2*16*128 + 32*128 = 8,192) bf16 + recurrent (32, 128, 128) fp32
    assert spec.state_bytes == 3 * 8_192 * 2 + 32 * 128 * 128 * 4 == 2_146_304
    # full layer: 2 KV heads x (256 + 256) x 2 B
    assert spec.bytes_per_token(FULL) == 2 * 512 * 2
    # Qwen3_5TextConfig's default context (the raw dict declares none)
    assert spec.max_context_tokens == (32_768 if reader == "transformers" else None)


def test_state_dtype_override_beats_the_config():
    spec = load_hf_config(QWEN35, state_dtype=CacheDtype.BF16)
    assert spec.state_bytes == (3 * 8_192 + 32 * 128 * 128) * 2 == 1_097_728


def test_reader_is_named():
    pytest.importorskip("transformers", reason="the transformers reader needs transformers")
    assert read_config(QWEN35).reader.startswith("transformers ")
    assert read_config(QWEN35).reader.endswith(" Qwen3_5TextConfig")
    assert read_config(QWEN35, use_transformers=False).reader == "raw dict"


def test_unknown_model_type_falls_back_to_the_raw_dict():
    cfg = read_config({**QWEN35, "model_type": "not_a_transformers_family"})
    assert cfg.reader == "raw dict"


def test_transformers_is_not_imported_by_kvchain():
    import os
    import subprocess

    code = "import sys, kvchain, kvchain.model, kvchain.cli; print('transformers' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == "False"
    # sibling: the same probe sees transformers once a config has been read
    pytest.importorskip("transformers", reason="the sibling probe needs transformers")
    code = ("import sys; from kvchain.model import load_hf_config; "
            "load_hf_config({'model_type': 'llama', 'num_hidden_layers': 1, "
            "'hidden_size': 64, 'num_attention_heads': 1, 'vocab_size': 10, "
            "'intermediate_size': 8}); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == "True"


GEMMA4 = {
    "model_type": "gemma4_text", "num_hidden_layers": 6, "hidden_size": 2816,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "num_global_key_value_heads": 2, "global_head_dim": 512, "attention_k_eq_v": True,
    "sliding_window": 1024, "enable_moe_block": True, "num_experts": 128,
    "top_k_experts": 8, "moe_intermediate_size": 704, "intermediate_size": 2112,
    "vocab_size": 262144,
}


def test_gemma4_global_layers_have_their_own_geometry(reader):
    spec = load_hf_config(GEMMA4)
    # Gemma4TextConfig: layers 0-4 sliding, 5 full; full layers use global_head_dim 512
    # and (attention_k_eq_v) 2 global KV heads; K and V both cached (v_norm differs from
    # k_norm in Gemma4TextAttention): 2 x (512 + 512) x 2 B = 4,096 B, not 8 x 512 x 2.
    assert shape(spec) == [
        (WINDOW, 1024, [0, 1, 2, 3, 4], 5 * 8 * (256 + 256) * 2),
        (FULL, None, [5], 2 * (512 + 512) * 2),
    ]
    # top_k_experts = 8 routed experts per token of 128; each expert 3 x 2816 x 704
    expert = 3 * 2816 * 704
    assert spec.total_params - spec.active_params == 6 * (128 - 8) * expert


def test_gemma4_without_k_eq_v_keeps_local_kv_heads(reader):
    spec = load_hf_config({**GEMMA4, "attention_k_eq_v": False})
    assert spec.bytes_per_token(FULL) == 8 * (512 + 512) * 2


def test_gemma4_kv_shared_layers_keep_no_cache(reader):
    # 12 layers W W W W W F W W W W W F; the last 4 (8..11) reuse earlier KV
    spec = load_hf_config({**GEMMA4, "num_hidden_layers": 12, "num_kv_shared_layers": 4})
    assert shape(spec) == [
        (WINDOW, 1024, [0, 1, 2, 3, 4, 6, 7], 7 * 8 * 512 * 2),
        (FULL, None, [5], 2 * 1024 * 2),
    ]


NEMOTRON_H = {
    "model_type": "nemotron_h", "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
    "hidden_size": 1024, "mamba_num_heads": 16, "mamba_head_dim": 64, "n_groups": 2,
    "ssm_state_size": 128, "conv_kernel": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 1000, "intermediate_size": 100,
}


def test_nemotron_h_depth_from_the_pattern(reader):
    spec = load_hf_config(NEMOTRON_H)
    assert spec.num_layers == 4
    # Mamba-2: conv (3, 1024 + 2*2*128) bf16; ssm (16, 64, 128): NemotronHConfig defaults
    # mamba_ssm_cache_dtype to float32; the raw dict declares none, so bf16 there.
    ssm = 16 * 64 * 128 * (4 if reader == "transformers" else 2)
    assert shape(spec) == [
        (STATE, None, [0, 3], 2 * (3 * 1536 * 2 + ssm)),
        (FULL, None, [1], 2 * 256 * 2),
    ]


# --- dtype fields ------------------------------------------------------------------------

LLAMA = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 512, "vocab_size": 1000,
}


@pytest.mark.parametrize(("fields", "nbytes"), [
    ({}, 2),
    ({"kv_cache_dtype": "fp8_e4m3"}, 1),
    ({"kv_cache_dtype": "auto"}, 2),
    ({"quantization_config": {"quant_method": "fp8", "kv_cache_scheme":
                              {"num_bits": 8, "type": "float"}}}, 1),
    ({"quantization_config": {"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}}, 1),
])
def test_kv_dtype_fields(reader, fields, nbytes):
    spec = load_hf_config({**LLAMA, **fields})
    assert spec.bytes_per_token(FULL) == 2 * 2 * (64 + 64) * nbytes


def test_kv_dtype_override_beats_the_config():
    spec = load_hf_config({**LLAMA, "kv_cache_dtype": "fp8"}, kv_dtype=CacheDtype.FP32)
    assert spec.bytes_per_token(FULL) == 2 * 2 * 128 * 4


def test_unknown_dtype_spelling_is_a_typed_error():
    bad = {**LLAMA, "kv_cache_dtype": "int3"}
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        load_hf_config(bad)
    assert bad["kv_cache_dtype"] == "int3"


def test_mamba_cache_dtype_sets_both_state_tensors(reader):
    spec = load_hf_config({**NEMOTRON_H, "mamba_cache_dtype": "float32",
                           "mamba_ssm_cache_dtype": "float32"})
    assert spec.state_bytes == 2 * (3 * 1536 * 4 + 16 * 64 * 128 * 4)


# --- item 2: families --------------------------------------------------------------------


def test_pure_mamba2_is_state_only(reader):
    # transformers' Mamba2Mixer: conv over intermediate + 2*n_groups*state_size channels,
    # ssm state (num_heads, head_dim, state_size)
    spec = load_hf_config({
        "model_type": "mamba2", "num_hidden_layers": 2, "hidden_size": 256, "num_heads": 8,
        "head_dim": 64, "expand": 2, "n_groups": 1, "state_size": 16, "conv_kernel": 4,
        "vocab_size": 1000,
    })
    assert shape(spec) == [(STATE, None, [0, 1], 2 * (3 * (512 + 32) * 2 + 8 * 64 * 16 * 2))]


def test_pure_mamba1_is_state_only(reader):
    # transformers' MambaMixer: conv (K-1, intermediate), ssm (intermediate, state_size)
    spec = load_hf_config({
        "model_type": "mamba", "num_hidden_layers": 3, "hidden_size": 128, "expand": 2,
        "state_size": 16, "conv_kernel": 4, "vocab_size": 1000,
    })
    assert shape(spec) == [(STATE, None, [0, 1, 2], 3 * (3 * 256 * 2 + 256 * 16 * 2))]


SAMBAY = {
    "model_type": "phi4flash", "num_hidden_layers": 8, "mb_per_layer": 2,
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "sliding_window": 128, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
}


def test_sambay_has_three_classes(reader):
    # Phi4FlashDecoderLayer (microsoft/Phi-4-mini-flash-reasoning modeling_phi4flash.py),
    # n = 8: Mamba-1 at 0, 2, 4 (4 = n/2 is still a Mamba layer, yoco_cross starts at 6);
    # window attention at 1, 3 (self-decoder); full at 5 (= n/2 + 1, its KV feeds the
    # cross-decoder); 6, 7 are a GMU and a cross-attention layer without cache.
    spec = load_hf_config(SAMBAY)
    mamba = 3 * 512 * 2 + 512 * 16 * 2  # conv (3, 2*256) + ssm (512, 16), bf16
    kv = 2 * (64 + 64) * 2  # 2 KV heads x head_dim 256/4 = 64
    assert shape(spec) == [
        (STATE, None, [0, 2, 4], 3 * mamba),
        (WINDOW, 128, [1, 3], 2 * kv),
        (FULL, None, [5], kv),
    ]
    assert spec.max_context_tokens == 4096


PHI4_FLASH = "microsoft--Phi-4-mini-flash-reasoning.json"


def test_phi4_mini_flash_reads_the_published_file_unedited(reader):
    """The published config.json, read as bundled (no key added): 32 layers, 2560 wide,
    40 heads, 20 KV heads, window 512, and no mamba_* field (c9a1289 refused it: "lacks
    'mamba_expand'"). Phi4FlashConfig's defaults apply (d_state 16, d_conv 4, expand 2):
    9 Mamba layers x (3 x 5120 + 5120 x 16) x 2 B; 8 window layers x 20 x 128 x 2 B; one
    full layer. The defaults used are reported with their source."""
    from importlib import resources

    path = resources.files("kvchain.catalog").joinpath("data", "model_configs", PHI4_FLASH)
    spec = load_hf_config(str(path))
    assert spec.state_bytes == 9 * (3 * 5120 + 5120 * 16) * 2 == 1_751_040
    assert spec.bytes_per_token(WINDOW) == 8 * 20 * 128 * 2 == 40_960
    assert spec.bytes_per_token(FULL) == 20 * 128 * 2 == 5_120
    assert spec.max_context_tokens == 262_144  # the file's own max_position_embeddings
    noted = {d.field: d.value for d in spec.defaulted}
    assert {k: noted.get(k) for k in ("mamba_d_state", "mamba_d_conv", "mamba_expand")} == {
        "mamba_d_state": "16", "mamba_d_conv": "4", "mamba_expand": "2"}
    assert all("configuration_phi4flash.py" in d.by for d in spec.defaulted)
    # sibling: fields the file sets (window, KV heads) are not listed as defaults
    assert not {"sliding_window", "num_key_value_heads", "num_hidden_layers"} & set(noted)


def test_phi4_flash_file_values_beat_the_class_defaults(reader):
    """A field the file sets wins over the table (mamba_d_state 32 doubles the ssm part:
    (3 x 512 + 512 x 32) x 2 B per Mamba layer of the 8-layer toy)."""
    spec = load_hf_config({**SAMBAY, "mamba_d_state": 32})
    assert spec.state_bytes == 3 * (3 * 512 + 512 * 32) * 2
    assert "mamba_d_state" not in {d.field for d in spec.defaulted}


KIMI = {
    "model_type": "kimi_linear", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 4, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32, "v_head_dim": 32, "q_lora_rank": None,
    "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3],
                           "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4},
    "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 64,
    "intermediate_size": 512, "first_k_dense_replace": 1, "vocab_size": 1000,
}


def test_kimi_linear_kda_and_mla(reader):
    # KimiDeltaAttention (transformers modeling_kimi_linear.py): one conv over q, k, v
    # (3 x 4 heads x 32 = 384 channels, K-1 = 3 columns), recurrent (4, 32, 32);
    # MLA layer 3: latent kv_lora_rank + qk_rope_head_dim = 80 elements per token
    spec = load_hf_config(KIMI)
    assert shape(spec) == [
        (STATE, None, [0, 1, 2], 3 * (3 * 384 * 2 + 4 * 32 * 32 * 2)),
        (FULL, None, [3], (64 + 16) * 2),
    ]


DSV4 = {
    "model_type": "deepseek_v4", "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4],
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128,
    "q_lora_rank": 32, "sliding_window": 16, "index_head_dim": 32, "index_n_heads": 4,
    "o_groups": 2, "o_lora_rank": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "n_shared_experts": 1, "vocab_size": 1000,
}


def test_deepseek_v4_compressed_kv(reader):
    # DeepseekV4Attention / DeepseekV4HCACache / DeepseekV4CSACache (transformers):
    # every layer keeps a 16-token window of one shared K=V head (128 x 2 B = 256 B);
    # CSA keeps one 128-element KV entry + one 32-element indexer key per 4 tokens
    # ((128 + 32) / 4 x 2 B = 80 B per token); HCA one 128-element entry per 128 tokens
    # (2 B per token). Compressed entries live as long as the request: the full class.
    spec = load_hf_config(DSV4)
    assert shape(spec) == [
        (WINDOW, 16, [0, 1, 2, 3], 4 * 256),
        (FULL, None, [1, 2, 3], 80 + 2 + 80),
    ]


def test_compressed_entry_must_split_evenly():
    with pytest.raises(ConfigError, match="group of 128"):
        load_hf_config({**DSV4, "head_dim": 96, "compress_ratios": [128, 0, 0, 0]},
                       use_transformers=False)


TOY = {
    "model_type": "toy_multi_window", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 512, "vocab_size": 1000,
}


def test_two_window_sizes_give_two_window_classes():
    spec = load_hf_config({
        **TOY,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention"],
        "sliding_window": [128, 11, None, 128],
    })
    kv = 2 * 128 * 2  # 2 KV heads x (64 + 64) x 2 B
    assert shape(spec) == [
        (WINDOW, 11, [1], kv),
        (WINDOW, 128, [0, 3], 2 * kv),
        (FULL, None, [2], kv),
    ]
    assert [c.window for c in spec.cache_classes(WINDOW)] == [11, 128]
    assert spec.bytes_per_token(WINDOW) == 3 * kv


def test_window_next_to_chunked_local():
    spec = load_hf_config({
        **TOY,
        "layer_types": ["sliding_attention", "chunked_attention", "full_attention",
                        "chunked_attention"],
        "sliding_window": 128, "attention_chunk_size": 256,
    })
    kv = 2 * 128 * 2
    assert shape(spec) == [
        (WINDOW, 128, [0], kv),
        (LOCAL, 256, [1, 3], 2 * kv),
        (FULL, None, [2], kv),
    ]


def test_per_layer_window_list_needs_a_window_for_each_window_layer():
    from kvchain.errors import MissingFieldError

    with pytest.raises(MissingFieldError, match="layer 1"):
        load_hf_config({**TOY, "layer_types": ["sliding_attention"] * 4,
                        "sliding_window": [128, None, 11, 11]})


def test_multimodal_wrappers_read_their_text_config(reader):
    # Gemma4Config / Qwen3_5Config keep the language model under text_config; the raw keys
    # the text class consumes (global_head_dim...) must survive the class's view of it
    gemma = {k: v for k, v in GEMMA4.items() if k != "model_type"}
    spec = load_hf_config({"model_type": "gemma4",
                           "text_config": {**gemma, "model_type": "gemma4_text"}})
    assert spec.bytes_per_token(FULL) == 2 * (512 + 512) * 2
    qwen = {k: v for k, v in QWEN35.items() if k != "model_type"}
    spec = load_hf_config({"model_type": "qwen3_5",
                           "text_config": {**qwen, "model_type": "qwen3_5_text"}})
    assert spec.state_bytes == 2_146_304
