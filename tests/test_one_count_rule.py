"""One copy of the count rule: every check that a value is a whole number (a Python or
NumPy int, never a bool) goes through :func:`kvchain.field_types.is_whole`; 14 checks in
10 modules had their own spelling of it (``isinstance(v, bool) or not
isinstance(v, int | np.integer)``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kvchain.field_types import is_whole

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kvchain"
SPELLED = re.compile(r"isinstance\([^()]*,\s*int \| np\.integer\)")


def spelled_out(source: str) -> int:
    """How many times ``source`` spells the rule out instead of calling ``is_whole``."""
    return len(SPELLED.findall(source))


def test_only_field_types_spells_out_the_count_rule() -> None:
    found = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
             if (n := spelled_out(p.read_text()))}
    assert found == {"field_types.py": 1}


def test_the_spelling_check_finds_a_planted_copy() -> None:
    assert spelled_out("if isinstance(v, bool) or not isinstance(v, int | np.integer):") == 1
    assert spelled_out("if not is_whole(v):") == 0


def test_is_whole_by_hand() -> None:
    assert is_whole(0) and is_whole(2**70) and is_whole(np.int8(-3)) and is_whole(np.uint64(5))
    for value in (True, False, 1.0, float("nan"), "1", None, np.float64(2.0), np.bool_(True)):
        assert not is_whole(value), value
