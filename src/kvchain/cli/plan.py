"""``kvchain plan``: capacity of one model's chain on one GPU, beside fixed pools."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import fits, largest_fitting, max_units
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.cli import app
from kvchain.cli.common import KV_DTYPE_HELP, STATE_DTYPE_HELP, load_spec, render_bands
from kvchain.errors import ConfigError, KVChainError
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
        longest_request_tokens: longest lone request (prompt tokens, 1 output token).
        concurrent_requests: ``(prompt, output)`` requests that fit at their peak, together.
        full_tokens: full-attention tokens that fit with ``slots_held`` state slots held
            (0 without a full band).
        slots_held: state slots held for ``full_tokens``.
    """

    longest_request_tokens: int
    concurrent_requests: int
    full_tokens: int
    slots_held: int


def chain_capacity(layout: ChainLayout, prompt: int, output: int,
                   slots_held: int | None) -> Capacity:
    """Capacity of a chain, from the planner on its empty snapshot (no second formula).

    Raises:
        InvalidDemandError: non-positive prompt/output/chunk.
    """
    geom = RequestGeometry.of(layout)
    empty = Chain(layout).snapshot()
    return _capacity([(geom, empty)], layout.buffer_bytes, prompt, output, slots_held)


def fixed_pool_layouts(layout: ChainLayout) -> list[ChainLayout]:
    """The same classes as separate pools of fixed bytes (one single-band chain each).

    Split rule (SGLang defaults): the state pool takes ``0.9 / 1.9`` of the buffer
    (``--mamba-full-memory-ratio 0.9``: state bytes = 0.9 x the rest); the window (or local)
    pool holds ``0.8 x`` the full pool's tokens (``--swa-full-tokens-ratio 0.8``).

    Raises:
        BufferTooSmallError: a pool too small for one smallest request.
    """
    b = layout.buffer_bytes
    by = {band.lifetime: band.cache_class for band in layout.bands}
    state = by.get(LifetimeClass.STATE)
    rest = b
    pools: list[tuple[CacheClass, int]] = []
    if state is not None:
        state_bytes = int(b * STATE_FULL_MEMORY_RATIO / (1 + STATE_FULL_MEMORY_RATIO))
        if len(by) == 1:
            state_bytes = b
        pools.append((state, state_bytes))
        rest = b - state_bytes
    full = by.get(LifetimeClass.FULL)
    win = by.get(LifetimeClass.WINDOW) or by.get(LifetimeClass.LOCAL)
    if full is not None and win is not None:
        full_tokens = rest / (full.bytes_per_token + WINDOW_FULL_TOKENS_RATIO * win.bytes_per_token)
        full_bytes = int(full_tokens * full.bytes_per_token)
        pools += [(full, full_bytes), (win, rest - full_bytes)]
    elif full is not None or win is not None:
        pools.append((full or win, rest))  # type: ignore[arg-type]
    return [plan_layout([c], nbytes, layout.page_size,
                        state_slots_per_request=layout.state_slots_per_request)
            for c, nbytes in pools]


def pools_capacity(layout: ChainLayout, prompt: int, output: int,
                   slots_held: int | None) -> Capacity:
    """:func:`chain_capacity` for fixed per-class pools (:func:`fixed_pool_layouts`): a
    demand fits iff every pool fits its own part."""
    parts = [(RequestGeometry.of(pl), Chain(pl).snapshot()) for pl in fixed_pool_layouts(layout)]
    return _capacity(parts, layout.buffer_bytes, prompt, output, slots_held)


def _capacity(parts: list[tuple[RequestGeometry, ChainSnapshot]], buffer_bytes: int,
              prompt: int, output: int, slots_held: int | None) -> Capacity:
    def all_fit(demands: list[Demand]) -> bool:
        return all(fits(snap, d) for (_, snap), d in zip(parts, demands, strict=True))

    def lone(tokens: int) -> list[Demand]:
        return [lifetime_demand(g, tokens, 1) for g, _ in parts]

    longest = largest_fitting(lambda n: n == 0 or all_fit(lone(n)), buffer_bytes)
    unit = [lifetime_demand(g, prompt, output) for g, _ in parts]
    concurrent = min(max_units(snap, u) if not u.is_empty else 1 << 62
                     for (_, snap), u in zip(parts, unit, strict=True))
    slots = concurrent if slots_held is None else slots_held
    full_tokens = 0
    for g, snap in parts:
        if g.full is None:
            continue
        held = [0] * g.num_bands
        if g.state is not None:
            held[g.state] = slots
        else:  # slots live in another pool
            pass
        one_page = [0] * g.num_bands
        one_page[g.full] = 1
        if fits(snap, Demand(tuple(held))):
            full_tokens = max_units(snap, Demand(tuple(one_page)), Demand(tuple(held))) \
                * g.page_size
    return Capacity(longest, concurrent, full_tokens, slots)


@app.command("plan")
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
        model_spec = load_spec(model, config, spec_file=spec, kv_dtype=kv_dtype, tp=tp,
                               state_dtype=state_dtype)
        gpu_spec = get_gpu(gpu)
        if buffer_bytes is None:
            buffer = kv_buffer_bytes(gpu_spec, model_spec.weight_bytes, mem_fraction=mem_fraction)
        else:
            buffer = buffer_bytes
        if slots_held is not None and slots_held < 0:
            raise ConfigError(f"--slots-held must be >= 0, got {slots_held}")
        layout = plan_layout(model_spec.classes, buffer, page_size)
        ours = chain_capacity(layout, prompt, output, slots_held)
        pools = pools_capacity(layout, prompt, output, slots_held)
        context = model_spec.max_context_tokens
        ours_longest = longest_request(ours.longest_request_tokens, context)
        pools_longest = longest_request(pools.longest_request_tokens, context)
    except KVChainError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    report = {
        "model": model_spec.name, "gpu": gpu_spec.name, "buffer_bytes": buffer,
        "weight_bytes": model_spec.weight_bytes if buffer_bytes is None else None,
        "activation_reserve_bytes": DEFAULT_ACTIVATION_RESERVE_BYTES
        if buffer_bytes is None else None,
        "page_size": page_size, "chain": layout.shape_name,
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
    console.print(f"[bold]{model_spec.name}[/bold] on {gpu_spec.name}: KV buffer "
                  f"{buffer:,} B" + ("" if buffer_bytes is not None else
                                      f" = {gpu_spec.memory_bytes:,} x {mem_fraction} - weights "
                                      f"{model_spec.weight_bytes:,} - reserve "
                                      f"{DEFAULT_ACTIVATION_RESERVE_BYTES:,}"))
    console.print(render_bands(layout))
    table = Table(title=f"capacity for ({prompt:,} prompt, {output:,} output) requests")
    table.add_column("")
    table.add_column("kvchain chain", justify="right")
    table.add_column("fixed pools", justify="right")
    table.add_column("chain / pools", justify="right")
    has_state = layout.band(LifetimeClass.STATE) is not None
    full_label = (f"full-attention tokens ({ours.slots_held:,} state slots held)" if has_state
                  else "full-attention tokens (nothing else held)")
    for label, a, b in (
        ("longest lone request (tokens)", ours_longest.tokens, pools_longest.tokens),
        ("concurrent requests", ours.concurrent_requests, pools.concurrent_requests),
        (full_label, ours.full_tokens, pools.full_tokens),
    ):
        table.add_row(label, f"{a:,}", f"{b:,}", f"{a / b:.2f}x" if b else "-")
    console.print(table)
    console.print(f"longest lone request bound by: {ours_longest.bound} (chain), "
                  f"{pools_longest.bound} (fixed pools); KV bytes allow "
                  f"{ours.longest_request_tokens:,} / {pools.longest_request_tokens:,} tokens, "
                  "the model's context "
                  + (f"{context:,} tokens" if context is not None else "is unknown"))
    rules = []
    if has_state:
        rules.append("state pool = 0.9/1.9 of the buffer (SGLang --mamba-full-memory-ratio)")
    if len(layout.bands) - has_state > 1:
        rules.append("window pool tokens = 0.8 x full pool tokens (SGLang "
                     "--swa-full-tokens-ratio)")
    if rules:
        console.print("fixed pools: " + "; ".join(rules))


@dataclass(frozen=True, slots=True)
class LongestRequest:
    """The longest lone request and what bounds it.

    Attributes:
        tokens: prompt tokens of the longest lone request with its 1 output token (as
            :attr:`Capacity.longest_request_tokens`): ``min(KV-bytes bound, context - 1)``,
            since prompt + output may not exceed the context.
        bound: ``"kv_bytes"`` when the buffer binds first (or ties), ``"context"`` when the
            model's context length does.
    """

    tokens: int
    bound: str


def longest_request(kv_bound_tokens: int, context: int | None) -> LongestRequest:
    """Cap the KV-bytes bound at the model's context length and say which binds.

    Example: a buffer that holds 37.7M prompt tokens of a model with a 32,768-token
    context: ``LongestRequest(32_767, "context")`` (32,767 prompt + 1 output token).
    """
    if context is not None and context - 1 < kv_bound_tokens:
        return LongestRequest(context - 1, "context")
    return LongestRequest(kv_bound_tokens, "kv_bytes")


def _as_dict(c: Capacity, longest: LongestRequest) -> dict[str, int | str]:
    return {"longest_request_tokens": longest.tokens,
            "longest_request_bound": longest.bound,
            "longest_request_tokens_kv_bound": c.longest_request_tokens,
            "concurrent_requests": c.concurrent_requests, "full_tokens": c.full_tokens,
            "slots_held": c.slots_held}
