"""The decode step's vectorised demand (``RequestTable.decode_rows`` over numpy rows) reads
the full band's formula for a window band's *plain* rows (``plain_rows``: held pages
``[first, end)`` with ``first <= f <= end``, ``f`` the first page of the token's window),
and the window policy's own formula for the others; checked against ``WindowPolicy.pages``
on values derived by hand (``W = 128``, ``P = 16``: ``f(s) = max(0, s - 127) // 16``), with a
planted sibling (the full band's formula for every row) that the same values catch."""

from __future__ import annotations

import numpy as np

from kvchain.bands.policies import WindowPolicy, grown_pages, plain_rows

W = WindowPolicy(band=0, page_size=16, tokens=128)

# (first, end, start) -> pages of a decode (1 token at ``start``), by hand:
CASES = [
    # s = 1,008: f = 881 // 16 = 55, stop page ceil(1,009 / 16) = 64; [55, 63): 1 page
    (55, 63, 1_008, 1),
    # s = 1,007: stop page 63; [55, 63) covers it: 0
    (55, 63, 1_007, 0),
    # empty row at the window's start (first = end = f = 55), s = 1,008: pages 55..63, 9
    (55, 55, 1_008, 9),
    # not plain, missing on the left: [57, 63) at s = 1,008 (f = 55): 9 - 6 = 3 pages
    (57, 63, 1_008, 3),
    # not plain, held pages behind the window: [40, 50) at s = 1,008 (f = 55 > 50): 9
    (40, 50, 1_008, 9),
]


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    first, end, start, want = (np.array(c, dtype=np.int64) for c in zip(*CASES, strict=True))
    return first, end, start, want


def test_plain_rows_by_hand() -> None:
    first, end, start, _ = _arrays()
    assert plain_rows(W, first, end, start).tolist() == [True, True, True, False, False]


def test_the_window_formula_on_hand_values() -> None:
    first, end, start, want = _arrays()
    assert W.pages(first, end, start, 1).tolist() == want.tolist()
    # the identity decode_rows uses: on the plain rows the full band's formula
    plain = plain_rows(W, first, end, start)
    assert (grown_pages(end, start + 1, 16)[plain] == want[plain]).all()


def test_planted_full_formula_for_every_row_is_caught() -> None:
    # Sibling: grown_pages on the rows that are not plain gives 1 and 14 pages where the
    # window needs 3 and 9 (pages missing on the left / all behind the window)
    _, end, start, want = _arrays()
    wrong = grown_pages(end, start + 1, 16)
    assert wrong.tolist() == [1, 0, 9, 1, 14]
    assert (wrong != want).sum() == 2


def test_decode_rows_numpy_path_on_hand_rows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The five window rows above beside a full band holding ceil(s / 16) pages (0 or 1
    # to add), through the numpy path (SCALAR_ROWS forced to 0): the window column is
    # the hand values, rows needing nothing dropped.
    from kvchain.bands.policies import FullPolicy
    from kvchain.requests import table as table_module
    from kvchain.requests.table import RequestTable

    monkeypatch.setattr(table_module, "SCALAR_ROWS", 0)
    table = RequestTable((W, FullPolicy(band=1, page_size=16)), (0, -1))
    slots = []
    for i, (first, end, start, _) in enumerate(CASES):
        slot = table.bind(i)
        slots.append(slot)
        table.set_row(0, slot, first, list(range(1_000 * i, 1_000 * i + end - first)))
        table.set_row(1, slot, 0, list(range(63)))  # 63 full pages: s = 1,008 needs one
        table.tokens[slot] = start
    at, rows, matrix = table.decode_rows(np.array(slots, dtype=np.int64), 1)
    # full band: 1,009 tokens need 64 pages (1 more), 1,008 need 63 (0 more)
    assert at == [0, 2, 3, 4]
    assert rows == [(1, 1), (9, 1), (3, 1), (9, 1)]
    assert matrix.tolist() == [list(r) for r in rows]
