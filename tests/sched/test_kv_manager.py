"""The request layer: ``request_demand`` (the one demand function), window-tail release,
page tables with the null page, and the KV manager's errors - exact values on tiny chains.

Geometry used unless stated: ``P = 16`` tokens per page, ``W = 128`` (window band = band 0,
LOW END; full band = band 1, HIGH END), 1,000 B per token per class (16,000 B pages).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import (
    AuditError,
    CapacityError,
    ForgedQuoteError,
    InvalidDemandError,
    ReservedPageError,
    UnknownRequestError,
)
from kvchain.layout import plan_layout
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand
from kvchain.requests.manager import KVManager

from ..cases.helpers import full_class, local_class, state_class, window_class

PAGE_BYTES = 16_000
WINDOW, FULL = 0, 1


def window_chain(pages: int = 200, window: int = 128) -> KVManager:
    layout = plan_layout([full_class(1_000), window_class(1_000, window)],
                         pages * PAGE_BYTES, 16)
    return KVManager(Chain(layout))


def expected_window_pages(geom: RequestGeometry, start: int, extend: int) -> int:
    """Pages covering ``[window_start(start), start + extend)`` (docs/design.md §4)."""
    first = geom.windows[0].first_page(start)
    return math.ceil((start + extend) / geom.page_size) - first


# --- request_demand ----------------------------------------------------------------------


def test_seventeen_token_extend_is_two_full_and_two_window_pages() -> None:
    geom = window_chain().geom
    assert request_demand(geom, NOTHING_HELD, 0, 17) == Demand((2, 2))
    # 16 tokens held on one full page: 17 more end at 33 -> 3 pages, 2 new.
    held = HeldPages.counts(geom, full=1, windows=((0, 1),))
    assert request_demand(geom, held, 16, 17) == Demand((2, 2))


def test_geometry_of_layouts() -> None:
    geom = window_chain().geom
    assert (geom.num_bands, geom.page_size, geom.window, geom.full, geom.state) == (
        2, 16, WINDOW, FULL, None)
    assert [type(p).__name__ for p in geom.policies] == ["WindowPolicy", "FullPolicy"]
    assert (geom.windows[0].tokens, geom.windows[0].kind, geom.state_slots) == (128, "window", 1)
    three = RequestGeometry.of(plan_layout(
        [full_class(1_000), window_class(1_000, 64), state_class(50_000)], 10_000_000, 16,
        state_slots_per_request=3))
    assert (three.state, three.window, three.full, three.state_slots) == (0, 1, 2, 3)
    assert [p.kind for p in three.policies] == ["state", "window", "full"]
    assert three.policies[0].slots == 3


@pytest.mark.parametrize(("chunk", "peak"), [(1, 9), (16, 10), (17, 10), (113, 16),
                                              (4_096, 265), (8_192, 521)])
def test_window_peak_pages(chunk: int, peak: int) -> None:
    geom = window_chain().geom
    assert geom.windows[0].peak_pages(chunk) == peak == math.ceil((128 - 1 + chunk) / 16) + 1


def test_window_demand_is_exact_and_reaches_the_peak_bound() -> None:
    geom = window_chain().geom
    for chunk in (1, 5, 16, 17, 40):
        seen = set()
        for start in range(0, 400):
            d = request_demand(geom, NOTHING_HELD, start, chunk)
            n = d.pages[WINDOW]
            assert n == expected_window_pages(geom, start, chunk)
            assert n <= geom.windows[0].peak_pages(chunk)
            assert d.pages[FULL] == math.ceil((start + chunk) / 16)
            seen.add(n)
        assert max(seen) == geom.windows[0].peak_pages(chunk)
    # Worst case: the window starts on the last token of a page (start 142: [15, 158)).
    assert request_demand(geom, NOTHING_HELD, 142, 16).pages[WINDOW] == 10
    # Page-aligned start: one page less ([1, 144) -> pages 0..8).
    assert request_demand(geom, NOTHING_HELD, 128, 16).pages[WINDOW] == 9


def test_held_pages_are_subtracted() -> None:
    geom = window_chain().geom
    # After 1,024 tokens with the window tail released: pages 56..63 (tokens [897, 1024)).
    held = HeldPages.counts(geom, full=64, windows=((56, 64),))
    assert request_demand(geom, held, 1_024, 1) == Demand((1, 1))
    assert request_demand(geom, held, 1_025, 1) == Demand((1, 1))  # page 64 still unheld
    held = HeldPages.counts(geom, full=65, windows=((56, 65),))
    assert request_demand(geom, held, 1_025, 1) == Demand((0, 0))


def test_headroom_adds_full_growth_and_the_later_window_peak() -> None:
    geom = window_chain().geom
    held = HeldPages.counts(geom, full=64, windows=((56, 64),))
    # 98 later decode tokens: full pages cover [0, 1,123) -> 71, 7 new; the window
    # peaks at ceil((127 + 1) / 16) + 1 = 9 pages between tail releases, 1 new.
    assert request_demand(geom, held, 1_024, 1, 98) == Demand((1, 7))
    # A prefill: 256 tokens now, 744 later in page-aligned chunks of 256 -> window peak
    # ceil(256 / 16) + ceil(127 / 16) = 24 pages, full ceil(1,000 / 16) = 63 pages.
    assert request_demand(geom, NOTHING_HELD, 0, 256, 744, 256) == Demand((24, 63))
    assert geom.windows[0].later_peak_pages(256) == 24 and geom.windows[0].peak_pages(256) == 25
    # Later chunks never need more pages than the rest of the prompt spans.
    assert request_demand(geom, NOTHING_HELD, 0, 16, 16, 8_192) == Demand((2, 2))


def test_state_slots_claimed_once() -> None:
    layout = plan_layout([full_class(1_000), state_class(50_000)], 10_000_000, 16,
                         state_slots_per_request=3)
    geom = RequestGeometry.of(layout)
    assert request_demand(geom, NOTHING_HELD, 0, 10) == Demand((3, 1))
    assert request_demand(geom, HeldPages.counts(geom, full=1, slots=3), 10, 10) == Demand((0, 1))
    assert request_demand(geom, NOTHING_HELD, 0, 0) == Demand((0, 0))


def test_local_chunks() -> None:
    layout = plan_layout([full_class(1_000), local_class(1_000, 64)], 200 * PAGE_BYTES, 16)
    kv = KVManager(Chain(layout))
    geom = kv.geom
    assert (geom.windows[0].kind, geom.windows[0].tokens, geom.window) == ("local", 64, 0)
    starts = [geom.windows[0].first_token(p) for p in (0, 63, 64, 70, 127, 128)]
    assert starts == [0, 0, 64, 64, 64, 128]
    assert request_demand(geom, NOTHING_HELD, 70, 10) == Demand((1, 5))  # local [64, 80)
    assert request_demand(geom, NOTHING_HELD, 60, 10) == Demand((5, 5))  # [0, 70)
    kv.allocate([(0, 70)])
    assert kv.commit(0, 70) == 4  # pages 0..3 lie before the chunk at 64
    assert kv.held(0) == HeldPages.counts(kv.geom, full=5, windows=((4, 5),))
    for _ in range(57):  # up to 127 tokens: the chunk [64, 128) grows to pages 4..7
        kv.allocate([(0, 1)])
        assert kv.commit(0, 1) == 0
    kv.allocate([(0, 1)])
    assert kv.commit(0, 1) == 4  # at 128 tokens a new local chunk starts
    assert kv.held(0) == HeldPages.counts(kv.geom, full=8, windows=((8, 8),))
    kv.audit()


def test_bad_token_counts_raise() -> None:
    geom = window_chain().geom
    for args in ((-1, 1, 0, 1), (0, -1, 0, 1), (0, 1, -1, 1), (0, 1, 0, 0)):
        with pytest.raises(InvalidDemandError):
            request_demand(geom, NOTHING_HELD, *args)


# --- window-tail release -------------------------------------------------------------------


def test_window_tail_release_counts() -> None:
    kv = window_chain()
    kv.allocate([(0, 200)])
    assert kv.held(0) == HeldPages.counts(kv.geom, full=13, windows=((0, 13),))
    before = kv.chain.snapshot().bands[WINDOW].holes
    assert kv.commit(0, 200) == 4  # pages 0..3 lie wholly before token 73
    assert kv.chain.snapshot().bands[WINDOW].holes == before + 4
    assert kv.held(0) == HeldPages.counts(kv.geom, full=13, windows=((4, 13),))
    released_at = []
    for _ in range(200, 260):
        kv.allocate([(0, 1)])
        if kv.commit(0, 1):
            released_at.append(kv.tokens(0))
    # The window [L - 127, L) leaves page k when L - 127 = 16 (k + 1).
    assert released_at == [207, 223, 239, 255]
    assert kv.held(0).span(WINDOW)[1] - kv.held(0).span(WINDOW)[0] == 9  # [133, 260): pages 8..16
    assert kv.release_window_tail(0) == 0
    kv.audit()


def test_reclaim_releases_what_commit_left_behind() -> None:
    kv = window_chain()
    kv.allocate([(0, 200), (1, 64)])
    kv._table.tokens[kv.pages(0).slot] = 200  # computed, tail not yet released
    kv._table.tokens[kv.pages(1).slot] = 64
    assert kv.reclaim_window_pages([0, 1, 99]) == 4  # request 1's window reaches token 0
    assert kv.reclaim_window_pages([0, 1]) == 0
    kv.audit()


def test_free_releases_everything() -> None:
    kv = window_chain()
    kv.allocate([(0, 200)])
    kv.commit(0, 200)
    snap = kv.chain.snapshot()
    assert kv.free(0) == 13 + 9
    after = kv.chain.snapshot()
    assert [b.live for b in after.bands] == [1, 0]  # the null page stays
    assert [b.holes - a.holes for a, b in zip(snap.bands, after.bands, strict=True)] == [9, 13]
    assert 0 not in kv and kv.held(0) == NOTHING_HELD and kv.tokens(0) == 0


# --- page tables ------------------------------------------------------------------------


def test_page_tables_with_the_null_page() -> None:
    kv = window_chain()
    null = kv.chain.null_page(WINDOW)
    kv.allocate([(0, 200)])
    window_vids = list(kv.pages(0).band(WINDOW))
    kv.commit(0, 200)
    table = kv.page_table(0, WINDOW)
    assert table.dtype == np.int64 and table.shape == (13,)
    assert table[:4].tolist() == [null] * 4
    assert table[4:].tolist() == window_vids[4:]
    assert null not in window_vids
    full = kv.page_table(0, FULL)
    assert tuple(full.tolist()) == kv.pages(0).band(FULL) and len(full) == 13
    phys = kv.chain.translate(WINDOW, table)
    assert phys[:4].tolist() == [int(kv.chain.translate(WINDOW, np.array([null]))[0])] * 4
    assert len(set(phys[4:].tolist())) == 9
    with pytest.raises(InvalidDemandError):
        kv.page_table(0, 7)
    with pytest.raises(UnknownRequestError):
        kv.page_table(5, WINDOW)
    with pytest.raises(ReservedPageError):
        kv.chain.null_page(FULL)  # a full band reserves no null page


def test_state_page_table_lists_slots() -> None:
    layout = plan_layout([full_class(1_000), state_class(50_000)], 10_000_000, 16,
                         state_slots_per_request=3)
    kv = KVManager(Chain(layout))
    kv.allocate([(0, 20)])
    assert tuple(kv.page_table(0, 0).tolist()) == kv.pages(0).band(0)
    assert len(kv.page_table(0, 0)) == 3 and len(kv.page_table(0, 1)) == 2


# --- errors and audit ---------------------------------------------------------------------


def test_allocation_errors_change_nothing() -> None:
    kv = window_chain(pages=20)
    with pytest.raises(InvalidDemandError):
        kv.allocate([(0, 16), (0, 16)])
    snap = kv.chain.snapshot()
    with pytest.raises(CapacityError):
        kv.allocate([(0, 16), (1, 200)])  # 1 + 13 window, 1 + 13 full > 19 pages
    assert kv.chain.snapshot() == snap and kv.chain.epoch == snap.epoch
    assert kv.num_requests == 0
    assert kv.allocate([(0, 16), (1, 16)]) == Demand((2, 2))
    assert kv.num_requests == 2
    with pytest.raises(InvalidDemandError):
        kv.commit(0, 17)  # one full page covers 16 tokens
    with pytest.raises(UnknownRequestError):
        kv.free(9)
    with pytest.raises(UnknownRequestError):
        kv.commit(9, 1)


def test_audit_finds_a_leaked_page() -> None:
    kv = window_chain()
    kv.allocate([(0, 32)])
    kv.audit()
    kv.chain.take(Demand((0, 1)))  # bound but held by no request
    with pytest.raises(AuditError, match="leaked"):
        kv.audit()


@pytest.mark.parametrize("batch", [[(1, "5")], [(1, 2.5)], [(1, True)], [1], [([1], 5)],
                                   [(1, 5, 0)], [(True, 5)]])
def test_allocate_refuses_malformed_batches_with_a_typed_error(batch) -> None:
    """Entries that are not (int request id, int tokens) pairs: InvalidDemandError (never a
    bare TypeError, never a bool read as one token) and nothing changes."""
    kv = window_chain()
    snap, epoch = kv.chain.snapshot(), kv.chain.epoch
    with pytest.raises(InvalidDemandError):
        kv.allocate(batch)
    assert kv.chain.snapshot() == snap and kv.chain.epoch == epoch and kv.num_requests == 0


def test_allocate_accepts_numpy_token_counts() -> None:
    """Sibling: a numpy int is a token count (17 tokens: 2 full + 2 window pages, as the
    17-token test above derives), so the refusals above are about type, not value."""
    kv = window_chain()
    assert kv.allocate([(1, np.int64(17))]) == Demand((2, 2))


def test_allocate_refuses_a_quote_that_is_not_a_quote() -> None:
    kv = window_chain()
    snap = kv.chain.snapshot()
    with pytest.raises(ForgedQuoteError):
        kv.allocate([(1, 17)], quote=object())  # type: ignore[arg-type]
    assert kv.chain.snapshot() == snap and kv.num_requests == 0
