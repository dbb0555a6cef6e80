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


# Memory as the device reports it (nvidia-smi memory.total, MiB x 2^20), each figure cited
# in gpu.py: A100 80GB 81,920 MiB, H100 SXM 81,559 MiB, H200 143,771 MiB, B200 183,359
# MiB. On c9a1289 these were the datasheets' decimal GB (80e9, 80e9, 141e9, 180e9).
@pytest.mark.parametrize(("alias", "memory", "mib", "flops", "bandwidth", "cited"), [
    ("a100", 85_899_345_920, "81,920 MiB", 312e12, 2.039e12, "modal-labs/modal-client"),
    ("h100", 85_520_809_984, "81559MiB", 989.4e12, 3.35e12, "NVIDIA/nccl issue #1264"),
    ("h200", 150_754_820_096, "143771MiB", 989.4e12, 4.8e12, "sgl-project/sglang issue #3196"),
    ("b200", 192_265_846_784, "183359MiB", 2.25e15, 8e12, "NVIDIA/TensorRT-LLM issue #10278"),
])
def test_device_reported_memory_and_datasheet_rates(alias, memory, mib, flops, bandwidth,
                                                     cited):
    gpu = get_gpu(alias)
    assert gpu.memory_bytes == memory  # e.g. 143,771 x 1,048,576 = 150,754,820,096
    assert gpu.memory_bytes % 2**20 == 0
    assert gpu.peak_dense_bf16_flops == flops
    assert gpu.hbm_bytes_per_s == bandwidth
    assert "datasheet" in gpu.source and mib in gpu.source and cited in gpu.source


def test_local_gpu_reads_cuda_or_refuses():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        local = get_gpu("local")
        assert local.memory_bytes == torch.cuda.mem_get_info(0)[1]
        assert "(local)" in local.name
    else:
        with pytest.raises(UnknownGPUError, match="needs a CUDA GPU visible to torch"):
            get_gpu("local")


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
    # floor(150,754,820,096 x 0.9) = 135,679,338,086; minus 16e9 of weights and 3 GiB
    # (3,221,225,472) = 116,458,112,614, down to a multiple of 256 (614 - 102):
    assert kv_buffer_bytes(get_gpu("h200"), 16 * 10**9) == 116_458_112_512


def test_kv_buffer_bytes_explicit():
    h100 = get_gpu("h100")
    # 85,520,809,984 - 1e9 (both multiples of 256)
    assert kv_buffer_bytes(h100, 10**9, mem_fraction=1.0, activation_reserve_bytes=0) \
        == 84_520_809_984
    assert kv_buffer_bytes(h100, 0, mem_fraction=0.5, activation_reserve_bytes=10) \
        == 42_760_404_736  # 42,760,404,992 - 10, rounded down to 256 B


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, float("nan")])
def test_bad_fraction(fraction):
    with pytest.raises(ConfigError, match="mem_fraction"):
        kv_buffer_bytes(get_gpu("a100"), 0, mem_fraction=fraction)


def test_weights_exceed_memory_names_numbers():
    # floor(85,899,345,920 x 0.9) = 77,309,411,328
    with pytest.raises(ConfigError, match=r"weights 75,000,000,000 B \+ reserve "
                                          r"3,221,225,472 B exceed 77,309,411,328 B"):
        kv_buffer_bytes(get_gpu("a100"), 75 * 10**9)
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
