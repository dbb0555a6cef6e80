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

The draft: a :class:`~kvchain.hf.speculative.ModelDraft` keeps transformers' own cache
(outside the chain); a :class:`~kvchain.hf.speculative.ChainDraft` keeps its KV and state
in the chain's draft bands (:func:`kvchain.model.with_draft`; a second
:class:`~kvchain.hf.runner.ModelRunner`): it prefills every prompt chunk the target
prefills, proposes by ``1 + k`` one-token decodes over its pages at positions
``L .. L + k`` (the last one writes ``d_k``'s KV and state so that its cache covers the
same tokens as the target's; its logits are not used), and is rolled back with the target:
``KVManager.verify`` truncates its pages like the target's, and its state follows the same
mode (under ``CHECKPOINTS`` its decode ``j`` reads ring slot ``w + j - 1`` and saves into
``w + j``, so one ring index serves both models; under ``REPLAY`` its checkpoint is copied
back and the ``1 + a`` kept tokens replayed through it).

Sampling is greedy (argmax of the last position's logits, fp32). Each forward translates
the rows' virtual page tables (``KVManager.page_table`` -> ``Chain.translate``) at the
moment it runs, so pages moved by the step's take are read where they now are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvchain.alloc.chain import Chain
from kvchain.bands.geometry import StateRollback
from kvchain.buffer import TorchBuffer
from kvchain.errors import ConfigError, InvalidRequestError
from kvchain.hf.layers import model_spec
from kvchain.hf.runner import ModelRunner
from kvchain.hf.speculative import ChainDraft, Draft, accepted_drafts
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model import with_draft
from kvchain.model.layers import TARGET
from kvchain.requests.manager import KVManager
from kvchain.sched.request import (
    DecodeSeq,
    EventKind,
    Request,
    RequestStatus,
    StepBatch,
    StepOutcome,
)
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
            the chain, or its prompt plus ``max_new_tokens`` exceeds the model's context:
            the rejection's own reason, with its bytes or tokens), ``None`` otherwise; a
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
        draft: proposes the drafts of speculative decode steps: a
            :class:`~kvchain.hf.speculative.ModelDraft` (its cache outside the chain) or
            a :class:`~kvchain.hf.speculative.ChainDraft` (its KV and state in the
            chain's draft bands, priced with the target's in one buffer); needs
            ``spec_tokens >= 1``.
        spec_tokens: ``k`` drafts per speculative decode step (0: plain decoding).
        rollback: how state layers roll back rejected drafts (module docstring):
            ``StateRollback.REPLAY`` (1 checkpoint slot, recompute after a rejection) or
            ``StateRollback.CHECKPOINTS`` (``k`` checkpoint slots, the verify's recurrent
            mixers run position by position, no recompute). Models without state layers
            take either (only pages roll back).

    Attributes:
        target: the target's :class:`~kvchain.hf.runner.ModelRunner`.
        drafter: a :class:`ChainDraft`'s runner over the draft bands, or ``None``.
        spec: :class:`SpecStats` of the speculative steps.
        proposals: every verify's ``(request id, its k drafts)``, in order (what the
            draft proposed; one entry per request per speculative step).

    Raises:
        ConfigError: a model's cache layers cannot be told, bad limits, a draft without
            ``spec_tokens >= 1`` (or the reverse), a chain draft whose vocabulary differs
            from the target's, or ``CHECKPOINTS`` on a model whose recurrent mixers
            cannot be found (:func:`~kvchain.hf.checkpoints.recurrent_mixers`).
        BufferTooSmallError: the buffer cannot hold one smallest request.
    """

    def __init__(self, model: Any, buffer_bytes: int, *, page_size: int = 4,
                 chunk_size: int = 8, max_running: int = 8,
                 max_prefill_tokens: int | None = None, audit: bool = False,
                 flush_every: int | None = None, draft: Draft | ChainDraft | None = None,
                 spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.REPLAY) -> None:
        if flush_every is not None and flush_every < 1:
            raise ConfigError(f"flush_every must be >= 1 or None, got {flush_every}")
        if type(spec_tokens) is not int or spec_tokens < 0:
            raise ConfigError(f"spec_tokens must be an int >= 0, got {spec_tokens!r}")
        if (draft is None) != (spec_tokens == 0):
            raise ConfigError("speculative decoding needs both a draft and spec_tokens >= 1")
        if (draft is not None and not isinstance(draft, ChainDraft)
                and not callable(getattr(draft, "propose", None))):
            raise ConfigError(f"draft must be a ChainDraft or have propose(tokens, k) (e.g. "
                              f"ModelDraft(model)); got {type(draft).__name__}")
        self.draft = draft
        self.spec = SpecStats()
        self.flush_every = flush_every
        self.model = model
        spec = model_spec(model)
        self.vocab_size = int(model.config.get_text_config(decoder=True).vocab_size)
        if isinstance(draft, ChainDraft):
            vocab = (model.config.get_text_config(decoder=True).vocab_size,
                     draft.model.config.get_text_config(decoder=True).vocab_size)
            if vocab[0] != vocab[1]:
                raise ConfigError(f"the draft's vocabulary ({vocab[1]} tokens) differs "
                                  f"from the target's ({vocab[0]})")
            spec = with_draft(spec, model_spec(draft.model))
        self.layers = tuple(x for x in spec.layers if x.owner == TARGET)
        self.layout: ChainLayout = plan_layout(spec.classes, buffer_bytes, page_size)
        self.buffer = TorchBuffer(self.layout.buffer_bytes, device=str(model.device))
        self.chain = Chain(self.layout, self.buffer)
        self.kv = KVManager(self.chain, spec_tokens=spec_tokens, rollback=rollback)
        # CHECKPOINTS on a state model: the verify's recurrent mixers run position by
        # position; each request's working ring slot (index into its 1 + k state slots)
        self.checkpointed = (spec_tokens > 0 and self.kv.geom.state is not None
                             and rollback is StateRollback.CHECKPOINTS)
        self._work: dict[int, int] = {}
        self.target = ModelRunner(model, self.layers, self.layout, self.buffer, self.chain,
                                  self.kv, checkpoints=self.checkpointed)
        self.drafter: ModelRunner | None = None
        if isinstance(draft, ChainDraft):
            self.drafter = ModelRunner(draft.model, tuple(x for x in spec.layers
                                                         if x.owner != TARGET),
                                       self.layout, self.buffer, self.chain, self.kv,
                                       checkpoints=self.checkpointed)
        # the model's context (max_position_embeddings; with a chain draft the shorter of
        # the two): a request past it is rejected at add, never run past its positions
        self.scheduler = Scheduler(self.kv, SchedulerConfig(
            max_running=max_running, chunk_size=chunk_size,
            max_prefill_tokens=max_prefill_tokens or chunk_size, audit_every_step=audit,
            max_context_tokens=spec.max_context_tokens))
        self.results: dict[int, GenerationResult] = {}
        self.proposals: list[tuple[int, list[int]]] = []  # (request id, its k drafts)
        self._pending: list[_Pending] = []
        self._seq: dict[int, list[int]] = {}
        self.step_count = 0

    @property
    def forwards(self) -> int:
        """Forwards of the target model (prefill chunks, decodes, verifies, replays)."""
        return self.target.forwards

    @property
    def draft_forwards(self) -> int:
        """Forwards of a :class:`ChainDraft` model over its pages (0 otherwise)."""
        return self.drafter.forwards if self.drafter is not None else 0

    # --- requests -----------------------------------------------------------------------

    def add(self, rid: int, prompt: Sequence[int], max_new_tokens: int,
            arrival_step: int = 0) -> None:
        """Queue a request that arrives at engine step ``arrival_step``. One whose prompt
        plus ``max_new_tokens`` exceeds the model's context (``max_position_embeddings``)
        is rejected at that step, as the scheduler rejects it: its
        :attr:`GenerationResult.rejected` starts with ``"context:"`` and it runs nothing.

        Raises:
            InvalidRequestError: an empty prompt, ``max_new_tokens < 1``, a duplicate id,
                or a prompt token that is not an int id in ``[0, vocab_size)`` of the
                target (checked here, before anything is queued).
        """
        if not prompt or max_new_tokens < 1 or rid in self.results:
            raise InvalidRequestError(f"request {rid}: need a non-empty prompt, "
                                      f"max_new_tokens >= 1 and a new id")
        bad = self._bad_token(prompt)
        if bad is not None:
            raise InvalidRequestError(f"request {rid}: prompt token id {bad!r} is not an int "
                                      f"in [0, {self.vocab_size}) (the target's vocabulary)")
        self.results[rid] = GenerationResult(rid, [int(t) for t in prompt])
        self._seq[rid] = [int(t) for t in prompt]
        self._pending.append(_Pending(rid, list(prompt), max_new_tokens, arrival_step))

    def _bad_token(self, tokens: Sequence[object]) -> object | None:
        """The first of ``tokens`` that is not a token id of the target (an int, not a
        bool, in ``[0, vocab_size)``; numpy integers count), or ``None``."""
        for t in tokens:
            if (isinstance(t, bool) or not isinstance(t, (int, np.integer))
                    or not 0 <= int(t) < self.vocab_size):
                return t
        return None

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
        batch, proposed = self._allocate(now)
        accepted: dict[int, int] = {}  # a speculative step's accepted drafts per request
        with torch.no_grad():
            for chunk in batch.prefills:
                if chunk.start == 0:  # fresh state slots (first chunk, or after retraction)
                    self._work.pop(chunk.rid, None)
                chunk_ids = self._seq[chunk.rid][chunk.start:chunk.start + chunk.tokens]
                read = [self._work.get(chunk.rid, 0)]
                logits = self.target.forward([chunk.rid], [chunk.start], [chunk_ids],
                                             read=read)
                if self.drafter is not None:  # the draft's prompt into its own pages
                    self.drafter.forward([chunk.rid], [chunk.start], [chunk_ids], read=read)
                r = self.scheduler.request(chunk.rid)
                if chunk.start + chunk.tokens >= r.prefill_target:
                    self._sample(chunk.rid, logits[0])
            if batch.decodes and batch.decodes[0].drafts:
                accepted = self._speculative(batch, proposed)
            elif batch.decodes:
                rids = [d.rid for d in batch.decodes]
                starts = [d.context for d in batch.decodes]
                ids = [[self._seq[d.rid][d.context]] for d in batch.decodes]
                logits = self.target.forward(rids, starts, ids)
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

    def _allocate(self, now: float) -> tuple[StepBatch, dict[int, list[int]]]:
        """The step's batch (``Scheduler.schedule``, then ``allocate``: the one take) and,
        for a draft outside the chain, each decode's ``k`` proposed drafts (request id ->
        drafts; empty otherwise), asked and checked between the two. A bad proposal (or a
        draft that raises) aborts the scheduled step (``Scheduler.abort``) before any page
        is taken and is raised: the chain and every request are as before the step.

        Raises:
            ConfigError: a proposal of the wrong length or with an id outside the
                vocabulary (:meth:`_check_drafts`).
        """
        step = self.scheduler.schedule(now)
        try:
            proposed = self._propose(step.decodes)
        except Exception:
            self.scheduler.abort(step)
            raise
        return self.scheduler.allocate(step, now), proposed

    def _propose(self, decodes: Sequence[DecodeSeq]) -> dict[int, list[int]]:
        """A draft outside the chain's ``k`` drafts per speculative decode, checked
        (request id -> drafts); ``{}`` for a chain draft (it proposes over its pages, after
        the take), no draft, or a step without drafts."""
        if (not decodes or not decodes[0].drafts or self.draft is None
                or isinstance(self.draft, ChainDraft)):
            return {}
        k = decodes[0].drafts
        out: dict[int, list[int]] = {}
        for d in decodes:
            drafts = list(self.draft.propose(self._seq[d.rid][:d.context + 1], k))
            self._check_drafts(d.rid, drafts, k)
            out[d.rid] = drafts
        return out

    def _check_drafts(self, rid: int, drafts: Sequence[object], k: int) -> None:
        """Refuse a proposal for request ``rid`` that is not ``k`` token ids of the target.

        Raises:
            ConfigError: a length other than ``k``, or an id outside ``[0, vocab_size)``.
        """
        if len(drafts) != k:
            raise ConfigError(f"the draft proposed {len(drafts)} tokens for request {rid}, "
                              f"expected {k}")
        bad = self._bad_token(drafts)
        if bad is not None:
            raise ConfigError(f"the draft proposed token id {bad!r} for request {rid}, "
                              f"outside the vocabulary [0, {self.vocab_size})")

    def _speculative(self, batch: StepBatch,
                     proposed: dict[int, list[int]]) -> dict[int, int]:
        """The decodes of a speculative step: draft (a chain draft's here; another's
        ``proposed``, asked and checked before the take by :meth:`_allocate`), one verify
        forward of ``1 + k`` tokens per row, accept, emit ``1 + a`` tokens, roll the state
        back (replay, or the ring index under ``CHECKPOINTS``). Returns request id ->
        accepted drafts (what ``scheduler.complete`` verifies)."""
        assert self.draft is not None
        k = batch.decodes[0].drafts
        rids = [d.rid for d in batch.decodes]
        starts = [d.context for d in batch.decodes]
        ring = 1 + k
        work = [self._work.get(rid, 0) for rid in rids]
        replay = self.kv.geom.state is not None and not self.checkpointed
        if self.drafter is not None:
            drafts = self._chain_drafts(batch, k, work, replay)  # k argmax ids each
        else:
            drafts = [proposed[rid] for rid in rids]
        for rid, dr in zip(rids, drafts, strict=True):
            self.proposals.append((rid, list(dr)))
        ids = [[self._seq[d.rid][d.context], *dr]
               for d, dr in zip(batch.decodes, drafts, strict=True)]
        if replay:
            self.target.copy_state(rids, 0, 1)
        write = None
        if self.checkpointed:  # the state after position j into ring slot (w + j) mod ring
            write = (np.array(work)[:, None] + np.arange(ring)[None, :]) % ring
        # [B, 1 + k, vocab]
        logits = self.target.forward(rids, starts, ids, keep=ring, read=work, write=write)
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
            for rid, w in zip(rids, work, strict=True):
                a = accepted[rid]
                self._work[rid] = self._accepted_checkpoint(w, a, ring)
                self.spec.checkpoint_rollbacks += a < k
            self.spec.checkpoints_saved += ring * len(rids)
        return accepted

    def _chain_drafts(self, batch: StepBatch, k: int, work: list[int],
                      replay: bool) -> list[list[int]]:
        """A :class:`ChainDraft`'s ``k`` greedy drafts per row: ``1 + k`` one-token
        forwards of the draft over its pages, all rows together, at positions
        ``L + j`` (``j = 0 .. k``; the last computes ``d_k``'s KV and state, its logits
        unused). Its state: under ``REPLAY`` its working slot is first copied to its
        checkpoint; under ``CHECKPOINTS`` forward ``j`` reads ring slot ``w + j - 1``
        (``w`` for ``j = 0``) and saves into ``w + j``, as the target's verify does."""
        assert self.drafter is not None
        rids = [d.rid for d in batch.decodes]
        ring = 1 + k
        if replay:
            self.drafter.copy_state(rids, 0, 1)
        tokens = [self._seq[d.rid][d.context] for d in batch.decodes]
        drafts: list[list[int]] = [[] for _ in rids]
        w = np.array(work, dtype=np.int64)
        for j in range(ring):
            read, write = w, None
            if self.checkpointed:
                read = self._draft_read_slot(w, j, ring)
                write = ((w + j) % ring)[:, None]
            logits = self.drafter.forward(rids, [d.context + j for d in batch.decodes],
                                          [[t] for t in tokens], read=read.tolist(),
                                          write=write)
            if j == k:
                break
            tokens = [int(t) for t in logits.float().argmax(dim=-1).tolist()]
            for row, t in enumerate(tokens):
                drafts[row].append(t)
        return drafts

    @staticmethod
    def _draft_read_slot(work: np.ndarray, j: int, ring: int) -> np.ndarray:
        """``CHECKPOINTS``: the ring slots a chain draft's decode ``j`` reads its state
        from, the state after position ``j - 1`` that decode ``j - 1`` saved into
        ``(work + j - 1) mod ring`` (for ``j = 0`` the working slot ``work``)."""
        return (work + max(j - 1, 0)) % ring

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
        of rows with equal ``a`` (their K/V are written again, the same values), through
        the target and a chain draft."""
        groups: dict[int, list[int]] = {}
        for row, d in enumerate(batch.decodes):
            a = accepted[d.rid]
            if a < k:
                groups.setdefault(a, []).append(row)
        for a, rows in sorted(groups.items()):
            rids = [batch.decodes[r].rid for r in rows]
            starts = [batch.decodes[r].context for r in rows]
            kept = [ids[r][:1 + a] for r in rows]
            self._restore_state(rids)
            self.target.forward(rids, starts, kept)
            if self.drafter is not None:
                self.drafter.forward(rids, starts, kept)
            self.spec.replays += len(rows)
            self.spec.replayed_tokens += (1 + a) * len(rows)

    def _restore_state(self, rids: list[int]) -> None:
        """Copy the rows' checkpoint slots back into their working slots (target and a
        chain draft)."""
        self.target.copy_state(rids, 1, 0)
        if self.drafter is not None:
            self.drafter.copy_state(rids, 1, 0)

    def _sample(self, rid: int, logits: torch.Tensor) -> None:
        res = self.results[rid]
        row = logits.float().cpu()
        token = int(row.argmax())
        res.logits.append(row)
        res.tokens.append(token)
        self._seq[rid].append(token)
