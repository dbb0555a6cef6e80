"""The band policies (kvchain.bands.policies): each kind's formulas by hand, one request
(Python ints) and a batch (numpy arrays) through the same line, and the geometry read off a
layout with N window bands.

Unless stated: ``P = 16`` tokens per page.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.bands.geometry import RequestGeometry
from kvchain.bands.policies import FullPolicy, LocalPolicy, StatePolicy, WindowPolicy
from kvchain.errors import ConfigError, InvalidDemandError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand, tail_spans

P = 16
WIN = WindowPolicy(0, P, 128)
LOC = LocalPolicy(0, P, 64)
FULL = FullPolicy(1, P)
STATE = StatePolicy(2, P, 3)


def test_first_tokens_by_kind() -> None:
    # window: max(0, s - 127); local: floor(s / 64) * 64; full and state keep everything
    positions = [0, 63, 64, 127, 128, 200]
    assert [WIN.first_token(s) for s in positions] == [0, 0, 0, 0, 1, 73]
    assert [LOC.first_token(s) for s in positions] == [0, 0, 64, 64, 128, 192]
    assert [FULL.first_token(s) for s in positions] == [0] * 6
    assert [STATE.first_page(s) for s in positions] == [0] * 6
    # pages: window 73 // 16 = 4 at 200; local 192 // 16 = 12
    assert (WIN.first_page(200), LOC.first_page(200)) == (4, 12)


def test_pages_by_hand() -> None:
    # Nothing held, 17 tokens at 0: full ceil(17 / 16) = 2; window [0, 17) -> 2 pages;
    # state: its 3 slots (field case F5 for the first two).
    assert (FULL.pages(0, 0, 0, 17), WIN.pages(0, 0, 0, 17), STATE.pages(0, 0, 0, 17)) == (
        2, 2, 3)
    # Holding window pages [56, 64) at 1,024 tokens, one decode: the token's window starts
    # at 897 (page 56), it needs page 64: 1 page; full holds 64 pages: 1 more.
    assert (WIN.pages(56, 64, 1_024, 1), FULL.pages(0, 64, 1_024, 1)) == (1, 1)
    # State slots held: nothing more; nothing computed: nothing.
    assert STATE.pages(0, 3, 10, 10) == 0 and WIN.pages(0, 0, 5, 0) == 0
    # Local chunk [64, 80) for 10 tokens at 70: pages 4 (tokens 64..79): 1 page.
    assert LOC.pages(0, 0, 70, 10) == 1


def test_peaks_by_hand() -> None:
    # any start: ceil((W - 1 + c) / P) + 1; page-aligned later chunk: ceil(c / P) +
    # ceil((W - 1) / P)
    assert WIN.peak_pages(256) == 25 == -(-(127 + 256) // 16) + 1
    assert WIN.later_peak_pages(256) == 24 == 16 + 8
    assert FULL.peak_pages(17) == 3  # ceil(17 / 16) + 1
    assert STATE.peak_pages(10_000) == 3


def test_resume_starts_by_hand() -> None:
    # A hit after 9 pages (144 tokens) reads the window from 144 - 127 = 17 (page 1); a
    # local band from 128 (page 8); full pages all of them; state none.
    assert (WIN.resume_start(9), LOC.resume_start(9), FULL.resume_start(9),
            STATE.resume_start(9)) == (1, 8, 0, 9)


@pytest.mark.parametrize("policy", [WIN, LOC, FULL, STATE], ids=lambda p: p.kind)
def test_one_line_serves_a_request_and_a_batch(policy) -> None:
    # The decode batch calls the same formula over arrays: elementwise equal to the
    # scalar calls, for every held span and position of a small grid.
    rng = np.random.default_rng(7)
    t = rng.integers(0, 400, size=200)
    first = rng.integers(0, 20, size=200)
    end = first + rng.integers(0, 10, size=200)
    for extend, headroom, chunk, horizon in ((1, 0, 1, 0), (5, 0, 1, 0), (1, 40, 16, 90)):
        got = policy.pages(first, end, t, extend, headroom, chunk, horizon)
        want = [policy.pages(int(f), int(e), int(s), extend, headroom, chunk, horizon)
                for f, e, s in zip(first, end, t, strict=True)]
        assert isinstance(got, np.ndarray) and got.tolist() == want
        assert np.array_equal(policy.first_page(t), [policy.first_page(int(s)) for s in t])


def test_n_window_bands_each_with_their_own_formula() -> None:
    layout = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 4),
                          declared_class(LC.WINDOW, 1, 12), declared_class(LC.LOCAL, 1, 8)],
                         4_096, 4)
    g = RequestGeometry.of(layout)
    kinds = {(p.kind, getattr(p, "tokens", None)) for p in g.windows}
    assert kinds == {("window", 4), ("window", 12), ("local", 8)}
    # Nothing held, 16 tokens at 0: every token band covers [0, 16): 4 pages each.
    assert request_demand(g, NOTHING_HELD, 0, 16).pages == (4, 4, 4, 4)
    # Holding the pages a chunk of 16 left after its window-tail release, one decode at 16
    # needs page 4 in every band (window12 [5, 16) from page 1; window4 [13, 16) from page
    # 3; local [16, 24) from page 4: nothing held there, 1 page).
    spans = [(0, 4)] * g.num_bands
    for pol in g.windows:
        spans[pol.band] = (pol.first_page(16), 4)
    assert request_demand(g, HeldPages(tuple(spans)), 16, 1).pages == (1, 1, 1, 1)
    # Each window band keeps its own tails for a resume point at 3 pages (12 tokens):
    # window12 from page 0, window4 from page 2 ([9, 12)), local from page 2 ([8, 12)).
    tails = tail_spans(g, (3,))
    assert {g.policies[b].kind + str(g.policies[b].tokens): t
            for b, t in enumerate(tails) if t} == {"window12": ((0, 3),),
                                                  "window4": ((2, 3),), "local8": ((2, 3),)}


def test_a_policy_out_of_place_is_refused() -> None:
    with pytest.raises(ConfigError):
        RequestGeometry(P, (FullPolicy(1, P),))  # band 0 holding band 1's policy
    with pytest.raises(ConfigError):
        RequestGeometry(P, (FullPolicy(0, 8),))  # another page size
    g = RequestGeometry(P, (WIN, FULL))
    with pytest.raises(InvalidDemandError):
        HeldPages.counts(g, windows=((0, 1), (0, 1)))  # one window band only
