"""The decode step's hand-out (``StepPath._distribute``) and window-tail release
(``StepPath.release_fronts``) run over the rows' ints up to ``SCALAR_ROWS`` rows and over numpy
columns above; the stream of ``test_decode_rows_scalar`` (every step's demands, need
thresholds, held pages and the chain, both sides forced) covers them, and a planted
defect in each int path (a release that keeps its last page, a hand-out one column off in a
window band) is caught by the same comparison."""

from __future__ import annotations

import pytest

from kvchain.errors import KVChainError
from kvchain.requests import table as table_module
from kvchain.requests.step import StepPath

from .test_decode_rows_scalar import stream


def test_both_paths_agree_on_a_second_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert stream(monkeypatch, 10_000, 7) == stream(monkeypatch, 0, 7)


def test_a_wrong_int_release_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = StepPath._front_columns

    def short(self, band, slots, first, keep_from):  # type: ignore[no-untyped-def]
        return real(self, band, slots, first, [k - 1 for k in keep_from])

    numpy_always = stream(monkeypatch, 0, 0)
    monkeypatch.setattr(StepPath, "_front_columns", short)
    assert stream(monkeypatch, 10_000, 0) != numpy_always


def test_a_wrong_int_hand_out_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = table_module.RequestTable.start_column

    def one_off(self, pol, slot):  # type: ignore[no-untyped-def]
        return real(self, pol, slot) + int(pol.windowed)  # planted: a window page skipped

    numpy_always = stream(monkeypatch, 0, 1)
    monkeypatch.setattr(table_module.RequestTable, "start_column", one_off)
    try:
        planted = stream(monkeypatch, 10_000, 1)
    except KVChainError:  # the skipped page's pad is released later: refused
        return
    assert planted != numpy_always
