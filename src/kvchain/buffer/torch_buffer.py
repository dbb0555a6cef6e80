"""The torch backend: the buffer is one uint8 torch tensor on the CPU or a CUDA device.

torch is imported lazily, so kvchain works without it. On CUDA, copies are issued on the
current stream (asynchronous to the host) and :meth:`TorchBuffer.fence` records a
``torch.cuda.Event`` there; on the CPU every operation is synchronous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvchain.buffer.base import (
    CompletedFence,
    CountingBackend,
    check_copy,
    check_page,
    grid_pages,
    page_data,
)
from kvchain.buffer.copy_plan import plan_copy
from kvchain.buffer.numpy_buffer import DEFAULT_CHUNK_BYTES, chunk_pages_for
from kvchain.buffer.page_layout import layer_placements, view_geometry
from kvchain.errors import BufferUnsupportedError
from kvchain.layout import BandLayout
from kvchain.model.layers import CacheDtype, LayerCache

if TYPE_CHECKING:
    import torch


def import_torch() -> Any:
    """Import torch.

    Raises:
        BufferUnsupportedError: torch is not installed (``pip install kvchain[torch]``).
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the test environment has torch
        raise BufferUnsupportedError(
            "TorchBuffer needs torch; install it with `pip install kvchain[torch]`") from exc
    return torch


class CudaFence:
    """A fence backed by a ``torch.cuda.Event`` recorded on the current stream."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def query(self) -> bool:
        """True once the stream has passed the event (never blocks)."""
        return bool(self._event.query())

    def wait(self) -> None:
        """Block the host until the stream has passed the event."""
        self._event.synchronize()


class TorchBuffer(CountingBackend):
    """A zero-filled uint8 torch tensor of ``nbytes`` on ``device`` (see
    :class:`~kvchain.buffer.BufferBackend`: its methods, shapes and errors).

    Copies run in chunks of at most ``chunk_bytes`` in the order of
    :func:`~kvchain.buffer.copy_plan.plan_copy` (``index_select`` into a staging tensor,
    then ``index_copy_``), exactly as :class:`~kvchain.buffer.NumpyBuffer` does, so both
    backends give identical bytes. Views are ``as_strided`` views of the buffer in the
    tensors' own dtypes (bf16 ``torch.bfloat16``, fp16 ``torch.float16``, fp8
    ``torch.float8_e4m3fn`` (the e4m3 format engines use for fp8 KV caches), fp32
    ``torch.float32``).

    Args:
        nbytes: buffer bytes (``B``), >= 0.
        device: a torch device string, e.g. ``"cpu"``, ``"cuda"``, ``"cuda:1"``.
        chunk_bytes: staging bytes per copy chunk.

    Raises:
        BufferUnsupportedError: torch is not installed, or the device is unavailable.
        BufferArgumentError: negative ``nbytes`` or ``chunk_bytes < 1``.
    """

    def __init__(self, nbytes: int, device: str = "cpu", *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(nbytes, chunk_bytes)
        torch = import_torch()
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise BufferUnsupportedError(f"device {device!r} asked for but CUDA is unavailable")
        self._torch = torch
        self._tensor = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        self._dtypes = {
            CacheDtype.BF16: torch.bfloat16,
            CacheDtype.FP16: torch.float16,
            CacheDtype.FP8: torch.float8_e4m3fn,
            CacheDtype.FP32: torch.float32,
        }

    @property
    def device(self) -> torch.device:
        """The tensor's device."""
        return self._tensor.device

    @property
    def tensor(self) -> torch.Tensor:
        """The whole buffer (uint8, aliases the bytes)."""
        return self._tensor

    def _pages(self, band: BandLayout) -> torch.Tensor:
        """The band's grid as a ``[num_pages, page_bytes / w]`` matrix of ``w``-byte words,
        ``w`` the widest of 8, 4, 2, 1 dividing both ``grid_base`` and ``page_bytes``:
        torch's CPU index kernels copy uint8 rows about 10x slower than int64 rows."""
        num = grid_pages(band, self.nbytes)
        start = band.grid_base
        raw = self._tensor[start:start + num * band.page_bytes]
        for word, dtype in ((8, self._torch.int64), (4, self._torch.int32),
                            (2, self._torch.int16)):
            if start % word == 0 and band.page_bytes % word == 0:
                return raw.view(dtype).view(num, band.page_bytes // word)
        return raw.view(num, band.page_bytes)

    def _index(self, idx: np.ndarray) -> torch.Tensor:
        return self._torch.as_tensor(idx, dtype=self._torch.int64).to(self._tensor.device)

    def copy_pages(self, band: BandLayout, src: np.ndarray, dst: np.ndarray) -> None:
        """:meth:`BufferBackend.copy_pages`, issued on the current stream on CUDA."""
        s, d = check_copy(band, src, dst, self.nbytes)
        pages = self._pages(band)
        plan = plan_copy(s, d, chunk_pages_for(band.page_bytes, self._chunk_bytes))
        spill = None
        if plan.spill_pages.size:
            spill = pages.index_select(0, self._index(plan.spill_pages))
        for chunk in plan.chunks:
            staged = pages.index_select(0, self._index(chunk.src))
            if chunk.spill_slot is not None:
                assert spill is not None
                from_spill = np.flatnonzero(chunk.spill_slot >= 0)
                staged[self._index(from_spill)] = spill[self._index(chunk.spill_slot[from_spill])]
            pages.index_copy_(0, self._index(chunk.dst), staged)
        self._counter.count_copy(int(s.size), band.page_bytes)

    def zero_pages(self, band: BandLayout, idx: np.ndarray) -> None:
        """:meth:`BufferBackend.zero_pages`."""
        i = self._zero_index(band, idx)
        if i.size:
            self._pages(band).index_fill_(0, self._index(i), 0)

    def write_page(self, band: BandLayout, j: int, data: bytes | np.ndarray) -> None:
        """:meth:`BufferBackend.write_page`."""
        j = check_page(band, j, self.nbytes)
        raw = self._torch.from_numpy(page_data(band, data)).to(self._tensor.device)
        start = band.grid_base + j * band.page_bytes
        self._tensor[start:start + band.page_bytes].copy_(raw)

    def read_page(self, band: BandLayout, j: int) -> np.ndarray:
        """:meth:`BufferBackend.read_page`, as a host numpy array (synchronizes)."""
        j = check_page(band, j, self.nbytes)
        start = band.grid_base + j * band.page_bytes
        return self._tensor[start:start + band.page_bytes].cpu().numpy().copy()

    def layer_views(self, band: BandLayout, layer: LayerCache) -> dict[str, Any]:
        """:meth:`BufferBackend.layer_views`, in the tensors' own dtypes."""
        num = grid_pages(band, self.nbytes)
        views: dict[str, Any] = {}
        for placement in layer_placements(band, layer):
            geo = view_geometry(band, placement, num)
            dtype = self._dtypes[geo.dtype]
            if num == 0:
                views[geo.name] = self._torch.empty(geo.shape, dtype=dtype,
                                                    device=self._tensor.device)
                continue
            # A typed 1-D window that starts at the tensor's first byte and spans whole
            # elements; as_strided then lays the pages over it.
            span = (num - 1) * band.page_bytes + placement.nbytes
            typed = self._tensor[geo.base_byte:geo.base_byte + span].view(dtype)
            views[geo.name] = typed.as_strided(geo.shape, geo.strides,
                                               typed.storage_offset())
        return views

    def fence(self) -> CudaFence | CompletedFence:
        """On CUDA, an event recorded on the current stream; on the CPU, complete."""
        if self._tensor.device.type == "cuda":
            event = self._torch.cuda.Event()
            event.record(self._torch.cuda.current_stream(self._tensor.device))
            return CudaFence(event)
        return CompletedFence()

    def __repr__(self) -> str:
        return f"TorchBuffer(nbytes={self.nbytes:,}, device={str(self.device)!r})"
