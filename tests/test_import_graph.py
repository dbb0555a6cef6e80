"""The package's import graph has no circle: a lower module never imports an upper one,
not even inside a function or under ``TYPE_CHECKING`` (which is how the last one hid:
``sim.run_options`` built ``sim.engine.SimConfig`` inside a method)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    """``src/kvchain/sim/engine.py`` -> ``kvchain.sim.engine`` (a package's
    ``__init__.py`` is the package)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports anywhere (``from a.b import c``
    counts ``a.b.c`` when that is a module, else ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
    return out & modules


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules it imports, over ``sources`` (module name -> source). A
    package's ``__init__`` re-exports its parts, so a part's import of a package above it
    (``kvchain.cache.radix`` of ``kvchain.cache``) is not a layering edge and is left out."""
    names = set(sources)
    return {name: {m for m in imports_of(text, names) - {name}
                   if not name.startswith(m + ".")}
            for name, text in sources.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm),
    each sorted; every circle of the graph lies inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted((SRC / "kvchain").rglob("*.py"))}


def test_the_package_imports_in_no_circle():
    sources = package_sources()
    assert len(sources) > 100  # the whole package was read
    assert circles(graph(sources)) == []


def test_a_planted_function_level_import_is_a_circle():
    """The check can fail: the import that ``sim.run_options`` had inside a method, put
    back, closes the circle with ``sim.engine``."""
    sources = package_sources()
    sources["kvchain.sim.run_options"] += (
        "\n\ndef _planted():\n    from kvchain.sim.engine import SimConfig\n    return SimConfig\n")
    found = circles(graph(sources))
    assert len(found) == 1
    assert {"kvchain.sim.engine", "kvchain.sim.run_options"} <= set(found[0])


def test_circles_on_a_hand_graph():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
