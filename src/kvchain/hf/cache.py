"""A transformers ``Cache`` whose bytes live in the chain.

transformers v5 hands every layer's cache to the model through one ``Cache`` object of
per-layer objects: attention layers call ``cache.update(k, v, layer_idx)``; recurrent layers
(Mamba-2, Gated DeltaNet) call ``get_conv_state`` / ``get_recurrent_state`` and
``update_conv_state`` / ``update_recurrent_state``, and their single-token decode kernels
update the conv and SSM state tensors in place. :class:`ChainCache` subclasses that
``Cache`` with:

* :class:`PagedKVLayer` (a ``CacheLayerMixin``): ``update`` scatters the new K/V
  (``[B, kv_heads, T, head_dim]``) into the rows' pages, at physical page
  ``table[b, pos // P]`` and slot ``pos % P``, and returns them unchanged; the paged
  attention (:mod:`kvchain.hf.attention`) reads every token back through the page table.
* :class:`SlotStateLayer` (a ``LinearAttentionLayer``): before the forward, the rows'
  working state slots are gathered from the state band's views (``[slots, *shape]``) into
  batch tensors the model reads and updates in place; after the forward they are written
  back to the slots. Between forwards the state exists only in the slots, so the chain's
  compactions move it like any page. In a ``CHECKPOINTS`` verify the state after each
  position is saved into its own checkpoint slot instead (:meth:`SlotStateLayer.save`,
  driven by :mod:`kvchain.hf.checkpoints`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, LinearAttentionLayer

from kvchain.hf.context import ForwardBatch, LayerBinding, current_batch
from kvchain.model.layers import LifetimeClass


class PagedKVLayer(CacheLayerMixin):
    """One attention layer's cache: K/V pages of the chain (see module docstring)."""

    def __init__(self, binding: LayerBinding) -> None:
        super().__init__()
        self.binding = binding
        self.is_sliding = binding.layer.lifetime is not LifetimeClass.FULL
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the pages are the chain's."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, kv_heads, T, head_dim]`` K and V of the current batch into its pages;
        returns them unchanged (the attention reads the pages)."""
        batch = current_batch()
        table = batch.tables[self.binding.band]
        pos = batch.positions()
        page = table.gather(1, pos // batch.page_size)
        slot = pos % batch.page_size
        for name, states in (("k", key_states), ("v", value_states)):
            view = self.binding.views[name]
            view[page, slot] = states.transpose(1, 2).to(view.dtype)
        return key_states, value_states

    def get_seq_length(self) -> int:
        """Tokens in the cache before this forward, when every row has the same count.

        Raises:
            ValueError: rows of different lengths (transformers' single-length interface
                cannot express them; pass ``position_ids``).
        """
        start = current_batch().start
        if bool((start != start[0]).any()):
            raise ValueError("rows of the batch hold different numbers of tokens")
        return int(start[0])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: never used (the paged attention masks itself)."""
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        """No fixed maximum (-1)."""
        return -1


class SlotStateLayer(LinearAttentionLayer):
    """One recurrent layer's conv and SSM state in the rows' state slots."""

    def __init__(self, binding: LayerBinding) -> None:
        super().__init__(number_of_states=1)
        self.binding = binding
        self.saved = 0  # positions of the current forward saved to checkpoint slots

    def load(self, batch: ForwardBatch) -> None:
        """Gather the rows' slots into batch tensors (zeros for fresh requests)."""
        assert batch.slots is not None
        self.saved = 0
        for name, states, flags in (("conv", self.conv_states, self.is_conv_states_initialized),
                                    ("recurrent", self.recurrent_states,
                                     self.is_recurrent_states_initialized)):
            view = self.binding.views.get(name)
            if view is None:
                continue
            data = view[batch.slots]  # advanced indexing: a copy, [B, *shape]
            if batch.fresh:
                data.zero_()
            states[0] = data
            flags[0] = True
            self.device, self.dtype = data.device, data.dtype
        conv = self.conv_states[0]
        self.conv_kernel_size[0] = int(conv.shape[-1]) if conv is not None else None
        self.has_previous_state[0] = not batch.fresh

    def save(self, batch: ForwardBatch, position: int) -> None:
        """Write the batch tensors (the state after ``position`` of this forward's ``T``)
        into the rows' checkpoint slots ``batch.checkpoints[:, position]``.

        Raises:
            ValueError: the batch has no checkpoint slots, or ``position`` is not the next
                one (positions are saved in order ``0 .. T - 1``, once each).
        """
        if batch.checkpoints is None or position != self.saved:
            raise ValueError(f"layer {self.binding.layer.index}: checkpoint {position} saved "
                             f"out of order (next {self.saved}) or without checkpoint slots")
        self._write(batch.checkpoints[:, position])
        self.saved += 1

    def store(self, batch: ForwardBatch) -> None:
        """Write the batch tensors back into the rows' slots; with checkpoint slots, check
        instead that every position's state was saved (:meth:`save`).

        Raises:
            ValueError: a checkpoint forward that saved fewer or more than ``T`` states
                (its mixer did not run position by position).
        """
        assert batch.slots is not None
        if batch.checkpoints is None:
            self._write(batch.slots)
        elif self.saved != batch.length:
            raise ValueError(f"layer {self.binding.layer.index}: {self.saved} of "
                             f"{batch.length} positions' states saved (the recurrent mixer "
                             f"did not run per position)")
        self.saved = 0
        self.conv_states[0] = None
        self.recurrent_states[0] = None

    def _write(self, slots: torch.Tensor) -> None:
        for name, states in (("conv", self.conv_states), ("recurrent", self.recurrent_states)):
            view = self.binding.views.get(name)
            data = states[0]
            if view is not None and data is not None:
                view[slots] = data.to(view.dtype)


class ChainCache(Cache):
    """The cache object passed to a transformers model as ``cache=``.

    Args:
        bindings: model layer index -> :class:`LayerBinding` (layers with a cache).
        num_layers: decoder layers of the model (others get transformers' ``DummyLayer``).
    """

    def __init__(self, bindings: dict[int, LayerBinding], num_layers: int) -> None:
        layers: list[Any] = []
        for i in range(num_layers):
            b = bindings.get(i)
            if b is None:
                layers.append(DummyLayer())
            elif b.layer.lifetime is LifetimeClass.STATE:
                layers.append(SlotStateLayer(b))
            else:
                layers.append(PagedKVLayer(b))
        super().__init__(layers=layers)
        self.bindings = bindings

    def load(self, batch: ForwardBatch) -> None:
        """Before a forward: gather recurrent state from the rows' slots."""
        for layer in self.layers:
            if isinstance(layer, SlotStateLayer):
                layer.load(batch)

    def store(self, batch: ForwardBatch) -> None:
        """After a forward: write recurrent state back to the rows' slots."""
        for layer in self.layers:
            if isinstance(layer, SlotStateLayer):
                layer.store(batch)
