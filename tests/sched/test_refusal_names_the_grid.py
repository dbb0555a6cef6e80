"""A refusal whose bytes suffice names what binds instead of a byte shortfall that is not one.

gemma-3-27b with gemma-3-1b as its draft, ``P = 16``, ``B = 470,000,000 B``: four bands
(draft.full LOW END | window FLOAT | draft.window FLOAT | full HIGH END). The smallest
request is 1 full page, 65 window pages, 33 draft.window pages and 1 draft.full page:
65,536 + 65 x 6,815,744 + 33 x 360,448 + 1,310,720 = 456,294,400 B, and the empty chain
has 470,000,000 - 7,176,192 (null pages) = 462,823,808 B free, yet the planner finds no
placement of whole pages on the two floating bands' page grids (RefusalReason.GRID). The
scheduler's construction refused it with "it needs 456,294,400 B of pages and joint
admission fits at most the 462,823,808 B free": a byte shortfall that is not one. And
``plan_layout`` counted bytes only and accepted the buffer (``kvchain plan`` printed 0
concurrent without saying why); it now packs the smallest request on the grids
(``smallest_request_reach``) and refuses it with the grid named, as the planner does.
"""

from __future__ import annotations

import pytest

import kvchain.layout
from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand, RefusalReason
from kvchain.catalog.loader import load_model_source
from kvchain.errors import BufferTooSmallError
from kvchain.layout import (
    plan_layout,
    smallest_request_bytes,
    smallest_request_pages,
    smallest_request_reach,
)
from kvchain.requests.manager import KVManager
from kvchain.sched.scheduler import Scheduler

B = 470_000_000


def _unchecked_layout(monkeypatch: pytest.MonkeyPatch) -> kvchain.layout.ChainLayout:
    """The layout without its grid check (the old, bytes-only minimum): what the
    scheduler's own construction check must still refuse."""
    model = load_model_source("gemma-3-27b", draft_model="gemma-3-1b")
    with monkeypatch.context() as m:
        m.setattr(kvchain.layout, "smallest_request_reach", lambda *a, **k: 0)
        return plan_layout(model.classes, B, 16)


def test_grid_refusal_is_not_called_a_byte_shortfall(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _unchecked_layout(monkeypatch)
    chain = Chain(layout)
    smallest = Demand(smallest_request_pages(layout.bands, 1))
    assert smallest.pages == (1, 65, 33, 1)
    quote = chain.price(smallest)
    assert not quote.fits and quote.reason is RefusalReason.GRID
    with pytest.raises(BufferTooSmallError) as info:
        Scheduler(KVManager(chain))
    message = str(info.value)
    assert "fits at most the 462,823,808 B free" not in message
    assert ("its 456,294,400 B of pages fit the 462,823,808 B free, but no placement of whole "
            "pages fits the bands' page grids") in message


def test_layout_minimum_agrees_with_the_planner() -> None:
    model = load_model_source("gemma-3-27b", draft_model="gemma-3-1b")
    try:
        layout = plan_layout(model.classes, B, 16)
    except BufferTooSmallError:
        return  # refused at the layout, as at the scheduler: the entry points agree
    assert Chain(layout).price(Demand(smallest_request_pages(layout.bands, 1))).fits


def test_layout_refusal_names_the_grid_and_its_bytes() -> None:
    # Packed on the grids (P = 16; pages: draft.full 65,536 | window 6,815,744 (1 null) |
    # draft.window 360,448 (1 null) | full 1,310,720 B):
    #   draft.full   [0, 65,536)
    #   window       from ceil(65,536 / 6,815,744) = page 1 = 6,815,744, (1 + 65) pages:
    #                6,815,744 + 449,839,104 = 456,654,848
    #   draft.window from ceil(456,654,848 / 360,448) = page 1,267 = 456,687,616 (1,266
    #                pages end at 456,327,168, below), (1 + 33) pages: + 12,255,232 =
    #                468,942,848
    #   full (HIGH)  1,310,720 B below the buffer's end: 468,942,848 + 1,310,720 =
    #                470,253,568 B > 470,000,000, though the pages are 456,294,400 +
    #                7,176,192 (null) = 463,470,592 B.
    model = load_model_source("gemma-3-27b", draft_model="gemma-3-1b")
    with pytest.raises(BufferTooSmallError) as info:
        plan_layout(model.classes, B, 16)
    assert info.value.needed_bytes == 470_253_568
    assert info.value.available_bytes == B
    assert ("its 463,470,592 B of pages (with null pages) fit, but no placement of whole "
            "pages fits the bands' page grids") in str(info.value)
    assert "they need 470,253,568 B" in str(info.value)
    # exactly that many bytes: accepted, and the planner places the smallest request
    # (the float grids do not move with B; the full END's pages sit below its end)
    layout = plan_layout(model.classes, 470_253_568, 16)
    assert smallest_request_reach(layout.bands, 1) == 470_253_568
    assert smallest_request_bytes(layout.bands, 1) + layout.reserved_bytes == 463_470_592
    assert Chain(layout).price(Demand(smallest_request_pages(layout.bands, 1))).fits
    with pytest.raises(BufferTooSmallError):
        plan_layout(model.classes, 470_253_567, 16)


def test_planted_bytes_only_minimum_disagrees_with_the_planner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the old bytes-only check accepts B; the planner then cannot place the smallest
    # request on the empty chain: the disagreement the grid check removes
    layout = _unchecked_layout(monkeypatch)
    quote = Chain(layout).price(Demand(smallest_request_pages(layout.bands, 1)))
    assert not quote.fits and quote.reason is RefusalReason.GRID


def test_plan_and_simulate_exit_2_naming_the_grid() -> None:
    from typer.testing import CliRunner

    from kvchain.cli import _load_commands, app

    _load_commands()
    for command in ("plan", "simulate"):
        result = CliRunner().invoke(app, [command, "--model", "gemma-3-27b", "--draft-model",
                                          "gemma-3-1b", "--spec-tokens", "3",
                                          "--buffer-bytes", str(B)])
        assert result.exit_code == 2 and result.stdout == "", (command, result.output)
        assert "no placement of whole pages fits the bands' page grids" in result.stderr
        assert "they need 470,253,568 B" in result.stderr
