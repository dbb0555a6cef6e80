"""Tiny random-weight configs of real transformers families (scaled down, same layer kinds).

Every config keeps each layer kind of its family (sliding or chunked-local attention, full
attention, Mamba-2 or Gated DeltaNet) at the smallest width that transformers accepts:
hidden 32, 4 query heads, 2 KV heads of 8 dims, vocab 96, fp32. Windows and chunks are 8
tokens so that 4-token pages get released and reused within a 20-token request.
"""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = dict(vocab_size=96, hidden_size=32, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, intermediate_size=32,
                              max_position_embeddings=256, pad_token_id=None,
                              eos_token_id=None, bos_token_id=None)
_GDN: dict[str, Any] = dict(linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=8, linear_value_head_dim=8,
                            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=16, shared_expert_intermediate_size=16)

FAMILIES = ("gpt-oss", "gemma-3", "llama-4", "qwen3-next", "nemotron-h", "lara-mini")


def family_config(name: str) -> Any:
    """The transformers config of family ``name`` (one of :data:`FAMILIES`)."""
    import transformers as tf

    if name == "gpt-oss":  # window + full, attention sinks, MoE
        return tf.GptOssConfig(**COMMON, num_hidden_layers=2, sliding_window=8,
                               layer_types=["sliding_attention", "full_attention"],
                               num_local_experts=4, num_experts_per_tok=2)
    if name == "gemma-3":  # window + full (real models: 5 window layers per full one)
        return tf.Gemma3TextConfig(**COMMON, num_hidden_layers=2, sliding_window=8,
                                   layer_types=["sliding_attention", "full_attention"])
    if name == "llama-4":  # chunked-local (RoPE) + full (NoPE), MoE
        # attn_temperature_tuning scales NoPE queries by a position taken from
        # cache.get_seq_length(), one number for the whole batch: off, so that rows of
        # different lengths can decode together.
        return tf.Llama4TextConfig(**COMMON, intermediate_size_mlp=32, num_hidden_layers=2,
                                   attention_chunk_size=8, no_rope_layers=[1, 0],
                                   num_local_experts=2, attn_temperature_tuning=False)
    if name == "qwen3-next":  # Gated DeltaNet + full (gated attention), MoE
        return tf.Qwen3NextConfig(**COMMON, **_GDN, num_hidden_layers=2,
                                  layer_types=["linear_attention", "full_attention"])
    if name == "nemotron-h":  # Mamba-2 + full + MLP-only layers
        return tf.NemotronHConfig(**COMMON, num_hidden_layers=4,
                                  layers_block_type=["linear_attention", "mlp",
                                                     "full_attention", "mlp"],
                                  mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8,
                                  n_groups=2, conv_kernel=4, chunk_size=8)
    if name == "lara-mini":  # Gated DeltaNet + window + full: three bands (state|window|full)
        return tf.LaraMiniConfig(**COMMON, **_GDN, num_hidden_layers=3, sliding_window=8,
                                 layer_types=["linear_attention", "sliding_attention",
                                              "full_attention"])
    raise KeyError(name)


def build_model(name: str, device: str = "cpu", seed: int = 0,
                init_std: float | None = None) -> Any:
    """A random-weight fp32 model of family ``name`` in eval mode (seeded); ``init_std``
    sets the weights' standard deviation (``initializer_range``; default: the family's)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = family_config(name)
    if init_std is not None:
        config.initializer_range = init_std
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(device).eval()
