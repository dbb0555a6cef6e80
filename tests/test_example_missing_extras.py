"""``examples/generate.py`` without its extras says what to install and exits with status 2
(a new user found a bare ``ModuleNotFoundError: torch`` traceback). The extras are hidden
from the child process (``sys.modules[name] = None`` makes their import fail), so this runs
with or without torch installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
HIDE = ("import runpy, sys; sys.modules[{name!r}] = None; "
        "runpy.run_path({path!r}, run_name='__main__')")


@pytest.mark.parametrize("name", ["torch", "transformers"])
def test_a_missing_extra_is_named_with_its_install_command(name: str) -> None:
    run = subprocess.run([sys.executable, "-c", HIDE.format(name=name, path=str(EXAMPLE))],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "needs torch and transformers" in run.stderr
    assert 'pip install -e ".[torch,hf]"' in run.stderr
    assert "Traceback" not in run.stderr
