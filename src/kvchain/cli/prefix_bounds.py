"""``kvchain prefix-bounds``: what any prefix cache could hit on a trace.

Prints the infinite-cache bound and, with a capacity, the LRU bound of
:mod:`kvchain.sim.prefix_bounds` (prompt tokens in whole pages whose content was seen in
an earlier prompt). A capacity in bytes is turned into pages of the model's
full-attention class (``P x E_full`` bytes a page): window pages of a cached prefix are
kept only near its resumable ends and state checkpoints are few, so full pages are what
fills a cache.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from kvchain.cli import app
from kvchain.cli.common import fail, load_spec, note, out_console, warn
from kvchain.errors import ConfigError, KVChainError
from kvchain.model.layers import LifetimeClass
from kvchain.sim.prefix_bounds import HitBound, keyed_prompts, walk_bound
from kvchain.sim.run_options import check_values
from kvchain.sim.traces import load_trace


@app.command("prefix-bounds", short_help="Hit-rate bounds of a prefix cache on a trace.")
def prefix_bounds_command(
    trace: Annotated[str, typer.Option("--trace", help="Bundled trace name or a trace file "
                                       "with content block ids (hash_ids).")] = "mooncake",
    requests: Annotated[int | None, typer.Option("--requests", help="First N requests "
                                                 "(default: all).")] = None,
    page_size: Annotated[int, typer.Option("--page-size", help="Tokens per page.")] = 16,
    capacity_pages: Annotated[int | None, typer.Option(
        "--capacity-pages", help="LRU capacity in pages.")] = None,
    capacity_bytes: Annotated[int | None, typer.Option(
        "--capacity-bytes", help="LRU capacity in bytes (needs --model).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model whose full-attention "
                                              "bytes per token size a page.")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel ranks (bytes per rank).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """Hit-rate bounds of a prefix cache on a trace: infinite cache and LRU of a size."""
    console = out_console()
    try:
        check_values(requests=requests, page_size=page_size, tp=tp,
                    capacity_pages=capacity_pages, capacity_bytes=capacity_bytes)
        if capacity_pages is not None and capacity_bytes is not None:
            raise ConfigError("give --capacity-pages or --capacity-bytes, not both")
        if capacity_bytes is not None and model is None:
            raise ConfigError("--capacity-bytes needs --model to size a page")
        # The model is loaded whenever it is named, so a misspelt name is refused even
        # where nothing reads it (without --capacity-bytes).
        spec = None if model is None else load_spec(model, None, tp=tp)
        if spec is not None and capacity_bytes is not None:
            per_token = spec.bytes_per_token(LifetimeClass.FULL)
            if per_token == 0:
                raise ConfigError(f"model {model!r} has no full-attention class to cache")
            page_bytes = per_token * page_size
            if capacity_bytes < page_bytes:  # not one page: no LRU bound to compute
                raise ConfigError(f"--capacity-bytes {capacity_bytes:,} is less than one page "
                                  f"of {model} ({page_size} tokens x {per_token:,} B of "
                                  f"full attention per token = {page_bytes:,} B)")
            capacity_pages = capacity_bytes // page_bytes
        loaded = load_trace(trace, first=requests)
        block_tokens = int(getattr(loaded, "block_tokens", 512))
        keyed = keyed_prompts(loaded.requests, page_size, block_tokens)  # once for both
        bounds: list[HitBound] = [walk_bound(keyed, page_size)]
        if capacity_pages is not None:
            bounds.append(walk_bound(keyed, page_size, capacity_pages))
    except KVChainError as exc:  # bad options, traces, block ids: typed, exit 2
        fail(exc)
    if model is not None and capacity_bytes is None:
        warn("--model only sizes the pages of --capacity-bytes: without it the bounds are "
             "in pages and read no model")
    elif model is None and tp != 1:
        warn("--tp only splits the bytes of --model's pages: without --model it changes "
             "nothing")
    if bounds[0].requests == 0:
        fail(f"trace {loaded.name!r} has no content block ids")
    if all(tokens < page_size for tokens, _ in keyed):
        note(f"no prompt fills a page of {page_size:,} tokens (the longest is "
             f"{max(tokens for tokens, _ in keyed):,}): a cache of whole pages hits none")
    rows = [{"cache": "infinite" if b.capacity_pages is None else f"LRU {b.capacity_pages:,} pages",
             "capacity_pages": b.capacity_pages, "requests": b.requests,
             "prompt_tokens": b.prompt_tokens, "hit_tokens": b.hit_tokens,
             "hit_rate": round(b.hit_rate, 6)} for b in bounds]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"prefix-cache bounds: {loaded.name}, {bounds[0].requests:,} "
                        f"requests, {page_size} tokens/page")
    for col in ("cache", "prompt tok", "hit tok", "hit rate"):
        table.add_column(col, justify="left" if col == "cache" else "right")
    for r, b in zip(rows, bounds, strict=True):
        table.add_row(str(r["cache"]), f"{b.prompt_tokens:,}", f"{b.hit_tokens:,}",
                      f"{100 * b.hit_rate:.2f}%")
    console.print(table)
