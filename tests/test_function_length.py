"""No function of the package has a body over 60 lines (its statements after the
docstring; a command's typer signature and a long docstring do not count). The request
layer and the simulator's event loop are held to 60 lines whole, docstring included
(tests/requests/test_request_parts.py, tests/sim/test_engine_parts.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kvchain"
LIMIT = 60


def long_bodies(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """``(name, body lines)`` of the functions of ``source`` whose body, from its first
    statement after the docstring to its end, runs over ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0]
            if (len(body) > 1 and isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                first = body[1]
            lines = (node.end_lineno or node.lineno) - first.lineno + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


def test_no_function_body_of_the_package_runs_over_60_lines() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 100  # the whole package was read
    found = {str(p.relative_to(PACKAGE)): long_bodies(p.read_text()) for p in files}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_body_check_finds_a_planted_long_body() -> None:
    # Sibling: 61 body lines after a docstring are found; the docstring does not count.
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    assert long_bodies('def f():\n    """Doc.\n\n    More.\n    """\n' + body) == [("f", 61)]
    assert long_bodies('def f():\n    """Doc."""\n' + body[:-len("    x60 = 60\n")]) == []
    assert long_bodies("def f():\n" + body) == [("f", 61)]
