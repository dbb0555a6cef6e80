"""A small batched generation loop: a transformers model on kvchain's scheduler and chain.

One engine step (as a serving engine runs it)::

    scheduler.step(now)        admission + ONE chain take for the step's chunks and decodes;
                               the take realizes the planner's plan, compactions and float
                               relocations included (each after WaitFence on the last
                               forward's fence)
    for each prefill chunk:    forward of one row, T = chunk tokens
    decodes:                   one forward of all decoding rows, T = 1
    chain.begin_forward(fence) after each forward (CUDA: an event; CPU: complete)
    scheduler.complete(...)    commit tokens, window-tail release, finishes release pages

Speculative decoding (``spec_tokens = k`` with a ``draft``): a decode computes ``1 + k``
tokens (the last sampled token and the draft's ``k``) in the same one forward of all
decoding rows, over pages the request layer priced with its speculative demand; the
verify (:mod:`kvchain.hf.speculative`) keeps ``1 + a`` and ``scheduler.complete`` hands
``a`` to ``KVManager.verify``, which releases the rejected drafts' pages. State layers roll
back in one of two modes (``rollback``):

* ``REPLAY`` (2 state slots per request): before the verify forward each row's working
  state slot is copied into its checkpoint slot; after a rejection it is copied back and
  the ``1 + a`` accepted tokens are computed again through the target (one forward per
  distinct ``a``), before the commit releases any window page those tokens read;
* ``CHECKPOINTS`` (``1 + k`` state slots per request, a ring): the verify forward runs
  each recurrent mixer position by position (:mod:`kvchain.hf.checkpoints`) and saves the
  state after position ``j`` into ring slot ``(w + j) mod (1 + k)``, ``w`` the ring slot
  of the working state; the verify makes ring slot ``(w + a) mod (1 + k)`` (the state after
  the last accepted token) the working slot: an index, nothing copied or recomputed.

Sampling is greedy (argmax of the last position's logits, fp32). Each forward translates
the rows' virtual page tables (``KVManager.page_table`` -> ``Chain.translate``) at the
moment it runs, so pages moved by the step's take are read where they now are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvchain.alloc.chain import Chain
from kvchain.bands.geometry import StateRollback
from kvchain.buffer import TorchBuffer
from kvchain.errors import ConfigError, InvalidRequestError
from kvchain.hf.attention import ATTENTION_NAME
from kvchain.hf.cache import ChainCache
from kvchain.hf.checkpoints import per_position_state, recurrent_mixers
from kvchain.hf.context import ForwardBatch, LayerBinding, forward_context
from kvchain.hf.layers import model_layer_caches
from kvchain.hf.speculative import Draft, accepted_drafts
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import LifetimeClass, group_classes
from kvchain.requests.manager import KVManager
from kvchain.sched.request import EventKind, Request, RequestStatus, StepBatch, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig


@dataclass
class GenerationResult:
    """One request's generation.

    Attributes:
        rid: request id.
        prompt: prompt token ids.
        tokens: generated token ids, in order.
        logits: per generated token, the ``[vocab]`` fp32 logits it was sampled from (CPU).
        finished_step: engine step at which it finished (``None`` while running).
        rejected: why the scheduler rejected the request at its arrival (it can never fit
            the chain: the rejection's own reason, with its bytes), ``None`` otherwise; a
            rejected request generates no token.
    """

    rid: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    finished_step: int | None = None
    rejected: str | None = None


@dataclass
class SpecStats:
    """Counts of the engine's speculative decode steps (one per request per step).

    Attributes:
        verifies: speculative decodes verified.
        drafted: draft tokens proposed and computed by the target (``k`` per verify).
        accepted: drafts kept (a verify keeps ``1 + a`` tokens).
        rejected: verifies in which the target rejected a draft (its greedy token differs
            from a draft before the output length ends the step).
        replays: ``REPLAY`` state rollbacks (checkpoint copied back, ``1 + a`` tokens
            recomputed): every verify that keeps ``a < k`` drafts (rejected, or cut by the
            output length).
        replayed_tokens: tokens recomputed by those replays.
        checkpoint_rollbacks: ``CHECKPOINTS`` state rollbacks: verifies that keep
            ``a < k`` drafts, whose working state becomes checkpoint ``a`` (not the state
            after the last computed position); nothing recomputed.
        checkpoints_saved: states saved into checkpoint slots under ``CHECKPOINTS``:
            ``1 + k`` per verify (each for every state layer).
    """

    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    replays: int = 0
    replayed_tokens: int = 0
    checkpoint_rollbacks: int = 0
    checkpoints_saved: int = 0


@dataclass(frozen=True)
class _Pending:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int


class ChainEngine:
    """Batched greedy generation of a transformers causal LM with its caches in a chain.

    Args:
        model: a transformers causal LM (eval mode; its device and dtype are used).
        buffer_bytes: bytes of the chain's buffer (a ``TorchBuffer`` on the model's device).
        page_size: ``P`` tokens per page.
        chunk_size: largest prefill chunk (tokens; at least ``P``).
        max_running: most requests running at once.
        max_prefill_tokens: prefill tokens per step (default ``chunk_size``).
        audit: run the chain and KV-manager audits after every step.
        flush_every: every this many steps, compact the chain between steps
            (``Chain.flush_idle``: waits for the last forward's fence, then compacts every
            band's holes), as an engine does when it has a moment; ``None``: only the moves
            the planner puts into takes.
        draft: proposes the drafts of speculative decode steps (e.g.
            :class:`~kvchain.hf.speculative.ModelDraft`); needs ``spec_tokens >= 1``.
        spec_tokens: ``k`` drafts per speculative decode step (0: plain decoding).
        rollback: how state layers roll back rejected drafts (module docstring):
            ``StateRollback.REPLAY`` (1 checkpoint slot, recompute after a rejection) or
            ``StateRollback.CHECKPOINTS`` (``k`` checkpoint slots, the verify's recurrent
            mixers run position by position, no recompute). Models without state layers
            take either (only pages roll back).

    Raises:
        ConfigError: the model's cache layers cannot be told, bad limits, a draft without
            ``spec_tokens >= 1`` (or the reverse), or ``CHECKPOINTS`` on a model whose
            recurrent mixers cannot be found (:func:`~kvchain.hf.checkpoints.recurrent_mixers`).
        BufferTooSmallError: the buffer cannot hold one smallest request.
    """

    def __init__(self, model: Any, buffer_bytes: int, *, page_size: int = 4,
                 chunk_size: int = 8, max_running: int = 8,
                 max_prefill_tokens: int | None = None, audit: bool = False,
                 flush_every: int | None = None, draft: Draft | None = None,
                 spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.REPLAY) -> None:
        if flush_every is not None and flush_every < 1:
            raise ConfigError(f"flush_every must be >= 1 or None, got {flush_every}")
        if type(spec_tokens) is not int or spec_tokens < 0:
            raise ConfigError(f"spec_tokens must be an int >= 0, got {spec_tokens!r}")
        if (draft is None) != (spec_tokens == 0):
            raise ConfigError("speculative decoding needs both a draft and spec_tokens >= 1")
        self.draft = draft
        self.spec = SpecStats()
        self.flush_every = flush_every
        self.model = model
        self.layers = model_layer_caches(model)
        self.layout: ChainLayout = plan_layout(group_classes(self.layers), buffer_bytes,
                                               page_size)
        self.buffer = TorchBuffer(self.layout.buffer_bytes, device=str(model.device))
        self.chain = Chain(self.layout, self.buffer)
        self.kv = KVManager(self.chain, spec_tokens=spec_tokens, rollback=rollback)
        # CHECKPOINTS on a state model: the mixers the verify runs position by position,
        # and each request's working ring slot (index into its first 1 + k state slots)
        self._mixers: dict[int, Any] = {}
        self._work: dict[int, int] = {}
        self.checkpointed = (spec_tokens > 0 and self.kv.geom.state is not None
                             and rollback is StateRollback.CHECKPOINTS)
        if self.checkpointed:
            self._mixers = recurrent_mixers(model, [layer.index for layer in self.layers
                                                    if layer.lifetime is LifetimeClass.STATE])
        self.scheduler = Scheduler(self.kv, SchedulerConfig(
            max_running=max_running, chunk_size=chunk_size,
            max_prefill_tokens=max_prefill_tokens or chunk_size, audit_every_step=audit))
        bindings = {}
        for layer in self.layers:
            band = self.layout.index_of(layer.lifetime)
            assert band is not None
            views = self.buffer.layer_views(self.layout.bands[band], layer)
            bindings[layer.index] = LayerBinding(layer, band, views)
        self.bindings = bindings
        config = model.config.get_text_config(decoder=True)
        num_layers = max(int(getattr(config, "num_hidden_layers", 0) or 0),
                         max(bindings) + 1)
        self.cache = ChainCache(bindings, num_layers)
        self.results: dict[int, GenerationResult] = {}
        self._pending: list[_Pending] = []
        self._seq: dict[int, list[int]] = {}
        self.step_count = 0
        self.forwards = 0

    # --- requests -----------------------------------------------------------------------

    def add(self, rid: int, prompt: Sequence[int], max_new_tokens: int,
            arrival_step: int = 0) -> None:
        """Queue a request that arrives at engine step ``arrival_step``.

        Raises:
            InvalidRequestError: an empty prompt, ``max_new_tokens < 1``, or a duplicate id.
        """
        if not prompt or max_new_tokens < 1 or rid in self.results:
            raise InvalidRequestError(f"request {rid}: need a non-empty prompt, "
                                      f"max_new_tokens >= 1 and a new id")
        self.results[rid] = GenerationResult(rid, [int(t) for t in prompt])
        self._seq[rid] = [int(t) for t in prompt]
        self._pending.append(_Pending(rid, list(prompt), max_new_tokens, arrival_step))

    @property
    def idle(self) -> bool:
        """Nothing pending, waiting or running."""
        return not self._pending and self.scheduler.idle

    # --- one step -----------------------------------------------------------------------

    def step(self) -> StepBatch:
        """Admit arrivals, allocate (moves happen here), run the forwards, complete, and
        every ``flush_every`` steps compact between steps."""
        now = float(self.step_count)
        for p in [p for p in self._pending if p.arrival_step <= self.step_count]:
            self._pending.remove(p)
            if not self.scheduler.add(Request(p.rid, len(p.prompt), p.max_new_tokens, now),
                                      now):
                why = [e.detail for e in self.scheduler.drain_events()
                       if e.kind is EventKind.REJECTED and e.rid == p.rid]
                self.results[p.rid].rejected = why[-1] if why else "rejected"
        batch = self.scheduler.step(now)
        accepted: dict[int, int] = {}  # a speculative step's accepted drafts per request
        with torch.no_grad():
            for chunk in batch.prefills:
                if chunk.start == 0:  # fresh state slots (first chunk, or after retraction)
                    self._work.pop(chunk.rid, None)
                chunk_ids = self._seq[chunk.rid][chunk.start:chunk.start + chunk.tokens]
                logits = self._forward([chunk.rid], [chunk.start], [chunk_ids])
                r = self.scheduler.request(chunk.rid)
                if chunk.start + chunk.tokens >= r.prefill_target:
                    self._sample(chunk.rid, logits[0])
            if batch.decodes and batch.decodes[0].drafts:
                accepted = self._speculative(batch)
            elif batch.decodes:
                rids = [d.rid for d in batch.decodes]
                starts = [d.context for d in batch.decodes]
                ids = [[self._seq[d.rid][d.context]] for d in batch.decodes]
                logits = self._forward(rids, starts, ids)
                for row, rid in enumerate(rids):
                    self._sample(rid, logits[row])
        self.scheduler.complete(batch, StepOutcome(0.0, accepted=accepted), now)
        for rid, res in self.results.items():
            req = self.scheduler.requests.get(rid)
            if (res.finished_step is None and req is not None
                    and req.status is RequestStatus.FINISHED):
                res.finished_step = self.step_count
                self._work.pop(rid, None)
        self.step_count += 1
        if self.flush_every is not None and self.step_count % self.flush_every == 0:
            self.chain.flush_idle()
        return batch

    def run(self, max_steps: int = 10_000) -> dict[int, GenerationResult]:
        """Step until every request finished (or ``max_steps``); returns the results."""
        while not self.idle and self.step_count < max_steps:
            self.step()
        return self.results

    # --- internals ----------------------------------------------------------------------

    def _speculative(self, batch: StepBatch) -> dict[int, int]:
        """The decodes of a speculative step: draft, one verify forward of ``1 + k``
        tokens per row, accept, emit ``1 + a`` tokens, roll the state back by replay.
        Returns request id -> accepted drafts (what ``scheduler.complete`` verifies)."""
        assert self.draft is not None
        k = batch.decodes[0].drafts
        rids = [d.rid for d in batch.decodes]
        starts = [d.context for d in batch.decodes]
        drafts = [self.draft.propose(self._seq[d.rid][:d.context + 1], k)
                  for d in batch.decodes]
        for rid, dr in zip(rids, drafts, strict=True):
            if len(dr) != k:
                raise ConfigError(f"the draft proposed {len(dr)} tokens for request {rid}, "
                                  f"expected {k}")
        ids = [[self._seq[d.rid][d.context], *dr]
               for d, dr in zip(batch.decodes, drafts, strict=True)]
        replay = self.kv.geom.state is not None and not self.checkpointed
        if replay:
            self._copy_state(rids, to_checkpoint=True)
        # [B, 1 + k, vocab]; CHECKPOINTS: the state after every position saved
        logits = self._forward(rids, starts, ids, keep=1 + k, checkpoints=self.checkpointed)
        greedy = logits.argmax(dim=-1).tolist()
        found = {rid: self._accept(dr, g) for rid, dr, g in zip(rids, drafts, greedy,
                                                                strict=True)}
        kept = self.scheduler.kept_drafts(batch, found)  # capped by the output left
        accepted = dict(zip(rids, kept, strict=True))
        for row, (rid, a) in enumerate(accepted.items()):
            for pos in range(1 + a):
                self._sample(rid, logits[row, pos])
        self.spec.verifies += len(rids)
        self.spec.drafted += k * len(rids)
        self.spec.accepted += sum(kept)
        most = self.scheduler.kept_drafts(batch, dict.fromkeys(rids, k))  # output left
        self.spec.rejected += sum(found[rid] < m for rid, m in zip(rids, most, strict=True))
        if replay:
            self._replay(batch, accepted, ids, k)
        if self.checkpointed:
            ring = 1 + k
            for rid, a in accepted.items():
                w = self._work.get(rid, 0)
                self._work[rid] = self._accepted_checkpoint(w, a, ring)
                self.spec.checkpoint_rollbacks += a < k
            self.spec.checkpoints_saved += ring * len(rids)
        return accepted

    @staticmethod
    def _accepted_checkpoint(work: int, accepted: int, ring: int) -> int:
        """``CHECKPOINTS`` rollback: the ring slot that holds the state after the last
        accepted token, ``(work + accepted) mod ring`` (the verify saved the state after
        its position ``j`` into ring slot ``(work + j) mod ring``); it becomes the working
        slot."""
        return (work + accepted) % ring

    @staticmethod
    def _accept(drafts: list[int], greedy: list[int]) -> int:
        """Drafts accepted (:func:`~kvchain.hf.speculative.accepted_drafts`)."""
        return accepted_drafts(drafts, greedy)

    def _replay(self, batch: StepBatch, accepted: dict[int, int], ids: list[list[int]],
                k: int) -> None:
        """REPLAY rollback of the rows that kept fewer than ``k`` drafts: working state
        slot <- checkpoint slot, then one forward of the ``1 + a`` kept tokens per group
        of rows with equal ``a`` (their K/V are written again, the same values)."""
        groups: dict[int, list[int]] = {}
        for row, d in enumerate(batch.decodes):
            a = accepted[d.rid]
            if a < k:
                groups.setdefault(a, []).append(row)
        for a, rows in sorted(groups.items()):
            rids = [batch.decodes[r].rid for r in rows]
            self._restore_state(rids)
            self._forward(rids, [batch.decodes[r].context for r in rows],
                          [ids[r][:1 + a] for r in rows])
            self.spec.replays += len(rows)
            self.spec.replayed_tokens += (1 + a) * len(rows)

    def _restore_state(self, rids: list[int]) -> None:
        """Copy the rows' checkpoint slots back into their working slots."""
        self._copy_state(rids, to_checkpoint=False)

    def _copy_state(self, rids: list[int], to_checkpoint: bool) -> None:
        """Working state slot -> checkpoint slot (or back) for every state layer; the
        slots are translated now (the step's take may have moved them)."""
        band = self.kv.geom.state
        assert band is not None
        work, ckpt = [], []
        for rid in rids:
            slots = self.kv.page_table(rid, band)
            if len(slots) < 2:
                raise ConfigError(f"request {rid} holds {len(slots)} state slots; REPLAY "
                                  f"needs a working slot and a checkpoint")
            phys = self.chain.translate(band, slots[:2])
            work.append(int(phys[0]))
            ckpt.append(int(phys[1]))
        device = self.buffer.device
        src = torch.as_tensor(work if to_checkpoint else ckpt, device=device)
        dst = torch.as_tensor(ckpt if to_checkpoint else work, device=device)
        for binding in self.bindings.values():
            if binding.band != band:
                continue
            for view in binding.views.values():
                view[dst] = view[src]

    def _sample(self, rid: int, logits: torch.Tensor) -> None:
        res = self.results[rid]
        row = logits.float().cpu()
        token = int(row.argmax())
        res.logits.append(row)
        res.tokens.append(token)
        self._seq[rid].append(token)

    def _batch(self, rids: list[int], starts: list[int], length: int,
               checkpoints: bool = False) -> ForwardBatch:
        device = self.buffer.device
        geom = self.kv.geom
        tables: dict[int, torch.Tensor] = {}
        for band in {b.band for b in self.bindings.values()}:
            if band == geom.state:
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
        if geom.state is not None:
            # the working slot: the first one, or under CHECKPOINTS ring slot w; with
            # checkpoints, position j's state goes to ring slot (w + j) mod (1 + k)
            ring = 1 + geom.spec_tokens if self.checkpointed else 1
            cols = np.arange(length if checkpoints else 1)
            phys = []
            for rid in rids:
                have = self.kv.page_table(rid, geom.state)
                if len(have) < ring:
                    raise ConfigError(f"request {rid} holds {len(have)} state slots; "
                                      f"CHECKPOINTS needs {ring}")
                w = self._work.get(rid, 0)
                phys.append(self.chain.translate(geom.state, have[(w + cols) % ring]))
            ring_slots = torch.as_tensor(np.array(phys, dtype=np.int64), device=device)
            slots = ring_slots[:, 0].contiguous()
            if checkpoints:
                ckpt = ring_slots
        fresh = [s == 0 for s in starts]
        if any(fresh) and not all(fresh):
            raise ValueError("a forward mixes rows at position 0 with rows past it")
        start = torch.as_tensor(starts, dtype=torch.long, device=device)
        return ForwardBatch(start, length, geom.page_size, tables, slots, all(fresh),
                            self.bindings, ckpt)

    def _forward(self, rids: list[int], starts: list[int], ids: list[list[int]],
                 keep: int | None = None, checkpoints: bool = False) -> torch.Tensor:
        """One forward of rows with equal token counts; returns ``[B, vocab]`` logits of
        each row's last token, or with ``keep`` the ``[B, keep, vocab]`` logits of its last
        ``keep`` tokens. ``checkpoints``: the recurrent mixers run position by position
        and save the state after each position into the rows' checkpoint ring slots."""
        batch = self._batch(rids, starts, len(ids[0]), checkpoints)
        device = self.model.device
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=device)
        config = self.model.config
        previous = config._attn_implementation
        self.model.set_attn_implementation(ATTENTION_NAME)
        try:
            split = (per_position_state(self._mixers, self.cache) if checkpoints
                     else contextlib.nullcontext())
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
