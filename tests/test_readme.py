"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README has a Python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["quote"].fits  # type: ignore[attr-defined]
