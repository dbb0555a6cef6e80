"""The GPU table and the KV buffer budget."""

from __future__ import annotations

import dataclasses

import pytest

from kvchain.errors import ConfigError, UnknownGPUError
from kvchain.gpu import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    KNOWN_GPUS,
    GPUSpec,
    get_gpu,
    kv_buffer_bytes,
)


@pytest.mark.parametrize(("alias", "memory", "flops", "bandwidth"), [
    ("a100", 80_000_000_000, 312e12, 2.039e12),
    ("h100", 80_000_000_000, 989.4e12, 3.35e12),
    ("h200", 141_000_000_000, 989.4e12, 4.8e12),
    ("b200", 180_000_000_000, 2.25e15, 8e12),
])
def test_datasheet_figures(alias, memory, flops, bandwidth):
    gpu = get_gpu(alias)
    assert gpu.memory_bytes == memory
    assert gpu.peak_dense_bf16_flops == flops
    assert gpu.hbm_bytes_per_s == bandwidth
    assert "datasheet" in gpu.source


@pytest.mark.parametrize("name", ["H200", "h200", " H200 ", "h200_sxm", "H200 SXM",
                                  "H200-SXM-141GB", "h200-141gb"])
def test_lookup_is_case_insensitive_with_aliases(name):
    assert get_gpu(name).name == "H200-SXM-141GB"


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownGPUError, match=r"known: .*a100.*b200.*h100.*h200") as info:
        get_gpu("mi300x")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ConfigError)


def test_names_are_unique_and_ridge():
    assert len({g.name for g in KNOWN_GPUS}) == len(KNOWN_GPUS) == 4
    assert round(get_gpu("h100").ridge_flop_per_byte) == 295
    assert round(get_gpu("h200").ridge_flop_per_byte) == 206


def test_kv_buffer_bytes_default_reserve():
    assert DEFAULT_ACTIVATION_RESERVE_BYTES == 3 * 2**30
    # 141e9 x 0.9 = 126.9e9; minus 16e9 of weights and 3 GiB
    assert kv_buffer_bytes(get_gpu("h200"), 16 * 10**9) == 107_678_774_528


def test_kv_buffer_bytes_explicit():
    h100 = get_gpu("h100")
    assert kv_buffer_bytes(h100, 10**9, mem_fraction=1.0, activation_reserve_bytes=0) \
        == 79_000_000_000
    assert kv_buffer_bytes(h100, 0, mem_fraction=0.5, activation_reserve_bytes=10) \
        == 39_999_999_744  # 39,999,999,990 rounded down to 256 B


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, float("nan")])
def test_bad_fraction(fraction):
    with pytest.raises(ConfigError, match="mem_fraction"):
        kv_buffer_bytes(get_gpu("a100"), 0, mem_fraction=fraction)


def test_weights_exceed_memory_names_numbers():
    with pytest.raises(ConfigError, match=r"weights 70,000,000,000 B \+ reserve "
                                          r"3,221,225,472 B exceed 72,000,000,000 B"):
        kv_buffer_bytes(get_gpu("a100"), 70 * 10**9)
    with pytest.raises(ConfigError):
        kv_buffer_bytes(get_gpu("a100"), -1)
    with pytest.raises(ConfigError):
        kv_buffer_bytes(get_gpu("a100"), 0, activation_reserve_bytes=-1)


def test_spec_validation_and_replace():
    with pytest.raises(ConfigError):
        GPUSpec("x", 0, 1.0, 1.0, "")
    with pytest.raises(ConfigError):
        GPUSpec("x", 1, float("inf"), 1.0, "")
    measured = dataclasses.replace(get_gpu("h200"), memory_bytes=150_100_000_000)
    assert kv_buffer_bytes(measured, 0, mem_fraction=1.0, activation_reserve_bytes=0) \
        == 150_100_000_000
    with pytest.raises(dataclasses.FrozenInstanceError):
        measured.memory_bytes = 1  # type: ignore[misc]
