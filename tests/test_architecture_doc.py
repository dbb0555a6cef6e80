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
