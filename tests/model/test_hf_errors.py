"""Bad configs raise typed errors that name the field, and leave the input untouched."""

from __future__ import annotations

import copy
import sys

import pytest

from kvchain.errors import ConfigError, MissingFieldError, UnknownFamilyError
from kvchain.model import WeightFormat, load_hf_config


@pytest.fixture(autouse=True)
def _raw_dict_path(monkeypatch):
    """These tests pin kvchain's own field checks on the raw dict: transformers' classes
    fill a missing field with the family default (the reading engines get) and refuse
    ill-typed values before kvchain sees them (then kvchain falls back to the raw dict).
    What transformers fills in is tested in test_hf_transformers.py."""
    monkeypatch.setitem(sys.modules, "transformers", None)

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1000,
}


def test_unknown_family_names_model_type_and_architectures():
    bad = {**LLAMA, "model_type": "rwkv", "architectures": ["RwkvForCausalLM"]}
    before = copy.deepcopy(bad)
    with pytest.raises(UnknownFamilyError, match=r"model_type=rwkv.*RwkvForCausalLM"):
        load_hf_config(bad)
    assert bad == before


def test_unknown_layer_kind_names_index_and_value():
    bad = {**LLAMA, "layer_types": ["full_attention", "retention"]}
    with pytest.raises(UnknownFamilyError, match=r"layer_types\[1\] = 'retention'"):
        load_hf_config(bad)
    pattern = {**LLAMA, "model_type": "nemotron_h", "hybrid_override_pattern": "*X"}
    with pytest.raises(UnknownFamilyError, match=r"hybrid_override_pattern\[1\] = 'X'"):
        load_hf_config(pattern)


def test_missing_head_dim_and_hidden_size():
    bad = {k: v for k, v in LLAMA.items() if k not in ("head_dim", "hidden_size")}
    with pytest.raises(MissingFieldError, match="head_dim") as info:
        load_hf_config(bad)
    assert "hidden_size" in str(info.value)


def test_missing_layer_count_and_heads():
    with pytest.raises(MissingFieldError, match="num_hidden_layers"):
        load_hf_config({k: v for k, v in LLAMA.items() if k != "num_hidden_layers"})
    with pytest.raises(MissingFieldError, match="num_attention_heads"):
        load_hf_config({k: v for k, v in LLAMA.items() if k != "num_attention_heads"})


def test_missing_vocab_for_parameter_count():
    with pytest.raises(MissingFieldError, match="vocab_size"):
        load_hf_config({k: v for k, v in LLAMA.items() if k != "vocab_size"})


@pytest.mark.parametrize("window", [0, -128])
def test_zero_or_negative_window(window):
    bad = {**LLAMA, "model_type": "mistral", "sliding_window": window}
    with pytest.raises(ConfigError, match=rf"'sliding_window' must be positive, got {window}"):
        load_hf_config(bad)


def test_zero_chunk_and_missing_window_field():
    chunked = {**LLAMA, "model_type": "llama4_text", "attention_chunk_size": 0}
    with pytest.raises(ConfigError, match="attention_chunk_size"):
        load_hf_config(chunked)
    no_window = {**LLAMA, "layer_types": ["sliding_attention", "full_attention"]}
    with pytest.raises(MissingFieldError, match="sliding_window"):
        load_hf_config(no_window)


def test_tp_not_dividing_heads():
    with pytest.raises(ConfigError, match="tp=3 does not divide num_attention_heads=4"):
        load_hf_config(LLAMA, tp=3)
    odd_kv = {**LLAMA, "num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 384}
    with pytest.raises(ConfigError, match="num_key_value_heads=3"):
        load_hf_config(odd_kv, tp=2)
    for tp in (0, -1):
        with pytest.raises(ConfigError, match="tp must be a positive integer"):
            load_hf_config(LLAMA, tp=tp)


def test_tp_not_dividing_state_heads():
    mamba = {
        **LLAMA,
        "layer_types": ["mamba2", "full_attention"],
        "mamba_num_heads": 6,
        "mamba_head_dim": 32,
        "ssm_state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
    }
    with pytest.raises(ConfigError, match="tp=4 does not divide mamba num_heads=6"):
        load_hf_config(mamba, tp=4)


def test_layer_list_length_mismatch():
    bad = {**LLAMA, "layer_types": ["full_attention"] * 3}
    with pytest.raises(ConfigError, match="'layer_types' has 3 entries but num_hidden_layers is 2"):
        load_hf_config(bad)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_hf_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        load_hf_config(broken)
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_hf_config(array)


def test_non_integer_jet_value_dim():
    jet = {
        **LLAMA,
        "layer_types": ["jet", "attn"],
        "efficient_attention_config": {
            "jet": {"num_heads": 2, "head_dim": 96, "expand_v": 1.3, "conv_size": 4}
        },
    }
    with pytest.raises(ConfigError, match="expand_v"):
        load_hf_config(jet)


def test_unsupported_quantization_needs_explicit_format():
    quant = {**LLAMA, "quantization_config": {"quant_method": "awq"}}
    with pytest.raises(ConfigError, match="quant_method='awq'"):
        load_hf_config(quant)
    spec = load_hf_config(quant, weight_format=WeightFormat.BF16)
    assert spec.weight_bytes == 2 * spec.total_params


def test_field_of_wrong_type():
    with pytest.raises(ConfigError, match="'num_key_value_heads' must be a number"):
        load_hf_config({**LLAMA, "num_key_value_heads": "two"})


def test_bad_moe_and_no_rope_lists():
    moe = {**LLAMA, "num_local_experts": 4, "num_experts_per_tok": 1, "moe_layer_freq": [1]}
    with pytest.raises(ConfigError, match="'moe_layer_freq' has 1 entries"):
        load_hf_config(moe)
    rope = {**LLAMA, "model_type": "llama4_text", "no_rope_layers": [1, 2]}
    with pytest.raises(ConfigError, match="no_rope_layers must hold 0 or 1"):
        load_hf_config(rope)
