"""Window tails kept for the prefix cache in a reservation: counted once, beside the live
span they are not already part of (regression: they were added on top of the window's
whole peak, so a first chunk's own tails were reserved twice and a long prompt's admission
asked for a quarter more window pages than it can ever hold).

``P = 16``, ``W = 128`` (a tail is the 8 pages ``[q - 8, q)`` before a resume point ``q``:
``first_page(16 q) = (16 q - 127) // 16 = q - 8``), resume points every 32 pages (512
tokens), later chunks reserved at one page (the scheduler's ``headroom_chunk``).
"""

from __future__ import annotations

from kvchain.bands.geometry import RequestGeometry
from kvchain.bands.policies import WindowPolicy
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand, tail_spans

P = 16
WIN = WindowPolicy(0, P, 128)
POINTS = (32, 64, 96, 128)  # a 2,048-token prompt: every block and its last whole page
TAILS = ((24, 32), (56, 64), (88, 96), (120, 128))  # 4 x 8 = 32 pages


def test_tail_spans_by_hand() -> None:
    layout = plan_layout([declared_class(LC.WINDOW, 1, 128), declared_class(LC.FULL, 1)],
                         1 << 24, P)
    g = RequestGeometry.of(layout)
    win = g.windows[0].band
    assert tail_spans(g, POINTS)[win] == TAILS


def test_a_first_chunk_reserves_its_span_only() -> None:
    # First chunk of 1,024 tokens at 0, nothing held, 1,024 tokens later: live span now
    # [0, 64) = 64 pages; a later one-page chunk 1 + ceil(127 / 16) = 9 pages, beside at
    # most all 32 tail pages: 41 <= 64, so the tails add nothing (before: 64 + 32 = 96,
    # though after the chunk the band holds 16 pages and at most 32 + 9 later).
    assert WIN.pages(0, 0, 0, 1_024, 1_024, P) == 64
    assert WIN.resume_pages(POINTS, TAILS, 0, 0, 0, 1_024, 1_024, P) == 0


def test_a_short_first_chunk_reserves_the_later_tails() -> None:
    # First chunk of 256 tokens: now [0, 16) = 16 pages; later 9 + 32 tails = 41 pages:
    # the tails add 41 - 16 = 25 (before: 32).
    assert WIN.pages(0, 0, 0, 256, 1_792, P) == 16
    assert WIN.resume_pages(POINTS, TAILS, 0, 0, 0, 256, 1_792, P) == 25


def test_tails_held_behind_the_chunk_are_not_taken_again() -> None:
    # Holding window pages [24, 40) at 640 tokens (a chunk ended there; the tail [24, 32)
    # kept behind the window, which starts at page (640 - 127) // 16 = 32), a chunk of 512
    # tokens, 896 later: now [32, 72) = 40 pages of which [32, 40) held (have 8), later 9;
    # tails from page 24 on: T = 32, X = 8 of them below page 32 (held and kept).
    # pages = max(40, 9) - 8 = 32 (the chunk's new pages [40, 72)); tails add
    # max(40, 9 + 32 - 8) - 40 = 0 (before: 32, so 64 reserved for a 32-page take).
    assert WIN.pages(24, 40, 640, 512, 896, P) == 32
    assert WIN.resume_pages(POINTS, TAILS, 24, 40, 640, 512, 896, P) == 0


def test_the_step_take_adds_no_tail() -> None:
    # Without headroom (a step's own chunk) kept tails add nothing, as before.
    assert WIN.resume_pages(POINTS, TAILS, 0, 0, 0, 1_024, 0, P) == 0


def test_request_demand_counts_the_tails_once() -> None:
    # Through the one demand function on a window | full chain: full pages of 2,048
    # tokens = 128; window max(64, 9 + 32) = 64 (before: 96).
    layout = plan_layout([declared_class(LC.WINDOW, 1, 128), declared_class(LC.FULL, 1)],
                         1 << 24, P)
    g = RequestGeometry.of(layout)
    win, full = g.windows[0].band, g.fulls[0]
    tails = tail_spans(g, POINTS)
    d = request_demand(g, NOTHING_HELD, 0, 1_024, 1_024, P, POINTS, tails)
    assert (d.pages[win], d.pages[full]) == (64, 128)
    # A request holding [24, 40) of the window band and 40 full pages at 640 tokens:
    # window 32 (above), full ceil(2,048 / 16) - 40 = 88.
    spans = [(0, 0)] * g.num_bands
    spans[win], spans[full] = (24, 40), (0, 40)
    d = request_demand(g, HeldPages(tuple(spans)), 640, 512, 896, P, POINTS, tails)
    assert (d.pages[win], d.pages[full]) == (32, 88)
