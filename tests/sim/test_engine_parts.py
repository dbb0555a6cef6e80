"""The simulator's event loop (``kvchain.sim.engine``) in parts: ``simulate`` builds a run
(its parts from the options), serves the trace step by step and returns the metrics; no
function of the module runs over 60 lines (the 312-line ``simulate`` of round 10 is gone).
The run's numbers are pinned elsewhere (the README's default run, the fast-forward oracle,
tests/sim/test_engine.py); this checks the shape only."""

from __future__ import annotations

from pathlib import Path

from tests.requests.test_request_parts import long_functions

import kvchain.sim.engine as engine


def test_no_function_of_the_event_loop_runs_over_60_lines() -> None:
    assert long_functions(Path(engine.__file__).read_text()) == []


def test_the_length_check_finds_a_planted_long_function() -> None:
    # Sibling: a 62-line function (its def, 60 body lines, its return) is found.
    planted = "def f():\n" + "    x = 1\n" * 60 + "    return x\n"
    assert long_functions(planted) == [("f", 62)]
