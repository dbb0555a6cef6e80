"""The ``kvchain`` command line: plan | models | simulate | compare | replay | sweep.

Each command lives in its own module under ``kvchain.cli`` and registers itself on
:data:`app` when imported; :data:`COMMAND_MODULES` lists them.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from kvchain.audit import resolve_audit
from kvchain.cli.common import fail
from kvchain.errors import ConfigError

app = typer.Typer(
    name="kvchain",
    help="KV-cache memory manager for hybrid LLMs: models, plan, simulate, compare, replay, "
         "prefix-bounds, sweep.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: flags show as flags (no "<bool>" value), wraps at any width.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("kvchain")
        except PackageNotFoundError:  # run from a source tree without installing
            number = "unknown (not installed)"
        typer.echo(f"kvchain {number}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", callback=_version,
                                               is_eager=True,
                                               help="Print the version and exit.")] = False,
) -> None:
    """KV-cache memory manager for hybrid LLMs: plan, simulate, compare, replay."""
    # The audit switch is read from the environment when a chain or cache is built, deep
    # inside a run: a bad value would stop the run half-printed (exit 1). Every command
    # reads it here first, so it is refused as bad input (exit 2, nothing run).
    try:
        resolve_audit(None)
    except ConfigError as exc:
        fail(exc)


# Modules that register commands on `app` (one command per module).
COMMAND_MODULES: tuple[str, ...] = ("models", "plan", "simulate", "compare", "replay",
                                    "prefix_bounds", "sweep")


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"kvchain.cli.{name}")


def main() -> None:
    """Console-script entry point.

    A write that fails past the commands' own checks (standard output on a full disk,
    ``> /dev/full``; an output file whose disk fails mid-run) ends as ``error: cannot
    write: <why>`` on stderr with exit 1, not a traceback; a reader that closed the pipe
    (``| head``) ends quietly (click's own handling).
    """
    _load_commands()
    try:
        app(prog_name="kvchain")
    except OSError as exc:
        try:
            fail(f"cannot write: {exc}", code=1)
        except typer.Exit as done:  # outside the app: exit as it would have
            raise SystemExit(done.exit_code) from None
