"""The forward context: which requests one forward pass computes, and where their pages are.

As in a serving engine, the batch's metadata is set for the duration of one forward (a
context variable) and read by the cache layers (writes) and the attention function (reads),
which transformers calls without any request information of its own.

Shapes: ``B`` rows (requests), each computing ``T`` new tokens (the same ``T`` for every
row: one prefill chunk, or one decode token per row) from position ``start[b]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from kvchain.errors import KVChainError
from kvchain.model.layers import LayerCache, LifetimeClass


class NoForwardContextError(KVChainError, RuntimeError):
    """A chain cache layer or the paged attention ran outside :func:`forward_context`."""


@dataclass(frozen=True)
class LayerBinding:
    """Where one model layer's cache lies in the chain.

    Attributes:
        layer: the kvchain declaration (lifetime, window, tensors).
        band: band index in the chain.
        views: tensor name -> strided view over the band's grid
            (``[pages, page_size, heads, dim]`` for K/V, ``[slots, *shape]`` for state).
    """

    layer: LayerCache
    band: int
    views: dict[str, Any]

    @property
    def window(self) -> int | None:
        """Sliding window ``W`` or local chunk ``C`` tokens (``None`` for full)."""
        return self.layer.window

    @property
    def local(self) -> bool:
        """True for chunked-local attention."""
        return self.layer.lifetime is LifetimeClass.LOCAL


@dataclass(frozen=True)
class ForwardBatch:
    """One forward's rows and their physical pages (all tensors on the model's device).

    Attributes:
        start: ``[B]`` int64, tokens already in each row's cache.
        length: ``T``, new tokens per row.
        page_size: ``P`` tokens per page.
        tables: band index -> ``[B, max_pages]`` int64 physical pages (token bands; entry
            ``j`` holds tokens ``[j * P, (j + 1) * P)``; padding and released window pages
            point at the band's null page), from ``chain.translate`` at forward time.
        slots: ``[B]`` int64 physical state slots (working slot), or ``None``.
        fresh: True when every row starts at 0 (no previous recurrent state); a batch
            mixes no fresh rows with others (transformers keeps one "has previous state"
            flag per layer).
        layers: model layer index -> its :class:`LayerBinding`.
        checkpoints: ``[B, T]`` int64 physical state slots, or ``None``: with them the
            state after position ``j`` of row ``b`` is written to ``checkpoints[b, j]``
            (a ``CHECKPOINTS`` verify, :mod:`kvchain.hf.checkpoints`) and nothing else is
            written back; ``slots`` is still where the state before the forward is read.
    """

    start: torch.Tensor
    length: int
    page_size: int
    tables: dict[int, torch.Tensor]
    slots: torch.Tensor | None
    fresh: bool
    layers: dict[int, LayerBinding]
    checkpoints: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """``B``."""
        return int(self.start.shape[0])

    def positions(self) -> torch.Tensor:
        """``[B, T]`` absolute positions of the new tokens."""
        t = torch.arange(self.length, device=self.start.device)
        return self.start[:, None] + t[None, :]


_CURRENT: ContextVar[ForwardBatch | None] = ContextVar("kvchain_forward_batch", default=None)


@contextlib.contextmanager
def forward_context(batch: ForwardBatch) -> Iterator[ForwardBatch]:
    """Make ``batch`` the current forward's batch until the block ends."""
    token = _CURRENT.set(batch)
    try:
        yield batch
    finally:
        _CURRENT.reset(token)


def current_batch() -> ForwardBatch:
    """The batch of the forward running now.

    Raises:
        NoForwardContextError: no forward context is set.
    """
    batch = _CURRENT.get()
    if batch is None:
        raise NoForwardContextError("kvchain cache layers run only inside forward_context()")
    return batch
