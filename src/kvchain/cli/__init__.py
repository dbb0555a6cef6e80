"""The ``kvchain`` command line: plan | models | simulate | compare | replay | sweep.

Each command lives in its own module under ``kvchain.cli`` and registers itself on
:data:`app` when imported; :data:`COMMAND_MODULES` lists them.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="kvchain",
    help="KV-cache memory manager for hybrid LLMs: plan, simulate, compare, replay.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

@app.callback()
def _root() -> None:
    """KV-cache memory manager for hybrid LLMs: plan, simulate, compare, replay."""


# Modules that register commands on `app` (one command per module).
COMMAND_MODULES: tuple[str, ...] = ("models", "plan", "simulate", "compare", "replay",
                                    "sweep")


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"kvchain.cli.{name}")


def main() -> None:
    """Console-script entry point."""
    _load_commands()
    app()
