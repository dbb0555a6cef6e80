"""The bytes of the chain: numpy (default), torch (CPU/CUDA) and bookkeeping-only backends.

All backends implement :class:`BufferBackend`: page copies within one band (in place, in
bounded chunks, as if every source were read before any destination is written), zeroing,
single-page reads and writes for tests and tooling, per-layer strided views for attention
kernels, and fences that gate page moves on in-flight work.

=================  ============================  ==========================================
backend            bytes                         fence
=================  ============================  ==========================================
``NumpyBuffer``    uint8 numpy array             always complete
``TorchBuffer``    uint8 torch tensor, CPU/CUDA  CUDA event on the current stream (CUDA)
``NullBuffer``     none (counts only)            always complete
=================  ============================  ==========================================

The host tier's store is :class:`HostBuffer` (``buffer/host.py``): host memory (numpy, or a
torch tensor pinned when CUDA is available) laid out as one pool of fixed-size slots per
cache class, each with its own free-list allocator (:class:`HostPool`), and page copies
device <-> host through the backends above.
"""

from kvchain.buffer.base import (
    BufferBackend,
    BufferStats,
    CompletedFence,
    Fence,
    ManualFence,
    grid_pages,
)
from kvchain.buffer.copy_plan import CopyChunk, CopyPlan, plan_copy
from kvchain.buffer.host import (
    HOST_ALIGN_BYTES,
    HostBuffer,
    HostRegion,
    HostStats,
    copy_runs,
    host_regions,
)
from kvchain.buffer.host_pool import HostPool
from kvchain.buffer.null_buffer import NullBuffer
from kvchain.buffer.numpy_buffer import DEFAULT_CHUNK_BYTES, NumpyBuffer
from kvchain.buffer.page_layout import TensorPlacement, layer_placements
from kvchain.buffer.torch_buffer import CudaFence, TorchBuffer

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HOST_ALIGN_BYTES",
    "BufferBackend",
    "BufferStats",
    "CompletedFence",
    "CopyChunk",
    "CopyPlan",
    "CudaFence",
    "Fence",
    "HostBuffer",
    "HostPool",
    "HostRegion",
    "HostStats",
    "ManualFence",
    "NullBuffer",
    "NumpyBuffer",
    "TensorPlacement",
    "TorchBuffer",
    "copy_runs",
    "grid_pages",
    "host_regions",
    "layer_placements",
    "plan_copy",
]
