"""Parameter counts and weight bytes against hand arithmetic and published model cards.

Published totals come from the model cards on Hugging Face (and OpenAI's gpt-oss model
card, Table 1). Tolerances are stated per model: totals match within 0.5-3 %; "active"
labels like "A3B" are rounded to one significant digit, so those get wider bounds. What
the counter ignores (vectors, vision towers, MTP layers) is listed in kvchain.model.params.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from kvchain.catalog import load_model
from kvchain.model import LifetimeClass, WeightFormat, count_params, load_hf_config, weight_bytes
from kvchain.model.hf_layers import layer_plans, read_config

CONFIGS = resources.files("kvchain.catalog").joinpath("data").joinpath("model_configs")


def counts_of(stem: str):
    cfg = read_config(json.loads(CONFIGS.joinpath(f"{stem}.json").read_text()))
    return count_params(cfg, layer_plans(cfg))


def test_llama_31_8b_by_hand():
    c = counts_of("meta-llama--Meta-Llama-3.1-8B")
    embedding = 128_256 * 4_096
    attention = 4_096 * 4_096 * 2 + 4_096 * 1_024 * 2  # q, o; k, v
    mlp = 3 * 4_096 * 14_336
    assert (c.embedding, c.lm_head, c.tied) == (embedding, embedding, False)
    assert c.mixers == 32 * attention
    assert c.dense_mlp == 32 * mlp
    assert c.routed_experts == c.active_experts == c.shared == 0
    assert c.total == 8_029_995_008
    assert c.active == c.total - embedding  # the input lookup is not "active"


def test_gpt_oss_120b_by_hand():
    c = counts_of("openai--gpt-oss-120b")
    expert = 3 * 2_880 * 2_880
    assert c.routed_experts == 36 * 128 * expert == 114_661_785_600
    assert c.active_experts == 36 * 4 * expert
    assert c.shared == 36 * 2_880 * 128  # routers
    assert c.mixers == 36 * (2 * 2_880 * 64 * 64 + 2_880 * 8 * 128)
    assert c.total == 116_788_838_400


# name -> (published total, tolerance, published active, tolerance, source)
PUBLISHED = {
    "gpt-oss-120b": (116.83e9, 0.005, 5.13e9, 0.01, "OpenAI gpt-oss model card, Table 1"),
    "gpt-oss-20b": (20.91e9, 0.005, 3.61e9, 0.01, "OpenAI gpt-oss model card, Table 1"),
    "Qwen3-Next-80B-A3B": (80e9, 0.01, 3e9, 0.2, "Qwen/Qwen3-Next-80B-A3B-Thinking card"),
    "Llama-3.1-8B": (8.03e9, 0.001, None, None, "meta-llama/Llama-3.1-8B card"),
    "Jamba-v0.1": (52e9, 0.02, 12e9, 0.02, "ai21labs/Jamba-v0.1 card"),
    "Llama-4-Scout-17B-16E": (109e9, 0.02, 17e9, 0.06, "meta-llama Llama-4-Scout card"),
    "MiniMax-M1": (456e9, 0.005, 45.9e9, 0.03, "MiniMaxAI/MiniMax-M1-80k card"),
    "Qwen3-8B": (8.2e9, 0.005, None, None, "Qwen/Qwen3-8B card"),
    "MiMo-V2-Flash": (309e9, 0.005, 15e9, 0.02, "XiaomiMiMo/MiMo-V2-Flash card"),
    "Nemotron-3-Super-120B-A12B-FP8": (120e9, 0.01, 12e9, 0.02, "nvidia Nemotron 3 Super card"),
    "Nemotron-H-56B-Base-8K": (56e9, 0.01, None, None, "nvidia/Nemotron-H-56B-Base-8K card"),
    "SmallThinker-21BA3B": (21e9, 0.03, 3e9, 0.12, "PowerInfer/SmallThinker-21BA3B card"),
    "gemma-2-9b": (9.24e9, 0.001, None, None, "Gemma 2 technical report, Table 1"),
    "Mistral-7B-v0.1": (7.3e9, 0.015, None, None, "Mistral AI, 'Mistral 7B' announcement"),
    "Jet-Nemotron-2B": (2e9, 0.05, None, None, "jet-ai/Jet-Nemotron-2B card"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals(name):
    total, total_tol, active, active_tol, _source = PUBLISHED[name]
    spec = load_model(name)
    assert spec.total_params == pytest.approx(total, rel=total_tol)
    if active is not None:
        assert spec.active_params == pytest.approx(active, rel=active_tol)


def test_phi4_mini_flash_counts_its_cross_decoder():
    """Phi-4-mini-flash-reasoning (the bundled published config): h = 2560, vocab 200,064
    (tied), 32 gated MLPs of 3 x 2560 x 10240; 9 Mamba-1 layers (d_inner 5120, d_state 16,
    dt_rank 160, kernel 4) of 2hd + dK + d(r + 2n) + rd + dn + dh = 41,226,240; 9
    self-decoder attention layers of 3 x 2560 x 2560 (q, k+v of 20 x 64 x 2, out) =
    19,660,800. The cross-decoder (layers 18..31) keeps no cache but has weights (c9a1289
    counted none of them): 7 GMUs of 2 x 2560 x 5120 = 26,214,400 and 7 cross-attention
    layers of q + out = 2 x 2560 x 2560 = 13,107,200. Total 3,851,980,800; the checkpoint
    index's total_size is 7,706,608,640 B = 3,853,304,320 bf16 parameters (the rest are
    vectors, 0.03 %)."""
    spec = load_model("Phi-4-mini-flash-reasoning")
    self_decoder = (200_064 * 2560 + 32 * 3 * 2560 * 10240 + 9 * 41_226_240
                    + 9 * 19_660_800)
    assert self_decoder == 3_576_729_600
    assert spec.total_params == self_decoder + 7 * 26_214_400 + 7 * 13_107_200
    assert spec.total_params == 3_851_980_800
    assert spec.weight_bytes == 2 * 3_851_980_800  # bf16, no quantization_config
    assert 0 < 7_706_608_640 - spec.weight_bytes < 0.001 * 7_706_608_640


def test_mxfp4_experts_weight_bytes():
    c = counts_of("openai--gpt-oss-120b")
    expected = 2 * (c.total - c.routed_experts) + (c.routed_experts * 17 + 31) // 32
    assert weight_bytes(c, WeightFormat.MXFP4_EXPERTS) == expected
    spec = load_hf_config(json.loads(CONFIGS.joinpath("openai--gpt-oss-120b.json").read_text()))
    assert spec.weight_bytes == expected
    assert 64e9 < spec.weight_bytes < 66e9  # the published checkpoint is about 65 GB
    assert weight_bytes(c, WeightFormat.MXFP4_EXPERTS, tp=2) == -(-expected // 2)


def test_fp8_and_bf16_weight_bytes():
    c = counts_of("XiaomiMiMo--MiMo-V2-Flash")
    head = c.embedding + c.lm_head
    assert weight_bytes(c, WeightFormat.FP8) == 2 * head + (c.total - head)
    assert weight_bytes(c, WeightFormat.BF16) == 2 * c.total
    llama = counts_of("meta-llama--Meta-Llama-3.1-8B")
    assert weight_bytes(llama, WeightFormat.BF16, tp=4) == 2 * 8_029_995_008 // 4


def test_catalog_weight_format_override_for_fp8_checkpoint():
    # The Nemotron 3 Super FP8 config.json has no quantization_config; the catalog knows.
    spec = load_model("nemotron-3-super")
    c = counts_of("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    assert spec.weight_bytes == weight_bytes(c, WeightFormat.FP8)
    plain = load_hf_config(
        json.loads(
            CONFIGS.joinpath("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json").read_text()
        )
    )
    assert plain.weight_bytes == 2 * c.total


def test_tied_embeddings_count_once():
    c = counts_of("jet-ai--Jet-Nemotron-2B")
    assert c.tied and c.lm_head == 0
    assert c.active == c.total  # dense and tied: every parameter is read per token


def test_weight_bytes_rejects_bad_tp():
    from kvchain.errors import ConfigError

    with pytest.raises(ConfigError, match="tp must be >= 1"):
        weight_bytes(counts_of("Qwen--Qwen3-8B"), WeightFormat.BF16, tp=0)


def test_deepseek_v3_mla_and_moe():
    # Fields of deepseek-ai/DeepSeek-V3 config.json; model card: 671B total, 37B activated
    # (the 14B multi-token-prediction module is not counted there either).
    config = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "vocab_size": 129280,
        "tie_word_embeddings": False,
    }
    spec = load_hf_config(config)
    assert spec.total_params == pytest.approx(671e9, rel=0.002)
    assert spec.active_params == pytest.approx(37e9, rel=0.02)
    assert spec.bytes_per_token(LifetimeClass.FULL) == 61 * (512 + 64) * 2
