"""The request layer's parts (issue 20, items 5-6): the collaborators of ``KVManager`` get
what they read (no import of the manager, so no import circle in ``requests/``), the
window-tail release is an injected strategy (``keep_window_tail``) rather than a check
that ``commit`` is overridden, and no function of the layer runs over 60 lines.

Geometry of the by-hand test: as tests/requests/test_speculative.py (``P = 4``, window
``W = 8``, bands state (0), window (1), full (2), ``k = 3`` drafts).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import ConfigError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.cache_port import CachePort
from kvchain.requests.demand import HeldPages
from kvchain.requests.manager import KVManager

REQUESTS = Path(__file__).resolve().parents[2] / "src" / "kvchain" / "requests"
PARTS = ("attach", "audit", "cache_audit", "cache_glue", "cache_insert", "commits", "reads",
         "rows", "speculative", "step", "suspend")


def manager_imports(source: str) -> list[int]:
    """Lines of ``source`` that import ``kvchain.requests.manager`` (anywhere: module
    level, under ``TYPE_CHECKING``, inside a function)."""
    name = "kvchain.requests.manager"
    out = []
    for node in ast.walk(ast.parse(source)):
        names = ([node.module] if isinstance(node, ast.ImportFrom)
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        if name in names:
            out.append(node.lineno)
    return out


def long_functions(source: str, limit: int = 60) -> list[tuple[str, int]]:
    """``(name, lines)`` of the functions of ``source`` longer than ``limit`` lines
    (decorators and docstring included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


@pytest.mark.parametrize("module", PARTS)
def test_a_collaborator_does_not_import_the_manager(module: str) -> None:
    assert manager_imports((REQUESTS / f"{module}.py").read_text()) == []


def test_the_import_check_finds_a_planted_back_reference() -> None:
    # Sibling: the two forms the collaborators had (a type-only import at module level and
    # a function-local one) are each found, at their lines.
    planted = ("from typing import TYPE_CHECKING\n"
               "if TYPE_CHECKING:\n"
               "    from kvchain.requests.manager import KVManager\n"
               "def f():\n"
               "    import kvchain.requests.manager\n")
    assert manager_imports(planted) == [3, 5]


def test_no_function_of_the_request_layer_runs_over_60_lines() -> None:
    found = {p.name: long_functions(p.read_text()) for p in sorted(REQUESTS.glob("*.py"))}
    assert {name: fns for name, fns in found.items() if fns} == {}


def test_the_length_check_finds_a_planted_61_line_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(60))  # def line + 60 = 61 lines
    assert long_functions("def f():\n" + body) == [("f", 61)]
    assert long_functions("def f():\n" + body[:-len("    x59 = 59\n")]) == []


def fat_methods(source: str, cls: str = "KVManager") -> list[str]:
    """Methods of class ``cls`` in ``source`` (``__init__``, its construction, excepted)
    whose body is more than one statement once the docstring is set aside."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
                    continue
                body = fn.body
                if (body and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str)):
                    body = body[1:]
                if len(body) != 1:
                    out.append(fn.name)
    return out


def test_the_manager_is_a_facade_of_one_line_delegations() -> None:
    # issue 20: "kv_manager's class gone" - what stays is construction and one statement
    # per method (the step path is requests/step.py's StepPath)
    assert fat_methods((REQUESTS / "manager.py").read_text()) == []


def test_the_facade_check_finds_a_planted_two_statement_method() -> None:
    # Sibling: a method with a statement before its delegation is found, a docstring
    # alone does not count, __init__ is construction.
    planted = ("class KVManager:\n"
               "    def __init__(self):\n        self.a = 1\n        self.b = 2\n"
               "    def ok(self):\n        \"\"\"Doc.\"\"\"\n        return self.a\n"
               "    def fat(self, rid):\n        facts = self.a\n        return facts\n")
    assert fat_methods(planted) == ["fat"]


def layout():  # type: ignore[no-untyped-def]
    out = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 8),
                       declared_class(LC.STATE, 16)], 4_096, 4)
    assert out.shape_name == "state|window|full"
    return out


def spec_step(kv: KVManager) -> int:
    """A 10-token prefill, one speculative step of ``1 + 3`` tokens, a verify keeping 2;
    returns the verify's released pages."""
    kv.allocate([(0, 10)])
    kv.commit(0, 10)  # first_page(10) = (10 - 7) // 4 = 0: nothing to release
    kv.allocate([(0, 4)], kv.decode_demands([0], 3))
    assert kv.held(0) == HeldPages(((0, 4), (0, 4), (0, 4)))
    return kv.verify([0], [1], 3)


def test_a_kept_window_tail_is_released_by_the_reclaim_not_the_verify() -> None:
    # L = 12 after the verify: pages at or past ceil(12 / 4) = 3 roll back (page 3 of the
    # window and the full band: 2 pages); the window-tail release (first_page(12) =
    # (12 - 7) // 4 = 1: page 0) waits for the reclaim under keep_window_tail.
    kv = KVManager(Chain(layout(), debug_audit=True), spec_tokens=3, keep_window_tail=True)
    assert spec_step(kv) == 2
    assert kv.held(0) == HeldPages(((0, 4), (0, 3), (0, 3)))
    kv.audit()
    assert kv.reclaim_window_pages([0]) == 1
    assert kv.held(0) == HeldPages(((0, 4), (1, 3), (0, 3)))
    kv.audit()


def test_the_default_verify_releases_the_window_tail_at_once() -> None:
    # Sibling: the same step on the default strategy releases page 0 with the rollback:
    # 2 + 1 = 3 pages, and the reclaim finds nothing left.
    kv = KVManager(Chain(layout(), debug_audit=True), spec_tokens=3)
    assert spec_step(kv) == 3
    assert kv.held(0) == HeldPages(((0, 4), (1, 3), (0, 3)))
    assert kv.reclaim_window_pages([0]) == 0


def test_a_kept_window_tail_with_a_prefix_cache_is_refused() -> None:
    lay = plan_layout([declared_class(LC.WINDOW, 1_000, 32), declared_class(LC.FULL, 1_000)],
                      3_000_000, 16)
    cache = PrefixCache(CacheGeometry.of(lay), interval_tokens=64)
    chain = Chain(lay)
    with pytest.raises(ConfigError):
        KVManager(chain, cache, keep_window_tail=True)
    KVManager(chain, cache)  # nothing changed: the same chain and cache still build one


def cache_calls(source: str) -> set[str]:
    """Names ``X`` of the ``cache.X(`` calls in ``source``."""
    return set(re.findall(r"\bcache\.([a-z_]+)\(", source))


def port_methods() -> set[str]:
    """The methods of :class:`CachePort`."""
    return {name for name, v in vars(CachePort).items()
            if callable(v) and not name.startswith("_")}


def test_the_request_layer_calls_only_the_cache_port() -> None:
    # the 11 methods of docs/architecture.md's table, each called somewhere, none other
    called = set().union(*(cache_calls(p.read_text()) for p in REQUESTS.glob("*.py")))
    assert called == port_methods() and len(called) == 11


def test_the_port_check_finds_a_planted_call_outside_the_port() -> None:
    # Sibling: a glue that evicts by itself calls a method the port does not have.
    calls = cache_calls("self.cache.evict(1, 4)\ncache.match(k, 8)")
    assert calls - port_methods() == {"evict"}
