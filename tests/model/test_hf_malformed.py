"""Malformed Hugging Face configs raise typed errors naming the field: never a traceback, a
hang, a memory blow-up or silently wrong numbers (bugs found by an adversarial tester)."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

import kvchain.catalog
from kvchain.errors import ConfigError, KVChainError
from kvchain.model import load_hf_config
from kvchain.model.hf_layers import read_config


@pytest.fixture(autouse=True)
def _raw_dict_path(monkeypatch):
    """These tests pin kvchain's own field checks on the raw dict: transformers' classes
    fill a missing field with the family default (the reading engines get) and refuse
    ill-typed values before kvchain sees them (then kvchain falls back to the raw dict).
    What transformers fills in is tested in test_hf_transformers.py."""
    monkeypatch.setitem(sys.modules, "transformers", None)

# The verbatim HF configs packaged with kvchain (catalog/data/SOURCES.md).
CONFIGS = Path(kvchain.catalog.__file__).parent / "data" / "model_configs"
NEMOTRON3 = CONFIGS / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json"
QWEN3_NEXT = CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Thinking.json"
LLAMA4 = CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json"
JET = CONFIGS / "jet-ai--Jet-Nemotron-2B.json"

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


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def _with(base: dict, **changes: object) -> dict:
    out = copy.deepcopy(base)
    text = out.get("text_config")
    target = text if isinstance(text, dict) else out
    target.update(changes)
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_key_value_heads"])
def test_non_finite_numbers_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        load_hf_config({**LLAMA, field: value})


def test_nan_and_infinity_read_from_a_json_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA).replace('"head_dim": 64', '"head_dim": NaN'))
    with pytest.raises(ConfigError, match="head_dim"):
        load_hf_config(path)
    path.write_text(json.dumps(LLAMA).replace('"vocab_size": 1000', '"vocab_size": Infinity'))
    with pytest.raises(ConfigError, match="vocab_size"):
        load_hf_config(path)


@pytest.mark.parametrize("archs", [5, 1.5, {"a": 1}, [1, 2], True])
def test_non_string_architectures_refused(archs):
    with pytest.raises(ConfigError, match="architectures"):
        load_hf_config({**LLAMA, "architectures": archs})


def test_string_architectures_still_accepted():
    spec = load_hf_config({**LLAMA, "architectures": "LlamaForCausalLM"})
    assert spec.num_layers == 2


@pytest.mark.parametrize("path", [LLAMA4, QWEN3_NEXT, NEMOTRON3])
@pytest.mark.parametrize("layers", [1e30, 10**30, 10_001])
def test_absurd_layer_count_is_refused_fast(path, layers):
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_hf_config(_with(_raw(path), num_hidden_layers=layers))


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "intermediate_size"])
def test_absurd_sizes_are_refused(field):
    with pytest.raises(ConfigError, match=field):
        load_hf_config({**LLAMA, field: 1e30})


def test_read_config_wraps_directory_and_binary_files(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path))):
        read_config(tmp_path)
    binary = tmp_path / "config.json"
    binary.write_bytes(b'{"model_type": "\xff\xfe"}')
    with pytest.raises(ConfigError, match=r"config\.json"):
        read_config(binary)


def test_read_config_wraps_deep_nesting_and_huge_integers(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"deep\.json"):
        read_config(deep)
    huge = tmp_path / "huge.json"
    huge.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match=r"huge\.json"):
        read_config(huge)


def test_nemotron3_reference_numbers():
    spec = load_hf_config(NEMOTRON3)
    assert spec.state_bytes == 170_229_760
    assert spec.active_params < spec.total_params


@pytest.mark.parametrize("groups", [0, -1, -8, 2.5, True])
def test_nemotron3_bad_n_groups_refused(groups):
    with pytest.raises(ConfigError, match="n_groups"):
        load_hf_config(_with(_raw(NEMOTRON3), n_groups=groups))


@pytest.mark.parametrize("experts", [0, -1, None])
def test_nemotron3_moe_without_experts_refused(experts):
    with pytest.raises(ConfigError, match="n_routed_experts"):
        load_hf_config(_with(_raw(NEMOTRON3), n_routed_experts=experts))


def test_top_k_above_experts_refused():
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        load_hf_config(_with(_raw(NEMOTRON3), num_experts_per_tok=1e6))
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        load_hf_config(_with(_raw(NEMOTRON3), num_experts_per_tok=513))


@pytest.mark.parametrize("field", ["moe_intermediate_size", "moe_shared_expert_intermediate_size"])
def test_negative_intermediate_sizes_refused(field):
    with pytest.raises(ConfigError, match=field):
        load_hf_config(_with(_raw(NEMOTRON3), **{field: -5376}))


def test_negative_dense_intermediate_size_refused():
    with pytest.raises(ConfigError, match="intermediate_size"):
        load_hf_config({**LLAMA, "intermediate_size": -512})


@pytest.mark.parametrize(
    "field", ["shared_expert_intermediate_size", "moe_latent_size", "n_shared_experts"]
)
def test_negative_moe_extras_refused(field):
    raw = _raw(QWEN3_NEXT) if field == "shared_expert_intermediate_size" else _raw(NEMOTRON3)
    with pytest.raises(ConfigError, match=field):
        load_hf_config(_with(raw, **{field: -1}))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"v_head_dim": 0}, "v_head_dim"),
        ({"sliding_window": 4096, "layer_types": [7, "full_attention"]}, "layer_types"),
        (
            {"model_type": "gemma3", "sliding_window": 8, "sliding_window_pattern": 0},
            "sliding_window_pattern",
        ),
        (
            {"model_type": "gemma3", "sliding_window": 8, "sliding_window_pattern": -2},
            "sliding_window_pattern",
        ),
        ({"attn_type_list": [[1], 0]}, "attn_type_list"),
        (
            {
                "model_type": "qwen3",
                "sliding_window": 8,
                "use_sliding_window": True,
                "max_window_layers": -1,
            },
            "max_window_layers",
        ),
    ],
)
def test_bad_optional_fields_refused(changes, field):
    with pytest.raises(ConfigError, match=field):
        load_hf_config({**LLAMA, **changes})


@pytest.mark.parametrize("expand", ["abc", float("nan"), [2], -1.0])
def test_jet_bad_expand_v_refused(expand):
    raw = _raw(JET)
    raw["efficient_attention_config"]["jet"]["expand_v"] = expand
    with pytest.raises(ConfigError, match="expand_v"):
        load_hf_config(raw)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")))
def test_every_bundled_config_still_loads_with_active_at_most_total(path):
    spec = load_hf_config(path)
    assert 0 < spec.active_params <= spec.total_params
    assert spec.weight_bytes > 0


FUZZ_VALUES = [None, -1, 0, 1.5, float("nan"), float("inf"), 1e30, "x", [1], {"a": 1}, True]


@pytest.mark.parametrize("path", [NEMOTRON3, QWEN3_NEXT, LLAMA4, JET])
def test_every_field_fuzzed_raises_only_typed_errors(path):
    raw = _raw(path)
    fields = raw.get("text_config", raw)
    reference = load_hf_config(raw)
    for key in list(fields):
        for value in FUZZ_VALUES:
            try:
                spec = load_hf_config(_with(raw, **{key: value}))
            except KVChainError:
                continue
            assert 0 < spec.active_params <= spec.total_params, (key, value)
            assert spec.weight_bytes > 0, (key, value)
            assert spec.num_layers <= 10_000
    assert load_hf_config(raw) == reference


@pytest.mark.parametrize("tp", [True, 0, -2, 1.0])
def test_bad_tp_refused(tp):
    with pytest.raises(ConfigError, match="tp"):
        load_hf_config(LLAMA, tp=tp)


def test_the_packaged_configs_are_found():
    """The parametrized test above must not pass by collecting nothing: the package ships
    13 verbatim configs (catalog/data/SOURCES.md lists them)."""
    assert len(sorted(CONFIGS.glob("*.json"))) == 14
