"""``kvchain plan``: capacity of one model's chain on one GPU, beside fixed pools."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import fits, largest_fitting, max_units
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.cli import app
from kvchain.cli.common import (
    KV_DTYPE_HELP,
    STATE_DTYPE_HELP,
    check_flags,
    fail,
    load_spec,
    note_defaults,
    render_bands,
    warn_buffer,
)
from kvchain.errors import KVChainError
from kvchain.gpu import DEFAULT_ACTIVATION_RESERVE_BYTES, get_gpu, kv_buffer_bytes
from kvchain.kv_manager import RequestGeometry, lifetime_demand
from kvchain.layout import ChainLayout, plan_layout
from kvchain.spec.layers import CacheClass, CacheDtype, LifetimeClass

# Fixed-pool defaults as public engines ship them.
WINDOW_FULL_TOKENS_RATIO = 0.8  # SGLang --swa-full-tokens-ratio default
STATE_FULL_MEMORY_RATIO = 0.9  # SGLang --mamba-full-memory-ratio default (state : rest)


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
    """

    longest_request_tokens: int | None
    concurrent_requests: int
    full_tokens: int
    slots_held: int


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

    Split rule (SGLang defaults): the state pool takes ``0.9 / 1.9`` of the buffer
    (``--mamba-full-memory-ratio 0.9``: state bytes = 0.9 x the rest); each window (or
    local) pool holds ``0.8 x`` the full pool's tokens (``--swa-full-tokens-ratio 0.8``;
    SGLang has one window pool, so several window sizes each get that ratio); without a
    full class the window pools split the rest in proportion to their bytes per token.

    Raises:
        BufferTooSmallError: a pool too small for one smallest request.
    """
    b = layout.buffer_bytes
    classes = [band.cache_class for band in layout.bands]
    state = next((c for c in classes if c.lifetime is LifetimeClass.STATE), None)
    rest = b
    pools: list[tuple[CacheClass, int]] = []
    if state is not None:
        state_bytes = int(b * STATE_FULL_MEMORY_RATIO / (1 + STATE_FULL_MEMORY_RATIO))
        if len(classes) == 1:
            state_bytes = b
        pools.append((state, state_bytes))
        rest = b - state_bytes
    full = next((c for c in classes if c.lifetime is LifetimeClass.FULL), None)
    wins = [c for c in classes if c.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]
    if full is not None and wins:
        # Every window (or local) pool holds 0.8 x the full pool's tokens.
        e_wins = sum(c.bytes_per_token for c in wins)
        full_tokens = rest / (full.bytes_per_token + WINDOW_FULL_TOKENS_RATIO * e_wins)
        full_bytes = int(full_tokens * full.bytes_per_token)
        pools.append((full, full_bytes))
        left = rest - full_bytes
        for i, c in enumerate(wins):
            share = (left if i == len(wins) - 1
                     else int(full_tokens * WINDOW_FULL_TOKENS_RATIO * c.bytes_per_token))
            pools.append((c, share))
            left -= share
    elif full is not None or wins:
        pool_classes = [full] if full is not None else wins
        total_e = sum(c.bytes_per_token for c in pool_classes)
        left = rest
        for i, c in enumerate(pool_classes):
            share = left if i == len(pool_classes) - 1 else int(rest * c.bytes_per_token / total_e)
            pools.append((c, share))
            left -= share
    return [plan_layout([c], nbytes, layout.page_size,
                        state_slots_per_request=layout.state_slots_per_request)
            for c, nbytes in pools]


def pools_capacity(layout: ChainLayout, prompt: int, output: int,
                   slots_held: int | None) -> Capacity:
    """:func:`chain_capacity` for fixed per-class pools (:func:`fixed_pool_layouts`): a
    demand fits iff every pool fits its own part."""
    return _capacity(_pool_parts(layout), layout.buffer_bytes, prompt, output, slots_held)


def compare_capacity(layout: ChainLayout, prompt: int, output: int,
                     slots_held: int | None) -> tuple[Capacity, Capacity]:
    """The chain and the fixed pools, like with like: the token capacity of both is taken
    with the *same* number of state slots held.

    Args:
        slots_held: slots held on both sides; ``None``: the smaller of the two
            concurrencies (a count both layouts can hold, so neither side is measured
            holding more slots than the other).

    Returns:
        ``(chain, pools)``.

    Raises:
        BufferTooSmallError: a pool too small for one smallest request.
        InvalidDemandError: non-positive prompt/output.
    """
    chain_parts, pool_parts = _chain_parts(layout), _pool_parts(layout)
    b = layout.buffer_bytes
    if slots_held is None:
        slots_held = min(_concurrency(chain_parts, prompt, output),
                         _concurrency(pool_parts, prompt, output))
    return (_capacity(chain_parts, b, prompt, output, slots_held),
            _capacity(pool_parts, b, prompt, output, slots_held))


_Parts = list[tuple[RequestGeometry, ChainSnapshot]]


def _chain_parts(layout: ChainLayout) -> _Parts:
    return [(RequestGeometry.of(layout), Chain(layout).snapshot())]


def _pool_parts(layout: ChainLayout) -> _Parts:
    return [(RequestGeometry.of(pl), Chain(pl).snapshot()) for pl in fixed_pool_layouts(layout)]


def _concurrency(parts: _Parts, prompt: int, output: int) -> int:
    unit = [lifetime_demand(g, prompt, output) for g, _ in parts]
    return min(max_units(snap, u) if not u.is_empty else 1 << 62
               for (_, snap), u in zip(parts, unit, strict=True))


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
    held_all: list[Demand] = []
    for g, _ in parts:
        slot_pages = [0] * g.num_bands
        if g.state is not None:
            slot_pages[g.state] = slots
        held_all.append(Demand(tuple(slot_pages)))
    full_tokens = 0
    if all_fit(held_all):  # every pool holds its share of the slots
        for (g, snap), held in zip(parts, held_all, strict=True):
            if g.full is None:
                continue
            one_page = [0] * g.num_bands
            one_page[g.full] = 1
            full_tokens = max_units(snap, Demand(tuple(one_page)), held) * g.page_size
    return Capacity(longest, concurrent, full_tokens, slots)


@app.command("plan", short_help="Bands and capacity of one model's chain.")
def plan_command(
    model: Annotated[str, typer.Option(help="Bundled model name.")] = "gpt-oss-120b",
    config: Annotated[Path | None, typer.Option(help="A Hugging Face config.json.")] = None,
    spec: Annotated[Path | None, typer.Option(help="A JSON file declaring classes by bytes: "
                                                   "full, window, window_tokens, local, "
                                                   "chunk_tokens, state.")] = None,
    gpu: Annotated[str, typer.Option(help="a100, h100, h200, b200.")] = "h200",
    mem_fraction: Annotated[float, typer.Option(help="GPU memory fraction.")] = 0.9,
    buffer_bytes: Annotated[int | None, typer.Option(help="KV buffer bytes (instead of the "
                                                          "GPU memory model).")] = None,
    kv_dtype: Annotated[CacheDtype | None, typer.Option(help=KV_DTYPE_HELP)] = None,
    state_dtype: Annotated[CacheDtype | None, typer.Option(help=STATE_DTYPE_HELP)] = None,
    page_size: Annotated[int, typer.Option(help="Tokens per page.")] = 16,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
    prompt: Annotated[int, typer.Option(help="Prompt tokens of the request mix.")] = 2048,
    output: Annotated[int, typer.Option(help="Output tokens of the request mix.")] = 512,
    slots_held: Annotated[int | None, typer.Option(help="State slots held for the token "
                                                        "capacity (default: the concurrency).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Plan a model's KV buffer as a chain: bands, page bytes, longest request,
    concurrency, token capacity - side by side with fixed per-class pools."""
    console = Console()
    try:
        check_flags(mem_fraction=mem_fraction, buffer_bytes=buffer_bytes, page_size=page_size,
                    tp=tp, prompt=prompt, output=output, slots_held=slots_held)
        model_spec = load_spec(model, config, spec_file=spec, kv_dtype=kv_dtype, tp=tp,
                               state_dtype=state_dtype)
        gpu_spec = get_gpu(gpu)
        if buffer_bytes is None:
            buffer = kv_buffer_bytes(gpu_spec, model_spec.weight_bytes, mem_fraction=mem_fraction)
        else:
            buffer = buffer_bytes
        layout = plan_layout(model_spec.classes, buffer, page_size)
        ours, pools = compare_capacity(layout, prompt, output, slots_held)
        context = model_spec.max_context_tokens
        ours_longest = longest_request(ours.longest_request_tokens, context)
        pools_longest = longest_request(pools.longest_request_tokens, context)
    except KVChainError as exc:
        fail(exc)
    warn_buffer(model_spec, gpu_spec, buffer_bytes, spec_file=spec)
    note_defaults(model_spec, config)
    report = {
        "model": model_spec.name, "gpu": gpu_spec.name, "buffer_bytes": buffer,
        "weight_bytes": model_spec.weight_bytes if buffer_bytes is None else None,
        "activation_reserve_bytes": DEFAULT_ACTIVATION_RESERVE_BYTES
        if buffer_bytes is None else None,
        "page_size": page_size, "chain": layout.shape_name,
        "defaulted": [{"field": d.field, "value": d.value, "by": d.by}
                      for d in model_spec.defaulted],
        "bands": [{"band": b.label, "anchor": b.anchor.value, "page_bytes": b.page_bytes,
                   "bytes_per_token": b.cache_class.bytes_per_token,
                   "bytes_per_slot": b.cache_class.bytes_per_slot,
                   "window": b.cache_class.window, "null_pages": b.reserved_pages}
                  for b in layout.bands],
        "request": {"prompt": prompt, "output": output},
        "chain_capacity": _as_dict(ours, ours_longest),
        "fixed_pools_capacity": _as_dict(pools, pools_longest),
        "max_context_tokens": context,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(f"[bold]{escape(model_spec.name)}[/bold] on {gpu_spec.name}: KV buffer "
                  f"{buffer:,} B" + ("" if buffer_bytes is not None else
                                      f" = {gpu_spec.memory_bytes:,} x {mem_fraction} - weights "
                                      f"{model_spec.weight_bytes:,} - reserve "
                                      f"{DEFAULT_ACTIVATION_RESERVE_BYTES:,}"))
    console.print(render_bands(layout))
    table = Table(title=f"capacity for ({prompt:,} prompt, {output:,} output) requests")
    table.add_column("")
    table.add_column("chain", justify="right")
    table.add_column("fixed pools", justify="right")
    table.add_column("chain/pools", justify="right")
    has_state = layout.band(LifetimeClass.STATE) is not None
    for label, a, b in _capacity_rows(ours, pools, ours_longest, pools_longest, has_state):
        table.add_row(label, _count(a), _count(b),
                      f"{a / b:.2f}x" if isinstance(a, int) and isinstance(b, int) and b
                      else "-")
    console.print(table)
    if ours.longest_request_tokens is None:
        console.print("longest request: unbounded (KV) - no full-attention layer (window, "
                      "chunked and state bytes are capped per request); the limit is "
                      + (f"the model's context length, {context:,} tokens "
                         "(max_position_embeddings)" if context else
                         "the model's context length (not given by this config)"))
    else:
        assert pools.longest_request_tokens is not None
        console.print(f"longest lone request bound by: {ours_longest.bound} (chain), "
                      f"{pools_longest.bound} (fixed pools); KV bytes allow "
                      f"{ours.longest_request_tokens:,} / {pools.longest_request_tokens:,} "
                      "tokens, the model's context "
                      + (f"{context:,} tokens (max_position_embeddings)" if context is not None
                         else "is unknown"))
    rules = []
    if has_state:
        rules.append("state pool = 0.9/1.9 of the buffer (SGLang --mamba-full-memory-ratio)")
    if len(layout.bands) - has_state > 1:
        rules.append("window pool tokens = 0.8 x full pool tokens (SGLang "
                     "--swa-full-tokens-ratio)")
    if rules:
        console.print("fixed pools: " + "; ".join(rules))


def _capacity_rows(ours: Capacity, pools: Capacity, ours_longest: LongestRequest,
                   pools_longest: LongestRequest, has_state: bool
                   ) -> list[tuple[str, int | str, int | str]]:
    """Rows of the capacity table: each row measures both sides in the same conditions."""
    rows: list[tuple[str, int | str, int | str]] = [
        ("longest request (tokens)", _longest_cell(ours_longest), _longest_cell(pools_longest)),
        ("concurrent requests", ours.concurrent_requests, pools.concurrent_requests),
    ]
    if ours.full_tokens or pools.full_tokens:
        label = (f"full-attn tokens, both {ours.slots_held:,} slots" if has_state
                 else "full-attention tokens")
        rows.append((label, ours.full_tokens, pools.full_tokens))
    return rows


def _longest_cell(longest: LongestRequest) -> int | str:
    if longest.tokens is None:
        return "unbounded (KV)"
    return longest.tokens if longest.bound == "kv_bytes" else f"{longest.tokens:,} (context)"


def _count(value: int | str) -> str:
    return f"{value:,}" if isinstance(value, int) else value


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
    """
    if context is not None and (kv_bound_tokens is None or context - 1 < kv_bound_tokens):
        return LongestRequest(context - 1, "context")
    if kv_bound_tokens is None:
        return LongestRequest(None, "unbounded")
    return LongestRequest(kv_bound_tokens, "kv_bytes")


def _as_dict(c: Capacity, longest: LongestRequest) -> dict[str, int | str | None]:
    return {"longest_request_tokens": longest.tokens,
            "longest_request_bound": longest.bound,
            "longest_request_tokens_kv_bound": c.longest_request_tokens,
            "concurrent_requests": c.concurrent_requests, "full_tokens": c.full_tokens,
            "slots_held": c.slots_held}
