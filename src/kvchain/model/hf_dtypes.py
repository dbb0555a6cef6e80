"""Element types of the KV cache and the recurrent state, as a config declares them.

Every field that an engine reads for the cache's dtype is honoured, in this order (the
first present wins); a CLI or API override (``--kv-dtype``, ``--state-dtype``) beats all:

KV cache (attention K/V, MLA latents, compressed KV):

* ``kv_cache_dtype`` (the vLLM/SGLang engine argument, when a config carries it);
* ``quantization_config.kv_cache_quant_algo`` (NVIDIA ModelOpt checkpoints, ``"FP8"``;
  vLLM ``ModelOptFp8Config``);
* ``quantization_config.kv_cache_scheme`` (compressed-tensors checkpoints:
  ``{"num_bits": 8, "type": "float"}`` = fp8; vLLM ``CompressedTensorsConfig``);
* otherwise bf16: vLLM's ``kv_cache_dtype="auto"`` uses the model dtype, and
  ``torch_dtype``/``dtype`` of every bundled model is 16-bit (bf16 and fp16 both take
  2 bytes, so the byte counts do not depend on which).

Recurrent state (Mamba, Gated DeltaNet, KDA, lightning, JetBlock):

* SSM / recurrent ("temporal") state: ``mamba_ssm_cache_dtype`` (Nemotron-H / Nemotron 3;
  vLLM ``--mamba-ssm-cache-dtype``), ``mamba_ssm_dtype`` (Qwen3.5,
  transformers' ``Qwen3_5TextConfig`` passes it through), ``mamba_cache_dtype``
  (vLLM ``--mamba-cache-dtype``, both state tensors); default bf16;
* conv state: ``mamba_conv_dtype``, ``mamba_cache_dtype``; default bf16.

Value spellings accepted: ``float32``/``fp32``, ``bfloat16``/``bf16``,
``float16``/``fp16``/``half``, ``fp8``/``fp8_e4m3``/``fp8_e5m2``/``float8_*``; ``auto``
and ``null`` mean "not declared".

Example: Qwen3.5 with ``mamba_ssm_dtype: float32``: conv bf16, recurrent fp32, so a
Gated DeltaNet layer (16 k heads, 32 v heads, 128 x 128, kernel 4) holds
3 x 8,192 x 2 B + 32 x 128 x 128 x 4 B = 2,146,304 B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvchain.errors import ConfigError
from kvchain.model.hf_layers import HFConfig
from kvchain.model.layers import CacheDtype

_SPELLINGS: dict[str, CacheDtype] = {
    "float32": CacheDtype.FP32,
    "fp32": CacheDtype.FP32,
    "torch.float32": CacheDtype.FP32,
    "bfloat16": CacheDtype.BF16,
    "bf16": CacheDtype.BF16,
    "torch.bfloat16": CacheDtype.BF16,
    "float16": CacheDtype.FP16,
    "fp16": CacheDtype.FP16,
    "half": CacheDtype.FP16,
    "torch.float16": CacheDtype.FP16,
    "fp8": CacheDtype.FP8,
    "fp8_e4m3": CacheDtype.FP8,
    "fp8_e5m2": CacheDtype.FP8,
    "float8_e4m3fn": CacheDtype.FP8,
    "float8_e5m2": CacheDtype.FP8,
    "fp8_ds_mla": CacheDtype.FP8,
}


@dataclass(frozen=True, slots=True)
class DeclaredDtypes:
    """What a config declares (``None``: not declared, use the default).

    Attributes:
        kv: attention K/V dtype, and the field it came from.
        conv: conv-state dtype.
        temporal: SSM / recurrent state dtype.
        kv_field, conv_field, temporal_field: the field each came from (``""`` if none).
    """

    kv: CacheDtype | None
    conv: CacheDtype | None
    temporal: CacheDtype | None
    kv_field: str = ""
    conv_field: str = ""
    temporal_field: str = ""


def parse_dtype(value: object, field: str) -> CacheDtype | None:
    """A dtype spelling as a :class:`CacheDtype`; ``None`` for ``auto``/``null``.

    Raises:
        ConfigError: a spelling kvchain does not know (names the field and the value).
    """
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("", "auto"):
        return None
    if text not in _SPELLINGS:
        raise ConfigError(
            f"config field {field!r} = {value!r} is not a cache dtype kvchain knows "
            f"({sorted(_SPELLINGS)})"
        )
    return _SPELLINGS[text]


def _first(cfg: HFConfig, keys: tuple[str, ...]) -> tuple[CacheDtype | None, str]:
    for key in keys:
        parsed = parse_dtype(cfg.get(key), key)
        if parsed is not None:
            return parsed, key
    return None, ""


def _quantized_kv(cfg: HFConfig) -> tuple[CacheDtype | None, str]:
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None, ""
    algo = quant.get("kv_cache_quant_algo")
    if algo is not None:
        field = "quantization_config.kv_cache_quant_algo"
        return parse_dtype(algo, field), field
    scheme = quant.get("kv_cache_scheme")
    if isinstance(scheme, Mapping):
        field = "quantization_config.kv_cache_scheme"
        bits, kind = scheme.get("num_bits"), str(scheme.get("type", "float")).lower()
        if bits == 8 and kind == "float":
            return CacheDtype.FP8, field
        if bits == 16:
            return CacheDtype.BF16, field
        raise ConfigError(f"{field} = {dict(scheme)!r}: kvchain knows 8-bit float KV only")
    return None, ""


def config_dtypes(cfg: HFConfig) -> DeclaredDtypes:
    """The cache dtypes a config declares (see the module doc for the fields).

    Raises:
        ConfigError: a dtype spelling kvchain does not know, or a ``kv_cache_scheme`` other
            than 8-bit float.
    """
    kv, kv_field = _first(cfg, ("kv_cache_dtype",))
    if kv is None:
        kv, kv_field = _quantized_kv(cfg)
    temporal, t_field = _first(
        cfg, ("mamba_ssm_cache_dtype", "mamba_ssm_dtype", "mamba_cache_dtype")
    )
    conv, c_field = _first(cfg, ("mamba_conv_dtype", "mamba_cache_dtype"))
    return DeclaredDtypes(kv, conv, temporal, kv_field, c_field, t_field)
