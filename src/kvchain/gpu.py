"""The GPU table: published peaks of the GPUs the simulator models, and the KV budget.

Units: bytes (memory), FLOP/s (dense bf16 Tensor Core rate, no 2:4 sparsity), bytes/s (HBM
bandwidth). Vendor datasheets state memory in decimal GB (10^9 B) and bandwidth in TB/s
(10^12 B/s); this table stores exactly those figures as bytes.

Memory convention: ``memory_bytes`` is the datasheet figure read as decimal bytes, e.g.
H200 "141 GB" -> ``141 x 10^9 B`` (131.3 GiB). The runtime reports more: an H200 here
showed 143,771 MiB in ``nvidia-smi`` (150.75e9 B; ``shared`` device notes, KINDS.md) and
about 139.8 GiB (150.1e9 B) usable to CUDA; vLLM logs ``total_gpu_memory 79.22GiB``
(85.06e9 B) on an H100 "80 GB" (vllm-project/vllm PR #10511). We adopt the datasheet
number anyway because (1) every GPU has one, cited; (2) it is conservative: a simulated KV
buffer is never larger than a real one; (3) all GPUs use the same convention, so results
compare like with like. For a measured capacity, build a :class:`GPUSpec` with
``dataclasses.replace(get_gpu("h200"), memory_bytes=...)``.

Dense vs sparse: NVIDIA's Hopper and Blackwell datasheets print Tensor Core rates "with
sparsity"; the dense rate is half (the datasheets' own footnote). The A100 datasheet
prints both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvchain.errors import ConfigError, UnknownGPUError

GiB = 2**30

#: Bytes ``kv_buffer_bytes`` holds back for activations and non-torch allocations when the
#: caller gives no reserve: 3 GiB. Source: vLLM's profiling run for Llama-3-8B on an H100
#: (vllm-project/vllm PR #10511, "overhaul memory profiling"): ``non_torch_memory
#: 1.79GiB`` + ``PyTorch activation peak memory 1.26GiB`` = 3.05 GiB besides weights and
#: KV cache. A fixed round number keeps the budget simple and stated; pass the number an
#: engine's profiling run reports for other models.
DEFAULT_ACTIVATION_RESERVE_BYTES = 3 * GiB


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Published figures of one GPU.

    Attributes:
        name: display name, e.g. ``"H200-SXM-141GB"``.
        memory_bytes: HBM capacity in bytes (datasheet GB x 10^9; module docstring).
        peak_dense_bf16_flops: dense bf16 Tensor Core rate, FLOP/s (no sparsity).
        hbm_bytes_per_s: peak HBM bandwidth, bytes/s.
        source: the vendor document the figures come from.

    Raises:
        ConfigError: a non-positive figure or an empty name.
    """

    name: str
    memory_bytes: int
    peak_dense_bf16_flops: float
    hbm_bytes_per_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a GPU needs a name")
        for field, value in (("memory_bytes", self.memory_bytes),
                             ("peak_dense_bf16_flops", self.peak_dense_bf16_flops),
                             ("hbm_bytes_per_s", self.hbm_bytes_per_s)):
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"GPU {self.name}: {field} must be positive, got {value}")

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which work is compute-bound at peak:
        ``peak_dense_bf16_flops / hbm_bytes_per_s`` (H100 SXM: 989.4e12 / 3.35e12 = 295)."""
        return self.peak_dense_bf16_flops / self.hbm_bytes_per_s


A100_80GB_SXM = GPUSpec(
    name="A100-SXM4-80GB",
    memory_bytes=80 * 10**9,
    peak_dense_bf16_flops=312e12,
    hbm_bytes_per_s=2.039e12,
    source=("NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-"
            "r4-web.pdf), A100 80GB SXM: 80GB HBM2e, 2,039 GB/s, BFLOAT16 Tensor Core 312 "
            "TFLOPS (624 with sparsity)"),
)

H100_SXM = GPUSpec(
    name="H100-SXM5-80GB",
    memory_bytes=80 * 10**9,
    peak_dense_bf16_flops=989.4e12,
    hbm_bytes_per_s=3.35e12,
    source=("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80GB, 3.35TB/s, BFLOAT16 "
            "Tensor Core 1,979 TFLOPS with sparsity (dense: half; NVIDIA Hopper architecture "
            "whitepaper table: 989.4 TFLOPS dense bf16)"),
)

H200_SXM = GPUSpec(
    name="H200-SXM-141GB",
    memory_bytes=141 * 10**9,
    peak_dense_bf16_flops=989.4e12,
    hbm_bytes_per_s=4.8e12,
    source=("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141GB HBM3e, 4.8TB/s, "
            "BFLOAT16 Tensor Core 1,979 TFLOPS with sparsity (dense: half, the H100's "
            "Hopper Tensor Cores)"),
)

B200_SXM = GPUSpec(
    name="B200-SXM-180GB",
    memory_bytes=180 * 10**9,
    peak_dense_bf16_flops=2.25e15,
    hbm_bytes_per_s=8e12,
    source=("NVIDIA DGX B200 / HGX B200 datasheets: 8 GPUs with 1,440GB HBM3e (180GB each) "
            "and 64TB/s (8TB/s each), FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with "
            "sparsity (2.25 dense) at 1,000 W; MLPerf Inference v6.0 systems list the part "
            "as 'NVIDIA B200-SXM-180GB' (180 GB). Early announcements said 192 GB: the "
            "shipping HGX/DGX part has 180 GB enabled"),
)

KNOWN_GPUS: tuple[GPUSpec, ...] = (A100_80GB_SXM, H100_SXM, H200_SXM, B200_SXM)

_ALIASES: dict[str, GPUSpec] = {
    **{g.name.lower(): g for g in KNOWN_GPUS},
    "a100": A100_80GB_SXM, "a100-80gb": A100_80GB_SXM, "a100-sxm": A100_80GB_SXM,
    "a100-sxm4": A100_80GB_SXM, "a100-sxm-80gb": A100_80GB_SXM,
    "h100": H100_SXM, "h100-sxm": H100_SXM, "h100-sxm5": H100_SXM, "h100-80gb": H100_SXM,
    "h200": H200_SXM, "h200-sxm": H200_SXM, "h200-141gb": H200_SXM,
    "b200": B200_SXM, "b200-sxm": B200_SXM, "b200-180gb": B200_SXM,
}


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name, case-insensitively; spaces and underscores count as ``-``.

    Aliases: ``a100`` (80GB SXM), ``h100`` (SXM), ``h200``, ``b200``, and each full name
    (``"H200-SXM-141GB"``).

    Raises:
        UnknownGPUError: no GPU of that name; the message lists the known names.
    """
    key = "-".join(str(name).strip().lower().replace("_", "-").split())
    try:
        return _ALIASES[key]
    except KeyError:
        known = ", ".join(sorted({"a100", "h100", "h200", "b200"}
                                 | {g.name for g in KNOWN_GPUS}))
        raise UnknownGPUError(f"unknown GPU {name!r}; known: {known}") from None


KV_BUFFER_ALIGN_BYTES = 256
"""Alignment of KV buffers sized by :func:`kv_buffer_bytes` (bytes)."""


def kv_buffer_bytes(gpu: GPUSpec, weight_bytes: int, *, mem_fraction: float = 0.9,
                    activation_reserve_bytes: int | None = None) -> int:
    """Bytes left for the KV buffer on one GPU:
    ``floor(memory_bytes x mem_fraction) - weight_bytes - activation_reserve_bytes``,
    rounded down to a multiple of :data:`KV_BUFFER_ALIGN_BYTES` (256) so that every page
    grid - including a HIGH END's, anchored at the buffer's end - starts aligned for the
    kernels' typed views.

    ``mem_fraction`` plays the role of vLLM's ``gpu_memory_utilization`` (default 0.9 there
    too); the reserve defaults to :data:`DEFAULT_ACTIVATION_RESERVE_BYTES` (3 GiB).

    Example: H200 (141e9 B), 16e9 B of weights, defaults:
    ``126,900,000,000 - 16,000,000,000 - 3,221,225,472 = 107,678,774,528 B``.

    Raises:
        ConfigError: ``mem_fraction`` outside ``(0, 1]``; negative weights or reserve; or
            nothing left ("weights X B + reserve Y B exceed Z B").
    """
    if not (0.0 < mem_fraction <= 1.0):
        raise ConfigError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    reserve = DEFAULT_ACTIVATION_RESERVE_BYTES if activation_reserve_bytes is None \
        else activation_reserve_bytes
    if weight_bytes < 0 or reserve < 0:
        raise ConfigError(f"weight_bytes ({weight_bytes}) and activation_reserve_bytes "
                          f"({reserve}) must be >= 0")
    usable = math.floor(gpu.memory_bytes * mem_fraction)
    left = usable - weight_bytes - reserve
    if left <= 0:
        raise ConfigError(
            f"weights {weight_bytes:,} B + reserve {reserve:,} B exceed {usable:,} B "
            f"({mem_fraction:g} of {gpu.name}'s {gpu.memory_bytes:,} B): no room for a KV "
            f"buffer; split the weights over more tensor-parallel ranks (--tp N) or give the "
            f"buffer size (--buffer-bytes)")
    return left - left % KV_BUFFER_ALIGN_BYTES
