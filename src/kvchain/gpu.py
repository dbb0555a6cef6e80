"""The GPU table: published peaks of the GPUs the simulator models, and the KV budget.

Units: bytes (memory), FLOP/s (dense bf16 Tensor Core rate, no 2:4 sparsity), bytes/s (HBM
bandwidth). Vendor datasheets state bandwidth in TB/s (10^12 B/s) and rates in TFLOPS; this
table stores those figures as bytes/s and FLOP/s. Memory is not the datasheet's figure
(below).

Memory convention: ``memory_bytes`` is the memory the device reports, per GPU:
``nvidia-smi --query-gpu=memory.total`` in MiB x 2^20 (an H100 SXM "80 GB" reports
81,559 MiB = 85,520,809,984 B; an H200 "141 GB" 143,771 MiB = 150,754,820,096 B), each
figure cited on its GPU below. The datasheet's decimal GB (80e9, 141e9) understated what an
engine gets by 6-7%. CUDA's own total (``torch.cuda.mem_get_info()[1]``, what vLLM
multiplies by ``gpu_memory_utilization``) is a few hundred MiB lower still (vLLM logs
``total_gpu_memory 79.22GiB`` = 85.06e9 B on an H100, vllm-project/vllm PR #10511): the
driver's own reservation, not modelled; ``--gpu local`` (:func:`local_gpu`) reads that exact
figure on the machine it runs on.

What an engine keeps besides weights and the KV cache (:func:`kv_buffer_bytes`): vLLM's
rule (``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``): KV cache =
``total x gpu_memory_utilization - (weights + peak activation memory of a profiling
forward pass at the largest batch + non-torch memory: the CUDA context, NCCL buffers)``.
CUDA graphs are captured after the KV cache is allocated, so they live in the
``1 - gpu_memory_utilization`` headroom, as they do here. The reserve for activations and
non-torch memory defaults to :data:`DEFAULT_ACTIVATION_RESERVE_BYTES`.

Dense vs sparse: NVIDIA's Hopper and Blackwell datasheets print Tensor Core rates "with
sparsity"; the dense rate is half (the datasheets' own footnote). The A100 datasheet
prints both.

Host link (:class:`HostLink`, :attr:`GPUSpec.host_link`): the path between a GPU and host
memory that a host KV tier copies over, as a **nominal per-direction** rate. NVIDIA's
datasheets print both directions together ("PCIe Gen5: 128GB/s", "NVLink-C2C 900GB/s"); a
load-back uses one direction, so the table stores half. What a copy achieves is lower
(protocol overhead, DMA engines): the cost model applies an efficiency
(``kvchain.sim.cost.DEFAULT_HOST_LINK_EFFICIENCY``, with the measurements behind it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from kvchain.errors import ConfigError, UnknownGPUError
from kvchain.field_types import is_whole

GiB = 2**30

#: Bytes ``kv_buffer_bytes`` holds back, per rank, for what an engine keeps besides weights
#: and the KV cache inside its memory fraction - the peak activations of its profiling
#: forward pass and non-torch memory (CUDA context, NCCL buffers) - when the caller gives no
#: reserve: 3 GiB. Source: vLLM's profiling run for Llama-3-8B on an H100
#: (vllm-project/vllm PR #10511, "overhaul memory profiling"): ``non_torch_memory
#: 1.79GiB`` + ``PyTorch activation peak memory 1.26GiB`` = 3.05 GiB. The same model at
#: ``-tp 2`` logged ``non_torch_memory 3.58GiB`` (NCCL): under tensor parallelism the real
#: reserve is larger. CUDA graphs are not in it (module docstring). A fixed round number
#: keeps the budget simple and stated; pass the number an engine's profiling run reports.
DEFAULT_ACTIVATION_RESERVE_BYTES = 3 * GiB


@dataclass(frozen=True, slots=True)
class HostLink:
    """The link between one GPU and host memory (module docstring, "Host link").

    Attributes:
        name: e.g. ``"PCIe 5.0 x16"``, ``"NVLink-C2C"``.
        bytes_per_s: nominal rate of **one direction**, bytes/s (half of the datasheets'
            bidirectional figure).
        source: where the figure comes from.

    Raises:
        ConfigError: an empty name or a rate that is not a positive finite number.
    """

    name: str
    bytes_per_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a host link needs a name")
        if not (self.bytes_per_s > 0 and math.isfinite(self.bytes_per_s)):
            raise ConfigError(f"host link {self.name}: bytes_per_s must be positive, got "
                              f"{self.bytes_per_s}")


#: PCIe 4.0 x16 (A100 SXM to its host): 16 GT/s x 16 lanes = 32 GB/s per direction before
#: the 128b/130b line code (31.5 GB/s after).
PCIE4_X16 = HostLink(
    "PCIe 4.0 x16", 32e9,
    "NVIDIA A100 datasheet, A100 80GB SXM interconnect 'PCIe Gen4: 64GB/s' (both directions); "
    "PCIe 4.0: 16 GT/s per lane, x16")

#: PCIe 5.0 x16 (H100 / H200 SXM, and the B200 in HGX/DGX B200, to their x86 hosts):
#: 32 GT/s x 16 lanes = 64 GB/s per direction before the 128b/130b line code (63.0 GB/s
#: after).
PCIE5_X16 = HostLink(
    "PCIe 5.0 x16", 64e9,
    "NVIDIA H100 and H200 datasheets, SXM interconnect 'PCIe Gen5: 128GB/s' (both "
    "directions); PCIe 5.0: 32 GT/s per lane, x16. The DGX B200's hosts are Intel Xeon "
    "Platinum 8570 (PCIe 5.0), so a B200 reaches host memory over PCIe 5.0 x16 too")

#: NVLink-C2C (GH200 Grace Hopper, GB200 Grace Blackwell): 900 GB/s both directions per
#: GPU link, 450 GB/s each way. None of those GPUs is in :data:`KNOWN_GPUS` yet (their
#: reported memory is not sourced here); a ``GPUSpec`` built for one takes this link, and
#: :func:`local_gpu` gives it to a local GH200 / GB200.
NVLINK_C2C = HostLink(
    "NVLink-C2C", 450e9,
    "NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C 900GB/s bidirectional "
    "CPU-GPU; GB200: 900 GB/s bidirectional per NVLink-C2C link, one link per Blackwell GPU "
    "(NVIDIA Transformer Engine docs, CPU offloading, 'PCIe vs NVLink-C2C' figure)")


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Published figures of one GPU.

    Attributes:
        name: display name, e.g. ``"H200-SXM-141GB"``.
        memory_bytes: device memory in bytes as the device reports it (nvidia-smi
            ``memory.total`` MiB x 2^20, or CUDA's total for ``local``; module docstring).
        peak_dense_bf16_flops: dense bf16 Tensor Core rate, FLOP/s (no sparsity).
        hbm_bytes_per_s: peak HBM bandwidth, bytes/s.
        source: the vendor document the figures come from.
        host_link: the GPU's link to host memory (``None``: unknown; a host tier's copy
            time then cannot be priced).

    Raises:
        ConfigError: a non-positive figure or an empty name.
    """

    name: str
    memory_bytes: int
    peak_dense_bf16_flops: float
    hbm_bytes_per_s: float
    source: str
    host_link: HostLink | None = None

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


MiB = 2**20

A100_80GB_SXM = GPUSpec(
    name="A100-SXM4-80GB",
    memory_bytes=81_920 * MiB,
    peak_dense_bf16_flops=312e12,
    hbm_bytes_per_s=2.039e12,
    source=("NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-"
            "r4-web.pdf), A100 80GB SXM: 80GB HBM2e, 2,039 GB/s, BFLOAT16 Tensor Core 312 "
            "TFLOPS (624 with sparsity). Memory as the device reports it: nvidia-smi "
            "memory.total 81,920 MiB for an A100 80GB (modal-labs/modal-client PR #2797, "
            "the totals of their fleet; the same 81,920 MiB on an A800-SXM4-80GB, "
            "dexmal/dexbotic issue #41, driver 535.86.10)"),
    host_link=PCIE4_X16,
)

H100_SXM = GPUSpec(
    name="H100-SXM5-80GB",
    memory_bytes=81_559 * MiB,
    peak_dense_bf16_flops=989.4e12,
    hbm_bytes_per_s=3.35e12,
    source=("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80GB, 3.35TB/s, BFLOAT16 "
            "Tensor Core 1,979 TFLOPS with sparsity (dense: half; NVIDIA Hopper architecture "
            "whitepaper table: 989.4 TFLOPS dense bf16). Memory as the device reports it: "
            "nvidia-smi 'NVIDIA H100 80GB HBM3 ... 0MiB / 81559MiB' (NVIDIA/nccl issue "
            "#1264, driver 550.54.15; also modal-labs/modal-client PR #2797)"),
    host_link=PCIE5_X16,
)

H200_SXM = GPUSpec(
    name="H200-SXM-141GB",
    memory_bytes=143_771 * MiB,
    peak_dense_bf16_flops=989.4e12,
    hbm_bytes_per_s=4.8e12,
    source=("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141GB HBM3e, 4.8TB/s, "
            "BFLOAT16 Tensor Core 1,979 TFLOPS with sparsity (dense: half, the H100's "
            "Hopper Tensor Cores). Memory as the device reports it: nvidia-smi 'NVIDIA "
            "H200 ... 124585MiB / 143771MiB' (sgl-project/sglang issue #3196, driver "
            "550.144.03)"),
    host_link=PCIE5_X16,
)

B200_SXM = GPUSpec(
    name="B200-SXM-180GB",
    memory_bytes=183_359 * MiB,
    peak_dense_bf16_flops=2.25e15,
    hbm_bytes_per_s=8e12,
    source=("NVIDIA DGX B200 / HGX B200 datasheets: 8 GPUs with 1,440GB HBM3e (180GB each) "
            "and 64TB/s (8TB/s each), FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with "
            "sparsity (2.25 dense) at 1,000 W; MLPerf Inference v6.0 systems list the part "
            "as 'NVIDIA B200-SXM-180GB' (180 GB). Early announcements said 192 GB: the "
            "shipping HGX/DGX part has 180 GB enabled. Memory as the device reports it: "
            "nvidia-smi 'NVIDIA B200 ... 166593MiB / 183359MiB' (NVIDIA/TensorRT-LLM issue "
            "#10278, driver 580.95.05)"),
    host_link=PCIE5_X16,
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

    Aliases: ``a100`` (80GB SXM), ``h100`` (SXM), ``h200``, ``b200``, each full name
    (``"H200-SXM-141GB"``), and ``local``: this machine's GPU 0 (:func:`local_gpu`).

    Raises:
        UnknownGPUError: no GPU of that name (the message lists the known names), or
            ``local`` where torch sees no CUDA device.
    """
    key = "-".join(str(name).strip().lower().replace("_", "-").split())
    if key == "local":
        return local_gpu()
    try:
        return _ALIASES[key]
    except KeyError:
        known = ", ".join(sorted({"a100", "h100", "h200", "b200", "local"}
                                 | {g.name for g in KNOWN_GPUS}))
        raise UnknownGPUError(f"unknown GPU {name!r}; known: {known}") from None


def local_gpu(device: int = 0) -> GPUSpec:
    """The GPU torch sees as CUDA device ``device``: its name and the total memory CUDA
    reports (``torch.cuda.mem_get_info(device)[1]``, bytes: the figure vLLM multiplies by
    ``gpu_memory_utilization``), with the peak rates of the known GPU of the same kind
    (matched by ``A100`` / ``H100`` / ``H200`` / ``B200`` in the device name), and its host
    link: :data:`NVLINK_C2C` on a Grace superchip (``GH200`` / ``GB200`` in the name), else
    that GPU's.

    Raises:
        UnknownGPUError: torch is not installed, or sees no CUDA device ("--gpu local needs
            a CUDA GPU visible to torch"), or the device is none of the known kinds (its
            peak rates are unknown).
    """
    try:
        import torch
    except ImportError:
        raise UnknownGPUError("--gpu local needs torch with a CUDA GPU; torch is not "
                              "installed (name a GPU: a100, h100, h200, b200)") from None
    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        raise UnknownGPUError("--gpu local needs a CUDA GPU visible to torch; torch sees "
                              "none here (name a GPU: a100, h100, h200, b200)")
    props = torch.cuda.get_device_properties(device)
    total = int(torch.cuda.mem_get_info(device)[1])
    name = str(props.name)
    superchip = any(kind in name.upper() for kind in ("GH200", "GB200"))
    for kind, known in (("B200", B200_SXM), ("H200", H200_SXM), ("H100", H100_SXM),
                        ("A100", A100_80GB_SXM)):
        if kind in name.upper():
            return GPUSpec(name=f"{name} (local)", memory_bytes=total,
                           peak_dense_bf16_flops=known.peak_dense_bf16_flops,
                           hbm_bytes_per_s=known.hbm_bytes_per_s,
                           source=f"torch.cuda.mem_get_info total of the local {name} "
                                  f"({total:,} B); peak rates of {known.name}: "
                                  f"{known.source}",
                           host_link=NVLINK_C2C if superchip else known.host_link)
    raise UnknownGPUError(f"local GPU {name!r} ({total:,} B) is none of the known kinds "
                          f"(A100, H100, H200, B200): its peak rates are unknown; name a GPU "
                          f"or give --buffer-bytes")


def local_host_memory_bytes() -> int:
    """This machine's physical memory in bytes: ``sysconf(SC_PHYS_PAGES) x
    sysconf(SC_PAGE_SIZE)`` (what ``free -b`` reports as total), the base of a host tier
    sized as a fraction of host memory.

    Raises:
        ConfigError: the platform does not report its physical memory (no ``sysconf``
            names; give the host tier's bytes instead).
    """
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        pages = size = -1
    if pages <= 0 or size <= 0:
        raise ConfigError("this platform does not report its physical memory; give the host "
                          "tier's size in bytes (--host-bytes)")
    return int(pages) * int(size)


KV_BUFFER_ALIGN_BYTES = 256
"""Alignment of KV buffers sized by :func:`kv_buffer_bytes` (bytes)."""

DEFAULT_MEM_FRACTION = 0.9
"""Fraction of GPU memory for weights + KV cache unless told otherwise: vLLM's
``gpu_memory_utilization`` default (``vllm/config/cache.py``); every entry point's default."""


def kv_buffer_bytes(gpu: GPUSpec, weight_bytes: int, *, mem_fraction: float = DEFAULT_MEM_FRACTION,
                    activation_reserve_bytes: int | None = None) -> int:
    """Bytes left for the KV buffer on one GPU:
    ``floor(memory_bytes x mem_fraction) - weight_bytes - activation_reserve_bytes``,
    rounded down to a multiple of :data:`KV_BUFFER_ALIGN_BYTES` (256) so that every page
    grid - including a HIGH END's, anchored at the buffer's end - starts aligned for the
    kernels' typed views.

    ``mem_fraction``: :data:`DEFAULT_MEM_FRACTION`; the reserve defaults to
    :data:`DEFAULT_ACTIVATION_RESERVE_BYTES` (3 GiB).

    Example: H200 (143,771 MiB = 150,754,820,096 B), 16e9 B of weights, defaults:
    ``floor(150,754,820,096 x 0.9) = 135,679,338,086``; minus 16,000,000,000 and
    3,221,225,472 is 116,458,112,614, down to a multiple of 256: ``116,458,112,512 B``.
    All figures are per GPU, i.e. per tensor-parallel rank (``weight_bytes`` is one
    rank's share).

    Raises:
        ConfigError: ``mem_fraction`` not a number in ``(0, 1]`` (NaN and ``True``
            included); weights or reserve not a whole number of bytes >= 0 (a float, NaN
            or ``bool``: :func:`kvchain.field_types.is_whole`); or nothing left
            ("weights X B + reserve Y B exceed Z B").
    """
    if isinstance(mem_fraction, bool) or not isinstance(mem_fraction, int | float) \
            or not (0.0 < mem_fraction <= 1.0):
        raise ConfigError(f"mem_fraction must be a number in (0, 1], got {mem_fraction!r}")
    reserve = DEFAULT_ACTIVATION_RESERVE_BYTES if activation_reserve_bytes is None \
        else activation_reserve_bytes
    if not is_whole(weight_bytes) or not is_whole(reserve) or weight_bytes < 0 or reserve < 0:
        raise ConfigError(f"weight_bytes ({weight_bytes!r}) and activation_reserve_bytes "
                          f"({reserve!r}) must be whole numbers of bytes >= 0")
    weight_bytes, reserve = int(weight_bytes), int(reserve)
    usable = math.floor(gpu.memory_bytes * mem_fraction)
    left = usable - weight_bytes - reserve
    if left <= 0:
        raise ConfigError(
            f"weights {weight_bytes:,} B + reserve {reserve:,} B exceed {usable:,} B "
            f"({mem_fraction:g} of {gpu.name}'s {gpu.memory_bytes:,} B): no room for a KV "
            f"buffer; split the weights over more tensor-parallel ranks (--tp N) or give the "
            f"buffer size (--buffer-bytes)")
    return left - left % KV_BUFFER_ALIGN_BYTES
