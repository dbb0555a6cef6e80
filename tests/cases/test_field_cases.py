"""Field cases F1-F13 (``docs/field-cases.md``) as tests, with that table's numbers.

Every scheduler run goes through :func:`helpers.run_to_completion`, which checks the
README's invariants after every step (pages accounted for, zero divergences, no
retraction right after an admission, no stall on an idle chain, everything finishes).

Null pages: the layout reserves one null page in every window (or chunked-local) band and
none in full or state bands. Where a README number depends on it, the test says so.

F2, F3 (default chunk), F5, F7 and F13 first failed here; they are regression tests of
the fixes: later chunks reserved at one page (lifetime and admission demands), the chunk
search trying its upper bound first, a move pin for every step whose own take needs
moves, and the compaction a gate close runs before it closes.
"""

from __future__ import annotations

import math
from typing import ClassVar

import pytest

import kvchain.sched.scheduler as scheduler_module
from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import max_units, price
from kvchain.alloc.snapshot import Demand, RefusalReason
from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import BufferTooSmallError, CapacityError
from kvchain.layout import min_window_pages, plan_layout
from kvchain.model.layers import LifetimeClass
from kvchain.requests.demand import NOTHING_HELD, HeldPages, request_demand
from kvchain.requests.manager import KVManager
from kvchain.sched.admission import AdmissionRules, ChainPrefillBudget, NewTokenRatio
from kvchain.sched.driver import FixedStepDriver
from kvchain.sched.request import EventKind, Request, RequestStatus, StepBatch
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

from .helpers import (
    band_index,
    full_class,
    held_pages,
    make_scheduler,
    run_to_completion,
    seed_running,
    state_class,
    window_class,
)

# --- F1 --------------------------------------------------------------------------------

F1_CLASSES = (full_class(1_000), window_class(1_000, 128))


def test_f1_chain_too_small_fails_at_construction_naming_the_bytes() -> None:
    # smallest request: 1 full page (256,000 B) + ceil(127 / 256) + 1 = 2 window pages
    # (512,000 B) = 768,000 B; the layout also reserves the window band's null page
    # (256,000 B), so it reports 1,024,000 B needed.
    assert min_window_pages(128, 256) == 2
    with pytest.raises(BufferTooSmallError) as info:
        plan_layout(F1_CLASSES, 600_000, 256)
    err = info.value
    assert err.needed_bytes == 256_000 + 2 * 256_000 + 256_000
    assert err.available_bytes == 600_000
    assert "600,000 B" in str(err)
    assert "1,024,000 B" in str(err)
    assert "256,000 B of null pages" in str(err)


def test_f1_smallest_valid_chain_runs_the_request() -> None:
    with pytest.raises(BufferTooSmallError):
        plan_layout(F1_CLASSES, 1_024_000 - 1, 256)
    sched = make_scheduler(F1_CLASSES, 1_024_000, 256)
    result = run_to_completion(sched, [Request(0, 32, 8)])
    assert result.steps == 8  # one prefill step (first token) + 7 decode steps
    assert result.kinds(EventKind.FINISHED) == [0]
    assert sched.counters.retractions == 0


# --- F2 --------------------------------------------------------------------------------

F2_CLASSES = (full_class(1_000), window_class(1_000, 128))
F2_PAGE_BYTES = 256 * 1_000
F2_BUFFER = 29_000_000
F2_CONFIG = SchedulerConfig(chunk_size=8_192)


def test_f2_page_counts_of_the_long_prompt() -> None:
    layout = plan_layout(F2_CLASSES, F2_BUFFER, 256)
    geom = RequestGeometry.of(layout)
    assert geom.windows[0].peak_pages(8_192) == 34  # ceil((128 - 1 + 8192) / 256) + 1
    assert math.ceil((20_000 + 16 - 1) / 256) == 79
    # The README's peak (79 + 34 pages) fills the buffer's 113 whole pages; the layout's
    # null window page is a 114th.
    assert F2_BUFFER // F2_PAGE_BYTES == 113
    assert layout.reserved_bytes == F2_PAGE_BYTES


def _check_f2_run(sched: Scheduler, count: int) -> None:
    requests = [Request(i, 20_000, 16) for i in range(count)]
    result = run_to_completion(sched, requests)  # checks window-tail release every step
    assert sched.counters.rejected == 0
    assert sorted(result.kinds(EventKind.FINISHED)) == list(range(count))
    assert sched.counters.retractions == 0
    full = band_index(sched.chain.layout, LifetimeClass.FULL)
    window = band_index(sched.chain.layout, LifetimeClass.WINDOW)
    for rid in range(count):
        assert result.peak_pages[rid][full] == 79
        assert result.peak_pages[rid][window] <= 34
        assert result.peak_bytes[rid] <= 79 * F2_PAGE_BYTES + 34 * F2_PAGE_BYTES


def test_f2_lone_long_prompt_finishes() -> None:
    _check_f2_run(make_scheduler(F2_CLASSES, F2_BUFFER, 256, config=F2_CONFIG), 1)


def test_f2_sixteen_long_prompts_finish() -> None:
    _check_f2_run(make_scheduler(F2_CLASSES, F2_BUFFER, 256, config=F2_CONFIG), 16)


@pytest.mark.parametrize("count", [1, 16])
def test_f2_long_prompts_finish_without_the_null_page(count: int) -> None:
    # Without the null page the README's own bound (79 + 34 = 113 pages) fits the 113
    # whole pages of the buffer, and every request finishes with window-tail release.
    sched = make_scheduler(F2_CLASSES, F2_BUFFER, 256, config=F2_CONFIG, null_pages=False)
    _check_f2_run(sched, count)


# --- F3 --------------------------------------------------------------------------------

F3_CLASSES = (full_class(1_000), window_class(1_000, 128))
F3_PAGE_BYTES = 16 * 1_000
# 6 running x (13 full + 9 window) = 132 pages, + 1 null window page, + 10 free pages.
F3_BUFFER = (6 * (13 + 9) + 1 + 10) * F3_PAGE_BYTES


def _f3_scheduler(chunk_size: int) -> Scheduler:
    sched = make_scheduler(F3_CLASSES, F3_BUFFER, 16,
                           config=SchedulerConfig(chunk_size=chunk_size))
    for rid in range(6):
        seed_running(sched, rid, 200, 400)
    layout = sched.chain.layout
    for rid in range(6):
        pages = held_pages(sched, rid)
        assert pages[band_index(layout, LifetimeClass.FULL)] == 13
        assert pages[band_index(layout, LifetimeClass.WINDOW)] == 9
    assert sched.chain.snapshot().free_bytes == 160_000
    return sched


def _check_f3_new_request_waits(chunk_size: int) -> None:
    sched = _f3_scheduler(chunk_size)
    geom = sched.kv.geom
    # Its first chunk alone needs more than the 10 free pages.
    first = request_demand(geom, NOTHING_HELD, 0, min(chunk_size, 2_000))
    assert sum(first.pages) > 10
    # The six stop (end-of-sequence) after 16 output tokens, before their decodes outgrow
    # the 10 free pages (the next page boundary after 208 would need 12 more).
    driver = FixedStepDriver(1.0, stop_after={rid: 16 for rid in range(6)})
    new = Request(6, 2_000, 8, arrival_s=0.5)
    result = run_to_completion(sched, arrivals=[(0, new)], driver=driver)
    assert new.status is not RequestStatus.REJECTED
    finished = [e for e in result.events if e.kind is EventKind.FINISHED]
    assert [e.rid for e in finished] == [0, 1, 2, 3, 4, 5, 6]
    assert {e.time_s for e in finished[:6]} == {15.0}  # the six end in step 14
    assert result.admitted_at[6] == 15  # admitted in the very next step
    assert sched.counters.retractions == 0
    assert new.status is RequestStatus.FINISHED


def test_f3_new_request_waits_for_decode_headroom_default_chunk() -> None:
    _check_f3_new_request_waits(SchedulerConfig().chunk_size)


def test_f3_new_request_waits_for_decode_headroom_chunk_96() -> None:
    # C = 96: first chunk 6 full + 6 window = 12 pages > 10 free; lifetime 126 full + 15
    # window + 1 null = 142 <= 143 pages.
    _check_f3_new_request_waits(96)


def test_f3_the_ten_free_pages_are_the_decodes_headroom() -> None:
    # Counterfactual: something else takes the 10 free pages (an 80-token chunk: 5 full
    # + 5 window); the six then cannot cross the page boundary at 208 (12 pages needed,
    # 6 released by the window tail) and one is retracted - the latest arrival.
    sched = _f3_scheduler(96)
    for rid in range(6):
        sched.running[rid].arrival_s = float(rid)
    sched.kv.allocate([(100, 80)])
    assert sched.chain.snapshot().free_bytes == 0
    driver = FixedStepDriver(1.0, stop_after={rid: 16 for rid in range(6)})
    result = run_to_completion(sched, driver=driver, holders=[100])
    assert result.kinds(EventKind.RETRACTED) == [5]
    assert sched.requests[5].status is RequestStatus.FINISHED


F3B_CLASSES = (full_class(1_000), window_class(1_000, 64))
# 4 x (64, 200): 4 x ceil(263 / 16) = 68 full pages at the end, plus 32 window pages'
# worth of bytes (one of them is the window band's null page).
F3B_BUFFER = (68 + 32) * F3_PAGE_BYTES




def test_f3_window_tail_keeps_four_requests_running() -> None:
    sched = make_scheduler(F3B_CLASSES, F3B_BUFFER, 16)
    result = run_to_completion(sched, [Request(i, 64, 200) for i in range(4)])
    window = band_index(sched.chain.layout, LifetimeClass.WINDOW)
    assert sched.counters.retractions == 0
    assert result.max_running == 4
    # ceil((64 - 1 + 1) / 16) + 1 = 5 window pages per decoding request at most.
    assert max(result.peak_pages[i][window] for i in range(4)) == 5


def test_f3_out_of_window_pages_released_before_any_retraction() -> None:
    layout = plan_layout(F3B_CLASSES, F3B_BUFFER, 16)
    # a KV manager that does not release the window tail at commit (as engines that keep
    # window pages until they need the room): out-of-window pages pile up until the
    # scheduler's decode check reclaims them
    sched = Scheduler(KVManager(Chain(layout), keep_window_tail=True))
    full = band_index(layout, LifetimeClass.FULL)
    tight_steps: list[int] = []

    def before(step: int, s: Scheduler) -> None:
        if s.running and s.chain.snapshot().free_bytes < 4 * 2 * F3_PAGE_BYTES:
            tight_steps.append(step)

    result = run_to_completion(sched, [Request(i, 64, 200) for i in range(4)],
                               check_window_release=False, before_step=before)
    assert tight_steps  # decode steps with less free than the four need at a boundary
    assert sched.counters.window_pages_reclaimed > 0
    assert sched.counters.retractions == 0
    assert result.max_running == 4
    assert all(result.peak_pages[i][full] == 17 for i in range(4))


# --- F4 --------------------------------------------------------------------------------

F4_SLOT = 1_000_000
F4_PAGE_BYTES = 16 * 1_000
F4_CLASSES = (full_class(1_000), state_class(F4_SLOT))
# 5 slots + 32 full pages; an outside holder keeps 3 slots + 15 pages, so 2 slots' worth
# of bytes are free beyond the 17 full pages the request needs.
F4_BUFFER = 5 * F4_SLOT + 32 * F4_PAGE_BYTES


def _f4_chain() -> tuple[Chain, tuple[tuple[int, ...], ...]]:
    layout = plan_layout(F4_CLASSES, F4_BUFFER, 16, state_slots_per_request=3)
    assert layout.reserved_bytes == 0  # no null pages in full or state bands
    chain = Chain(layout)
    grant = chain.take(Demand((3, 15)))  # state LOW END = band 0, full HIGH END = band 1
    assert chain.snapshot().free_bytes == 2 * F4_SLOT + 17 * F4_PAGE_BYTES
    return chain, grant.pages


def test_f4_slots_all_or_nothing_in_budget_and_allocator() -> None:
    chain, held = _f4_chain()
    kv = KVManager(chain)
    rules = AdmissionRules.for_layout(chain.layout)
    assert rules.state_slots_per_request == 3
    headroom = NewTokenRatio().tokens(16 - 1)  # ceil(15 x 0.7) = 11
    demand = request_demand(kv.geom, NOTHING_HELD, 0, 256, headroom)
    assert demand == Demand((3, 17))
    snap = chain.snapshot()
    quote = price(snap, demand)
    assert not quote.fits and quote.shortfall_bytes == F4_SLOT
    assert not ChainPrefillBudget(snap, rules).admit(demand)
    with pytest.raises(CapacityError) as info:
        kv.allocate([(7, 256)])
    assert info.value.shortfall_bytes == F4_SLOT
    assert chain.snapshot() == snap and chain.epoch == snap.epoch
    assert 7 not in kv
    chain.release(0, [held[0][0]])  # 1 more slot's worth of bytes
    budget = ChainPrefillBudget(chain.snapshot(), rules)
    assert budget.admit(demand)
    kv.allocate([(7, 256)])
    assert kv.held(7).span(kv.geom.state) == (0, 3)
    assert kv.held(7).span(kv.geom.full) == (0, 16)


def test_f4_request_waits_holding_nothing_then_finishes() -> None:
    chain, held = _f4_chain()
    sched = Scheduler(KVManager(chain))
    outside = {"pages": Demand((3, 15))}
    waiting_checks: list[int] = []

    def before(step: int, s: Scheduler) -> None:
        if step == 5:
            s.chain.release(0, [held[0][0]])
            outside["pages"] = Demand((2, 15))
        if 0 in s.requests and s.requests[0].status is RequestStatus.WAITING:
            assert 0 not in s.kv and s.kv.held(0) == NOTHING_HELD
            waiting_checks.append(step)

    result = run_to_completion(sched, [Request(0, 256, 16)], before_step=before,
                               external=lambda: outside["pages"])
    assert waiting_checks == [0, 1, 2, 3, 4, 5]
    assert result.admitted_at[0] == 5
    assert result.peak_pages[0] == [3, 17]
    assert sched.counters.retractions == 0


def test_f4_request_waits_for_a_running_request_slots() -> None:
    # The same with the slots held by a running request: 5 slots + 52 pages; the blocker
    # (16, 40) holds 3 slots; (256, 16) needs 3 slots + 17 pages and waits for it.
    sched = make_scheduler(F4_CLASSES, 5 * F4_SLOT + 52 * F4_PAGE_BYTES, 16, state_slots=3)
    result = run_to_completion(sched, [Request(0, 16, 40)],
                               arrivals=[(1, Request(1, 256, 16, arrival_s=1.0))])
    finished_step = max(i for i, b in enumerate(result.batches)
                        if any(d.rid == 0 for d in b.decodes))
    assert result.admitted_at[1] == finished_step + 1
    assert result.kinds(EventKind.FINISHED) == [0, 1]
    assert sched.counters.retractions == 0


# --- F5 --------------------------------------------------------------------------------

F5_PAGE_BYTES = 16 * 1_000


def test_f5_seventeen_tokens_are_two_full_pages_everywhere() -> None:
    layout = plan_layout([full_class(1_000)], 5 * F5_PAGE_BYTES, 16)
    kv = KVManager(Chain(layout))
    demand = request_demand(kv.geom, NOTHING_HELD, 0, 17)
    assert demand == Demand((2,))
    budget = ChainPrefillBudget(kv.chain.snapshot(), AdmissionRules.for_layout(layout))
    assert budget.admit(demand)
    assert budget.reserved == Demand((2,))
    assert budget.admit(demand)
    assert budget.reserved == Demand((4,))
    assert not budget.fits(Demand((2,)))
    assert budget.fits(Demand((1,)))  # exactly the remaining room
    assert kv.allocate([(0, 17)]) == Demand((2,))
    assert kv.chain.bound_pages(0) == 2


@pytest.mark.parametrize(("pages", "admitted_first_step"), [(5, [0, 1]), (6, [0, 1, 2])])
def test_f5_later_candidates_see_the_remaining_room(pages: int,
                                                    admitted_first_step: list[int]) -> None:
    sched = make_scheduler([full_class(1_000)], pages * F5_PAGE_BYTES, 16)
    result = run_to_completion(sched, [Request(i, 17, 1) for i in range(3)])
    assert [r for r, s in result.admitted_at.items() if s == 0] == admitted_first_step
    assert sorted(result.admitted_at) == [0, 1, 2]


def test_f5_window_pages_of_a_seventeen_token_extend() -> None:
    layout = plan_layout([full_class(1_000), window_class(1_000, 128)], 100 * F5_PAGE_BYTES,
                         16)
    kv = KVManager(Chain(layout))
    assert request_demand(kv.geom, NOTHING_HELD, 0, 17) == Demand((2, 2))
    snap = kv.chain.snapshot()
    assert kv.allocate([(0, 17)]) == Demand((2, 2))
    after = kv.chain.snapshot()
    assert [b.live - a.live for a, b in zip(snap.bands, after.bands, strict=True)] == [2, 2]


def test_f5_chunk_cut_to_what_the_planner_fits() -> None:
    # Window band with 32 free pages (512 tokens), full band with 32 holes, no gap:
    # the (5000, 8) prefill's next chunk is cut from min(C, rest) = 904 to 512 tokens.
    classes = [full_class(1_000), window_class(1_000, 128)]
    sched = make_scheduler(classes, 761 * F5_PAGE_BYTES, 16,
                           config=SchedulerConfig(chunk_size=4_096))
    kv = sched.kv
    driver = FixedStepDriver(1.0)
    sched.add(Request(0, 5_000, 8), 0.0)
    batch = sched.step(0.0)
    assert [(p.rid, p.tokens) for p in batch.prefills] == [(0, 4_096)]
    sched.complete(batch, driver.run(batch), 1.0)
    kv.allocate([(102, 32 * 16)])
    kv.allocate([(101, 216 * 16)])
    kv.free(102)
    snap = kv.chain.snapshot()
    window = band_index(kv.chain.layout, LifetimeClass.WINDOW)
    full = band_index(kv.chain.layout, LifetimeClass.FULL)
    assert snap.bands[window].holes == 32 and snap.bands[full].holes == 32
    assert snap.bands[full].lo == snap.bands[window].hi  # no gap
    assert price(snap, kv.demand(0, 512)).fits
    assert not price(snap, kv.demand(0, 512 + 16)).fits
    batch = sched.step(1.0)
    assert [(p.rid, p.start, p.tokens) for p in batch.prefills] == [(0, 4_096, 512)]
    sched.complete(batch, driver.run(batch), 2.0)
    sched.audit()
    kv.free(101)
    result = run_to_completion(sched, driver=driver, start_s=2.0)
    assert result.kinds(EventKind.FINISHED) == [0]
    assert sched.counters.divergences == 0


def test_f5_waiting_request_first_chunk_is_the_largest_that_fits() -> None:
    classes = [full_class(1_000), window_class(1_000, 128)]
    sched = make_scheduler(classes, 60 * F5_PAGE_BYTES, 16)
    sched.kv.allocate([(100, 208)])  # another holder: 13 full + 13 window pages
    assert sched.chain.snapshot().free_bytes == 33 * F5_PAGE_BYTES
    assert sched.add(Request(0, 256, 2), 0.0)
    step = sched.schedule(0.0)
    assert [(p.rid, p.tokens) for p in step.prefills] == [(0, 256)]


# --- F6 --------------------------------------------------------------------------------

F6_E_FULL = 81_920
F6_E_WIN = 425_984
F6_W = 1_024
F6_C = 8_192
F6_BUFFER = 110_000 * F6_E_FULL + (F6_W + F6_C + 2 * 16) * F6_E_WIN
F6_CLASSES = (full_class(F6_E_FULL), window_class(F6_E_WIN, F6_W))


def _f6_scheduler() -> Scheduler:
    return make_scheduler(F6_CLASSES, F6_BUFFER, 16, config=SchedulerConfig(chunk_size=F6_C))


def test_f6_window_demand_capped_by_window_plus_chunk() -> None:
    sched = _f6_scheduler()
    assert F6_BUFFER == 12_950_700_032
    assert sched.kv.geom.windows[0].peak_pages(F6_C) == 577  # ceil((1024 - 1 + 8192) / 16) + 1
    # (W + C + 2P) window tokens = 578 pages; the null window page leaves exactly 577.
    result = run_to_completion(sched, [Request(0, 100_000, 16), Request(1, 1_000, 16)])
    layout = sched.chain.layout
    full = band_index(layout, LifetimeClass.FULL)
    window = band_index(layout, LifetimeClass.WINDOW)
    assert result.kinds(EventKind.FINISHED) == [0, 1]
    assert result.peak_pages[0][full] == 6_251
    assert result.peak_pages[0][window] <= 577
    assert result.peak_pages[1][full] == math.ceil((1_000 + 16 - 1) / 16)
    assert sched.counters.retractions == 0


def test_f6_never_fitting_request_rejected_without_blocking() -> None:
    sched = _f6_scheduler()
    result = run_to_completion(sched, [Request(9, 200_000, 16), Request(0, 100_000, 16),
                                       Request(1, 1_000, 16)])
    rejected = [e for e in result.events if e.kind is EventKind.REJECTED]
    assert [e.rid for e in rejected] == [9]
    assert rejected[0].time_s == 0.0
    # Why: the bytes it needs at its peak - at least its 12,501 full pages
    # (16,385,310,720 B; 20,317,995,008 B today with 577 window pages) - and the bytes
    # of the empty chain: B minus the null window page (6,815,744 B).
    available = F6_BUFFER - 16 * F6_E_WIN
    assert f"the empty chain ({available:,} B free)" in rejected[0].detail
    needed = int(rejected[0].detail.split()[1].replace(",", ""))
    assert needed >= 12_501 * 16 * F6_E_FULL > available
    assert sched.requests[9].status is RequestStatus.REJECTED
    assert result.kinds(EventKind.FINISHED) == [0, 1]


# --- F7 --------------------------------------------------------------------------------

F7_E_WIN = 131_072
F7_CLASSES = (window_class(F7_E_WIN, 48),)
F7_BUFFER = 10 * 16 * F7_E_WIN  # 10 window pages, one of them the null page


def _check_f7(r1: Request, r2_arrives: int, r1_pages_then: int) -> None:
    sched = make_scheduler(F7_CLASSES, F7_BUFFER, 16)
    r2 = Request(1, 64, 8, arrival_s=1.0)
    seen: list[int] = []

    def before(step: int, s: Scheduler) -> None:
        if step == r2_arrives:
            seen.append(held_pages(s, 0)[0])

    result = run_to_completion(sched, [r1], arrivals=[(r2_arrives, r2)], before_step=before)
    assert sched.counters.rejected == 0
    assert seen == [r1_pages_then]
    assert result.peak_pages[1][0] <= math.ceil((48 - 1 + 64) / 16) + 1  # 8 pages
    assert sorted(result.kinds(EventKind.FINISHED)) == [0, 1]
    assert sched.counters.divergences == 0


def test_f7_all_layers_windowed_readme_scenario() -> None:
    _check_f7(Request(0, 100, 200), r2_arrives=1, r1_pages_then=4)


def test_f7_all_layers_windowed_second_request_within_its_peak() -> None:
    # R1 (40, 200) is accepted (its later window peak is 6 pages); when R2 arrives R1 is at
    # 70 tokens and holds 4 window pages (tokens [23, 70) -> pages 1..4).
    _check_f7(Request(0, 40, 200), r2_arrives=30, r1_pages_then=4)


# --- F8 --------------------------------------------------------------------------------

F8_SLOT = 8_716_288
F8_E_FULL = 16_384
F8_BUFFER = 10 * F8_SLOT + 15_520 * F8_E_FULL
F8_CLASSES = (full_class(F8_E_FULL), state_class(F8_SLOT))


def test_f8_token_capacity_with_ten_slots() -> None:
    layout = plan_layout(F8_CLASSES, F8_BUFFER, 16)
    assert layout.reserved_bytes == 0  # full and state bands reserve no page
    chain = Chain(layout)
    chain.take(Demand((10, 0)))  # state LOW END = band 0
    pages = max_units(chain.snapshot(), Demand((0, 1)))
    assert pages * 16 == 15_520
    assert pages * 16 != 15_520 // 2  # never divided by the number of classes


def test_f8_ten_requests_run_concurrently() -> None:
    sched = make_scheduler(F8_CLASSES, F8_BUFFER, 16)
    result = run_to_completion(sched, [Request(i, 1_400, 50) for i in range(10)])
    assert result.max_running == 10
    assert all(result.peak_pages[i] == [1, 91] for i in range(10))
    assert sched.counters.retractions == 0
    assert len(result.kinds(EventKind.FINISHED)) == 10


# --- F9 --------------------------------------------------------------------------------

F9_CLASSES = (window_class(1_000, 32),)
F9_PAGE_BYTES = 32 * 1_000


def test_f9_window_straddling_two_pages() -> None:
    assert min_window_pages(32, 32) == 2
    with pytest.raises(BufferTooSmallError) as info:
        plan_layout(F9_CLASSES, 3 * F9_PAGE_BYTES - 1, 32)
    assert info.value.needed_bytes == 3 * F9_PAGE_BYTES  # 2 pages + the null page
    sched = make_scheduler(F9_CLASSES, 3 * F9_PAGE_BYTES, 32)
    tables: dict[int, list[int]] = {}

    def after(step: int, s: Scheduler, batch: StepBatch) -> None:
        for d in batch.decodes:
            if d.rid in s.kv:
                tables[d.context] = s.kv.page_table(d.rid, 0).tolist()

    null = sched.chain.null_page(0)
    result = run_to_completion(sched, [Request(0, 30, 10)], after_step=after)
    assert result.kinds(EventKind.FINISHED) == [0]
    assert result.peak_pages[0] == [2]
    # The decode at length 32 (token 32) reads the window [1, 32]: pages 0 and 1.
    assert len(tables[32]) == 2 and null not in tables[32]


# --- F10 -------------------------------------------------------------------------------

F10_SLOT = 50_000_000
F10_E_FULL = 32_000
F10_BUFFER = 40_000_000_000
F10_CLASSES = (full_class(F10_E_FULL), state_class(F10_SLOT))


def test_f10_capacity_with_64_slots() -> None:
    layout = plan_layout(F10_CLASSES, F10_BUFFER, 16)
    assert layout.reserved_bytes == 0  # no null pages in full or state bands
    chain = Chain(layout)
    chain.take(Demand((64, 0)))
    tokens = max_units(chain.snapshot(), Demand((0, 1))) * 16
    assert tokens == (40_000_000_000 - 64 * 50_000_000) // 32_000 == 1_150_000


def test_f10_sixty_four_requests_run_concurrently() -> None:
    config = SchedulerConfig(max_prefill_tokens=64 * 17_000)
    sched = make_scheduler(F10_CLASSES, F10_BUFFER, 16, config=config)
    result = run_to_completion(sched, [Request(i, 17_000, 100) for i in range(64)])
    assert result.max_running == 64
    assert all(result.peak_pages[i] == [1, math.ceil(17_099 / 16)] for i in range(64))
    assert sched.counters.retractions == 0
    assert len(result.kinds(EventKind.FINISHED)) == 64


# --- F11 -------------------------------------------------------------------------------

F11_CLASSES = (full_class(32), window_class(32, 128), state_class(48))


def _f11_chain(null_pages: bool = True) -> Chain:
    layout = plan_layout(F11_CLASSES, 6_784, 1, null_pages=null_pages)
    assert layout.shape_name == "state|window|full"
    chain = Chain(layout)
    chain.take(Demand((41, 0, 0)))
    assert chain.snapshot().bands[0].hi == 1_968  # off the 32-byte grid
    return chain


def test_f11_capacity_query() -> None:
    # byte bound (6,784 - 41 x 48) / 64 = 75.25; the grid gives 75 without null pages and
    # 74 with the window band's null page (it takes one window page of the float).
    assert (6_784 - 41 * 48) / 64 == 75.25
    assert max_units(_f11_chain(null_pages=False).snapshot(), Demand((0, 1, 1))) == 75
    chain = _f11_chain()
    assert max_units(chain.snapshot(), Demand((0, 1, 1))) == 74
    # A new request also claims its own slot: 42 slots end at 2,016 B (= 63 x 32).
    assert max_units(chain.snapshot(), Demand((0, 1, 1)), Demand((1, 0, 0))) == 74


def test_f11_admission_capacity_and_allocator_agree() -> None:
    chain = _f11_chain()
    kv = KVManager(chain)
    rules = AdmissionRules.for_layout(chain.layout)
    snap = chain.snapshot()
    capacity = max_units(snap, Demand((0, 1, 1)), Demand((1, 0, 0)))
    for tokens in range(60, 91):
        demand = request_demand(kv.geom, NOTHING_HELD, 0, tokens)
        assert demand == Demand((1, tokens, tokens))
        budget = ChainPrefillBudget(snap, rules)
        assert budget.fits(demand) == price(snap, demand).fits == (tokens <= capacity)
    # (85, 5): 85 + ceil(4 x 0.7) = 88 tokens with headroom; refused with a byte proof.
    demand = request_demand(kv.geom, NOTHING_HELD, 0, 85, NewTokenRatio().tokens(4))
    assert demand == Demand((1, 88, 88))
    quote = price(snap, demand)
    assert not quote.fits and quote.reason is RefusalReason.BYTES
    with pytest.raises(CapacityError):
        kv.allocate([(0, 85)])
    assert chain.snapshot() == snap
    kv.allocate([(1, capacity)])
    assert kv.held(1) == HeldPages.counts(kv.geom, full=capacity, windows=((0, capacity),),
                                          slots=1)


@pytest.mark.parametrize(("prompt", "admitted"), [(85, False), (70, True)])
def test_f11_scheduler_refuses_or_runs_with_41_slots_held(prompt: int, admitted: bool) -> None:
    chain = _f11_chain()
    sched = Scheduler(KVManager(chain))
    result = run_to_completion(sched, [Request(0, prompt, 5)], external=Demand((41, 0, 0)),
                               allow_stall=True)
    assert sched.counters.divergences == 0
    if admitted:
        # 70 + 5 - 1 = 74 tokens at its last decode: exactly the capacity.
        assert result.kinds(EventKind.FINISHED) == [0]
        assert result.peak_pages[0] == [1, 74, 74]
        assert sched.counters.retractions == 0
    else:
        assert result.stalled and result.steps == 0
        assert sched.requests[0].status is RequestStatus.WAITING
        assert 0 not in sched.kv


# --- F12 -------------------------------------------------------------------------------

F12_CLASSES = (full_class(1_000), window_class(1_000, 128))
F12_PAGE_BYTES = 16 * 1_000
F12_FLOOR = 0.7 * 0.14  # SGLang's default floor, the NewTokenRatio default
# 8 running x (64 full + 8 window) + 1 null + 8 x (7 full + 1 window) reserved + the
# (16, 2) prefill's 2 full + 2 window pages.
F12_EXACT_PAGES = 8 * (64 + 8) + 1 + 8 * (7 + 1) + 4


class RecordingBudget(ChainPrefillBudget):
    """The scheduler's budget, recording every reservation (a spy for F12)."""

    instances: ClassVar[list[RecordingBudget]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reservations: list[Demand] = []
        RecordingBudget.instances.append(self)

    def reserve(self, demand: Demand) -> None:
        self.reservations.append(demand)
        super().reserve(demand)


def _f12_scheduler(pages: int) -> Scheduler:
    sched = make_scheduler(F12_CLASSES, pages * F12_PAGE_BYTES, 16,
                           ratio=NewTokenRatio(value=F12_FLOOR))
    for rid in range(8):
        seed_running(sched, rid, 1_024, 1_001)  # 1,000 output tokens left
        assert held_pages(sched, rid) == [8, 64]  # window band 0, full band 1
    return sched


def test_f12_decode_headroom_includes_window_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    RecordingBudget.instances.clear()
    monkeypatch.setattr(scheduler_module, "ChainPrefillBudget", RecordingBudget)
    sched = _f12_scheduler(F12_EXACT_PAGES)
    assert sched.ratio.tokens(1_000 - 1) == 98  # ceil(999 x 0.098)
    sched.add(Request(8, 16, 2, arrival_s=1.0), 0.0)
    RecordingBudget.instances.clear()  # add() judged never-fits with its own budget
    driver = FixedStepDriver(1.0)
    batch = sched.step(0.0)
    budget = RecordingBudget.instances[0]
    # This step's decodes: the token at 1,024 opens full page 64 and window page 64.
    assert budget.reservations[0] == Demand((8, 8))
    # Each one's future: ceil((1,025 + 98) / 16) - 65 = 6 full pages; window: it holds 8
    # pages and grows to 9 until its next tail release, which this step's page covers.
    assert budget.reservations[1] == Demand((0, 6 * 8))  # the eight futures, summed
    assert budget.reservations[2] == Demand((2, 2))  # the admitted (16, 2)
    assert budget.reserved == Demand((8 + 2, 8 * 7 + 2))
    assert [(p.rid, p.tokens) for p in batch.prefills] == [(8, 16)]
    sched.complete(batch, driver.run(batch), 1.0)
    batch = sched.step(1.0)  # the next decode step
    assert sched.counters.retractions == 0
    assert {d.rid for d in batch.decodes} == set(range(9))


def test_f12_one_page_less_and_the_prefill_waits() -> None:
    sched = _f12_scheduler(F12_EXACT_PAGES - 1)
    sched.add(Request(8, 16, 2, arrival_s=1.0), 0.0)
    batch = sched.step(0.0)
    assert batch.prefills == ()
    assert sched.requests[8].status is RequestStatus.WAITING


def test_f12_run_to_the_end_never_retracts_after_an_admission() -> None:
    sched = _f12_scheduler(F12_EXACT_PAGES)
    result = run_to_completion(sched, [Request(8, 16, 2, arrival_s=1.0)])
    assert result.admitted_at[8] == 0
    assert len(result.kinds(EventKind.FINISHED)) == 9
    # The floor ratio reserves 98 of 1,000 tokens: the eight outgrow the buffer and are
    # retracted later (latest arrival first), never in a step right after an admission.
    assert sched.counters.retractions > 0


# --- F13 -------------------------------------------------------------------------------

F13_CLASSES = (full_class(2), window_class(2, 16))  # 32-byte pages at P = 16


def _f13_scheduler(buffer_bytes: int = 6_400, config: SchedulerConfig | None = None
                   ) -> Scheduler:
    layout = plan_layout(F13_CLASSES, buffer_bytes, 16)
    return Scheduler(KVManager(Chain(layout)), config)


def test_f13_gate_close_waits_for_the_admitted_allocation() -> None:
    sched = _f13_scheduler()
    kv = sched.kv
    # 40 full holes and 80 window holes inside the spans, a 1-page gap.
    kv.allocate([(100, 41 * 16)])
    kv.allocate([(101, 40 * 16)])
    kv.allocate([(102, 18 * 16)])
    kv.commit(100, 41 * 16)
    kv.free(101)
    snap = kv.chain.snapshot()
    assert [(b.label, b.live, b.holes) for b in snap.bands] == [("window", 20, 80),
                                                               ("full", 59, 40)]
    assert snap.bands[1].lo - snap.bands[0].hi == 32
    sched.add(Request(0, 800, 1), 0.0)  # 50 full + 50 window pages: needs compaction
    assert price(snap, Demand((50, 50))).needs_moves
    step = sched.schedule(0.0)
    assert [(p.rid, p.tokens) for p in step.prefills] == [(0, 800)]
    gate = kv.chain.set_move_gate(False)  # a KV transfer starts
    assert gate.open and gate.close_pending
    sched.allocate(step, 0.0)
    assert not kv.chain.gate.open
    # one compaction in the admitted plan, one as the deferred close realizes moves
    assert kv.chain.stats.compactions == 2
    assert kv.held(0).span(kv.geom.full)[1] == 50 == kv.held(0).span(kv.geom.window)[1]
    assert sched.counters.divergences == 0
    sched.audit()


def test_f13_gate_closed_before_admission_defers_the_request() -> None:
    sched = _f13_scheduler()
    kv = sched.kv
    kv.allocate([(100, 41 * 16)])
    kv.allocate([(101, 40 * 16)])
    kv.allocate([(102, 18 * 16)])
    kv.commit(100, 41 * 16)
    kv.free(101)
    kv.chain.set_move_gate(False)
    sched.add(Request(0, 800, 1), 0.0)
    # Priced on a snapshot whose gate is closed: either the chain realized the moves
    # before closing and the request fits in place, or it waits for the gate to reopen;
    # it is never admitted and then refused.
    step = sched.schedule(0.0)
    batch = sched.allocate(step, 0.0)
    if not batch.prefills:
        assert sched.requests[0].status is RequestStatus.WAITING
        kv.chain.set_move_gate(True)
        batch = sched.step(1.0)
    assert [(p.rid, p.tokens) for p in batch.prefills] == [(0, 800)]
    assert kv.held(0).span(kv.geom.full)[1] == 50 == kv.held(0).span(kv.geom.window)[1]
    assert sched.counters.divergences == 0
    sched.audit()


def test_f13_decode_only_step_survives_a_gate_close() -> None:
    sched = _f13_scheduler(6_368)  # 199 pages of 32 B
    kv = sched.kv
    driver = FixedStepDriver(1.0)
    sched.add(Request(0, 16, 5), 0.0)
    batch = sched.step(0.0)
    sched.complete(batch, driver.run(batch), 1.0)
    kv.allocate([(100, 60 * 16)])
    kv.allocate([(101, 38 * 16)])
    kv.commit(100, 60 * 16)  # 59 window holes; full band has no hole and no gap is left
    snap = kv.chain.snapshot()
    assert snap.bands[1].lo == snap.bands[0].hi and snap.bands[1].holes == 0
    assert price(snap, kv.demand(0, 1)).needs_moves
    step = sched.schedule(1.0)
    kv.chain.set_move_gate(False)
    sched.allocate(step, 1.0)
    assert sched.counters.divergences == 0


def test_f13_running_prefill_survives_a_gate_close() -> None:
    sched = _f13_scheduler(6_400, SchedulerConfig(chunk_size=160))
    kv = sched.kv
    driver = FixedStepDriver(1.0)
    sched.add(Request(0, 1_600, 200), 0.0)
    batch = sched.step(0.0)
    sched.complete(batch, driver.run(batch), 1.0)
    kv.allocate([(100, 94 * 16)])
    kv.commit(100, 94 * 16)  # 93 window holes, no gap
    snap = kv.chain.snapshot()
    assert snap.bands[1].lo == snap.bands[0].hi
    assert price(snap, kv.demand(0, 160)).needs_moves
    step = sched.schedule(1.0)
    assert [(p.rid, p.tokens) for p in step.prefills] == [(0, 160)]
    kv.chain.set_move_gate(False)
    sched.allocate(step, 1.0)
    assert sched.counters.divergences == 0


def test_f13_gate_closing_after_admission_does_not_retract() -> None:
    sched = _f13_scheduler(6_400)
    kv = sched.kv
    kv.allocate([(100, 60 * 16)])
    kv.allocate([(101, 39 * 16)])
    kv.commit(100, 60 * 16)  # 59 window holes, a 1-page gap, no full hole
    driver = FixedStepDriver(1.0)
    sched.add(Request(0, 16, 3), 0.0)
    step = sched.schedule(0.0)
    assert [(p.rid, p.tokens) for p in step.prefills] == [(0, 16)]
    batch = sched.allocate(step, 0.0)
    sched.complete(batch, driver.run(batch), 1.0)
    assert price(kv.chain.snapshot(), kv.demand(0, 1)).needs_moves
    kv.chain.set_move_gate(False)  # a KV transfer starts between the two steps
    batch = sched.step(1.0)
    assert sched.counters.retractions == 0
    assert [d.rid for d in batch.decodes] == [0]
