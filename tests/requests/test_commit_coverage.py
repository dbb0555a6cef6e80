"""A commit must not run past the pages a request holds, in every page band: an
all-window chain once accepted ``commit(0, 100)`` on one 16-token page (the check looked
only at bands that keep every token), and its decodes after that ran with no page."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.errors import InvalidDemandError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager


def _window_only() -> KVManager:
    # one 48-token window band, 16-token pages
    return KVManager(Chain(plan_layout([declared_class(LC.WINDOW, 1_000, 48)], 500_000, 16)))


def test_a_commit_past_the_window_pages_held_is_refused() -> None:
    kv = _window_only()
    kv.allocate([(0, 16)])  # one page: tokens [0, 16)
    before = (kv.tokens(0), kv.held(0), kv.chain.epoch)
    with pytest.raises(InvalidDemandError, match="not covered"):
        kv.commit(0, 17)  # token 16 is on page 1, not held
    with pytest.raises(InvalidDemandError, match="not covered"):
        kv.commit(0, 100)
    assert (kv.tokens(0), kv.held(0), kv.chain.epoch) == before
    assert kv.commit(0, 16) == 0 and kv.tokens(0) == 16  # exactly the page: accepted
    with pytest.raises(InvalidDemandError, match="not covered"):
        kv.commit_decodes([0])  # the 17th token needs page 1, not allocated
    assert kv.tokens(0) == 16
    kv.audit()


def test_a_decode_after_its_allocation_is_accepted() -> None:
    kv = _window_only()
    kv.allocate([(0, 16)])
    kv.commit(0, 16)
    kv.allocate([(0, 1)])  # page 1
    assert kv.commit_decodes([0]) == 0 and kv.tokens(0) == 17
    kv.audit()


@pytest.mark.parametrize("tokens", [1.5, True, 1.0, -1, "1", None], ids=repr)
def test_a_commit_of_a_non_int_or_negative_count_is_refused(tokens: object) -> None:
    # a float was truncated (commit(0, 1.5) added 1 token) and a bool counted as 1
    kv = _window_only()
    kv.allocate([(0, 16)])
    with pytest.raises(InvalidDemandError, match="tokens must be"):
        kv.commit(0, tokens)  # type: ignore[arg-type]
    assert kv.tokens(0) == 0
    assert kv.commit(0, 2) == 0 and kv.tokens(0) == 2


def _window_full() -> KVManager:
    # a 48-token window band and a full band, 16-token pages (gpt-oss-120b's shape, small)
    return KVManager(Chain(plan_layout([declared_class(LC.WINDOW, 1_000, 48),
                                        declared_class(LC.FULL, 1_000)], 2_000_000, 16)))


@pytest.mark.parametrize("short", ["full", "window"])
def test_a_decode_batch_short_in_either_page_band_is_refused(short: str) -> None:
    # The batched commit folds the page bands' row ends into their minimum (one check for
    # the batch): request 1 of three, short of its page 1 in only one band, must still be
    # refused. By hand: 16 tokens committed (page 0 in each band), each row then
    # allocated its decode's page 1 (tokens [16, 32)); request 1's row in band `short`
    # forgets page 1, so its 17th token is covered in the other band only.
    kv = _window_full()
    kv.allocate([(rid, 16) for rid in range(3)])
    for rid in range(3):
        kv.commit(rid, 16)
    kv.allocate([(rid, 1) for rid in range(3)])
    band = kv.geom.full if short == "full" else kv.geom.windows[0].band
    assert band is not None
    kv._table.rowlen[band, kv.pages(1).slot] -= 1
    with pytest.raises(InvalidDemandError, match="request 1: 1 token not covered"):
        kv.commit_decodes([0, 1, 2])
    assert [kv.tokens(rid) for rid in range(3)] == [16, 16, 16]  # nothing committed
    kv.commit_decodes([0, 2])  # the covered rows commit
    assert [kv.tokens(rid) for rid in range(3)] == [17, 16, 17]


def test_a_decode_batch_on_a_state_only_chain_commits() -> None:
    # Regression (found in round 10): on a chain of one state band (a pure recurrent
    # model) the batched commit's coverage check had no page band to look at and returned
    # the bool False, whose ``.any()`` raised AttributeError. A state slot covers every
    # token: by hand, 5 tokens committed, then two decodes -> 7 tokens, 0 pages released.
    kv = KVManager(Chain(plan_layout([declared_class(LC.STATE, 1_000)], 100_000, 16)))
    kv.allocate([(0, 5), (1, 3)])
    kv.commit(0, 5)
    kv.commit(1, 3)
    for _ in range(2):
        kv.apply(kv.plan(kv.decode_demands([0, 1])))
        assert kv.commit_decodes([0, 1]) == 0
    assert (kv.tokens(0), kv.tokens(1)) == (7, 5)
    kv.audit()
