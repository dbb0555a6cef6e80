"""``kvchain replay``: replay recorded chain operation streams, or generate them.

``kvchain replay OPS.jsonl`` replays each section of a JSON-lines stream (format:
:mod:`kvchain.testing.replay`) on a fresh chain (``NullBuffer``), audits after every
operation and prints per shape: operations, pricing decisions, divergences between price
and outcome, audit violations. Exit status 1 on any divergence or violation.

``kvchain replay --generate SHAPE --ops N --seed S -o FILE`` writes a seeded stream
instead (``--generate all``: one section per shape; ``--cache`` adds prefix-cache ops,
``--host`` host offload / load-back / host eviction).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from kvchain.cli import app
from kvchain.cli.common import fail, out_console
from kvchain.errors import ConfigError
from kvchain.sim.run_options import check_values
from kvchain.testing.geometry import SHAPES
from kvchain.testing.replay import generate_section, replay_stream, write_stream

GENERATE_OPS = 10_000
"""``--ops`` when not given: operations per generated shape."""
GENERATE_PAGE_SIZE = 4
"""``--page-size`` when not given: tokens per page of a generated stream."""


@app.command("replay", short_help="Replay (or generate) an operation stream.")
def replay_command(
    stream: Annotated[Path | None, typer.Argument(help="JSON-lines operation stream.")] = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Stop at the first "
                                            "divergence or violation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
    generate: Annotated[str | None, typer.Option("--generate", help="Write a seeded stream "
                                                 f"of this shape ({', '.join(SHAPES)}, all) "
                                                 "instead of replaying.")] = None,
    ops: Annotated[int | None, typer.Option("--ops", help="With --generate: operations per "
                                            f"shape (default {GENERATE_OPS:,}).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="With --generate: generator seed "
                                             "(default 0).")] = None,
    page_size: Annotated[int | None, typer.Option("--page-size", help="With --generate: "
                                                  f"tokens per page (default "
                                                  f"{GENERATE_PAGE_SIZE}).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Stream file to "
                                                "write with --generate.")] = None,
    cache: Annotated[bool, typer.Option("--cache", help="With --generate: add prefix-cache "
                                        "ops (insert, lock, unlock; takes may evict).")] = False,
    host: Annotated[bool, typer.Option("--host", help="With --generate: add host ops "
                                       "(offload, load-back, host eviction).")] = False,
) -> None:
    """Replay a recorded operation stream with audits, or generate one (--generate)."""
    console = out_console()
    try:
        if generate is not None:
            if stream is not None:
                raise ConfigError(f"--generate writes a stream (to -o); it does not replay "
                                  f"{stream}: give one or the other")
            ops = GENERATE_OPS if ops is None else ops
            seed = 0 if seed is None else seed
            page_size = GENERATE_PAGE_SIZE if page_size is None else page_size
            check_values(ops=ops, seed=seed, page_size=page_size)
            if output is None:
                raise ConfigError("--generate needs -o FILE")
            shapes = SHAPES if generate == "all" else (generate,)
            sections = [generate_section(s, ops, seed, page_size=page_size, cache=cache,
                                         host=host)
                        for s in shapes]
            n = write_stream(output, sections)
            console.print(f"wrote {n:,} operations ({len(sections)} shape(s)) to {output}")
            return
        if stream is None:
            raise ConfigError("give a stream file to replay, or --generate SHAPE -o FILE")
        # A recorded stream carries its own shapes, seeds and page sizes: the generator's
        # options would be ignored, silently.
        unused = [flag for flag, value in (("--ops", ops), ("--seed", seed),
                                           ("--page-size", page_size), ("-o", output),
                                           ("--cache", cache or None),
                                           ("--host", host or None)) if value is not None]
        if unused:
            verb = "applies" if len(unused) == 1 else "apply"
            raise ConfigError(f"{', '.join(unused)} {verb} only with --generate (a recorded "
                              f"stream carries its own)")
        reports = replay_stream(stream, fail_fast=fail_fast)
    except ConfigError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([asdict(r) | {"ok": r.ok} for r in reports], indent=2))
    else:
        table = Table(title=f"kvchain replay {stream}",
                      caption="priced: pricing decisions; diverged: takes the chain refused "
                              "although their quote fit; violations: failed audits (both "
                              "must be 0); kops/s: thousands of operations per second")
        # divergences: the chain refused a take its quote fitted; violations: audits failed.
        # Short headers and kops/s keep 10,000-op sections within 80 columns; a long shape
        # name folds rather than cutting the must-be-0 columns.
        table.add_column("shape", justify="left", overflow="fold")
        for col in ("ops", "priced", "fits", "diverged", "violations", "kops/s"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in reports:
            style = "" if r.ok else "red"
            table.add_row(r.shape, f"{r.operations:,}", f"{r.decisions:,}", f"{r.fits:,}",
                          str(r.divergences), str(r.violations),
                          f"{r.operations / max(r.seconds, 1e-9) / 1e3:,.1f}", style=style)
        console.print(table)
        for r in reports:
            for m in r.messages:
                console.print(Text.assemble((r.shape, "red"), f" {m}"))
    if not all(r.ok for r in reports):
        raise typer.Exit(1)
