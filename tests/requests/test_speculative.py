"""Speculative decode steps in the request layer (issue 24 item 1): a step extends a request
by ``1 + k`` tokens, the verify keeps ``1 + a`` and rolls the rest back (values by hand).

Geometry: ``P = 4`` tokens per page; a window of ``W = 8`` tokens, a full class and a state
class (16 B slots), 1 B per token otherwise. Bands low -> high: state (0), window (1),
full (2). ``k = 3`` drafts unless stated.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.bands.policies import WindowPolicy
from kvchain.errors import AuditError, ConfigError, InvalidDemandError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.demand import NOTHING_HELD, HeldPages, lifetime_demand, request_demand
from kvchain.requests.manager import KVManager


def layout():  # type: ignore[no-untyped-def]
    out = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 8),
                       declared_class(LC.STATE, 16)], 4_096, 4)
    assert out.shape_name == "state|window|full"
    return out


def manager(k: int = 3) -> KVManager:
    return KVManager(Chain(layout(), debug_audit=True), spec_tokens=k)


def test_geometry_prices_the_speculative_extra() -> None:
    g = RequestGeometry.of(layout(), 3)
    # 1 working slot + k = 3 checkpoint slots; the window policy carries k for its slack
    assert g.state_slots == 4 and g.policies[0].slots == 4
    assert g.policies[1] == WindowPolicy(1, 4, 8, 3)
    # later decode peak: k = 0: ceil(1/4) + ceil(7/4) = 3 pages; k = 3: W + k = 11 tokens
    # at any start, ceil(10 / 4) + 1 = 4 pages
    assert WindowPolicy(1, 4, 8).later_peak_pages(1) == 3
    assert g.policies[1].later_peak_pages(1) == 4
    # lifetime of a 4-token prompt with 4 output tokens: KV 4 + 4 - 1 + k = 10 tokens ->
    # full ceil(10/4) = 3; window: first chunk [0, 4) 1 page, later peak min(ceil(10/4) -
    # 0, 4) = 3; state 4 slots. Without k: full ceil(7/4) = 2, window min(2, 3) = 2, 1 slot.
    assert lifetime_demand(g, 4, 4) == Demand((4, 3, 3))
    assert lifetime_demand(RequestGeometry.of(layout()), 4, 4) == Demand((1, 2, 2))
    with pytest.raises(ConfigError):
        RequestGeometry.of(layout(), -1)
    with pytest.raises(ConfigError):
        RequestGeometry.of(layout(), 3, "replay")  # type: ignore[arg-type]
    # one checkpoint plus replay: 1 working + 1 slot whatever k; k = 0 adds none
    replay = RequestGeometry.of(layout(), 3, StateRollback.REPLAY)
    assert replay.state_slots == 2 and replay.policies[0].slots == 2
    assert RequestGeometry.of(layout(), 0, StateRollback.REPLAY).state_slots == 1
    # the window slack and the k lifetime tokens are the same in both modes
    assert lifetime_demand(replay, 4, 4) == Demand((2, 3, 3))


def test_speculative_step_and_rollback_by_hand() -> None:
    kv = manager()
    # a 10-token prefill: full ceil(10/4) = 3 pages, window [0, 10) 3 pages, 4 slots
    assert kv.demand(0, 10) == Demand((4, 3, 3))
    kv.allocate([(0, 10)])
    kv.commit(0, 10)  # first_page(10) = (10 - 7) // 4 = 0: nothing released
    assert kv.held(0) == HeldPages(((0, 4), (0, 3), (0, 3)))
    # speculative step at s = 10: tokens 10..13 -> pages up to ceil(14/4) = 4: one more page
    # in the full band and in the window band ([3, 14): W + k = 11 tokens, pages 0..3)
    d = kv.decode_demands([0], 3)
    assert list(d) == [Demand((0, 1, 1))] == [kv.demand(0, 4)]
    kv.allocate([(0, 4)], d)
    assert kv.held(0) == HeldPages(((0, 4), (0, 4), (0, 4)))
    # verify keeps 1 + 1 = 2 tokens: L = 12, ceil(12/4) = 3 pages stay in full and window
    # (page 3 of each rolled back: 2 pages); window-tail release: first_page(12) = 1 ->
    # page 0 goes: 3 released in all; state slots stay (4)
    assert kv.verify([0], [1], 3) == 3
    assert kv.speculation.rolled_back_pages == [0, 1, 1]
    assert kv.tokens(0) == 12
    assert kv.held(0) == HeldPages(((0, 4), (1, 3), (0, 3)))
    kv.audit()
    kv.audit_settled([0])
    # all accepted: the next step at 12 takes page 3 again (tokens 12..15) and keeps it
    kv.allocate([(0, 4)], kv.decode_demands([0], 3))
    # L = 16: ceil(16/4) = 4 pages kept, nothing rolled back; window-tail release:
    # first_page(16) = (16 - 7) // 4 = 2 > 1: page 1 goes
    assert kv.verify([0], [3], 3) == 1
    assert kv.held(0) == HeldPages(((0, 4), (2, 4), (0, 4)))
    kv.free(0)
    kv.audit()
    assert [kv.chain.bound_pages(b) for b in range(3)] == [0, 1, 0]  # the window's null page


def test_refused_verify_changes_nothing() -> None:
    kv = manager()
    kv.allocate([(0, 10), (1, 10)])
    kv.commit(0, 10)
    kv.commit(1, 10)
    kv.allocate([(0, 4), (1, 4)], kv.decode_demands([0, 1], 3))
    before = (kv.held(0), kv.held(1), kv.tokens(0), kv.tokens(1))
    bad: list[object] = [[1], [1, -1], [1.0, 1], [1, 4], [True, 1]]
    for accepted in bad:
        with pytest.raises(InvalidDemandError):
            kv.verify([0, 1], accepted, 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidDemandError):
        kv.verify([0, 0], [1, 1], 3)
    with pytest.raises(InvalidDemandError):
        kv.verify([0, 1], [1, 1], 6)  # 1 + 6 tokens at 10 need 17 > 4 pages * 4 tokens
    with pytest.raises(InvalidDemandError):
        kv.decode_demands([0], -1)
    assert (kv.held(0), kv.held(1), kv.tokens(0), kv.tokens(1)) == before
    kv.audit()


def test_batch_equals_one_by_one() -> None:
    # 12 requests at different positions, a speculative step each, random acceptance: the
    # batched verify leaves every row as the one-by-one verify does
    rng = np.random.default_rng(5)
    prompts = rng.integers(1, 30, size=12).tolist()
    accepted = rng.integers(0, 4, size=12).tolist()
    kvs = [manager(), manager()]
    for kv in kvs:
        kv.allocate([(rid, n) for rid, n in enumerate(prompts)])
        for rid, n in enumerate(prompts):
            kv.commit(rid, n)
    rids = list(range(12))
    a, b = kvs
    da = a.decode_demands(rids, 3)
    assert list(da) == [a.demand(rid, 4) for rid in rids] == [request_demand(
        a.geom, a.held(rid), a.tokens(rid), 4) for rid in rids]
    for kv in kvs:
        kv.allocate([(rid, 4) for rid in rids], kv.decode_demands(rids, 3))
    released = a.verify(rids, accepted, 3)
    assert released == sum(b.verify([rid], [acc], 3) for rid, acc in zip(rids, accepted,
                                                                       strict=True))
    for rid in rids:
        assert a.held(rid) == b.held(rid)
        assert a.tokens(rid) == b.tokens(rid) == prompts[rid] + 1 + accepted[rid]
    for kv in kvs:
        kv.audit()
        kv.audit_settled(rids)


def test_speculative_demand_of_a_new_request() -> None:
    # A request holding nothing: its first chunk claims 1 + k = 4 slots
    g = RequestGeometry.of(layout(), 3)
    assert request_demand(g, NOTHING_HELD, 0, 1) == Demand((4, 1, 1))


def test_a_rollback_that_forgets_a_page_is_caught() -> None:
    # Planted sibling of audit_settled: a verify that leaves the last rejected full page
    # in the row (still bound) passes the leak audit but not the settled audit.
    kv = manager()
    kv.allocate([(0, 10)])
    kv.commit(0, 10)
    kv.allocate([(0, 4)], kv.decode_demands([0], 3))
    slot = kv.pages(0).slot
    table = kv._table
    kept = int(table.rowlen[2, slot])  # 4 pages, page 3 only rejected drafts (a = 0)
    kv.verify([0], [0], 3)
    # plant: put the released page back into the row (rebind it as the defect would keep it)
    vid = kv.chain.take(Demand((0, 0, 1))).pages[2][0]
    table.put_row(2, slot, kept - 1, [vid])
    kv.audit()  # every bound page is held: the leak audit alone cannot see it
    with pytest.raises(AuditError, match="rolled-back page kept"):
        kv.audit_settled([0])


def test_a_window_slack_left_behind_is_caught() -> None:
    kv = manager()
    kv.allocate([(0, 10)])
    kv.commit(0, 10)
    kv.allocate([(0, 4)], kv.decode_demands([0], 3))
    slot = kv.pages(0).slot
    table = kv._table
    first_before = int(table.first[1, slot])
    vid = int(table.tables[1][slot, first_before])
    kv.verify([0], [3], 3)  # L = 14: first_page(14) = 1, page 0 released
    # plant: the window-tail release forgot page 0 (rebound and kept)
    got = kv.chain.take(Demand((0, 1, 0))).pages[1][0]
    table.tables[1][slot, 0] = got
    table.first[1, slot] = 0
    assert vid != -1
    kv.audit()
    with pytest.raises(AuditError, match="behind its window"):
        kv.audit_settled([0])
