"""Roofline GPU cost model: how long one engine step takes.

One step runs one forward pass over a batch: a prefill chunk of ``c`` tokens for some
sequences (``s`` tokens already cached before the chunk), one decode token for others
(``c = 1``, ``s`` = context length). Its time is the roofline bound plus a fixed overhead::

    step_time = max(FLOPs / (peak_flops x mfu), bytes / (hbm_bandwidth x mbu)) + overhead

FLOPs (per tensor-parallel rank, like every :class:`~kvchain.model.spec.ModelSpec` figure):

- linear layers: ``2 x active_params x tokens`` (one multiply-add per weight per token);
- attention, per class, per layer, per (query token, key) pair:
  ``2 x heads x (d_qk + d_v)`` (``QK^T`` and ``PV``); with ``d_qk = d_v = head_dim`` that is
  the usual ``4 x heads x head_dim``. A token at position ``p`` attends ``p + 1`` keys (full),
  ``min(p + 1, W)`` (window) or ``(p mod C) + 1`` (chunked local);
- state layers (Mamba, Gated DeltaNet, lightning): a linear recurrence costing
  :data:`STATE_FLOPS_PER_ELEMENT` (4) FLOPs per state element per token (a multiply-add to
  update, a multiply-add to read out); their projections are already in ``active_params``.

Bytes:

- weights once per step. Dense models read all ``weight_bytes``. MoE models read the
  experts the batch touches; we take each weight as touched by each token independently
  with probability ``a = active_params / total_params``, so ``n`` tokens read
  ``weight_bytes x (1 - (1 - a)^n)``: exactly the active weights for one token, all of them
  for a large batch, monotone in between (this treats shared weights like experts, so it
  undercounts small batches of models with a large shared part);
- KV read: the keys a sequence's chunk attends, once per step (full ``s + c`` tokens, window
  ``min(s, W - 1) + c``, local ``(s mod C) + c``) times that class's ``E`` (bytes per token);
- KV written: every computed token, ``tokens x (E_full + E_win + E_loc)``;
- state: each sequence reads and writes its slot once: ``2 x S`` per sequence.

Ignored: activations' memory traffic, tensor-parallel communication, kernel launch gaps and
CUDA-graph effects (folded into ``step_overhead_s``), the LM head and sampling of only the
last token, FlashAttention re-reading KV tiles per query tile, prefix-cache hits (the
caller passes only computed tokens).

Worked example (``tests/sim/test_cost.py``): one full and one window layer (``W = 4``),
each K and V ``[2 heads, 4]`` bf16 (``E = 32 B``), 4 query heads, 1,000 params in 2,000 B;
a decode at context 10 does ``2,000 + 64 x 11 + 64 x 4 = 2,960`` FLOPs and moves
``2,000 + 32 x 11 + 32 x 4 + 64 = 2,544`` B.

Defaults (assumptions, with reasons):

- :data:`DEFAULT_MBU` 0.7: optimized CUDA serving stacks sustain about 70-85% of peak HBM
  bandwidth in decode (rule of thumb, https://www.open-source-ai.tech/glossary/model-
  bandwidth-utilization); a device-to-device copy on an H200 here reached 4.3 of 4.8 TB/s
  (0.90, measured for this project), the ceiling. We take the low end.
- :data:`DEFAULT_MFU` 0.5: a large bf16 matrix product on an H200 here ran at 788 TFLOP/s
  (0.80 of 989.4, same measurement), the ceiling for the linear layers; a whole step also runs
  attention, norms, activations and MoE routing at lower rates, so we take 0.5.
- :data:`DEFAULT_STEP_OVERHEAD_S` 1 ms: scheduling, input preparation and sampling not
  hidden by overlap scheduling (engines that overlap them approach 0: pass 0).

Step clock: :class:`StepClock` replaces the roofline by instant compute: every scheduler
step takes a fixed tick (``--clock steps --step-ms 30``), so a run can be compared step for
step with engines' CPU scheduler drivers (which run the scheduler without a model).

Page copies (the chain's own cost; :meth:`GPUCostModel.copy_time`): a step whose take
compacts or relocates pages copies ``b`` bytes device to device, which reads and writes each
byte once: ``copy_s = 2 x b / (hbm_bandwidth x mbu)``. Model: the copy runs as its own
kernel before the step's forward and does not overlap any forward. It cannot overlap this
step's forward, which reads the pages it moves; and it cannot overlap the previous forward,
which may still write the pages being moved - a copy waits for that forward's fence. The
simulator's loop runs the scheduler after the previous forward ended, so that wait has
already elapsed and costs nothing more than the serialization charged here: the step takes
``copy_s + forward time``. Baselines copy nothing and pay nothing. Example: 10 pages of
65,536 B on an H200 (4.8e12 B/s, mbu 0.7) cost ``2 x 655,360 / 3.36e12 = 0.39 us``.

Speed: :meth:`GPUCostModel.step_time` is a dozen float operations on an aggregate
:class:`StepWork`; the scheduler sums per-sequence work as it builds the batch with a
:class:`StepWorkBuilder` (or its own running sums, with the formulas above).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvchain.errors import ConfigError, CostModelError
from kvchain.gpu import GPUSpec
from kvchain.model.layers import LayerCache, LifetimeClass
from kvchain.model.spec import ModelSpec

#: FLOPs per state element per token of a recurrent layer (multiply-add update + readout).
STATE_FLOPS_PER_ELEMENT = 4
#: Fraction of peak HBM bandwidth a step achieves (module docstring: source and reasoning).
DEFAULT_MBU = 0.7
#: Fraction of peak dense bf16 FLOP/s a step achieves (module docstring).
DEFAULT_MFU = 0.5
#: Fixed seconds per step on top of the roofline bound (module docstring).
DEFAULT_STEP_OVERHEAD_S = 1e-3


#: Default tick of the step clock (ms of trace time per scheduler step).
DEFAULT_STEP_MS = 30.0


class ClockKind(enum.StrEnum):
    """How the simulator advances time: ``roofline`` (:class:`GPUCostModel`) or ``steps``
    (:class:`StepClock`: one scheduler step = one fixed tick)."""

    ROOFLINE = "roofline"
    STEPS = "steps"


@dataclass(frozen=True, slots=True)
class StepClock:
    """Instant compute: every step that computes at least one token takes ``step_s``.

    Attributes:
        step_s: seconds of trace time per scheduler step (``--step-ms 30`` -> 0.030).

    Raises:
        ConfigError: ``step_s`` not finite and > 0.
    """

    step_s: float = DEFAULT_STEP_MS / 1000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ConfigError(f"step clock tick must be a finite number of seconds > 0, got "
                              f"{self.step_s}")

    def step_time(self, work: StepWork) -> float:
        """``step_s`` for a step with tokens, 0 for an empty one (as the roofline)."""
        return self.step_s if work.tokens else 0.0

    def run_times(self, work: DecodeRunWork) -> np.ndarray:
        """Seconds of each step of a decode run: ``step_s`` each (0 for an empty batch),
        float64 ``[steps]``."""
        return np.full(work.steps, self.step_s if work.sequences else 0.0)

    def copy_time(self, copied_bytes: int) -> float:
        """0: the step clock models instant compute, page copies included (copied bytes
        are still counted in the summary).

        Raises:
            CostModelError: negative ``copied_bytes``.
        """
        if copied_bytes < 0:
            raise CostModelError(f"copied_bytes must be >= 0, got {copied_bytes}")
        return 0.0


# --- work ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepWork:
    """The work of one engine step, summed over its sequences.

    Per sequence with ``s`` tokens cached before the step and ``c`` tokens computed in it
    (``c = 1`` for a decode), positions ``s .. s + c - 1``:

    ======================  =================================================
    field                   per-sequence contribution
    ======================  =================================================
    ``sequences``           1
    ``tokens``              ``c``
    ``full_pairs``          ``sum_p (p + 1) = c x s + c (c + 1) / 2``
    ``window_pairs``        ``sum_p min(p + 1, W)``
    ``local_pairs``         ``sum_p ((p mod C) + 1)``
    ``full_kv_tokens``      ``s + c``
    ``window_kv_tokens``    ``min(s, W - 1) + c``
    ``local_kv_tokens``     ``(s mod C) + c``
    ======================  =================================================

    Pairs are (query token, key) pairs per layer of that class. Classes the model lacks
    contribute nothing (their fields stay 0).

    Raises:
        CostModelError: a negative field, or fewer tokens than sequences.
    """

    sequences: int = 0
    tokens: int = 0
    full_pairs: int = 0
    window_pairs: int = 0
    local_pairs: int = 0
    full_kv_tokens: int = 0
    window_kv_tokens: int = 0
    local_kv_tokens: int = 0

    def __post_init__(self) -> None:
        if min(self.sequences, self.full_pairs, self.window_pairs, self.local_pairs,
               self.full_kv_tokens, self.window_kv_tokens, self.local_kv_tokens) < 0 \
                or self.tokens < self.sequences:
            raise CostModelError(f"invalid step work {self}: fields must be >= 0 and "
                                 f"tokens >= sequences")

    def __add__(self, other: StepWork) -> StepWork:
        """Field-wise sum (the work of two batches run as one step)."""
        return StepWork(self.sequences + other.sequences, self.tokens + other.tokens,
                        self.full_pairs + other.full_pairs,
                        self.window_pairs + other.window_pairs,
                        self.local_pairs + other.local_pairs,
                        self.full_kv_tokens + other.full_kv_tokens,
                        self.window_kv_tokens + other.window_kv_tokens,
                        self.local_kv_tokens + other.local_kv_tokens)


@dataclass(frozen=True, slots=True)
class SequenceWork:
    """One sequence's share of a step.

    Attributes:
        tokens: tokens computed (``c``): the prefill chunk, or 1 for a decode.
        context: tokens cached before the step (``s``).
    """

    tokens: int
    context: int

    @staticmethod
    def decode(context: int) -> SequenceWork:
        """A decode step at ``context`` tokens."""
        return SequenceWork(1, context)


@dataclass(frozen=True, slots=True, eq=False)
class DecodeRunWork:
    """The work of ``steps`` consecutive decode steps of one batch (a decode run of the
    simulator's fast-forward): ``sequences`` requests decode in every step; in step ``j``
    the request with ``L`` cached tokens before the run decodes at context ``L + j``.

    Per step the fields are those :class:`StepWorkBuilder` sums with one
    :meth:`~StepWorkBuilder.add_decode` per request (``tokens = sequences``; each pairs
    field equals its KV-tokens field for a decode).

    Attributes:
        sequences: requests in the batch (``n``).
        full_pairs: int64 ``[steps]``: ``sum (L + j + 1)``.
        window_pairs: int64 ``[steps]``: ``sum min(L + j + 1, W)`` (0 without a window).
        local_pairs: int64 ``[steps]``: ``sum ((L + j) mod C + 1)`` (0 without a chunk).
    """

    sequences: int
    full_pairs: np.ndarray
    window_pairs: np.ndarray
    local_pairs: np.ndarray

    @property
    def steps(self) -> int:
        """Steps of the run."""
        return int(self.full_pairs.shape[0])

    def step(self, j: int) -> StepWork:
        """Step ``j``'s :class:`StepWork` (what the per-step loop builds)."""
        n = self.sequences
        full, win, loc = (int(self.full_pairs[j]), int(self.window_pairs[j]),
                          int(self.local_pairs[j]))
        return StepWork(n, n, full, win, loc, full, win, loc)


def _window_prefix(n: int, w: int) -> int:
    """``sum_{q=1..n} min(q, w)``."""
    if n <= w:
        return n * (n + 1) // 2
    return w * (w + 1) // 2 + (n - w) * w


def _local_prefix(n: int, c: int) -> int:
    """``sum_{p=0..n-1} ((p mod c) + 1)``."""
    r = n % c
    return (n // c) * (c * (c + 1) // 2) + r * (r + 1) // 2


class StepWorkBuilder:
    """Sums per-sequence work into a :class:`StepWork` while the scheduler builds a batch.

    Args:
        window: ``W`` tokens of the model's window class, or ``None`` if it has none.
        local_chunk: ``C`` tokens of its chunked-local class, or ``None``.

    Example: ``W = 4``, a prefill of 8 tokens at context 0 adds
    ``full_pairs = 36``, ``window_pairs = 10 + 4 x 4 = 26``, ``window_kv_tokens = 8``.
    """

    __slots__ = ("_full", "_full_kv", "_local", "_local_chunk", "_local_kv", "_seqs",
                 "_tokens", "_win", "_win_kv", "_window")

    def __init__(self, window: int | None = None, local_chunk: int | None = None) -> None:
        if (window is not None and window < 1) or (local_chunk is not None and local_chunk < 1):
            raise ConfigError(f"window and local_chunk must be >= 1 token, got {window} and "
                              f"{local_chunk}")
        self._window = window
        self._local_chunk = local_chunk
        self.reset()

    def reset(self) -> None:
        """Start a new step."""
        self._seqs = self._tokens = 0
        self._full = self._win = self._local = 0
        self._full_kv = self._win_kv = self._local_kv = 0

    def add_prefill(self, tokens: int, context: int) -> None:
        """Add a prefill chunk of ``tokens`` tokens after ``context`` cached tokens.

        Raises:
            CostModelError: ``tokens < 1`` or ``context < 0``.
        """
        if tokens < 1 or context < 0:
            raise CostModelError(f"a chunk needs tokens >= 1 and context >= 0, got tokens "
                                 f"{tokens}, context {context}")
        s, c = context, tokens
        self._seqs += 1
        self._tokens += c
        self._full += c * s + c * (c + 1) // 2
        self._full_kv += s + c
        w = self._window
        if w is not None:
            self._win += _window_prefix(s + c, w) - _window_prefix(s, w)
            self._win_kv += min(s, w - 1) + c
        lc = self._local_chunk
        if lc is not None:
            self._local += _local_prefix(s + c, lc) - _local_prefix(s, lc)
            self._local_kv += s % lc + c

    def add_verify(self, context: int, drafts: int) -> None:
        """Add a speculative decode's verify forward: the token sampled last and
        ``drafts`` draft tokens after ``context`` cached tokens, computed as one chunk of
        ``1 + drafts`` tokens (causal among themselves: the target scores every draft in
        one forward). The drafts' own forwards are not charged here: without a draft model
        they are free (an MTP / EAGLE head of about one layer, or n-gram lookup); a draft
        model with KV of its own is charged by :class:`DraftCostModel` (docs/design.md,
        speculative decoding and draft model bands).

        Raises:
            CostModelError: ``context < 0`` or ``drafts < 0``.
        """
        if drafts < 0:
            raise CostModelError(f"drafts must be >= 0, got {drafts}")
        self.add_prefill(1 + drafts, context)

    def add_decode(self, context: int) -> None:
        """Add one decode token after ``context`` cached tokens: a one-token chunk
        (:meth:`add_prefill`'s formulas at ``tokens = 1``).

        Raises:
            CostModelError: ``context < 0``.
        """
        self.add_prefill(1, context)

    def add_decodes(self, contexts: np.ndarray) -> None:
        """Add one decode token for each context length in ``contexts`` (vectorized: step
        0 of :meth:`decode_run`).

        Raises:
            CostModelError: a negative context.
        """
        ctx = np.asarray(contexts, dtype=np.int64)
        if ctx.size == 0:
            return
        run = self.decode_run(ctx, 1)
        n = run.sequences
        self._seqs += n
        self._tokens += n
        self._full += int(run.full_pairs[0])
        self._full_kv += int(run.full_pairs[0])
        self._win += int(run.window_pairs[0])
        self._win_kv += int(run.window_pairs[0])
        self._local += int(run.local_pairs[0])
        self._local_kv += int(run.local_pairs[0])

    def decode_run(self, contexts: np.ndarray, steps: int) -> DecodeRunWork:
        """The work of ``steps`` decode steps of the batch whose context lengths before the
        first step are ``contexts`` (each grows by one token a step), as arrays over the
        steps: step ``j`` equals :meth:`add_decode` of every ``contexts + j`` after a
        :meth:`reset` (the builder's own sums are not touched).

        Raises:
            CostModelError: a negative context, or ``steps < 1``.
        """
        ctx = np.asarray(contexts, dtype=np.int64)
        if steps < 1 or (ctx.size and int(ctx.min()) < 0):
            raise CostModelError(f"a decode run needs steps >= 1 and contexts >= 0, got "
                                 f"steps {steps}")
        n = int(ctx.size)
        j = np.arange(steps, dtype=np.int64)
        full = int(ctx.sum()) + n + n * j
        zero = np.zeros(steps, dtype=np.int64)
        win = loc = zero
        if n and (self._window is not None or self._local_chunk is not None):
            pos = ctx[None, :] + j[:, None]  # [steps, n]: each step's contexts
            if self._window is not None:
                win = np.minimum(pos + 1, self._window).sum(axis=1)
            if self._local_chunk is not None:
                loc = (pos % self._local_chunk).sum(axis=1) + n
        return DecodeRunWork(n, full, win, loc)

    def add(self, seq: SequenceWork) -> None:
        """Add one :class:`SequenceWork` (a decode when ``tokens == 1`` and ``context``
        is the cached length: both formulas agree there)."""
        self.add_prefill(seq.tokens, seq.context)

    def build(self) -> StepWork:
        """The summed work so far (the builder keeps counting until :meth:`reset`)."""
        return StepWork(self._seqs, self._tokens, self._full, self._win, self._local,
                        self._full_kv, self._win_kv, self._local_kv)


# --- cost ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepCost:
    """The roofline terms of one step.

    Attributes:
        flops: FLOPs of the step.
        bytes: HBM bytes moved (weights + KV read + KV written + state).
        weight_bytes: of ``bytes``, the weights.
        compute_s: ``flops / (peak x mfu)``.
        memory_s: ``bytes / (bandwidth x mbu)``.
        overhead_s: the fixed per-step overhead (0 for an empty step).
        total_s: ``max(compute_s, memory_s) + overhead_s``.
    """

    flops: float
    bytes: float
    weight_bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float
    total_s: float

    @property
    def compute_bound(self) -> bool:
        """True when compute, not HBM bandwidth, sets the step's time."""
        return self.compute_s > self.memory_s


def attention_flops_per_pair(layer: LayerCache, heads: int) -> int:
    """FLOPs of one (query, key) pair in one attention layer: ``2 x heads x (d_qk + d_v)``.

    ``d_qk``, ``d_v``: the last dimension of the layer's ``"k"`` and ``"v"`` tensors (``v``
    defaults to ``k``); for an MLA ``"latent"`` tensor both are its width (absorbed MLA
    attends over the latent; the rope part is folded in). Layers without these tensors
    (e.g. only indexer keys) cost 0 here. Example: K 192, V 128, 8 heads: 5,120.
    """
    dims = {t.name: t.shape[-1] if t.shape else 1 for t in layer.tensors}
    if "k" in dims:
        d_qk = dims["k"]
        d_v = dims.get("v", d_qk)
    elif "latent" in dims:
        latent = next(t for t in layer.tensors if t.name == "latent")
        d_qk = d_v = math.prod(latent.shape)
    else:
        return 0
    return 2 * heads * (d_qk + d_v)


class GPUCostModel:
    """Step times of one model on one GPU by the roofline (module docstring).

    Args:
        model: the model (per tensor-parallel rank).
        gpu: the GPU's published peaks.
        mfu: achieved fraction of peak FLOP/s, in ``(0, 1]``.
        mbu: achieved fraction of peak HBM bandwidth, in ``(0, 1]``.
        step_overhead_s: fixed seconds per non-empty step, ``>= 0``.

    Raises:
        ConfigError: an efficiency outside ``(0, 1]``, a negative overhead, or a model with
            ``total_params < 1``, ``active_params`` outside ``[1, total_params]`` or
            negative ``weight_bytes``.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, *, mfu: float = DEFAULT_MFU,
                 mbu: float = DEFAULT_MBU,
                 step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S) -> None:
        for name, value in (("mfu", mfu), ("mbu", mbu)):
            if not (0.0 < value <= 1.0):
                raise ConfigError(f"{name} must be in (0, 1], got {value}")
        if not (step_overhead_s >= 0.0 and math.isfinite(step_overhead_s)):
            raise ConfigError(f"step_overhead_s must be >= 0, got {step_overhead_s}")
        violated = [text for bad, text in (
            (model.total_params < 1, f"total_params >= 1 ({model.total_params})"),
            (model.active_params < 1, f"active_params >= 1 ({model.active_params})"),
            (model.active_params > model.total_params >= 1,
             f"active_params ({model.active_params}) <= total_params "
             f"({model.total_params})"),
            (model.weight_bytes < 0, f"weight_bytes >= 0 ({model.weight_bytes})")) if bad]
        if violated:
            raise ConfigError(
                f"model {model.name}: need {' and '.join(violated)}; a model declared "
                f"without weights needs them (spec file: weight_bytes, total_params, "
                f"active_params) or the step clock (--clock steps)")
        self.model = model
        self.gpu = gpu
        self.mfu = mfu
        self.mbu = mbu
        self.step_overhead_s = step_overhead_s

        heads = model.num_attention_heads

        def pair_flops(lifetime: LifetimeClass) -> int:
            return sum(attention_flops_per_pair(x, heads)
                       for cls in model.cache_classes(lifetime) for x in cls.layers)

        state = model.cache_class(LifetimeClass.STATE)
        state_elements = 0 if state is None else sum(
            math.prod(t.shape) for x in state.layers for t in x.tensors)
        # Several window (or chunk) sizes: the step's work counts every window layer at the
        # largest window - an upper bound on their attention work and KV reads (the KV
        # cache's pages are still accounted per class by the chain, exactly).
        windows = [c.window for c in model.cache_classes(LifetimeClass.WINDOW) if c.window]
        chunks = [c.window for c in model.cache_classes(LifetimeClass.LOCAL) if c.window]
        self._window = max(windows) if windows else None
        self._local_chunk = max(chunks) if chunks else None

        self.flops_per_token = 2 * model.active_params + STATE_FLOPS_PER_ELEMENT * state_elements
        self.flops_per_pair = {lt: pair_flops(lt) for lt in
                               (LifetimeClass.FULL, LifetimeClass.WINDOW, LifetimeClass.LOCAL)}
        self._f_full = self.flops_per_pair[LifetimeClass.FULL]
        self._f_win = self.flops_per_pair[LifetimeClass.WINDOW]
        self._f_loc = self.flops_per_pair[LifetimeClass.LOCAL]
        self._e_full = model.bytes_per_token(LifetimeClass.FULL)
        self._e_win = model.bytes_per_token(LifetimeClass.WINDOW)
        self._e_loc = model.bytes_per_token(LifetimeClass.LOCAL)
        self._e_written = self._e_full + self._e_win + self._e_loc
        self._state_rw = 2 * model.state_bytes
        self._weights = float(model.weight_bytes)
        self._untouched = 1.0 - model.active_params / model.total_params
        self._flop_rate = gpu.peak_dense_bf16_flops * mfu
        self._byte_rate = gpu.hbm_bytes_per_s * mbu

    def builder(self) -> StepWorkBuilder:
        """A :class:`StepWorkBuilder` with this model's window and local chunk."""
        return StepWorkBuilder(self._window, self._local_chunk)

    def work_of(self, sequences: Iterable[SequenceWork]) -> StepWork:
        """Sum per-sequence work (convenience; the scheduler can use :meth:`builder`)."""
        b = self.builder()
        for seq in sequences:
            b.add(seq)
        return b.build()

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes a step of ``tokens`` tokens reads:
        ``weight_bytes x (1 - (1 - active/total)^tokens)`` (all of them for a dense model
        and any ``tokens >= 1``; 0 for no tokens)."""
        return self._weights * (1.0 - self._untouched ** tokens)

    def step_time(self, work: StepWork) -> float:
        """Seconds of one step: ``max(FLOPs / (peak x mfu), bytes / (bandwidth x mbu))
        + step_overhead_s``; 0 for a step with no tokens."""
        tokens = work.tokens
        if tokens == 0:
            return 0.0
        flops = self._flops(tokens, work.full_pairs, work.window_pairs, work.local_pairs)
        moved = self._moved(tokens, work.full_kv_tokens, work.window_kv_tokens,
                            work.local_kv_tokens, work.sequences)
        return max(flops / self._flop_rate, moved / self._byte_rate) + self.step_overhead_s

    def _flops(self, tokens: int, full: Any, window: Any, local: Any) -> Any:
        """A step's FLOPs: per-token (weights) plus per attention pair of each class; the
        one copy of the formula, over ints (a step) or int64 arrays (a decode run)."""
        return (self.flops_per_token * tokens + self._f_full * full + self._f_win * window
                + self._f_loc * local)

    def _moved(self, tokens: int, full: Any, window: Any, local: Any, sequences: Any) -> Any:
        """A step's bytes moved: the weights read, the KV read per class (``full`` ...
        tokens of KV), the KV written and the states read and written; the one copy of
        the formula, over ints or arrays as :meth:`_flops`."""
        return (self.weight_bytes_read(tokens) + self._e_full * full + self._e_win * window
                + self._e_loc * local + self._e_written * tokens + self._state_rw * sequences)

    def run_times(self, work: DecodeRunWork) -> np.ndarray:
        """Seconds of each step of a decode run, float64 ``[steps]``: :meth:`step_time` of
        each step's work as array arithmetic over the steps, with the same operations in
        the same order (integer FLOPs exact in int64, each term converted to float where
        the scalar formula converts it), so each entry equals ``step_time(work.step(j))``
        bit for bit (tested). Falls back to the scalar formula per step if a FLOP count
        could leave the range where int64 is exact.
        """
        n = work.sequences
        if n == 0:
            return np.zeros(work.steps)
        bound = (abs(self.flops_per_token) * n + abs(self._f_full) * int(work.full_pairs[-1])
                 + abs(self._f_win) * int(work.window_pairs.max())
                 + abs(self._f_loc) * int(work.local_pairs.max()))
        if bound >= 2 ** 62:
            return np.array([self.step_time(work.step(j)) for j in range(work.steps)])
        # A decode reads as many KV tokens as it has attention pairs.
        flops = self._flops(n, work.full_pairs, work.window_pairs, work.local_pairs)
        moved = self._moved(n, work.full_pairs, work.window_pairs, work.local_pairs, n)
        return np.maximum(flops / self._flop_rate, moved / self._byte_rate) \
            + self.step_overhead_s

    def copy_time(self, copied_bytes: int) -> float:
        """Seconds to copy ``copied_bytes`` bytes of pages within HBM (compaction or
        relocation): ``2 x copied_bytes / (hbm_bandwidth x mbu)``, each byte read once and
        written once, serialized with the forwards (module docstring: the model).

        Raises:
            CostModelError: negative ``copied_bytes``.
        """
        if copied_bytes < 0:
            raise CostModelError(f"copied_bytes must be >= 0, got {copied_bytes}")
        return 2.0 * copied_bytes / self._byte_rate

    def breakdown(self, work: StepWork) -> StepCost:
        """The roofline terms of one step (same arithmetic as :meth:`step_time`)."""
        tokens = work.tokens
        flops = float(self._flops(tokens, work.full_pairs, work.window_pairs,
                                  work.local_pairs))
        weights = self.weight_bytes_read(tokens)
        moved = self._moved(tokens, work.full_kv_tokens, work.window_kv_tokens,
                            work.local_kv_tokens, work.sequences)
        compute_s = flops / self._flop_rate
        memory_s = moved / self._byte_rate
        overhead = self.step_overhead_s if tokens else 0.0
        total = max(compute_s, memory_s) + overhead if tokens else 0.0
        return StepCost(flops, float(moved), weights, compute_s, memory_s, overhead, total)

    def __repr__(self) -> str:
        return (f"GPUCostModel({self.model.name!r} on {self.gpu.name}, mfu={self.mfu}, "
                f"mbu={self.mbu}, overhead={self.step_overhead_s} s)")


# --- the draft model's forwards (speculative decoding) -------------------------------------


class DraftCostModel:
    """Seconds a speculative step spends in the draft model's forwards (docs/design.md,
    "Draft model bands").

    The draft (:mod:`kvchain.model.draft`) proposes ``k`` drafts per decoding request one
    forward at a time. Per step, as vLLM's proposer runs it (``vllm/v1/spec_decode/
    eagle.py``, ``propose``: one forward over the tokens the target just computed, then
    ``num_speculative_tokens - 1`` forwards of one token per request; the draft-model
    proposer subclasses it):

    * forward 1: every prefill chunk of the step (``c`` tokens after ``s``, the draft's
      prefill over the prompt) and one token per decoding request at its context;
    * forwards ``2 .. k``: one token per decoding request at context ``s + i - 1``.

    Each forward is priced by the roofline of the draft's own spec
    (:class:`GPUCostModel` of ``model.draft``: its weights read once per forward, so ``k``
    times a step; its own KV read at its own bytes per token and windows; its state read
    and written), with no per-forward overhead (the step's overhead is charged once, by the
    target's forward; engines run the draft loop in one CUDA graph). A draft that shares
    the target's KV (``MTP_SHARED``) or no draft costs nothing
    (:meth:`of` gives ``None``), as before. Not charged: a draft's state replay under
    ``REPLAY`` rollback (the target's replay is charged by the simulator).

    Args:
        draft: the draft's own spec (``ModelSpec.draft``).
        gpu: the GPU.
        mfu, mbu: as :class:`GPUCostModel`.

    Raises:
        ConfigError: as :class:`GPUCostModel` (a draft without weights or parameters).
    """

    def __init__(self, draft: ModelSpec, gpu: GPUSpec, *, mfu: float = DEFAULT_MFU,
                 mbu: float = DEFAULT_MBU) -> None:
        self.cost = GPUCostModel(draft, gpu, mfu=mfu, mbu=mbu, step_overhead_s=0.0)
        self._builder = self.cost.builder()

    @staticmethod
    def of(model: ModelSpec, gpu: GPUSpec, *, mfu: float = DEFAULT_MFU,
           mbu: float = DEFAULT_MBU) -> DraftCostModel | None:
        """The draft cost of ``model``'s draft, or ``None`` when it has none or its draft
        shares the target's KV (``MTP_SHARED``: charged as a free head)."""
        kind = model.draft_kind
        if model.draft is None or kind is None or kind.shares_target_kv:
            return None
        return DraftCostModel(model.draft, gpu, mfu=mfu, mbu=mbu)

    def step_seconds(self, prefills: Iterable[tuple[int, int]],
                     decodes: Iterable[tuple[int, int]]) -> float:
        """Seconds of the draft's forwards in one step.

        Args:
            prefills: ``(tokens, start)`` of every prefill chunk of the step.
            decodes: ``(context, drafts)`` of every decoding request (``drafts = k``; a
                decode with 0 drafts still runs forward 1, keeping the draft's KV level
                with the target's).

        Returns:
            ``sum over forwards f = 1 .. max(drafts)`` of the draft roofline of that
            forward's tokens (above); 0 when the step computes nothing.
        """
        b, cost = self._builder, self.cost
        seqs = list(decodes)
        b.reset()
        for tokens, start in prefills:
            b.add_prefill(tokens, start)
        for context, _ in seqs:
            b.add_decode(context)
        total = cost.step_time(b.build())
        for i in range(1, max((d for _, d in seqs), default=0)):
            b.reset()
            for context, drafts in seqs:
                if drafts > i:
                    b.add_decode(context + i)
            total += cost.step_time(b.build())
        return total


# --- host <-> device transfers (the host KV tier) -------------------------------------------

#: Fraction of a host link's nominal per-direction rate a large pinned-memory copy achieves:
#: 0.8. Measured by NVIDIA's nvbandwidth tool: an A100 SXM (PCIe 4.0 x16, 32 GB/s nominal)
#: copied host -> device at 25.13 GB/s = 0.79 (NVIDIA/nvbandwidth issue #42); an H100 (PCIe
#: 5.0 x16, 64 GB/s) device -> host at 52.77 GB/s = 0.82 (issue #24); a GH200 (NVLink-C2C,
#: 450 GB/s) host -> device at 346 GB/s with its copy engines = 0.77 (issue #23). We take
#: 0.8 for every link.
DEFAULT_HOST_LINK_EFFICIENCY = 0.8


class LoadOverlap(enum.StrEnum):
    """How a load-back of host KV overlaps the forward that uses it.

    ``LAYERWISE``: the engine copies layer ``i``'s pages while it computes earlier layers,
    and layer ``i``'s attention waits only for its own pages: SGLang HiCache's load-back
    (``python/sglang/srt/managers/cache_controller.py``: a ``LayerDoneCounter`` that the
    attention of each layer waits on, ``wait_until(layer_id)``), and vLLM-Ascend's layerwise
    KV pool (``wait_for_layer_load``: layer ``i + 1``'s transfer overlaps layer ``i``'s
    attention). ``NONE``: the whole load ends before the forward starts (a bulk copy, as a
    connector that loads before scheduling the request does; the request's TTFT pays all of
    it).
    """

    LAYERWISE = "layerwise"
    NONE = "none"


def host_transfer_time(nbytes: int, gpu: GPUSpec, *,
                       efficiency: float = DEFAULT_HOST_LINK_EFFICIENCY) -> float:
    """Seconds to copy ``nbytes`` bytes one way between host memory and ``gpu``:
    ``nbytes / (host_link.bytes_per_s x efficiency)``.

    Example: 1 GiB (1,073,741,824 B) over PCIe 5.0 x16 (64e9 B/s) at 0.8 takes
    ``1,073,741,824 / 51.2e9 = 20.97 ms``; over NVLink-C2C (450e9 B/s): 2.98 ms.

    Raises:
        CostModelError: negative ``nbytes``.
        ConfigError: ``efficiency`` outside ``(0, 1]``, or a GPU without a host link.
    """
    if nbytes < 0:
        raise CostModelError(f"transfer bytes must be >= 0, got {nbytes}")
    if not (0.0 < efficiency <= 1.0):
        raise ConfigError(f"host link efficiency must be in (0, 1], got {efficiency}")
    if gpu.host_link is None:
        raise ConfigError(f"GPU {gpu.name} has no host link figure (GPUSpec.host_link): a "
                          f"host tier's copies cannot be priced on it")
    return nbytes / (gpu.host_link.bytes_per_s * efficiency)


def overlapped_time(load_s: float, forward_s: float, layers: int,
                    overlap: LoadOverlap = LoadOverlap.LAYERWISE) -> float:
    """Seconds from the start of a load-back of ``load_s`` to the end of the forward of
    ``forward_s`` that reads it.

    ``LAYERWISE`` over ``L`` layers, each layer's load ``a = load_s / L`` and compute
    ``c = forward_s / L`` (loads back to back on the copy stream, layer ``i``'s compute
    after its own load and layer ``i - 1``'s compute): ``a + (L - 1) x max(a, c) + c`` -
    the forward plus ``a`` when loads are faster than compute, the load plus ``c`` when
    slower. ``NONE``: ``load_s + forward_s``.

    Example: ``load_s = 8 ms``, ``forward_s = 4 ms``, 4 layers: ``a = 2``, ``c = 1``:
    ``2 + 3 x 2 + 1 = 9 ms`` (``NONE``: 12 ms).

    Raises:
        CostModelError: a negative time, or ``layers < 1``.
    """
    if load_s < 0 or forward_s < 0 or layers < 1:
        raise CostModelError(f"need load_s, forward_s >= 0 and layers >= 1, got {load_s}, "
                             f"{forward_s}, {layers}")
    if LoadOverlap(overlap) is LoadOverlap.NONE:
        return load_s + forward_s
    a, c = load_s / layers, forward_s / layers
    return a + (layers - 1) * max(a, c) + c


@dataclass(frozen=True, slots=True)
class HostHitTiming:
    """What a host hit saves a lone request's first token (:func:`host_hit_ttft`).

    Attributes:
        recompute_s: the forward over the whole prompt (no hit).
        load_s: the load-back of the hit's bytes.
        with_hit_s: the load-back and the forward over the rest of the prompt, overlapped
            as the engine does.
        saved_s: ``recompute_s - with_hit_s`` (negative: recomputing is faster).
    """

    recompute_s: float
    load_s: float
    with_hit_s: float
    saved_s: float


def host_hit_ttft(cost: GPUCostModel, prompt_tokens: int, hit_tokens: int, load_bytes: int,
                  *, efficiency: float = DEFAULT_HOST_LINK_EFFICIENCY,
                  overlap: LoadOverlap = LoadOverlap.LAYERWISE) -> HostHitTiming:
    """The TTFT a host hit of ``hit_tokens`` saves a lone request of ``prompt_tokens``
    against recomputing them, when the hit loads ``load_bytes`` from host memory.

    Model: the request's prompt runs in one forward (no chunked prefill, no other requests
    in the step). Without the hit that forward computes all ``n`` prompt tokens:
    ``recompute_s = step_time(prefill n at context 0)``. With it the forward computes the
    ``n - T`` tokens after the hit (``step_time(prefill n - T at context T)``) while the
    hit's ``load_bytes`` load over the GPU's host link (:func:`host_transfer_time`), the two
    overlapped by :func:`overlapped_time` over the model's ``num_layers``; the step's fixed
    overhead is not overlapped (it is the host's scheduling work):
    ``with_hit_s = overhead + overlapped_time(load_s, forward_s - overhead, L)``.

    Example (tests/sim/test_cost.py): what the hit skips is compute the copy replaces, so a
    hit saves TTFT while its load is shorter than the compute of its tokens.

    Raises:
        CostModelError: ``hit_tokens`` outside ``[1, prompt_tokens - 1]`` (the last prompt
            token is always computed), or negative ``load_bytes``.
        ConfigError: as :func:`host_transfer_time`.
    """
    if not (1 <= hit_tokens < prompt_tokens):
        raise CostModelError(f"a host hit covers 1 .. prompt - 1 tokens (the last prompt "
                             f"token is computed), got {hit_tokens} of {prompt_tokens}")
    load_s = host_transfer_time(load_bytes, cost.gpu, efficiency=efficiency)
    b = cost.builder()
    b.add_prefill(prompt_tokens, 0)
    recompute_s = cost.step_time(b.build())
    b.reset()
    b.add_prefill(prompt_tokens - hit_tokens, hit_tokens)
    suffix_s = cost.step_time(b.build())
    overhead = cost.step_overhead_s
    with_hit_s = overhead + overlapped_time(load_s, suffix_s - overhead,
                                            cost.model.num_layers, overlap)
    return HostHitTiming(recompute_s, load_s, with_hit_s, recompute_s - with_hit_s)


@dataclass(frozen=True, slots=True)
class HostRetractionCost:
    """``auto`` retraction's question (:class:`kvchain.sched.retraction.RetractionCost`) on
    the roofline: is a victim's round trip to host faster than recomputing it?

    Model: the copy out at the suspension and the load back at the resume each take
    :func:`host_transfer_time` of the victim's bytes, serialized with the forwards (as the
    simulator charges them: no overlap assumed); the recompute is the prefill of the
    ``computed_tokens`` tokens it held, from context 0 in one forward, without the step's
    fixed overhead (the overhead is paid by the step either way):
    ``host_is_cheaper = 2 x transfer(bytes) < step_time(prefill tokens) - overhead``.

    Example: gpt-oss-120b on an H200 (PCIe 5.0 x16 at 0.8: 51.2 GB/s): a request of
    8,192 tokens holds about 8,192 x 36,864 B = 302 MB of full pages (plus its window
    tail), 2 x 5.9 ms against a prefill of 0.19 s on the roofline: host copy.

    Attributes:
        cost: the roofline cost model (its GPU's host link prices the copies).
        efficiency: fraction of the host link's nominal rate a copy achieves.
    """

    cost: GPUCostModel
    efficiency: float = DEFAULT_HOST_LINK_EFFICIENCY

    def transfer_s(self, nbytes: int) -> float:
        """One copy of ``nbytes`` over the host link (:func:`host_transfer_time`)."""
        return host_transfer_time(nbytes, self.cost.gpu, efficiency=self.efficiency)

    def recompute_s(self, tokens: int) -> float:
        """The prefill of ``tokens`` tokens from context 0, less the step overhead."""
        b = self.cost.builder()
        b.add_prefill(tokens, 0)
        return self.cost.step_time(b.build()) - self.cost.step_overhead_s

    def host_is_cheaper(self, computed_tokens: int, host_bytes: int) -> bool:
        """``2 x transfer_s(host_bytes) < recompute_s(computed_tokens)`` (class docstring;
        ``False`` for 0 tokens: nothing to save)."""
        if computed_tokens < 1:
            return False
        return 2.0 * self.transfer_s(host_bytes) < self.recompute_s(computed_tokens)
