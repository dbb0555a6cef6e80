"""Capacity planning: one model's KV buffer on one GPU, as a chain and as fixed pools.

The library side of ``kvchain plan`` (the CLI only parses and prints): :func:`plan_capacity`
sizes the buffer from the GPU memory model (:func:`kvchain.gpu.kv_buffer_bytes`), lays out
the chain and prices, on its empty snapshot, the longest lone request, the concurrency of a
request mix and the token capacity with state slots held - with the planner itself, no
second formula - beside the same classes in fixed per-class pools (SGLang's default split).

Units: bytes, tokens, requests, state slots. Every figure is **per tensor-parallel rank**:
the model's weights and cache bytes are one rank's share under ``tp``, and so are the
buffer, the tokens and the requests (a request's KV is split over the ranks, so the
concurrency of the group equals one rank's).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import fits, largest_fitting, max_units
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.errors import BufferTooSmallError, ConfigError
from kvchain.field_types import is_whole
from kvchain.gpu import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    DEFAULT_MEM_FRACTION,
    GPUSpec,
    kv_buffer_bytes,
)
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.spec import ModelSpec
from kvchain.pool_split import fixed_pool_bytes, ordered_classes
from kvchain.requests.demand import lifetime_demand


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one memory layout can hold.

    Attributes:
        longest_request_tokens: longest lone request (prompt tokens, 1 output token);
            ``None`` when the KV cache never bounds it (no full-attention band: window,
            chunked-local and state bytes are capped per request).
        concurrent_requests: ``(prompt, output)`` requests that fit at their peak, together.
        full_tokens: full-attention tokens that fit with ``slots_held`` state slots held
            (0 without a full band, or if ``slots_held`` slots do not fit).
        slots_held: state slots held for ``full_tokens``.
        holds_none: why the layout holds no request at all (a fixed pool too small for
            one smallest request: :func:`fixed_pool_layouts`' refusal, which names the
            pool and its bytes); ``None`` when it is measured. When set, every count is 0.
    """

    longest_request_tokens: int | None
    concurrent_requests: int
    full_tokens: int
    slots_held: int
    holds_none: str | None = None


def chain_capacity(layout: ChainLayout, prompt: int, output: int,
                   slots_held: int | None) -> Capacity:
    """Capacity of a chain, from the planner on its empty snapshot (no second formula).

    Args:
        layout: the chain.
        prompt, output: tokens of one request of the mix.
        slots_held: state slots held for the token capacity (``None``: the concurrency).

    Raises:
        InvalidDemandError: non-positive prompt/output/chunk.
    """
    return _capacity(_chain_parts(layout), layout.buffer_bytes, prompt, output, slots_held)


def fixed_pool_layouts(layout: ChainLayout) -> list[ChainLayout]:
    """The same classes as separate pools of fixed bytes (one single-band chain each).

    Split rule: SGLang's defaults, the one the fixed-pool baseline uses
    (:func:`kvchain.pool_split.fixed_pool_shares`, sized by
    :func:`~kvchain.pool_split.fixed_pool_bytes`); pools come in band order. A target's and
    a draft model's full (state) classes are pools of their own that hold the same count,
    as SGLang's EAGLE draft worker shares the target's token allocator
    (``python/sglang/srt/speculative/eagle_worker.py``).

    Raises:
        BufferTooSmallError: a pool too small for one smallest request (the message names
            the pool and its bytes, its share of the buffer; ``available_bytes`` is the
            pool's).
    """
    b = layout.buffer_bytes
    classes = [band.cache_class for band in layout.bands]
    pools = list(zip(ordered_classes(classes), fixed_pool_bytes(classes, b), strict=True))
    out = []
    for c, nbytes in pools:
        try:
            out.append(plan_layout([c], nbytes, layout.page_size,
                                   state_slots_per_request=layout.state_slots_per_request))
        except BufferTooSmallError as exc:  # its message would call the pool "buffer"
            raise BufferTooSmallError(
                f"the fixed {c.label} pool of {nbytes:,} B (its share of the {b:,} B "
                f"buffer) cannot hold one smallest request: it needs "
                f"{exc.needed_bytes:,} B", needed_bytes=exc.needed_bytes,
                available_bytes=nbytes) from None
    return out


def pools_capacity(layout: ChainLayout, prompt: int, output: int,
                   slots_held: int | None) -> Capacity:
    """:func:`chain_capacity` for fixed per-class pools (:func:`fixed_pool_layouts`): a
    demand fits iff every pool fits its own part. Pools of which one cannot hold one
    smallest request hold none: every count 0, :attr:`Capacity.holds_none` says why."""
    parts = _pool_parts(layout)
    if isinstance(parts, str):
        return _holding_none(parts, slots_held or 0)
    return _capacity(parts, layout.buffer_bytes, prompt, output, slots_held)


def compare_capacity(layout: ChainLayout, prompt: int, output: int,
                     slots_held: int | None) -> tuple[Capacity, Capacity]:
    """The chain and the fixed pools, like with like: the token capacity of both is taken
    with the *same* number of state slots held.

    Args:
        slots_held: slots held on both sides; ``None``: the smaller of the two
            concurrencies (a count both layouts can hold, so neither side is measured
            holding more slots than the other).

    Returns:
        ``(chain, pools)``; pools of which one cannot hold one smallest request hold none
        (:func:`pools_capacity`), and the chain is then measured with ``slots_held`` (0
        when ``None``: the only count both hold).

    Raises:
        InvalidDemandError: non-positive prompt/output.
    """
    chain_parts, pool_parts = _chain_parts(layout), _pool_parts(layout)
    b = layout.buffer_bytes
    if slots_held is None:
        slots_held = (0 if isinstance(pool_parts, str) else
                      min(_concurrency(chain_parts, prompt, output),
                          _concurrency(pool_parts, prompt, output)))
    ours = _capacity(chain_parts, b, prompt, output, slots_held)
    if isinstance(pool_parts, str):
        return ours, _holding_none(pool_parts, slots_held)
    return ours, _capacity(pool_parts, b, prompt, output, slots_held)


@dataclass(frozen=True, slots=True)
class SpeculativeCapacity:
    """Concurrency of the request mix when every decode drafts ``spec_tokens`` tokens
    (speculative decoding), on the chain and on the fixed pools, beside ``k = 0``.

    Each request's lifetime demand is priced by the request layer's speculative geometry
    (:meth:`kvchain.bands.geometry.RequestGeometry.of`): ``k`` more tokens of every band
    (the verify's drafts), window and chunked-local bands holding ``W + k`` tokens until
    verified, and the state band ``k`` more slots (``CHECKPOINTS``: one per draft) or one
    (``REPLAY``: one checkpoint, the accepted tokens recomputed). The fixed pools are the
    same split as :func:`fixed_pool_layouts` with those slots per request: a state pool that
    reserves ``k + 1`` consecutive slots per request (vLLM's TPU backend keeps
    ``num_spec + 1`` slots per request) holds ``1 / (k + 1)`` of the requests it held.

    Attributes:
        spec_tokens: ``k`` drafts per decode.
        rollback: how the state band rolls back.
        chain_concurrent, pools_concurrent: requests that fit together at their peak.
        chain_plain, pools_plain: the same at ``k = 0`` (:attr:`Capacity.concurrent_requests`).
        pools_holds_none: why the pools hold none with the speculative extra (``None``:
            measured).
    """

    spec_tokens: int
    rollback: StateRollback
    chain_concurrent: int
    pools_concurrent: int
    chain_plain: int
    pools_plain: int
    pools_holds_none: str | None = None


def speculative_capacity(layout: ChainLayout, prompt: int, output: int, spec_tokens: int,
                         rollback: StateRollback = StateRollback.CHECKPOINTS,
                         ) -> SpeculativeCapacity:
    """:class:`SpeculativeCapacity` of ``(prompt, output)``-token requests.

    Example (tests/test_capacity.py): 1,000 B per full-attention token and a 50,000,000 B
    state slot in a 1e9 B buffer, ``(1,000, 100)`` requests, 16-token pages. At ``k = 0`` a
    request holds ``ceil(1,099 / 16) = 69`` pages (1,104,000 B) and 1 slot: 51,104,000 B,
    19 on the chain; the fixed state pool (``0.9 / 1.9`` of the buffer, 473,684,210 B)
    holds 9 slots: 9 requests. With ``k = 3`` checkpoints: 69 pages (1,102 tokens) and 4
    slots, 201,104,000 B: 4 on the chain, ``9 // 4 = 2`` in the pools; with ``REPLAY``:
    2 slots, 101,104,000 B: 9 on the chain, ``9 // 2 = 4`` in the pools.

    Raises:
        ConfigError: ``spec_tokens`` not an int >= 0, an unknown ``rollback``.
        InvalidDemandError: non-positive prompt/output.
    """
    chain_plain = _concurrency(_chain_parts(layout), prompt, output)
    chain = _concurrency(_chain_parts(layout, spec_tokens, rollback), prompt, output)
    plain = _pool_parts(layout)
    spec = _pool_parts(layout, spec_tokens, rollback)
    pools_plain = 0 if isinstance(plain, str) else _concurrency(plain, prompt, output)
    if isinstance(spec, str):
        return SpeculativeCapacity(spec_tokens, rollback, chain, 0, chain_plain, pools_plain,
                                   spec)
    return SpeculativeCapacity(spec_tokens, rollback, chain,
                               _concurrency(spec, prompt, output), chain_plain, pools_plain)


_Parts = list[tuple[RequestGeometry, ChainSnapshot]]


def _chain_parts(layout: ChainLayout, spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.CHECKPOINTS) -> _Parts:
    return [(RequestGeometry.of(layout, spec_tokens, rollback), Chain(layout).snapshot())]


def _pool_parts(layout: ChainLayout, spec_tokens: int = 0,
                rollback: StateRollback = StateRollback.CHECKPOINTS) -> _Parts | str:
    """The pools' parts, or why they hold no request (:func:`fixed_pool_layouts`' refusal:
    the buffer itself holds one, so the split left a pool too small)."""
    try:
        pool_layouts = fixed_pool_layouts(layout)
    except BufferTooSmallError as exc:
        return str(exc)
    return [(RequestGeometry.of(pl, spec_tokens, rollback), Chain(pl).snapshot())
            for pl in pool_layouts]


def _holding_none(reason: str, slots_held: int) -> Capacity:
    """The capacity of a layout that holds no request: no token, no request (the longest
    lone request is 0 tokens: the KV cache bounds it to nothing)."""
    return Capacity(0, 0, 0, slots_held, reason)


def _concurrency(parts: _Parts, prompt: int, output: int) -> int:
    unit = [lifetime_demand(g, prompt, output) for g, _ in parts]
    return min(max_units(snap, u) if not u.is_empty else 1 << 62
               for (_, snap), u in zip(parts, unit, strict=True))


def _slots_demand(g: RequestGeometry, slots: int) -> Demand:
    """``slots`` state slots in every state band of ``g`` (a draft's too), nothing else."""
    pages = [0] * g.num_bands
    for band in g.states:
        pages[band] = slots
    return Demand(tuple(pages))


def most_state_slots(layout: ChainLayout) -> int | None:
    """The most state slots the chain of ``layout`` holds (one in every state band per
    slot) with room left for one page of every full-attention band: the largest
    ``slots_held`` whose token capacity (:attr:`Capacity.full_tokens`) is not 0 for want
    of room; ``None`` when the layout has no state band. ``O(log buffer_bytes)`` calls of
    :func:`fits`.

    Example (tests/test_breaker_round15.py): a 1e9 B buffer of 16-token pages, 1,000 B
    per full-attention token and a 50,000,000 B state slot: 20 slots are the whole buffer
    (no byte for a token), 19 leave 50,000,000 B, room for a 16,000 B page: 19.
    """
    (g, snap), = _chain_parts(layout)
    if not g.states:
        return None

    def room(n: int) -> bool:
        pages = list(_slots_demand(g, n).pages)
        for band in g.fulls:
            pages[band] += 1
        return fits(snap, Demand(tuple(pages)))

    return largest_fitting(lambda n: n == 0 or room(n), layout.buffer_bytes)


def _capacity(parts: _Parts, buffer_bytes: int, prompt: int, output: int,
              slots_held: int | None) -> Capacity:
    def all_fit(demands: list[Demand]) -> bool:
        return all(fits(snap, d) for (_, snap), d in zip(parts, demands, strict=True))

    def lone(tokens: int) -> list[Demand]:
        return [lifetime_demand(g, tokens, 1) for g, _ in parts]

    if any(g.full is not None for g, _ in parts):
        longest: int | None = largest_fitting(lambda n: n == 0 or all_fit(lone(n)),
                                              buffer_bytes)
    else:  # window, chunked-local and state bytes are capped per request
        longest = None
    concurrent = _concurrency(parts, prompt, output)
    slots = concurrent if slots_held is None else slots_held
    held_all = [_slots_demand(g, slots) for g, _ in parts]
    full_tokens = 0
    if all_fit(held_all):  # every pool holds its share of the slots
        counts = []
        for (g, snap), held in zip(parts, held_all, strict=True):
            if not g.fulls:
                continue
            one_page = [0] * g.num_bands
            for band in g.fulls:  # a token's KV in every full band (a draft's too)
                one_page[band] = 1
            counts.append(max_units(snap, Demand(tuple(one_page)), held) * g.page_size)
        full_tokens = min(counts) if counts else 0  # every pool must hold them
    return Capacity(longest, concurrent, full_tokens, slots)


@dataclass(frozen=True, slots=True)
class LongestRequest:
    """The longest lone request and what bounds it.

    Attributes:
        tokens: prompt tokens of the longest lone request with its 1 output token (as
            :attr:`Capacity.longest_request_tokens`): ``min(KV-bytes bound, context - 1)``,
            since prompt + output may not exceed the context; ``None`` when neither bounds
            it (no full-attention layer and no known context).
        bound: ``"kv_bytes"`` when the buffer binds first (or ties), ``"context"`` when the
            model's context length does, ``"unbounded"`` when neither does.
    """

    tokens: int | None
    bound: str


def longest_request(kv_bound_tokens: int | None, context: int | None) -> LongestRequest:
    """Cap the KV-bytes bound (``None``: unbounded, no full-attention layer) at the model's
    context length and say which binds.

    Example: a buffer that holds 37.7M prompt tokens of a model with a 32,768-token
    context: ``LongestRequest(32_767, "context")`` (32,767 prompt + 1 output token).

    Raises:
        ConfigError: a context that is not a whole number >= 2 tokens (one prompt and one
            output token; 0 gave a longest request of -1 tokens), or a KV-bytes bound that
            is not a whole number >= 0.
    """
    if context is not None and (not is_whole(context) or context < 2):
        raise ConfigError(f"a context length must be a whole number >= 2 tokens, got "
                          f"{context!r}")
    if kv_bound_tokens is not None and (not is_whole(kv_bound_tokens) or kv_bound_tokens < 0):
        raise ConfigError(f"a KV-bytes bound must be a whole number >= 0 tokens, got "
                          f"{kv_bound_tokens!r}")
    if context is not None and (kv_bound_tokens is None or context - 1 < kv_bound_tokens):
        return LongestRequest(context - 1, "context")
    if kv_bound_tokens is None:
        return LongestRequest(None, "unbounded")
    return LongestRequest(kv_bound_tokens, "kv_bytes")


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Where the KV buffer's bytes come from, on one GPU (one tensor-parallel rank).

    Attributes:
        buffer_bytes: the KV buffer.
        given: True when the caller gave ``buffer_bytes`` (the GPU memory model unused:
            the other fields are then ``None``).
        gpu_memory_bytes: the device memory (:attr:`GPUSpec.memory_bytes`).
        mem_fraction: the fraction of it an engine may use (vLLM's
            ``gpu_memory_utilization``).
        weight_bytes: one rank's weights.
        reserve_bytes: what the engine keeps besides weights and KV inside the fraction
            (activations, CUDA context, NCCL; :data:`kvchain.gpu.DEFAULT_ACTIVATION_RESERVE_BYTES`).
    """

    buffer_bytes: int
    given: bool
    gpu_memory_bytes: int | None = None
    mem_fraction: float | None = None
    weight_bytes: int | None = None
    reserve_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The numbers ``kvchain plan`` prints, all per tensor-parallel rank.

    Attributes:
        model: the model (one rank's share of it).
        gpu: the GPU.
        tp: tensor-parallel size the model was split over.
        budget: the buffer and its memory model.
        layout: the chain.
        prompt, output: tokens of one request of the mix.
        chain, pools: the chain's and the fixed pools' capacity (:func:`compare_capacity`).
        chain_longest, pools_longest: their longest lone request, capped at the context.
    """

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    budget: MemoryBudget
    layout: ChainLayout
    prompt: int
    output: int
    chain: Capacity
    pools: Capacity
    chain_longest: LongestRequest
    pools_longest: LongestRequest


def plan_capacity(model: ModelSpec, gpu: GPUSpec, *, tp: int = 1,
                  mem_fraction: float = DEFAULT_MEM_FRACTION, buffer_bytes: int | None = None,
                  page_size: int = 16, prompt: int = 2048, output: int = 512,
                  slots_held: int | None = None) -> CapacityPlan:
    """Plan ``model`` (already split over ``tp`` ranks: its bytes are one rank's) on one
    ``gpu``: the buffer (``buffer_bytes``, or :func:`kvchain.gpu.kv_buffer_bytes` of the
    GPU's memory at ``mem_fraction`` minus one rank's weights and the default engine
    reserve), the chain's layout with ``page_size``-token pages, and the capacity of the
    chain and of fixed pools for ``(prompt, output)``-token requests
    (:func:`compare_capacity`; ``slots_held`` as there). Every figure is per rank.

    Example: field case F10 (``docs/field-cases.md``): a declared model with
    ``E_full = 32,000 B``, ``S = 50,000,000 B``, a 40e9 B buffer, 64 slots held:
    ``chain.full_tokens == (40e9 - 64 x 50e6) / 32,000 = 1,150,000``.

    Raises:
        ConfigError: ``tp`` not a whole number >= 1 (``True``, ``1.5``); a memory
            fraction or weights that leave no room (:func:`kvchain.gpu.kv_buffer_bytes`).
        BufferTooSmallError: a buffer too small for one smallest request (fixed pools
            that hold none are reported, not raised: ``pools.holds_none``).
        InvalidDemandError: a non-positive prompt or output.
    """
    if not is_whole(tp) or tp < 1:
        raise ConfigError(f"tp must be >= 1 (a whole number), got {tp!r}")
    if buffer_bytes is None:
        reserve = DEFAULT_ACTIVATION_RESERVE_BYTES
        weights = model.resident_weight_bytes  # a draft's weights beside the target's
        budget = MemoryBudget(kv_buffer_bytes(gpu, weights, mem_fraction=mem_fraction,
                                              activation_reserve_bytes=reserve), False,
                              gpu.memory_bytes, mem_fraction, weights, reserve)
    else:
        budget = MemoryBudget(buffer_bytes, True)
    layout = plan_layout(model.classes, budget.buffer_bytes, page_size)
    ours, pools = compare_capacity(layout, prompt, output, slots_held)
    context = model.max_context_tokens
    return CapacityPlan(model, gpu, tp, budget, layout, prompt, output, ours, pools,
                        longest_request(ours.longest_request_tokens, context),
                        longest_request(pools.longest_request_tokens, context))
