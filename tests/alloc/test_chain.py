"""Chain executor: handcrafted plans through the one take path, on real bytes.

The first part runs plans written by hand (with an in-test oracle for the predicted
snapshots), so it checks the executor independently of the planner: page copies keep every
virtual page's bytes, tables stay a bijection, invalid operations change nothing, and the
audit catches planted corruption. The second part takes through the planner: worked
examples (docs/pricing.md §1-2, field cases F11, F13), price == outcome and refusal
changes nothing on seeded random sequences, gates and fences.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pytest

from kvchain.alloc import (
    Action,
    Chain,
    ChainSnapshot,
    Compact,
    Demand,
    Extend,
    PlanStep,
    Quote,
    Relocate,
    Side,
    UseHoles,
    WaitFence,
)
from kvchain.buffer import ManualFence, NumpyBuffer, TorchBuffer
from kvchain.errors import (
    AuditError,
    CapacityError,
    DoubleReleaseError,
    ForgedQuoteError,
    InvalidDemandError,
    MovesBlockedError,
    PlanMismatchError,
    ReservedPageError,
    StaleQuoteError,
    UnknownPageError,
)
from kvchain.layout import Anchor, ChainLayout, plan_layout
from kvchain.model.layers import CacheClass, LifetimeClass
from kvchain.testing.unsafe import unsafe_take_plan

# --- layouts ---------------------------------------------------------------------------


def window_class(bytes_per_token: int, window: int = 4) -> CacheClass:
    return CacheClass(LifetimeClass.WINDOW, bytes_per_token, 0, window, ())


def full_class(bytes_per_token: int) -> CacheClass:
    return CacheClass(LifetimeClass.FULL, bytes_per_token, 0, None, ())


def state_class(bytes_per_slot: int) -> CacheClass:
    return CacheClass(LifetimeClass.STATE, 0, bytes_per_slot, None, ())


def two_end_layout(buffer_bytes: int = 6_400, pa: int = 32, pz: int = 32) -> ChainLayout:
    """window LOW END (A) | full HIGH END (Z), page_size 1, no null pages."""
    return plan_layout([window_class(pa), full_class(pz)], buffer_bytes, 1, null_pages=False)


def three_band_layout(buffer_bytes: int = 6_784) -> ChainLayout:
    """state LOW END (48 B slots) | window FLOAT (32 B) | full HIGH END (32 B)."""
    return plan_layout([state_class(48), window_class(32), full_class(32)], buffer_bytes, 1,
                       null_pages=False)


# --- an independent oracle for handcrafted plans ----------------------------------------


def predict(snap: ChainSnapshot, action: Action) -> ChainSnapshot:
    """Snapshot arithmetic of one action (module docstring of alloc.snapshot)."""
    if isinstance(action, WaitFence):
        return replace(snap, bands=tuple(replace(b, fence_pending=False) for b in snap.bands))
    b = snap.bands[action.band]
    p = b.page_bytes
    if isinstance(action, UseHoles):
        new = replace(b, live=b.live + action.pages, holes=b.holes - action.pages)
    elif isinstance(action, Extend):
        k = action.pages
        new = (replace(b, hi=b.hi + k * p, live=b.live + k) if action.side is Side.HIGH
               else replace(b, lo=b.lo - k * p, live=b.live + k))
    elif isinstance(action, Compact):
        k = action.pages
        new = (replace(b, hi=b.hi - k * p, holes=b.holes - k) if action.side is Side.HIGH
               else replace(b, lo=b.lo + k * p, holes=b.holes - k))
    else:
        new = replace(b, lo=action.lo, hi=action.lo + b.live * p, holes=0)
    return snap.with_band(action.band, new)


def run_plan(chain: Chain, actions: list[Action]):
    """Execute a handcrafted plan through ``Chain.take`` (the one take path)."""
    before = chain.snapshot()
    pages = [0] * chain.num_bands
    steps = []
    snap = before
    for a in actions:
        snap = predict(snap, a)
        steps.append(PlanStep(a, snap))
        if isinstance(a, UseHoles | Extend):
            pages[a.band] += a.pages
    demand = Demand(tuple(pages))
    return unsafe_take_plan(chain, demand, Quote(demand, before, tuple(steps), True))


# --- real bytes ------------------------------------------------------------------------


def pattern(band: int, vid: int, page_bytes: int) -> np.ndarray:
    """A byte pattern unique to (band, vid)."""
    data = ((np.arange(page_bytes) + 1) * (vid + 3) + band * 53) % 251
    data[0], data[1], data[2] = vid & 255, vid >> 8, band + 1
    return data.astype(np.uint8)


def bound_ids(chain: Chain, band: int) -> np.ndarray:
    return np.flatnonzero(chain.band(band).v2p >= 0)


def null_ids(chain: Chain, band: int) -> set[int]:
    return {chain.null_page(band)} if chain.layout.bands[band].reserved_pages else set()


def fill(chain: Chain, buf: NumpyBuffer) -> None:
    """Write its pattern into every bound page but the null pages (through translate)."""
    for i, bl in enumerate(chain.layout.bands):
        vids = [v for v in bound_ids(chain, i).tolist() if v not in null_ids(chain, i)]
        for vid, j in zip(vids, chain.translate(i, np.array(vids, dtype=np.int64)),
                          strict=True):
            buf.write_page(bl, int(j), pattern(i, vid, bl.page_bytes))


def check_bytes(chain: Chain, buf: NumpyBuffer) -> int:
    """Every bound page reads its pattern back through translate (null pages: zeros);
    returns pages checked."""
    n = 0
    for i, bl in enumerate(chain.layout.bands):
        vids = bound_ids(chain, i)
        nulls = null_ids(chain, i)
        for vid, j in zip(vids.tolist(), chain.translate(i, vids), strict=True):
            want = (np.zeros(bl.page_bytes, np.uint8) if vid in nulls
                    else pattern(i, vid, bl.page_bytes))
            assert np.array_equal(buf.read_page(bl, int(j)), want), (i, vid, int(j))
            n += 1
    return n


def full_state(chain: Chain, buf: NumpyBuffer | None = None) -> tuple:
    """Everything a refused or invalid call must leave unchanged."""
    tables = tuple((b.v2p.copy(), b.p2v.copy(), b.is_hole.copy(), b.lo_idx, b.hi_idx,
                    b.live, b.holes, np.sort(b.free_vids()))
                   for b in (chain.band(i) for i in range(chain.num_bands)))
    data = None if buf is None else buf.array.copy()
    return chain.snapshot(), chain.epoch, tables, data, chain.gate, chain.stats


def assert_same_state(a: tuple, b: tuple) -> None:
    assert a[0] == b[0] and a[1] == b[1] and a[4] == b[4] and a[5] == b[5]
    for ta, tb in zip(a[2], b[2], strict=True):
        for x, y in zip(ta, tb, strict=True):
            assert np.array_equal(x, y)
    if a[3] is not None:
        assert np.array_equal(a[3], b[3])


def two_end_with_holes(buf: NumpyBuffer | None = None) -> Chain:
    """docs/pricing.md §1 setting: A and Z 100 live each, then 40 of A and 80 of Z
    released as interior holes (every other/most pages, never the frontier page)."""
    chain = Chain(two_end_layout(), buf, debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 100), Extend(1, Side.LOW, 100)])
    if buf is not None:
        fill(chain, buf)
    chain.release(0, list(range(0, 80, 2)))  # 40 pages of A
    chain.release(1, list(range(0, 99)) [:80])  # 80 pages of Z nearest B
    return chain


BACKENDS = {
    "numpy": NumpyBuffer,
    "torch-cpu": lambda nbytes: TorchBuffer(nbytes, "cpu"),
}
# torch is optional (the `torch` extra): its backend's cases skip without it.
BACKEND_PARAMS = [pytest.param(name, marks=pytest.mark.skipif(
    name.startswith("torch") and importlib.util.find_spec("torch") is None,
    reason="torch not installed (pip install -e '.[torch]')")) for name in sorted(BACKENDS)]


# --- tests -----------------------------------------------------------------------------


def test_empty_chains_start_at_their_anchors() -> None:
    two = Chain(two_end_layout())
    a, z = two.snapshot().bands
    assert (a.lo, a.hi, z.lo, z.hi, a.live, z.live) == (0, 0, 6_400, 6_400, 0, 0)
    assert two.epoch == 0
    three = Chain(three_band_layout())
    s, w, f = three.snapshot().bands
    # The float starts at the 32 B grid page nearest the middle: round(6,784 / 64) = 106.
    assert (s.hi, w.lo, w.hi, f.lo) == (0, 3_392, 3_392, 6_784)
    assert w.anchor is Anchor.FLOAT


def test_snapshot_is_cached_per_epoch() -> None:
    chain = Chain(two_end_layout())
    s1 = chain.snapshot()
    assert chain.snapshot() is s1
    run_plan(chain, [Extend(0, Side.HIGH, 3)])
    s2 = chain.snapshot()
    assert s2 is not s1 and s2.epoch == 1 and s2.bands[0].live == 3
    chain.release(0, [])
    assert chain.epoch == 1  # nothing released, nothing changed
    chain.release(0, [0, 2])
    assert chain.epoch == 2  # one bump per call
    assert chain.snapshot().bands[0].holes == 2


def test_grant_lists_new_ids_holes_first_then_extensions() -> None:
    chain = Chain(two_end_layout(), debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 5)])
    chain.release(0, [1, 3])
    grant = run_plan(chain, [UseHoles(0, 2), Extend(0, Side.HIGH, 2)])
    assert grant.pages == ((1, 3, 5, 6), ())
    assert chain.translate(0, np.array([1, 3, 5, 6])).tolist() == [1, 3, 5, 6]
    assert chain.bound_pages(0) == 7 and chain.stats.takes == 2


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_compaction_keeps_every_page_byte_for_byte(backend: str) -> None:
    buf = BACKENDS[backend](6_400)
    chain = two_end_with_holes(buf)
    a, z = chain.snapshot().bands
    assert (a.live, a.holes, z.live, z.holes, a.hi, z.lo) == (60, 40, 20, 80, 3_200, 3_200)
    run_plan(chain, [Compact(1, Side.LOW, 30), Compact(0, Side.HIGH, 25)])
    a, z = chain.snapshot().bands
    assert (a.hi, a.holes, z.lo, z.holes) == (75 * 32, 15, 3_200 + 30 * 32, 50)
    # The 30 vacated slots of Z (ids 70..99) held its 20 live pages (ids 80..99): all
    # moved; A's top 25 slots (ids 75..99) held 23 live pages (all but 76 and 78).
    assert chain.stats.pages_copied == 20 + 23
    assert chain.stats.bytes_copied == 43 * 32
    assert check_bytes(chain, buf) == 80
    # Full compaction of both ENDs: no holes left, frontiers packed.
    run_plan(chain, [Compact(0, Side.HIGH, 15), Compact(1, Side.LOW, 50)])
    a, z = chain.snapshot().bands
    assert (a.hi, a.holes, z.lo, z.holes) == (60 * 32, 0, 6_400 - 20 * 32, 0)
    assert check_bytes(chain, buf) == 80


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_float_compaction_and_relocation_keep_bytes(backend: str) -> None:
    buf = BACKENDS[backend](6_784)
    chain = Chain(three_band_layout(), buf, debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 10), Extend(1, Side.LOW, 20),
                     Extend(1, Side.HIGH, 20), Extend(2, Side.LOW, 30)])
    fill(chain, buf)
    w = chain.snapshot().bands[1]
    assert (w.lo, w.hi) == (3_392 - 640, 3_392 + 640)
    chain.release(1, list(range(0, 40, 3)))  # 14 window holes on both sides of the middle
    run_plan(chain, [Compact(1, Side.HIGH, 4), Compact(1, Side.LOW, 3)])
    w = chain.snapshot().bands[1]
    assert (w.lo, w.hi, w.live, w.holes) == (2_752 + 96, 4_032 - 128, 26, 7)
    assert check_bytes(chain, buf) == 10 + 26 + 30
    # Pack the float against the state band (byte 480 rounds up to 480 = 15 x 32).
    run_plan(chain, [Relocate(1, 480)])
    w = chain.snapshot().bands[1]
    assert (w.lo, w.hi, w.holes) == (480, 480 + 26 * 32, 0)
    assert chain.translate(1, bound_ids(chain, 1)).min() == 15
    assert check_bytes(chain, buf) == 66
    # An overlapping shift up by 3 pages.
    run_plan(chain, [Relocate(1, 480 + 96)])
    assert chain.snapshot().bands[1].lo == 576
    assert chain.stats.relocations == 2
    assert check_bytes(chain, buf) == 66


def test_flush_idle_compacts_everything_and_keeps_bytes() -> None:
    buf = NumpyBuffer(6_784)
    chain = Chain(three_band_layout(), buf, debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 12), Extend(1, Side.HIGH, 30),
                     Extend(2, Side.LOW, 40)])
    fill(chain, buf)
    chain.release(0, [0, 5])
    chain.release(1, [3, 4, 10, 29])
    chain.release(2, list(range(0, 40, 4)))
    before = chain.stats.pages_copied
    copied = chain.flush_idle()
    assert copied == chain.stats.pages_copied - before > 0
    s, w, f = chain.snapshot().bands
    assert (s.holes, w.holes, f.holes) == (0, 0, 0)
    assert (s.hi, w.lo, w.hi, f.lo) == (10 * 48, 3_392, 3_392 + 26 * 32, 6_784 - 30 * 32)
    assert check_bytes(chain, buf) == 10 + 26 + 30
    assert chain.flush_idle() == 0


def test_closed_gate_blocks_moves_and_copies_nothing() -> None:
    buf = NumpyBuffer(6_400)
    chain = two_end_with_holes(buf)
    chain.set_move_gate(False, realize_moves=False)
    assert chain.snapshot().bands[0].movable is False
    before = full_state(chain, buf)
    assert chain.flush_idle() == 0
    with pytest.raises(MovesBlockedError):
        run_plan(chain, [Compact(1, Side.LOW, 10)])
    assert_same_state(before, full_state(chain, buf))
    assert chain.stats.pages_copied == 0


def test_gate_pins_defer_closing() -> None:
    chain = Chain(two_end_layout(), debug_audit=True)
    pin = chain.pin_moves()
    epoch = chain.epoch
    state = chain.set_move_gate(False)
    assert (state.open, state.close_pending, state.pins) == (True, True, 1)
    assert chain.epoch == epoch and chain.snapshot().bands[1].movable
    with chain.pin_moves():
        assert chain.gate.pins == 2
    assert chain.gate.open  # one pin still held
    pin.release()
    assert (chain.gate.open, chain.gate.close_pending, chain.gate.pins) == (False, False, 0)
    assert chain.epoch == epoch + 1 and not chain.snapshot().bands[0].movable
    pin.release()  # a second release is a no-op
    assert chain.gate.pins == 0
    # Opening cancels a pending close.
    chain.set_move_gate(True)
    with chain.pin_moves():
        chain.set_move_gate(False)
        chain.set_move_gate(True)
    assert chain.gate.open and not chain.gate.close_pending


class Fence:
    def __init__(self) -> None:
        self.done = False
        self.waits = 0

    def query(self) -> bool:
        return self.done

    def wait(self) -> None:
        self.waits += 1
        self.done = True


def test_fence_pending_until_waited_or_polled() -> None:
    chain = Chain(two_end_layout(), debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 4)])
    fence = Fence()
    chain.begin_forward(fence)
    assert all(b.fence_pending for b in chain.snapshot().bands)
    chain.release(0, [1])
    with pytest.raises(PlanMismatchError):  # a copy without WaitFence first is a bug
        run_plan(chain, [Compact(0, Side.HIGH, 1)])
    run_plan(chain, [WaitFence(), Compact(0, Side.HIGH, 1)])
    assert fence.waits == 1 and not chain.snapshot().bands[0].fence_pending
    # A fence that completes on its own is seen at the next snapshot (one epoch bump).
    late = Fence()
    chain.begin_forward(late)
    epoch = chain.epoch
    late.done = True
    assert not chain.snapshot().bands[0].fence_pending and chain.epoch == epoch + 1
    assert late.waits == 0
    # An already complete fence changes nothing.
    epoch = chain.epoch
    chain.begin_forward(late)
    assert chain.epoch == epoch


def test_plan_mismatch_is_detected() -> None:
    chain = Chain(two_end_layout())
    before = chain.snapshot()
    wrong = predict(before, Extend(0, Side.HIGH, 3))
    demand = Demand((2, 0))
    quote = Quote(demand, before, (PlanStep(Extend(0, Side.HIGH, 2), wrong),), True)
    state = full_state(chain)
    with pytest.raises(PlanMismatchError):
        unsafe_take_plan(chain, demand, quote)  # caught before anything is applied
    assert_same_state(state, full_state(chain))
    with pytest.raises(ForgedQuoteError):
        chain.take(demand, quote)  # and never accepted as a token
    assert_same_state(state, full_state(chain))


def test_extension_onto_a_neighbour_is_a_plan_bug() -> None:
    chain = Chain(two_end_layout())
    run_plan(chain, [Extend(1, Side.LOW, 150)])
    state = full_state(chain)
    with pytest.raises(PlanMismatchError):
        run_plan(chain, [Extend(0, Side.HIGH, 51)])
    assert_same_state(state, full_state(chain))


def test_release_validates_everything_first() -> None:
    buf = NumpyBuffer(6_400)
    chain = Chain(two_end_layout(), buf, debug_audit=True)
    run_plan(chain, [Extend(0, Side.HIGH, 10), Extend(1, Side.LOW, 10)])
    fill(chain, buf)
    chain.release(0, [4])
    before = full_state(chain, buf)
    cases = [
        (UnknownPageError, 0, [1, 10]),  # 10 never taken
        (UnknownPageError, 0, [1, 10_000]),  # out of range
        (UnknownPageError, 0, [-1]),
        (UnknownPageError, 0, np.array([1.0])),
        (DoubleReleaseError, 0, [2, 3, 2]),
        (DoubleReleaseError, 0, [1, 4]),  # 4 already released
        (InvalidDemandError, 2, [1]),
        (InvalidDemandError, True, [1]),
    ]
    for error, band, vids in cases:
        with pytest.raises(error):
            chain.release(band, vids)
        assert_same_state(before, full_state(chain, buf))
    chain.audit()


def test_translate_errors() -> None:
    chain = Chain(two_end_layout())
    run_plan(chain, [Extend(1, Side.LOW, 3)])
    assert chain.translate(1, np.array([[0, 2], [1, 1]])).tolist() == [[199, 197],
                                                                         [198, 198]]
    assert chain.translate(1, np.array([], dtype=np.int64)).size == 0
    for bad in (np.array([3]), np.array([-1]), np.array([200]), np.array([0.0])):
        with pytest.raises(UnknownPageError):
            chain.translate(1, bad)
    with pytest.raises(InvalidDemandError):
        chain.translate(5, np.array([0]))


def test_invalid_demands_change_nothing() -> None:
    chain = Chain(two_end_layout())
    run_plan(chain, [Extend(0, Side.HIGH, 2)])
    before = full_state(chain)
    for demand in (Demand((1,)), Demand((1, -1)), Demand((True, 0)),
                   Demand((np.int64(1), 0)), Demand((1.0, 0)), (1, 0)):
        with pytest.raises(InvalidDemandError):
            chain.take(demand)  # type: ignore[arg-type]
    assert_same_state(before, full_state(chain))


def test_null_page_of_a_band_without_one() -> None:
    chain = Chain(two_end_layout())
    with pytest.raises(ReservedPageError):
        chain.null_page(0)


# --- the audit catches planted corruption ----------------------------------------------


def corrupted_chains():
    def p2v_cleared(c: Chain) -> None:
        b = c.band(0)
        b.p2v[b.v2p[3]] = -1

    def v2p_swapped(c: Chain) -> None:
        b = c.band(0)
        b.v2p[[2, 3]] = b.v2p[[3, 2]]

    def live_counter(c: Chain) -> None:
        c.band(1).live += 1

    def hole_map(c: Chain) -> None:
        c.band(0).is_hole[0] = True

    def hole_summary(c: Chain) -> None:
        c.band(0).block_holes[0] += 1

    def overlap(c: Chain) -> None:
        b = c.band(0)
        b.hi_idx += 200
        b.holes += 200
        b.is_hole[b.hi_idx - 200:b.hi_idx] = True

    def stale_snapshot(c: Chain) -> None:
        b = c.band(1)
        b.is_hole[b.v2p[5]] = True
        b.block_holes[b.v2p[5] // 256] += 1
        b.p2v[b.v2p[5]] = -1
        b.v2p[5] = -1
        b._free_vids[b._free_top] = 5
        b._free_top += 1
        b.live -= 1
        b.holes += 1

    def live_outside_span(c: Chain) -> None:
        c.band(0).p2v[150] = 7

    return [p2v_cleared, v2p_swapped, live_counter, hole_map, hole_summary, overlap,
            stale_snapshot, live_outside_span]


@pytest.mark.parametrize("corrupt", corrupted_chains(), ids=lambda f: f.__name__)
def test_audit_catches_planted_corruption(corrupt) -> None:
    chain = Chain(two_end_layout())
    run_plan(chain, [Extend(0, Side.HIGH, 10), Extend(1, Side.LOW, 10)])
    chain.release(0, [1])
    chain.snapshot()
    chain.audit()
    corrupt(chain)
    with pytest.raises(AuditError):
        chain.audit()


# --- takes priced by the planner ------------------------------------------------------


def write_grant(chain: Chain, buf: NumpyBuffer, pages: tuple[tuple[int, ...], ...]) -> None:
    for i, vids in enumerate(pages):
        if vids:
            bl = chain.layout.bands[i]
            for vid, j in zip(vids, chain.translate(i, np.array(vids)), strict=True):
                buf.write_page(bl, int(j), pattern(i, vid, bl.page_bytes))


def test_two_end_worked_example() -> None:
    """docs/pricing.md §1: (50, 50) fits with 10 copies; (61, 61) short by 64 B."""
    buf = NumpyBuffer(6_400)
    chain = two_end_with_holes(buf)
    quote = chain.price(Demand((61, 61)))
    assert (quote.fits, quote.shortfall_bytes, quote.reason.value) == (False, 64, "bytes")
    before = full_state(chain, buf)
    with pytest.raises(CapacityError) as err:
        chain.take(Demand((61, 61)))
    assert (err.value.shortfall_bytes, err.value.reason) == (64, "bytes")
    assert err.value.demand == Demand((61, 61))
    assert_same_state(before, full_state(chain, buf))

    grant = chain.take(Demand((50, 50)))
    a, z = chain.snapshot().bands
    assert (a.live, a.holes, z.live, z.holes) == (110, 0, 70, 20)
    assert (a.hi, z.lo) == (110 * 32, 3_200 + 10 * 32)  # Z's frontier 10 pages higher
    assert chain.snapshot().gap_above(0) == 0
    assert chain.snapshot() == grant.quote.after
    assert [len(p) for p in grant.pages] == [50, 50]
    assert chain.stats.pages_copied == 10  # Z's 10 frontier slots held live pages
    write_grant(chain, buf, grant.pages)
    assert check_bytes(chain, buf) == 110 + 70


def test_three_band_worked_example() -> None:
    """docs/pricing.md §2 / F11: 41 slots held, n full + n window fit for n <= 75."""
    chain = Chain(three_band_layout(), debug_audit=True)
    chain.take(Demand((41, 0, 0)))
    assert chain.snapshot().bands[0].hi == 1_968
    assert chain.price(Demand((0, 75, 75))).fits
    refused = chain.price(Demand((0, 76, 76)))
    assert not refused.fits and refused.shortfall_bytes > 0
    before = full_state(chain)
    with pytest.raises(CapacityError):
        chain.take(Demand((0, 76, 76)))
    assert_same_state(before, full_state(chain))
    grant = chain.take(Demand((0, 75, 75)))
    _, w, f = chain.snapshot().bands
    assert (w.lo, w.hi, f.lo) == (62 * 32, 137 * 32, 6_784 - 75 * 32)
    assert chain.snapshot() == grant.quote.after


def test_null_pages_are_taken_zeroed_and_held() -> None:
    layout = plan_layout([state_class(48), window_class(32), full_class(32)], 6_784, 1)
    assert [b.reserved_pages for b in layout.bands] == [0, 1, 0]
    buf = NumpyBuffer(6_784)
    buf.array[:] = 0xAB  # garbage: the null page must be zeroed
    chain = Chain(layout, buf, debug_audit=True)
    null = chain.null_page(1)
    w = chain.snapshot().bands[1]
    assert (w.live, w.holes, chain.bound_pages(1)) == (1, 0, 1)
    j = int(chain.translate(1, np.array([null]))[0])
    assert w.lo <= j * 32 < w.hi
    assert not buf.read_page(layout.bands[1], j).any()
    with pytest.raises(ReservedPageError):
        chain.release(1, [null])
    with pytest.raises(ReservedPageError):
        chain.null_page(2)
    assert chain.stats.takes == 1


def test_quote_is_reused_only_on_the_same_epoch() -> None:
    chain = Chain(two_end_layout(), debug_audit=True)
    quote = chain.price(Demand((3, 2)))
    grant = chain.take(Demand((3, 2)), quote)
    assert grant.quote is quote
    stale = chain.price(Demand((1, 1)))
    chain.release(0, [0])
    state = full_state(chain)
    with pytest.raises(StaleQuoteError):  # priced before the release: refused
        chain.take(Demand((1, 1)), stale)
    assert_same_state(state, full_state(chain))
    grant = chain.take(Demand((1, 1)))
    assert grant.quote.before.epoch == stale.before.epoch + 1
    assert grant.quote.steps[0].action == UseHoles(0, 1)
    other = chain.price(Demand((2, 0)))
    state = full_state(chain)
    with pytest.raises(ForgedQuoteError):  # priced for another demand
        chain.take(Demand((1, 0)), other)
    assert_same_state(state, full_state(chain))
    assert chain.take(Demand((2, 0)), other).quote is other


def f13_chain() -> tuple[Chain, NumpyBuffer]:
    """F13: two-END full + window chain, 40 full and 80 window holes inside the spans,
    small gap (64 B)."""
    layout = plan_layout([window_class(32), full_class(32)], 6_464, 1, null_pages=False)
    buf = NumpyBuffer(6_464)
    chain = Chain(layout, buf, debug_audit=True)
    chain.take(Demand((100, 100)))
    fill(chain, buf)
    chain.release(0, list(range(1, 81)))  # 80 window holes
    chain.release(1, list(range(0, 80, 2)))  # 40 full holes
    return chain, buf


def test_f13_pin_defers_gate_close_until_allocation() -> None:
    chain, buf = f13_chain()
    demand = Demand((20, 80))  # needs the window band's spare holes compacted
    quote = chain.price(demand)
    assert quote.fits and quote.needs_moves
    pin = chain.pin_moves()  # admission relied on moves
    gate = chain.set_move_gate(False)  # a KV transfer wants to start
    assert gate.close_pending and gate.open
    grant = chain.take(demand, quote)  # allocation: the admitted request never fails
    assert grant.quote is quote
    assert chain.stats.pages_copied > 0
    pin.release()
    assert not chain.gate.open and not chain.snapshot().bands[0].movable
    write_grant(chain, buf, grant.pages)
    assert check_bytes(chain, buf) == 40 + 140


def test_f13_without_pin_the_closed_gate_refuses_and_copies_nothing() -> None:
    chain, buf = f13_chain()
    demand = Demand((20, 80))
    quote = chain.price(demand)
    chain.set_move_gate(False, realize_moves=False)
    before = full_state(chain, buf)
    with pytest.raises(StaleQuoteError):
        chain.take(demand, quote)  # priced with the gate open: stale
    assert_same_state(before, full_state(chain, buf))
    with pytest.raises(CapacityError) as err:
        chain.take(demand, chain.price(demand))  # priced again with the gate closed
    assert err.value.reason == "moves_blocked" and err.value.shortfall_bytes > 0
    assert_same_state(before, full_state(chain, buf))
    assert chain.stats.pages_copied == 0
    chain.set_move_gate(True)
    chain.take(demand)
    assert chain.stats.pages_copied > 0


def test_gate_close_realizes_moves_first() -> None:
    """Contract 6: by default a close compacts first, so the in-place price with the gate
    closed equals the price with moves (two ENDs) and the admitted demand still fits."""
    chain, buf = f13_chain()
    demand = Demand((20, 80))
    assert chain.price(demand).needs_moves
    chain.set_move_gate(False)
    assert not chain.gate.open and chain.stats.pages_copied > 0
    assert all(b.holes == 0 for b in chain.snapshot().bands)
    quote = chain.price(demand)
    assert quote.fits and not quote.needs_moves
    write_grant(chain, buf, chain.take(demand).pages)
    assert check_bytes(chain, buf) == 40 + 140


def test_a_plan_that_copies_waits_for_the_fence_first() -> None:
    chain, buf = f13_chain()
    fence = ManualFence()
    chain.begin_forward(fence)
    # In place: no wait, the fence stays pending and the prediction says so.
    grant = chain.take(Demand((5, 5)))
    assert fence.waits == 0 and chain.snapshot().bands[0].fence_pending
    assert chain.snapshot() == grant.quote.after
    grant = chain.take(Demand((10, 75)))
    actions = [s.action for s in grant.quote.steps]
    assert isinstance(actions[0], WaitFence)
    assert any(isinstance(a, Compact) for a in actions)
    assert fence.waits == 1 and not chain.snapshot().bands[1].fence_pending
    write_grant(chain, buf, grant.pages)
    chain.audit()


def test_float_packing_through_take_keeps_bytes() -> None:
    buf = NumpyBuffer(6_784)
    chain = Chain(three_band_layout(), buf, debug_audit=True)
    chain.take(Demand((10, 60, 40)))
    fill(chain, buf)
    chain.release(1, list(range(0, 60, 2)))  # 30 window holes spread over the float
    write_grant(chain, buf, chain.take(Demand((0, 0, 80))).pages)  # full END grows down
    s, w, _ = chain.snapshot().bands
    need = Demand((w.lo // 48 - s.hi // 48 + 5, 0, 0))  # state wants past the float's lo
    quote = chain.price(need)
    assert quote.fits
    grant = chain.take(need)
    kinds = {type(step.action) for step in grant.quote.steps}
    assert kinds & {Compact, Relocate}
    assert chain.snapshot() == grant.quote.after
    write_grant(chain, buf, grant.pages)
    assert check_bytes(chain, buf) == chain.bound_pages(0) + 30 + 120


@pytest.mark.parametrize("shape", ["one", "two", "three"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_operations_price_equals_outcome(shape: str, seed: int) -> None:
    """Contracts 1 and 2 on seeded random take/release/gate/fence/flush sequences, with an
    audit after every operation and the bytes of every page checked."""
    rng = np.random.default_rng(seed)
    if shape == "one":
        layout = plan_layout([full_class(16)], 4_096, 1, null_pages=False)
    elif shape == "two":
        layout = plan_layout([window_class(24), full_class(16)], 4_096, 1)
    else:
        layout = plan_layout([state_class(40), window_class(16), full_class(24)], 8_192, 1)
    buf = NumpyBuffer(layout.buffer_bytes)
    chain = Chain(layout, buf, debug_audit=True)
    held: list[list[int]] = [[] for _ in layout.bands]
    fence: ManualFence | None = None
    outcomes = {"fit": 0, "refused": 0}
    for step in range(160):
        op = rng.random()
        if op < 0.5:
            pages = tuple(int(x) for x in rng.integers(0, 60, size=len(layout.bands)))
            demand = Demand(pages)
            quote = chain.price(demand)
            if quote.fits:
                grant = chain.take(demand, quote)
                assert chain.snapshot() == quote.after
                write_grant(chain, buf, grant.pages)
                for i, vids in enumerate(grant.pages):
                    held[i].extend(vids)
                outcomes["fit"] += 1
            else:
                before = full_state(chain, buf)
                with pytest.raises(CapacityError) as err:
                    chain.take(demand, quote)
                assert err.value.shortfall_bytes == quote.shortfall_bytes > 0
                assert_same_state(before, full_state(chain, buf))
                outcomes["refused"] += 1
        elif op < 0.85:
            i = int(rng.integers(len(layout.bands)))
            if held[i]:
                n = int(rng.integers(1, len(held[i]) + 1))
                pick = rng.choice(len(held[i]), size=n, replace=False)
                vids = [held[i][k] for k in pick]
                chain.release(i, vids)
                held[i] = [v for k, v in enumerate(held[i]) if k not in set(pick.tolist())]
        elif op < 0.9:
            chain.set_move_gate(bool(rng.random() < 0.6))
        elif op < 0.95:
            if fence is not None and rng.random() < 0.5:
                fence.complete()
            fence = ManualFence()
            chain.begin_forward(fence)
        else:
            chain.flush_idle()
        if step % 20 == 0:
            check_bytes(chain, buf)
    assert check_bytes(chain, buf) == sum(len(h) for h in held) + sum(
        b.reserved_pages for b in layout.bands)
    assert outcomes["fit"] > 10 and outcomes["refused"] > 0
    chain.set_move_gate(True)
    chain.flush_idle()
    assert all(b.holes == 0 for b in chain.snapshot().bands)
    assert check_bytes(chain, buf) == sum(len(h) for h in held) + sum(
        b.reserved_pages for b in layout.bands)


def test_extend_of_empty_float_and_ends_from_an_empty_chain() -> None:
    chain = Chain(three_band_layout(), debug_audit=True)
    grant = chain.take(Demand((2, 3, 4)))
    assert [s.action for s in grant.quote.steps] == [
        Extend(0, Side.HIGH, 2), Extend(1, Side.LOW, 3), Extend(2, Side.LOW, 4)]
    assert grant.pages == ((0, 1), (0, 1, 2), (0, 1, 2, 3))
