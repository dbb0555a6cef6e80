"""The request layer on a chain of two window sizes: every window band keeps its own
pages, demands its own window and releases out of its own window (values by hand).

Geometry: ``P = 4`` tokens per page, windows of 4 and 12 tokens and a full class, 1 B per
token each (4 B pages). Floats by bytes per request, largest first: window12 (LOW END,
band 0), window4 (band 1), full (HIGH END, band 2).
"""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.bands.policies import FullPolicy, WindowPolicy
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.demand import HeldPages, request_demand
from kvchain.requests.manager import KVManager


def two_window_manager() -> KVManager:
    layout = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 4),
                          declared_class(LC.WINDOW, 1, 12)], 4_096, 4)
    assert layout.shape_name == "window12|window4|full"
    return KVManager(Chain(layout, debug_audit=True))


def test_geometry_lists_every_window_band() -> None:
    g = two_window_manager().geom
    assert g.windows == (WindowPolicy(0, 4, 12), WindowPolicy(1, 4, 4))
    assert g.policies == (*g.windows, FullPolicy(2, 4))
    assert (g.window, g.full, g.state) == (0, 2, None)


def test_each_window_band_demands_and_releases_its_own_window() -> None:
    kv = two_window_manager()
    # 16 tokens at 0: full ceil(16 / 4) = 4 pages; each window band covers [0, 16) while
    # the chunk runs: 4 pages each.
    assert kv.demand(0, 16) == Demand((4, 4, 4))
    kv.allocate([(0, 16)])
    # After the forward the next token is 16: window12 keeps [5, 16) -> from page 1
    # (1 released); window4 keeps [13, 16) -> from page 3 (3 released).
    assert kv.commit(0, 16) == 1 + 3
    assert kv.held(0) == HeldPages(((1, 4), (3, 4), (0, 4)))
    # A decode at 16: a 5th full page; window12 needs pages 1..4 (holds 1..3): 1; window4
    # needs pages 3..4 (holds 3): 1.
    assert kv.demand(0, 1) == Demand((1, 1, 1))
    assert request_demand(kv.geom, kv.held(0), 16, 1) == Demand((1, 1, 1))
    null12, null4 = kv.chain.null_page(0), kv.chain.null_page(1)
    table12 = kv.page_table(0, 0).tolist()
    assert table12[0] == null12 and len(table12) == 4 and null12 not in table12[1:]
    table4 = kv.page_table(0, 1).tolist()
    assert table4[:3] == [null4] * 3 and len(table4) == 4 and table4[3] != null4
    kv.audit()
    kv.free(0)
    kv.audit()
    assert [kv.chain.bound_pages(b) for b in range(3)] == [1, 1, 0]  # null pages only


def test_a_leak_in_the_second_window_band_is_caught() -> None:
    # Sibling of the audit above: a page of window4 (band 1) forgotten by the request layer.
    kv = two_window_manager()
    kv.allocate([(0, 16)])
    kv._table.rowlen[1, kv.pages(0).slot] -= 1  # its last page forgotten, still bound
    with pytest.raises(AuditError, match=r"band 1: .* 1 leaked"):
        kv.audit()
    assert len(kv.pages(0).band(0)) == 4
