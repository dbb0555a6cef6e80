"""Window tails kept for the prefix cache in a reservation: none is reserved beside a
step's live span. A tail of a point a step reaches lies inside that step's span, and the
step's commit hands it to the cache (incremental insertion,
tests/cache/test_incremental_insert.py), so no later step holds it. (History: the tails were
first added on top of the window's whole peak, then once beside a later step's span until
the prefill end; both reserved pages the request never holds at once.)

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
    # [0, 64) = 64 pages; a later one-page chunk 1 + ceil(127 / 16) = 9 pages; the tails
    # add nothing (first fix: max(64, 9 + 32) - 64 = 0 too; before it: 64 + 32 = 96).
    assert WIN.pages(0, 0, 0, 1_024, 1_024, P) == 64
    assert WIN.resume_pages(POINTS, 0, 0, 0, 1_024, 1_024, P) == 0


def test_a_short_first_chunk_reserves_no_later_tail() -> None:
    # First chunk of 256 tokens: now [0, 16) = 16 pages; a later one-page step 9 pages,
    # and the tails add nothing: each goes to the cache at the commit of the chunk that
    # reaches its point (before incremental insertion: max(16, 9 + 32) - 16 = 25 more).
    assert WIN.pages(0, 0, 0, 256, 1_792, P) == 16
    assert WIN.resume_pages(POINTS, 0, 0, 0, 256, 1_792, P) == 0


def test_tails_held_behind_the_chunk_are_not_taken_again() -> None:
    # Holding window pages [32, 40) at 640 tokens (a chunk ended there; the tail [24, 32)
    # of point 32 went to the cache at its commit; the window starts at page
    # (640 - 127) // 16 = 32), a chunk of 512 tokens, 896 later: now [32, 72) = 40 pages of
    # which [32, 40) held (have 8), later 9: pages = max(40, 9) - 8 = 32 (the chunk's new
    # pages [40, 72)); the tails add 0.
    assert WIN.pages(32, 40, 640, 512, 896, P) == 32
    assert WIN.resume_pages(POINTS, 32, 40, 640, 512, 896, P) == 0


def test_the_step_take_adds_no_tail() -> None:
    # Without headroom (a step's own chunk) kept tails add nothing, as before.
    assert WIN.resume_pages(POINTS, 0, 0, 0, 1_024, 0, P) == 0


def test_request_demand_counts_the_tails_once() -> None:
    # Through the one demand function on a window | full chain: full pages of 2,048
    # tokens = 128; window max(64, 9) = 64 (first: 96).
    layout = plan_layout([declared_class(LC.WINDOW, 1, 128), declared_class(LC.FULL, 1)],
                         1 << 24, P)
    g = RequestGeometry.of(layout)
    win, full = g.windows[0].band, g.fulls[0]
    d = request_demand(g, NOTHING_HELD, 0, 1_024, 1_024, P, POINTS)
    assert (d.pages[win], d.pages[full]) == (64, 128)
    # A request holding [32, 40) of the window band and 40 full pages at 640 tokens:
    # window 32 (above), full ceil(2,048 / 16) - 40 = 88.
    spans = [(0, 0)] * g.num_bands
    spans[win], spans[full] = (32, 40), (0, 40)
    d = request_demand(g, HeldPages(tuple(spans)), 640, 512, 896, P, POINTS)
    assert (d.pages[win], d.pages[full]) == (32, 88)
