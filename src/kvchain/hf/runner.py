"""One transformers model bound to the chain: its layers' bands, its cache object, and one
forward over the requests' pages.

:class:`kvchain.hf.ChainEngine` holds one runner for the target and, with a
:class:`~kvchain.hf.speculative.ChainDraft`, one for the draft model, whose layers are the
chain's draft bands (``draft.full``, ``draft.window``, ``draft.state``: the layout of
:func:`kvchain.model.with_draft`). Each runner reads and writes only its own bands; the
request layer gives every request pages in all of them, so both models' caches follow the
request's tokens and are rolled back by the same ``KVManager.verify``.

State slots: a request's state band holds ``state_slots`` slots (1, or ``1 + k`` under
``CHECKPOINTS``, 2 under ``REPLAY``); a forward names, per row, the slot it reads the
state from (``read``, an index into the request's slots) and, for a checkpointed forward,
the slot each position's state goes to (``write``, ``[B, T]`` indices; otherwise the state
is written back where it was read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvchain.alloc.chain import Chain
from kvchain.buffer import TorchBuffer
from kvchain.errors import ConfigError
from kvchain.hf.attention import ATTENTION_NAME
from kvchain.hf.cache import ChainCache
from kvchain.hf.checkpoints import per_position_state, recurrent_mixers
from kvchain.hf.context import ForwardBatch, LayerBinding, forward_context
from kvchain.layout import ChainLayout
from kvchain.model.layers import LayerCache, LifetimeClass
from kvchain.requests.manager import KVManager


class ModelRunner:
    """A transformers causal LM whose caches are bands of a chain.

    Args:
        model: the transformers model (eval mode).
        layers: its cache layers (:func:`kvchain.hf.model_layer_caches`), tagged with
            their owner (a draft's ``owner = "draft"``), each held by a band of
            ``layout`` (:meth:`ChainLayout.band_of`).
        layout, buffer, chain, kv: the chain's layout, bytes, allocator and request layer.
        checkpoints: find the recurrent mixers for per-position state saves
            (``CHECKPOINTS`` rollback, :mod:`kvchain.hf.checkpoints`).

    Raises:
        LayoutError: a layer that no band of the layout holds.
        ConfigError: the layers span two state bands, or ``checkpoints`` and a state
            layer whose mixer cannot be found.
    """

    def __init__(self, model: Any, layers: Sequence[LayerCache], layout: ChainLayout,
                 buffer: TorchBuffer, chain: Chain, kv: KVManager, *,
                 checkpoints: bool = False) -> None:
        self.model = model
        self.layers = tuple(layers)
        self.layout, self.buffer, self.chain, self.kv = layout, buffer, chain, kv
        bindings = {}
        for layer in self.layers:
            band = layout.band_of(layer)
            views = buffer.layer_views(layout.bands[band], layer)
            bindings[layer.index] = LayerBinding(layer, band, views)
        self.bindings = bindings
        states = {b.band for b in bindings.values() if b.layer.lifetime is LifetimeClass.STATE}
        if len(states) > 1:
            raise ConfigError(f"one model's state layers lie in bands {sorted(states)}")
        self.state: int | None = states.pop() if states else None
        self.mixers: dict[int, Any] = {}
        if checkpoints and self.state is not None:
            self.mixers = recurrent_mixers(model, [x.index for x in self.layers
                                                   if x.lifetime is LifetimeClass.STATE])
        config = model.config.get_text_config(decoder=True)
        num_layers = max(int(getattr(config, "num_hidden_layers", 0) or 0),
                         max(bindings) + 1)
        self.cache = ChainCache(bindings, num_layers)
        self.forwards = 0

    def state_slots(self, rids: Sequence[int], cols: np.ndarray) -> np.ndarray:
        """``[B, len(cols)]`` physical state slots: row ``b`` the request's slots
        ``cols[b]`` (indices into its state slots, ``[B, n]``), translated now.

        Raises:
            ConfigError: a request that holds fewer slots than an index needs.
        """
        assert self.state is not None
        out = np.empty(cols.shape, dtype=np.int64)
        for b, rid in enumerate(rids):
            have = self.kv.page_table(rid, self.state)
            if int(cols[b].max()) >= len(have):
                raise ConfigError(f"request {rid} holds {len(have)} state slots; the "
                                  f"forward names slot {int(cols[b].max())}")
            out[b] = self.chain.translate(self.state, have[cols[b]])
        return out

    def copy_state(self, rids: Sequence[int], src: int, dst: int) -> None:
        """Copy each request's state slot ``src`` into its slot ``dst`` (indices into its
        state slots) for every state layer of this model."""
        if self.state is None:
            return
        cols = np.tile(np.array([src, dst]), (len(rids), 1))
        phys = torch.as_tensor(self.state_slots(rids, cols), device=self.buffer.device)
        for binding in self.bindings.values():
            if binding.band == self.state:
                for view in binding.views.values():
                    view[phys[:, 1]] = view[phys[:, 0]]

    def _batch(self, rids: Sequence[int], starts: Sequence[int], length: int,
               read: Sequence[int] | None, write: np.ndarray | None) -> ForwardBatch:
        device = self.buffer.device
        tables: dict[int, torch.Tensor] = {}
        for band in {b.band for b in self.bindings.values()}:
            if band == self.state:
                continue
            rows = [self.chain.translate(band, self.kv.page_table(rid, band)) for rid in rids]
            width = max(len(r) for r in rows)
            # Padding (masked by the attention): the band's null page if it has one.
            pad = 0
            if self.layout.bands[band].reserved_pages:
                null = np.array([self.chain.null_page(band)])
                pad = int(self.chain.translate(band, null)[0])
            table = np.full((len(rows), width), pad, dtype=np.int64)
            for i, r in enumerate(rows):
                table[i, :len(r)] = r
            tables[band] = torch.as_tensor(table, device=device)
        slots = ckpt = None
        if self.state is not None:
            cols = np.zeros((len(rids), 1), dtype=np.int64) if read is None else \
                np.asarray(read, dtype=np.int64)[:, None]
            if write is not None:
                cols = np.concatenate([cols, np.asarray(write, dtype=np.int64)], axis=1)
            phys = torch.as_tensor(self.state_slots(rids, cols), device=device)
            slots = phys[:, 0].contiguous()
            if write is not None:
                ckpt = phys[:, 1:].contiguous()
        fresh = [s == 0 for s in starts]
        if any(fresh) and not all(fresh):
            raise ValueError("a forward mixes rows at position 0 with rows past it")
        start = torch.as_tensor(list(starts), dtype=torch.long, device=device)
        return ForwardBatch(start, length, self.layout.page_size, tables, slots, all(fresh),
                            self.bindings, ckpt)

    def forward(self, rids: Sequence[int], starts: Sequence[int], ids: list[list[int]],
                keep: int | None = None, read: Sequence[int] | None = None,
                write: np.ndarray | None = None) -> torch.Tensor:
        """One forward of rows with equal token counts ``T`` over their pages.

        Args:
            rids: the rows' request ids.
            starts: tokens already in each row's cache (its first new position).
            ids: ``[B, T]`` token ids.
            keep: return the logits of each row's last ``keep`` tokens
                (``[B, keep, vocab]``); ``None``: of its last token (``[B, vocab]``).
            read: per row, the state slot (index into the request's state slots) the
                state is read from (default 0).
            write: ``[B, T]`` state slot indices: the state after position ``j`` goes to
                slot ``write[b, j]`` (the recurrent mixers run position by position,
                :mod:`kvchain.hf.checkpoints`); ``None``: written back to ``read``.

        Raises:
            ConfigError: a slot index past a request's slots.
            ValueError: rows at position 0 mixed with rows past it.
        """
        batch = self._batch(rids, starts, len(ids[0]), read, write)
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=self.model.device)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(ATTENTION_NAME)
        try:
            split = per_position_state(self.mixers if write is not None else {}, self.cache)
            with forward_context(batch), split:
                self.cache.load(batch)
                out = self.model(input_ids=input_ids, position_ids=batch.positions(),
                                 cache=self.cache, use_cache=True,
                                 logits_to_keep=keep or 1)
                self.cache.store(batch)
        finally:
            self.model.set_attn_implementation(previous)
        self.chain.begin_forward(self.buffer.fence())
        self.forwards += 1
        if keep is not None:
            return out.logits[:, -keep:, :]
        return out.logits[:, -1, :]
