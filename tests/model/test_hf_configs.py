"""Every bundled verbatim config.json loads with the classes and bytes derived by hand.

Per attention layer: kv_heads x (k_dim + v_dim) x 2 B (bf16). State shapes: vLLM
MambaStateShapeCalculator (conv (K-1, conv_dim), ssm/recurrent per head); JetBlock: NVlabs
Jet-Nemotron jet_block.py / dynamic_conv.py (recurrent (heads, 96, 256), conv cache
(value_dim, K) with all K = 4 columns).
"""

from __future__ import annotations

import json
import sys
from importlib import resources

import pytest

from kvchain.model import CacheDtype, LifetimeClass, load_hf_config

CONFIGS = resources.files("kvchain.catalog").joinpath("data").joinpath("model_configs")

FULL, WINDOW, LOCAL, STATE = (
    LifetimeClass.FULL,
    LifetimeClass.WINDOW,
    LifetimeClass.LOCAL,
    LifetimeClass.STATE,
)


def config(stem: str) -> dict:
    return json.loads(CONFIGS.joinpath(f"{stem}.json").read_text())


# stem -> {lifetime: (layers, bytes per token or per request, window)}
EXPECTED = {
    "openai--gpt-oss-120b": {
        WINDOW: (18, 18 * 8 * (64 + 64) * 2, 128),
        FULL: (18, 18 * 8 * (64 + 64) * 2, None),
    },
    "openai--gpt-oss-20b": {
        WINDOW: (12, 12 * 8 * 128 * 2, 128),
        FULL: (12, 12 * 8 * 128 * 2, None),
    },
    "Qwen--Qwen3-8B": {FULL: (36, 36 * 8 * 256 * 2, None)},
    # 28 layers x 8 KV heads x (128 + 128) x 2 B = 114,688 B per token (the draft of round 6)
    "Qwen--Qwen3-0.6B": {FULL: (28, 28 * 8 * 256 * 2, None)},
    "meta-llama--Meta-Llama-3.1-8B": {FULL: (32, 32 * 8 * 256 * 2, None)},
    "Qwen--Qwen3-Next-80B-A3B-Thinking": {
        # conv (3, 2*16*128 + 32*128) + recurrent (32, 128, 128), bf16
        STATE: (36, 36 * (3 * 8192 + 32 * 128 * 128) * 2, None),
        FULL: (12, 12 * 2 * 512 * 2, None),
    },
    "nvidia--Nemotron-H-56B-Base-8K": {
        # conv (3, 16384 + 2*8*256) bf16 + ssm (256, 64, 256) fp32: the config declares no
        # mamba_ssm_cache_dtype and transformers' NemotronHConfig defaults it to float32
        STATE: (54, 54 * (3 * 20480 * 2 + 256 * 64 * 256 * 4), None),
        FULL: (10, 10 * 8 * 256 * 2, None),
    },
    "MiniMaxAI--MiniMax-M1": {
        STATE: (70, 70 * 64 * 128 * 128 * 2, None),
        FULL: (10, 10 * 8 * 256 * 2, None),
    },
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": {
        LOCAL: (36, 36 * 8 * 256 * 2, 8192),
        FULL: (12, 12 * 8 * 256 * 2, None),
    },
    "jet-ai--Jet-Nemotron-2B": {
        # 24 JetBlocks: recurrent (12, 96, 256) + conv (12 * 256, 4), bf16
        STATE: (24, 24 * (12 * 96 * 256 + 3072 * 4) * 2, None),
        WINDOW: (2, 2 * 2 * 256 * 2, 1152),
        FULL: (2, 2 * 2 * 256 * 2, None),
    },
    "PowerInfer--SmallThinker-21BA3B-Instruct": {
        WINDOW: (39, 39 * 4 * 256 * 2, 4096),
        FULL: (13, 13 * 4 * 256 * 2, None),
    },
    "XiaomiMiMo--MiMo-V2-Flash": {
        # W = sliding_window_size + 1 = 129: transformers' MiMoV2FlashConfig (the SGLang
        # reference attends to 128 previous tokens plus the query)
        WINDOW: (39, 39 * 8 * (192 + 128) * 2, 129),
        FULL: (9, 9 * 4 * (192 + 128) * 2, None),
    },
    "microsoft--Phi-4-mini-flash-reasoning": {
        # SambaY, 32 layers (Phi4FlashDecoderLayer): Mamba-1 at 0, 2, ..., 16 (9 layers),
        # window attention at 1, 3, ..., 15 (8), full attention at 17 = n/2 + 1; 18..31
        # keep no cache. The file sets no mamba_* field: Phi4FlashConfig's defaults
        # d_state 16, d_conv 4, expand 2 -> d_inner 2 x 2560 = 5120; conv (3, 5120) +
        # ssm (5120, 16), bf16. 20 KV heads x head_dim 2560 / 40 = 64.
        STATE: (9, 9 * (3 * 5120 + 5120 * 16) * 2, None),
        WINDOW: (8, 8 * 20 * (64 + 64) * 2, 512),
        FULL: (1, 20 * (64 + 64) * 2, None),
    },
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8": {
        # conv (3, 8192 + 2*8*128) bf16 + ssm (128, 64, 128) fp32 (mamba_ssm_cache_dtype)
        STATE: (40, 40 * (3 * 10240 * 2 + 128 * 64 * 128 * 4), None),
        FULL: (8, 8 * 2 * 256 * 2, None),
    },
}


# Without transformers (the raw dict) two readings differ from the configuration classes':
# no NemotronHConfig default, so the SSM state stays bf16; MiMo's window is the raw
# sliding_window field, 128.
RAW_DIFFERS = {
    "nvidia--Nemotron-H-56B-Base-8K": {
        STATE: (54, 54 * (3 * 20480 + 256 * 64 * 256) * 2, None),
    },
    "XiaomiMiMo--MiMo-V2-Flash": {WINDOW: (39, 39 * 8 * (192 + 128) * 2, 128)},
}


def test_every_bundled_config_has_expectations():
    stems = {p.name.removesuffix(".json") for p in CONFIGS.iterdir() if p.name.endswith(".json")}
    assert stems == set(EXPECTED)


@pytest.mark.parametrize("raw", [False, True], ids=["transformers", "raw-dict"])
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_config_classes_and_bytes(stem, raw, monkeypatch):
    if raw:  # transformers "not installed": the raw-dict path must still load every config
        monkeypatch.setitem(sys.modules, "transformers", None)
    else:  # transformers' configuration classes: only where transformers is installed
        pytest.importorskip("transformers", reason="the transformers reader needs transformers")
    spec = load_hf_config(config(stem))
    expected = {**EXPECTED[stem], **(RAW_DIFFERS.get(stem, {}) if raw else {})}
    assert [c.lifetime for c in spec.classes] == [
        lt for lt in (STATE, WINDOW, LOCAL, FULL) if lt in expected
    ]
    for c in spec.classes:
        layers, nbytes, window = expected[c.lifetime]
        assert len(c.layers) == layers
        assert (c.bytes_per_slot if c.lifetime is STATE else c.bytes_per_token) == nbytes
        assert c.window == window


def test_worked_numbers_in_bytes():
    jet = load_hf_config(config("jet-ai--Jet-Nemotron-2B"))
    assert jet.bytes_per_token(FULL) == 2_048
    assert jet.bytes_per_token(WINDOW) == 2_048
    assert jet.state_bytes == 14_745_600
    nemo3 = load_hf_config(config("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    assert nemo3.state_bytes == 170_229_760
    assert nemo3.bytes_per_token(FULL) == 8_192
    mimo = load_hf_config(config("XiaomiMiMo--MiMo-V2-Flash"))
    assert (mimo.bytes_per_token(FULL), mimo.bytes_per_token(WINDOW)) == (23_040, 199_680)
    small = load_hf_config(config("PowerInfer--SmallThinker-21BA3B-Instruct"))
    assert (small.bytes_per_token(FULL), small.bytes_per_token(WINDOW)) == (26_624, 79_872)


def test_layer_placement():
    jet = load_hf_config(config("jet-ai--Jet-Nemotron-2B"))
    assert [layer.index for layer in jet.cache_class(FULL).layers] == [14, 19]
    assert [layer.index for layer in jet.cache_class(WINDOW).layers] == [20, 21]
    scout = load_hf_config(config("meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    assert [layer.index for layer in scout.cache_class(FULL).layers] == list(range(3, 48, 4))
    minimax = load_hf_config(config("MiniMaxAI--MiniMax-M1"))
    assert [layer.index for layer in minimax.cache_class(FULL).layers] == list(range(7, 80, 8))
    next_ = load_hf_config(config("Qwen--Qwen3-Next-80B-A3B-Thinking"))
    assert [layer.index for layer in next_.cache_class(FULL).layers] == list(range(3, 48, 4))
    mimo = load_hf_config(config("XiaomiMiMo--MiMo-V2-Flash"))
    assert [layer.index for layer in mimo.cache_class(FULL).layers] == [
        0, 5, 11, 17, 23, 29, 35, 41, 47
    ]


def test_tensor_shapes():
    jet = load_hf_config(config("jet-ai--Jet-Nemotron-2B"))
    state = jet.cache_class(STATE).layers[0]
    assert state.kind == "jet"
    assert [(t.name, t.shape, t.dtype) for t in state.tensors] == [
        ("recurrent", (12, 96, 256), CacheDtype.BF16),
        ("conv", (3072, 4), CacheDtype.BF16),
    ]
    mimo = load_hf_config(config("XiaomiMiMo--MiMo-V2-Flash"))
    full = mimo.cache_class(FULL).layers[0]
    assert [(t.name, t.shape) for t in full.tensors] == [("k", (4, 192)), ("v", (4, 128))]
    win = mimo.cache_class(WINDOW).layers[0]
    assert [(t.name, t.shape) for t in win.tensors] == [("k", (8, 192)), ("v", (8, 128))]
    nemo = load_hf_config(config("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    ssm = nemo.cache_class(STATE).layers[0]
    assert [(t.name, t.shape, t.dtype) for t in ssm.tensors] == [
        ("conv", (3, 10240), CacheDtype.BF16),
        ("ssm", (128, 64, 128), CacheDtype.FP32),
    ]


def test_model_fields():
    spec = load_hf_config(config("openai--gpt-oss-120b"))
    assert spec.name == "gpt_oss"  # a mapping without _name_or_path: its model_type
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.tp) == (
        36,
        2880,
        64,
        1,
    )
    named = load_hf_config(config("openai--gpt-oss-120b"), name="oss", source="here")
    assert (named.name, named.source) == ("oss", "here")


def test_load_from_path(tmp_path):
    path = tmp_path / "openai--gpt-oss-20b.json"
    path.write_text(json.dumps(config("openai--gpt-oss-20b")))
    spec = load_hf_config(path)
    assert spec.name == "gpt-oss-20b"
    assert spec.source == str(path)
    assert spec.bytes_per_token(FULL) == 24_576


# --- tensor parallelism and dtypes ------------------------------------------------------------


def test_tp2_halves_kv_where_heads_divide():
    one = load_hf_config(config("openai--gpt-oss-120b"))
    two = load_hf_config(config("openai--gpt-oss-120b"), tp=2)
    assert two.bytes_per_token(FULL) == one.bytes_per_token(FULL) // 2 == 18_432
    assert two.bytes_per_token(WINDOW) == 18_432
    assert two.num_attention_heads == 32
    assert two.tp == 2


def test_tp2_halves_state():
    one = load_hf_config(config("Qwen--Qwen3-Next-80B-A3B-Thinking"))
    two = load_hf_config(config("Qwen--Qwen3-Next-80B-A3B-Thinking"), tp=2)
    assert two.state_bytes == one.state_bytes // 2 == 19_759_104
    assert two.bytes_per_token(FULL) == 12_288
    jet2 = load_hf_config(config("jet-ai--Jet-Nemotron-2B"), tp=2)
    assert jet2.state_bytes == 7_372_800
    assert jet2.bytes_per_token(FULL) == 1_024  # 2 KV heads over 2 ranks: one each


def test_kv_heads_replicated_when_fewer_than_ranks():
    # Nemotron 3 Super: 2 KV heads, tp=4: each rank keeps one whole head (replicated x2).
    spec = load_hf_config(config("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"), tp=4)
    assert spec.bytes_per_token(FULL) == 8 * 1 * 256 * 2 == 4_096
    assert spec.state_bytes == 170_229_760 // 4
    # MiMo, tp=8: full layers 4 KV heads -> 1 per rank (replicated); window 8 -> 1 per rank.
    mimo = load_hf_config(config("XiaomiMiMo--MiMo-V2-Flash"), tp=8)
    assert mimo.bytes_per_token(FULL) == 9 * 1 * 320 * 2
    assert mimo.bytes_per_token(WINDOW) == 39 * 1 * 320 * 2


def test_kv_dtype_and_state_dtype():
    fp8 = load_hf_config(config("openai--gpt-oss-120b"), kv_dtype=CacheDtype.FP8)
    assert fp8.bytes_per_token(FULL) == 18_432
    nemo = load_hf_config(
        config("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"), state_dtype=CacheDtype.BF16
    )
    assert nemo.state_bytes == 40 * (3 * 10240 + 128 * 64 * 128) * 2 == 86_343_680
    qwen32 = load_hf_config(
        config("Qwen--Qwen3-Next-80B-A3B-Thinking"), state_dtype=CacheDtype.FP32
    )
    assert qwen32.state_bytes == 2 * 39_518_208
    assert qwen32.bytes_per_token(FULL) == 24_576  # kv_dtype untouched
