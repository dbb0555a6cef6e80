"""The architecture table (docs/architecture.md, "Layers") and the README's "Where things
are" name every package and top-level module of ``src/kvchain``: a module added without
its place in the picture fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kvchain"


def _parts() -> set[str]:
    """``name/`` for each subpackage, ``name.py`` for each top-level module (not
    ``__init__.py``)."""
    out = {f"{p.name}/" for p in PACKAGE.iterdir()
           if p.is_dir() and (p / "__init__.py").exists()}
    out |= {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return out


def _layers_table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Layers")
    return text[start:text.index("\n## ", start + 1)]


def _where_things_are() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Where things are")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_layers_table_names_every_package_and_module():
    named = set(re.findall(r"`([a-z_]+(?:/|\.py))`", _layers_table()))
    assert _parts() - named == set()


def test_the_readme_names_every_package_and_module():
    named = set(re.findall(r"`([a-z_]+(?:/|\.py))`", _where_things_are()))
    assert _parts() - named == set()


def test_a_module_missing_from_the_picture_is_found(tmp_path):
    # The sibling that must fail: a part the table does not name is reported.
    named = set(re.findall(r"`([a-z_]+(?:/|\.py))`", _layers_table()))
    assert "new_module.py" in (_parts() | {"new_module.py"}) - named


def test_the_cli_row_and_the_app_help_name_every_command():
    """The CLI row omitted ``prefix-bounds``; ``kvchain --help`` said "plan, simulate,
    compare, replay" and cut the prefix-bounds and sweep lines with "..."."""
    from typer.testing import CliRunner

    from kvchain.cli import _load_commands, app

    _load_commands()
    names = [c.name for c in app.registered_commands]
    assert set(names) == {"models", "plan", "simulate", "compare", "replay", "prefix-bounds",
                          "sweep"}
    row = next(line for line in _layers_table().splitlines() if line.startswith("| CLI |"))
    assert set(re.findall(r"`(?:kvchain )?([a-z-]+)`", row)) >= set(names)
    help_text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"}).stdout
    assert "..." not in help_text.split("Commands:")[1]  # no command line cut
    head = " ".join(help_text.split("Options:")[0].split())
    assert all(name in head for name in names)


def test_the_vocabulary_allows_several_floats():
    """A chain of n >= 3 bands has n - 2 FLOATs (layout.chain_anchors): the vocabulary said
    "the one band between two ENDs"."""
    from kvchain.layout import Anchor, chain_anchors

    assert chain_anchors(5).count(Anchor.FLOAT) == 3
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "the one band between two ENDs" not in text
    assert "has `n - 2` FLOATs" in " ".join(text.split())
