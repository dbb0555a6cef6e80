"""Family rules and generic per-layer lists, on small synthetic configs."""

from __future__ import annotations

from kvchain.model import LifetimeClass, load_hf_config

FULL, WINDOW, LOCAL, STATE = (
    LifetimeClass.FULL,
    LifetimeClass.WINDOW,
    LifetimeClass.LOCAL,
    LifetimeClass.STATE,
)

BASE = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1000,
}
PER_LAYER = 2 * (64 + 64) * 2  # 2 KV heads, K and V of 64, bf16: 512 B per token


def cfg(**fields):
    return {**BASE, **fields}


def indices(spec, lifetime):
    return [layer.index for layer in spec.cache_class(lifetime).layers]


def test_gemma3_pattern():
    spec = load_hf_config(
        cfg(model_type="gemma3_text", num_hidden_layers=12, sliding_window=1024)
    )
    assert indices(spec, FULL) == [5, 11]
    assert spec.cache_class(WINDOW).window == 1024
    assert spec.bytes_per_token(WINDOW) == 10 * PER_LAYER
    custom = load_hf_config(
        cfg(
            model_type="gemma3_text",
            num_hidden_layers=8,
            sliding_window=512,
            sliding_window_pattern=4,
        )
    )
    assert indices(custom, FULL) == [3, 7]


def test_gemma3_multimodal_reads_text_config():
    spec = load_hf_config(
        {
            "model_type": "gemma3",
            "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": cfg(model_type="gemma3_text", num_hidden_layers=6, sliding_window=64),
        }
    )
    assert indices(spec, FULL) == [5]
    assert spec.cache_class(WINDOW).window == 64


def test_gemma2_alternates_from_window():
    spec = load_hf_config(cfg(model_type="gemma2", num_hidden_layers=4, sliding_window=4096))
    assert indices(spec, WINDOW) == [0, 2]
    assert indices(spec, FULL) == [1, 3]


def test_jamba_attention_period():
    spec = load_hf_config(
        cfg(
            model_type="jamba",
            num_hidden_layers=16,
            attn_layer_period=8,
            attn_layer_offset=4,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
        )
    )
    assert indices(spec, FULL) == [4, 12]
    # Mamba-1, d_inner = 2 x 256: conv (3, 512) + ssm (512, 16), bf16
    assert spec.state_bytes == 14 * (3 * 512 + 512 * 16) * 2
    assert spec.cache_class(STATE).layers[0].kind == "mamba1"


def test_qwen3_next_interval():
    spec = load_hf_config(
        cfg(
            model_type="qwen3_next",
            num_hidden_layers=8,
            full_attention_interval=4,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        )
    )
    assert indices(spec, FULL) == [3, 7]
    # conv (3, 2*2*32 + 4*16) + recurrent (4, 16, 32)
    assert spec.state_bytes == 6 * (3 * 192 + 4 * 16 * 32) * 2


def test_llama4_without_no_rope_list_and_with_it():
    spec = load_hf_config(
        cfg(model_type="llama4_text", num_hidden_layers=8, attention_chunk_size=8192)
    )
    assert indices(spec, FULL) == [3, 7]
    assert indices(spec, LOCAL) == [0, 1, 2, 4, 5, 6]
    assert spec.cache_class(LOCAL).window == 8192
    listed = load_hf_config(
        cfg(
            model_type="llama4_text",
            num_hidden_layers=4,
            attention_chunk_size=16,
            no_rope_layers=[1, 0, 1, 0],
        )
    )
    assert indices(listed, FULL) == [1, 3]


def test_falcon_h1_every_layer_attention_and_mamba2():
    spec = load_hf_config(
        cfg(
            model_type="falcon_h1",
            num_hidden_layers=3,
            mamba_n_heads=8,
            mamba_d_head=32,
            mamba_d_state=16,
            mamba_n_groups=1,
            mamba_d_conv=4,
            mamba_d_ssm=256,
        )
    )
    assert indices(spec, FULL) == [0, 1, 2]
    assert indices(spec, STATE) == [0, 1, 2]
    # conv (3, 256 + 2*1*16) + ssm (8, 32, 16)
    assert spec.state_bytes == 3 * (3 * 288 + 8 * 32 * 16) * 2


def test_mistral_all_window_and_llama_all_full():
    mistral = load_hf_config(cfg(model_type="mistral", num_hidden_layers=4, sliding_window=4096))
    assert [c.lifetime for c in mistral.classes] == [WINDOW]
    assert mistral.bytes_per_token(WINDOW) == 4 * PER_LAYER
    llama = load_hf_config(cfg(model_type="llama", num_hidden_layers=4))
    assert [c.lifetime for c in llama.classes] == [FULL]
    qwen_off = load_hf_config(
        cfg(model_type="qwen3", num_hidden_layers=4, sliding_window=4096, use_sliding_window=False)
    )
    assert [c.lifetime for c in qwen_off.classes] == [FULL]
    qwen_on = load_hf_config(
        cfg(
            model_type="qwen2",
            num_hidden_layers=4,
            sliding_window=4096,
            use_sliding_window=True,
            max_window_layers=2,
        )
    )
    assert indices(qwen_on, WINDOW) == [2, 3]


def test_head_dim_derived_from_hidden_and_mha_default():
    spec = load_hf_config(
        {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
         "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 100}
    )
    # no head_dim: 256 / 4 = 64; no num_key_value_heads: MHA, 4 KV heads
    assert spec.bytes_per_token(FULL) == 2 * 4 * (64 + 64) * 2


def test_unseen_family_with_layer_types_loads():
    spec = load_hf_config(
        cfg(
            model_type="brand_new",
            num_hidden_layers=4,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention", "mamba2", "mlp"],
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=8,
            n_groups=2,
            conv_kernel=4,
        )
    )
    assert [c.lifetime for c in spec.classes] == [STATE, WINDOW, FULL]
    # one block per layer (an "mlp" entry is present): conv (3, 64 + 2*2*8) + ssm (4, 16, 8)
    assert spec.state_bytes == (3 * 96 + 4 * 16 * 8) * 2


def test_layers_block_type_and_plus_joined_kinds():
    spec = load_hf_config(
        cfg(
            model_type="zamba_like",
            num_hidden_layers=3,
            layers_block_type=["mamba", "hybrid", "full_attention+mamba"],
            mamba_d_state=4,
            mamba_d_conv=4,
            mamba_expand=1,
        )
    )
    assert indices(spec, FULL) == [1, 2]
    assert indices(spec, STATE) == [0, 1, 2]
    assert spec.cache_class(STATE).layers[0].kind == "mamba1"


def test_minimax_attn_type_list_lightning():
    spec = load_hf_config(
        cfg(
            model_type="minimax",
            num_hidden_layers=4,
            attn_type_list=[0, 0, 0, 1],
            num_local_experts=2,
            num_experts_per_tok=1,
        )
    )
    assert indices(spec, FULL) == [3]
    assert spec.state_bytes == 3 * 4 * 64 * 64 * 2  # (heads, head_dim, head_dim)


def test_mla_latent_is_one_tensor_and_replicated_over_ranks():
    deepseek = cfg(
        model_type="deepseek_v3",
        num_hidden_layers=2,
        num_key_value_heads=4,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=1536,
    )
    spec = load_hf_config(deepseek)
    layer = spec.cache_class(FULL).layers[0]
    assert layer.kind == "mla"
    assert [(t.name, t.shape) for t in layer.tensors] == [("latent", (1, 576))]
    assert spec.bytes_per_token(FULL) == 2 * 576 * 2
    assert load_hf_config(deepseek, tp=4).bytes_per_token(FULL) == 2 * 576 * 2


def test_mamba2_groups_replicated_when_fewer_than_ranks():
    one_group = cfg(
        model_type="custom",
        num_hidden_layers=1,
        layer_types=["mamba2"],
        mamba_num_heads=8,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=1,
        conv_kernel=4,
    )
    # tp=2: each rank keeps the (replicated) group: conv_dim = 256 + 2*2*16 = 320, / 2
    spec = load_hf_config(one_group, tp=2)
    assert spec.state_bytes == (3 * 160 + 4 * 32 * 16) * 2
