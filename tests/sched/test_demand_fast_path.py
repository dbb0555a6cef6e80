"""request_demand's fast path (every touched page already held) gives exactly what the
general formulas give."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.kv_manager import HeldPages, RequestGeometry, _general_demand, request_demand


@st.composite
def cases(draw):
    has = [draw(st.booleans()) for _ in range(3)]  # state, window, full
    if not any(has):
        has[2] = True
    index = 0
    bands = []
    for present in has:
        bands.append(index if present else None)
        index += present
    state, window, full = bands
    geom = RequestGeometry(index, draw(st.sampled_from([1, 4, 16])), full, window,
                           draw(st.sampled_from([1, 3, 16, 128])), draw(st.booleans()),
                           state, draw(st.integers(1, 3)))
    first = draw(st.integers(0, 12))
    held = HeldPages(draw(st.integers(0, 40)), first, first + draw(st.integers(0, 20)),
                     draw(st.integers(0, 3)))
    return geom, held, draw(st.integers(0, 400)), draw(st.integers(1, 40))


@settings(max_examples=3000, deadline=None)
@given(cases())
def test_fast_path_equals_general_formulas(case):
    geom, held, start, extend = case
    assert request_demand(geom, held, start, extend) == _general_demand(
        geom, held, start, extend, 0, 1)
