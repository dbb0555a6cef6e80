"""The chain's snapshot is built incrementally: after a change only the bands it touched get
a new band snapshot, the others' are reused, and the evictor's order is asked again only
when its version moved. "Incremental == from scratch" is checked under the audit flag (every
build) and by ``Chain.audit`` (the kept band snapshots); a planted forgotten touch makes both
fail. ``Chain.price_pages`` answers a repeated query on pages without building a Demand."""

from __future__ import annotations

import pytest

from kvchain.alloc import Chain, Demand
from kvchain.alloc import chain as chain_module
from kvchain.alloc.snapshot import SnapshotParts
from kvchain.errors import AuditError, InvalidDemandError
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass

from .test_eviction import ListEvictor


def _layout() -> ChainLayout:
    # window LOW END | full HIGH END, 32 B pages, B = 6,400 B: 200 pages of bytes in all
    win = CacheClass(LifetimeClass.WINDOW, 32, 0, 4, ())
    full = CacheClass(LifetimeClass.FULL, 32, 0, None, ())
    return plan_layout([win, full], 6_400, 1, null_pages=False)


def _fresh(chain: Chain) -> object:
    return chain._build_snapshot()


def test_a_release_of_one_band_rebuilds_that_band_only() -> None:
    chain = Chain(_layout(), audit=False)
    grant = chain.take(Demand((3, 5)))
    before = chain.snapshot()
    chain.release(1, grant.pages[1][:2])  # 2 full pages back: band 1 only
    after = chain.snapshot()
    assert after.bands[0] is before.bands[0]  # the window band's snapshot is reused
    assert after.bands[1] is not before.bands[1]
    # Full HIGH END: 5 pages taken (span 5 x 32 = 160 B), 2 released -> live 3, holes 2,
    # its frontiers unchanged (a release leaves holes): lo = 6,400 - 160 = 6,240.
    assert (after.bands[1].live, after.bands[1].holes, after.bands[1].lo) == (3, 2, 6_240)
    assert after == _fresh(chain) and after.epoch == chain.epoch


def test_a_take_of_both_bands_and_a_gate_change_rebuild_every_band() -> None:
    chain = Chain(_layout(), audit=False)
    first = chain.snapshot()
    chain.take(Demand((2, 1)))
    taken = chain.snapshot()
    assert taken.bands[0] is not first.bands[0] and taken.bands[1] is not first.bands[1]
    # LOW END window: 2 pages, [0, 64 B); HIGH END full: 1 page, [6,368, 6,400).
    assert (taken.bands[0].hi, taken.bands[1].lo) == (64, 6_368)
    chain.set_move_gate(False)  # the gate is a field of every band snapshot
    closed = chain.snapshot()
    assert not closed.bands[0].movable and not closed.bands[1].movable
    assert closed == _fresh(chain)


def test_the_order_is_asked_again_only_when_the_version_moves() -> None:
    chain = Chain(_layout(), audit=False)
    grant = chain.take(Demand((10, 10)))
    a, z = grant.pages
    evictor = ListEvictor([([], list(z[:4])), (list(a[:2]), [])])
    asked = []
    fetch = evictor.eviction_order

    def counted() -> object:
        asked.append(evictor.version)
        return fetch()

    evictor.eviction_order = counted  # type: ignore[method-assign]
    chain.set_evictor(evictor)
    first = chain.snapshot()
    chain.take(Demand((1, 0)))  # a new epoch, the cache unchanged: its order is reused
    second = chain.snapshot()
    assert asked == [0] and second.evictable is first.evictable
    assert second.epoch > first.epoch
    evictor.units = evictor.units[:1]
    evictor.version += 1
    third = chain.snapshot()
    # one unit left: 4 full pages (band 1)
    assert asked == [0, 1] and third.evictable.cumulative == ((0, 0), (0, 4))


def test_audit_flag_compares_every_build_with_a_fresh_one() -> None:
    chain = Chain(_layout(), audit=True)
    grant = chain.take(Demand((4, 4)))
    chain.release(0, grant.pages[0][:1])
    assert chain.snapshot() == _fresh(chain)
    chain.audit()


def _forget_band_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted defect: a change of band 1 is not touched (its kept snapshot goes stale)."""
    touch = SnapshotParts.touch

    def forgetful(self: SnapshotParts, band: int | None) -> None:
        if band != 1:
            touch(self, band)

    monkeypatch.setattr(SnapshotParts, "touch", forgetful)


def test_planted_forgotten_touch_fails_the_audit_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = Chain(_layout(), audit=True)
    grant = chain.take(Demand((2, 3)))
    chain.snapshot()
    _forget_band_one(monkeypatch)
    chain.release(1, grant.pages[1][:1])
    with pytest.raises(AuditError, match="incremental snapshot"):
        chain.snapshot()


def test_planted_forgotten_touch_fails_chain_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sibling with the flag off: the stale snapshot is served (the defect is real: band 1
    still says 3 live pages, the band holds 2), and ``audit`` names it, before the next
    build (the kept band snapshot) and after it (the cached snapshot)."""
    chain = Chain(_layout(), audit=False)
    grant = chain.take(Demand((2, 3)))
    chain.snapshot()
    _forget_band_one(monkeypatch)
    chain.release(1, grant.pages[1][:1])
    with pytest.raises(AuditError, match="bands \\[1\\] are stale"):
        chain.audit()
    stale = chain.snapshot()
    assert stale.bands[1].live == 3 and chain.band(1).live == 2
    with pytest.raises(AuditError):
        chain.audit()


def test_touch_of_every_band_and_of_an_index_outside_the_chain() -> None:
    kept = SnapshotParts(2)
    chain = Chain(_layout(), audit=False)
    bands = kept.bands(chain._bands, True, False)
    assert kept.bands(chain._bands, True, False) == bands  # nothing touched: reused
    kept.touch(5)  # outside the chain: marks nothing that exists
    assert kept.bands(chain._bands, True, False)[0] is bands[0]
    kept.touch(None)
    again = kept.bands(chain._bands, True, False)
    assert again[0] is not bands[0] and again == bands and kept.stale(chain._bands, True,
                                                                      False) == []


# --- price_pages: the memo on pages, no Demand built on a hit --------------------------------


def test_price_pages_is_price(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = Chain(_layout())
    pages = (3, 4)
    quote = chain.price_pages(pages)
    assert quote is chain.price(Demand((3, 4)))  # one memo: price's quote
    assert quote.demand == Demand((3, 4)) and quote.fits

    def no_demand(pages: object) -> Demand:
        raise AssertionError("a Demand was built on a memo hit")

    monkeypatch.setattr(chain_module, "Demand", no_demand)
    assert chain.price_pages(pages) is quote  # the same tuple: the identity test
    assert chain.price_pages(tuple([3, 4])) is quote  # an equal tuple: the lookup by value
    with pytest.raises(AssertionError):  # sibling: a miss builds one (the patch is live)
        chain.price_pages((1, 1))


def test_price_pages_dies_with_the_epoch_and_refuses_bad_pages() -> None:
    chain = Chain(_layout())
    quote = chain.price_pages((2, 2))
    chain.take(Demand((1, 0)))
    again = chain.price_pages((2, 2))
    assert again is not quote and again.before is chain.snapshot()
    epoch = chain.epoch
    chain.price_pages((1, 0))
    for bad in ((True, 0), (1.0, 0), [1, 0], (1,), (-1, 0)):
        with pytest.raises(InvalidDemandError):
            chain.price_pages(bad)  # type: ignore[arg-type]
    assert chain.epoch == epoch  # a refusal changes nothing


def test_a_new_evictor_at_the_same_version_is_asked_for_its_order() -> None:
    """Merge regression: ``set_evictor`` lives on the shared evictor side (EvictorHost), and
    the chain's own override forgets the kept order. Two evictors both at version 0: the
    second's order (2 window pages) must be served, not the first's (4 full pages);
    ``cumulative`` starts at the empty prefix (0, 0)."""
    chain = Chain(_layout(), audit=False)
    a, z = chain.take(Demand((10, 10))).pages
    chain.set_evictor(ListEvictor([([], list(z[:4]))]))
    assert chain.snapshot().evictable.cumulative == ((0, 0), (0, 4))
    second = ListEvictor([(list(a[:2]), [])])
    assert second.version == 0
    chain.set_evictor(second)
    assert chain.snapshot().evictable.cumulative == ((0, 0), (2, 0))


def test_planted_kept_order_across_evictors_serves_the_old_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sibling: with the override's reset planted out (the shared side's ``set_evictor``
    only), the first evictor's order is served after the switch, so the test above can
    fail."""
    from kvchain.alloc.evictor import EvictorHost
    monkeypatch.setattr(Chain, "set_evictor", EvictorHost.set_evictor)
    chain = Chain(_layout(), audit=False)
    a, z = chain.take(Demand((10, 10))).pages
    chain.set_evictor(ListEvictor([([], list(z[:4]))]))
    chain.snapshot()
    chain.set_evictor(ListEvictor([(list(a[:2]), [])]))
    assert chain.snapshot().evictable.cumulative == ((0, 0), (0, 4))
