"""Block tables (``KVManager.block_table``) and the vectorized decode path against the
per-request path: hand-derived tables for a tiny case, then seeded streams of prefill
chunks, decodes, arrivals and finishes on every chain shape, checked after every step,
each check with a sibling where a planted defect makes it fail."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError, UnknownPageError, UnknownRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager

SHAPES = {
    "full": [declared_class(LC.FULL, 1_024)],
    "window|full": [declared_class(LC.WINDOW, 1_024, 10), declared_class(LC.FULL, 1_024)],
    "local|full": [declared_class(LC.LOCAL, 1_024, 8), declared_class(LC.FULL, 1_024)],
    "state|full": [declared_class(LC.STATE, 50_000), declared_class(LC.FULL, 1_024)],
    "state|window|full": [declared_class(LC.STATE, 50_000), declared_class(LC.WINDOW, 512, 6),
                          declared_class(LC.FULL, 1_024)],
    "two windows": [declared_class(LC.FULL, 1_024), declared_class(LC.WINDOW, 1_024, 4),
                    declared_class(LC.WINDOW, 1_024, 13)],
}


def _manager(shape: str) -> KVManager:
    return KVManager(Chain(plan_layout(SHAPES[shape], 200_000_000, 4)))


# --- a tiny case by hand -----------------------------------------------------------------


def test_block_tables_of_two_requests_by_hand() -> None:
    kv = _manager("window|full")
    g = kv.geom
    full, window = g.full, g.window
    assert full is not None and window is not None
    # P = 4, W = 10. Request 0 computes 9 tokens, request 1 computes 3 in one take: full
    # ceil(9 / 4) = 3 and 1 pages, window 3 and 1 pages (nothing released mid-chunk).
    kv.allocate([(0, 9), (1, 3)])
    kv.commit(0, 9)
    kv.commit(1, 3)
    # A band hands out its free ids lowest first (band.py: the free stack starts as
    # cap - 1 .. 0) in batch order; the window band's null page took id 0 at construction.
    null = kv.chain.null_page(window)
    assert null == 0
    # full: request 0 got ids 0, 1, 2 and request 1 id 3; the full band reserves no null
    # page, so the short row is padded with -1.
    assert kv.reads.block_table([0, 1], full, physical=False).tolist() == [[0, 1, 2], [3, -1, -1]]
    # window: request 0 got 1, 2, 3 and request 1 got 4. After 9 tokens the next token's
    # window starts at 9 - 10 + 1 = 0: page 0 is kept. Request 1 holds page 0 only.
    assert kv.reads.block_table([0, 1], window, physical=False).tolist() == [[1, 2, 3],
                                                                      [4, null, null]]
    # four decodes of request 0 (positions 9 .. 12): the one at 12 needs a 4th page in
    # both bands (full id 4, window id 5, the lowest free); after it the next token's
    # window starts at 13 - 10 + 1 = 4, so page 0 (window id 1) goes back and its entry
    # becomes the null page. Only that last commit releases anything.
    released = []
    for _ in range(4):
        kv.allocate([(0, 1)], kv.decode_demands([0]))
        released.append(kv.commit_decodes([0]))
    assert released == [0, 0, 0, 1]
    assert kv.reads.block_table([1, 0], window, physical=False).tolist() == [[4, null, null, null],
                                                                      [null, 2, 3, 5]]
    assert kv.reads.block_table([0, 1], full, physical=False).tolist() == [[0, 1, 2, 4],
                                                                    [3, -1, -1, -1]]
    # physical ids: the allocator's translate of the virtual ones, pads kept
    virt = kv.reads.block_table([0, 1], full, physical=False)
    phys = kv.reads.block_table([0, 1], full)
    assert phys.dtype == np.int64 and phys.shape == (2, 4)
    assert phys[1, 1:].tolist() == [-1, -1, -1]
    assert phys[virt >= 0].tolist() == kv.chain.translate(full, virt[virt >= 0]).tolist()
    virt_window = kv.reads.block_table([0, 1], window, physical=False)
    assert (kv.reads.block_table([0, 1], window)
            == kv.chain.translate(window, virt_window)).all()
    assert kv.reads.block_table([], full).shape == (0, 0)
    # pages held per band from the arrays: full 4 + 1; window 3 (pages 1-3 of request 0,
    # page 0 released) + 1; an unknown id (7) counts nothing, and no ids is all zeros
    counts = [0, 0]
    counts[full], counts[window] = 5, 4
    assert kv.reads.held_per_band([0, 1, 7]) == tuple(counts)
    counts[full], counts[window] = 4, 3
    assert kv.reads.held_per_band([0]) == tuple(counts)
    assert kv.reads.held_per_band([]) == (0, 0)


def test_block_table_refuses_unknown_requests_and_bands() -> None:
    kv = _manager("window|full")
    kv.allocate([(0, 5)])
    with pytest.raises(UnknownRequestError):
        kv.reads.block_table([0, 7], 0)
    with pytest.raises(InvalidDemandError):
        kv.reads.block_table([0], 2)
    with pytest.raises(InvalidDemandError):
        kv.reads.block_table([0], True)


def test_rows_are_cleared_and_slots_reused_after_free() -> None:
    kv = _manager("full")
    kv.allocate([(0, 12)])  # 3 pages
    kv.free(0)
    kv.allocate([(1, 4)])  # 1 page, the freed slot again: no stale columns
    assert kv.reads.block_table([1], 0, physical=False).shape == (1, 1)


def test_many_requests_grow_slots_and_columns() -> None:
    kv = _manager("full")
    kv.allocate([(rid, 4 * (rid + 1)) for rid in range(100)])  # > 64 slots, > 16 columns
    table = kv.reads.block_table(list(range(100)), 0, physical=False)
    assert table.shape == (100, 100)  # request 99 holds 100 pages
    for rid in (0, 63, 64, 99):
        assert table[rid, :rid + 1].tolist() == kv.page_table(rid, 0).tolist()
        assert (table[rid, rid + 1:] == -1).all()


# --- seeded streams: vectorized path == per-request path, tables == page_table ------------


def table_mismatches(kv: KVManager) -> list[str]:
    """Every request's block-table row against its page table, in every band: the row
    starts with ``translate(page_table)`` and is padded beyond (empty list: all agree)."""
    rids = sorted(kv._requests)
    out = []
    for band in range(kv.geom.num_bands):
        virt = kv.reads.block_table(rids, band, physical=False)
        try:
            table = kv.reads.block_table(rids, band)
        except UnknownPageError as exc:  # a released (unbound) id left in a row
            out.append(f"band {band}: {exc}")
            continue
        pad = kv._table.pads[band]
        for i, rid in enumerate(rids):
            pt = kv.page_table(rid, band)
            want = kv.chain.translate(band, pt).tolist() if pt.size else []
            row, vrow = table[i].tolist(), virt[i].tolist()
            if row[:len(want)] != want or vrow[:len(pt)] != pt.tolist():
                out.append(f"band {band} request {rid}: {vrow} vs page table {pt.tolist()}")
            if any(v != pad for v in vrow[len(pt):]):
                out.append(f"band {band} request {rid}: padding {vrow[len(pt):]}")
    return out


def step_mismatches(vec: KVManager, ref: KVManager, rng: random.Random,
                    live: dict[int, int], next_rid: list[int]) -> list[str]:
    """One step of a random stream on both managers: arrivals, prefill chunks (the rest of
    a prompt) and decodes in one allocation, then commits; ``vec`` through the batched
    decode path, ``ref`` request by request. Returns what differed (demands, grants, page
    tables translated to physical pages, chain snapshots)."""
    out: list[str] = []
    for _ in range(rng.choice((0, 0, 1, 2))):  # arrivals: prompt tokens still to compute
        live[next_rid[0]] = rng.randint(1, 30)
        next_rid[0] += 1
    prefills = [(rid, min(left, rng.randint(1, 12))) for rid, left in live.items() if left]
    decodes = [rid for rid, left in live.items() if not left]
    rng.shuffle(decodes)
    want = [ref.demand(rid, 1) for rid in decodes]
    got = vec.decode_demands(decodes)
    if list(got) != want:
        out.append(f"decode demands {list(got)} vs {want}")
    batch = prefills + [(rid, 1) for rid in decodes]
    pf = [ref.demand(rid, c) for rid, c in prefills]
    if prefills:  # as the scheduler: one list for prefill chunks and decodes
        g_vec = vec.allocate(batch, [*(vec.demand(rid, c) for rid, c in prefills), *got])
    else:  # decodes only: the decode path's own list
        g_vec = vec.allocate(batch, got)
    g_ref = ref.allocate(batch, [*pf, *want])
    if g_vec != g_ref:
        out.append(f"grants {g_vec} vs {g_ref}")
    released_ref = sum(ref.commit(rid, c) for rid, c in prefills)
    released_vec = sum(vec.commit(rid, c) for rid, c in prefills)
    released_ref += sum(ref.commit(rid, 1) for rid in decodes)
    released_vec += vec.commit_decodes(decodes)
    if released_vec != released_ref:
        out.append(f"released {released_vec} vs {released_ref}")
    for rid, c in prefills:
        live[rid] -= c
    for rid in list(live):
        if rid in vec and rng.random() < 0.08:  # finishes (or is retracted)
            vec.free(rid)
            ref.free(rid)
            del live[rid]
    for rid in sorted(live):
        if vec.held(rid) != ref.held(rid) or vec.tokens(rid) != ref.tokens(rid):
            out.append(f"request {rid}: {vec.held(rid)} vs {ref.held(rid)}")
        for band in range(ref.geom.num_bands):
            a = vec.chain.translate(band, vec.page_table(rid, band)).tolist()
            b = ref.chain.translate(band, ref.page_table(rid, band)).tolist()
            if a != b:
                out.append(f"request {rid} band {band}: pages {a} vs {b}")
    if vec.chain.snapshot() != ref.chain.snapshot():
        out.append("chain snapshots differ")
    return out + table_mismatches(vec)


def run_stream(shape: str, seed: int, steps: int) -> list[str]:
    """A seeded stream of ``steps`` steps on two managers (see :func:`step_mismatches`)."""
    vec, ref = _manager(shape), _manager(shape)
    rng = random.Random(seed)
    live: dict[int, int] = {}
    next_rid = [0]
    for _ in range(steps):
        bad = step_mismatches(vec, ref, rng, live, next_rid)
        if bad:
            return bad
        vec.audit()
    return []


@pytest.mark.parametrize("shape", list(SHAPES))
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 60))
def test_vectorized_path_equals_per_request_path(shape: str, seed: int, steps: int) -> None:
    assert run_stream(shape, seed, steps) == []


def test_a_planted_stale_row_is_caught() -> None:
    # Sibling of the table check: a release that forgets to put the null page in the row.
    kv = _manager("window|full")
    kv.allocate([(0, 9)])
    kv.commit(0, 9)
    assert table_mismatches(kv) == []
    window = kv.geom.window
    assert window is not None
    table = kv._table.tables[window]
    slot = kv.pages(0).slot
    kept = int(table[slot, 0])
    released = 0
    for _ in range(4):  # the 4th commit releases page 0 (see the hand-derived case)
        kv.allocate([(0, 1)], kv.decode_demands([0]))
        released += kv.commit_decodes([0])
    assert released == 1 and table_mismatches(kv) == []
    table[slot, 0] = kept  # the defect: the released id left in the row
    assert table_mismatches(kv) != []


def test_a_decode_batch_of_a_fresh_request_is_refused() -> None:
    """A decode extends a held row: ``decode_demands`` of an id that holds nothing is
    refused (a breaker found ``[99]`` built a plan that ``apply`` turned into a new
    request); its first token is a prefill chunk (``allocate``)."""
    for shape in SHAPES:
        kv = _manager(shape)
        before = kv.chain.snapshot()
        for rids in ([3], [3, 3]):
            with pytest.raises(UnknownRequestError, match="request 3 holds no pages"):
                kv.decode_demands(rids)
        assert 3 not in kv and kv.chain.snapshot() == before
        # by hand: 1 page in each token band, the state band's slots (1 here)
        ref = _manager(shape)
        assert kv.allocate([(3, 1)]) == ref.allocate([(3, 1)]) == Demand(
            tuple(1 for _ in range(kv.geom.num_bands)))
        assert kv.held(3) == ref.held(3) and table_mismatches(kv) == []
        assert kv.commit_decodes([3]) == ref.commit(3, 1) == 0
        assert kv.tokens(3) == 1 and table_mismatches(kv) == []


def test_block_tables_follow_the_prefix_cache_paths() -> None:
    # With a prefix cache the decode path runs per request; attach (a hit's shared pages),
    # kept window tails, checkpoints and inserts on free change the lists outside the
    # vectorized path: the rows must follow (read again from the lists) after every step.
    from kvchain.cache.keys import page_keys_from_tokens
    from kvchain.cache.radix import CacheGeometry, PrefixCache
    from kvchain.sched.request import Request, StepOutcome
    from kvchain.sched.scheduler import Scheduler, SchedulerConfig

    layout = plan_layout(SHAPES["window|full"], 200_000_000, 4)
    kv = KVManager(Chain(layout), PrefixCache(CacheGeometry.of(layout), interval_tokens=8))
    sched = Scheduler(kv, SchedulerConfig(max_prefill_tokens=24, chunk_size=12))
    rng = random.Random(7)
    now, hits = 0.0, 0
    for rid in range(12):  # prompts sharing a 16-token prefix, then their own tokens
        prompt = list(range(16)) + [1_000 * rid + i for i in range(rng.randint(1, 20))]
        sched.add(Request(rid, len(prompt), rng.randint(1, 12), now,
                          page_keys=page_keys_from_tokens(prompt, 4)), now)
        for _ in range(3):
            batch = sched.step(now)
            now += 1.0
            sched.complete(batch, StepOutcome(1.0), now)
            sched.audit()
            assert table_mismatches(kv) == []
            hits = max(hits, max((kv.hit_tokens(r) for r in kv._requests), default=0))
    while not sched.idle:
        batch = sched.step(now)
        now += 1.0
        sched.complete(batch, StepOutcome(1.0), now)
        assert table_mismatches(kv) == []
    assert hits >= 16  # the shared prefix was served from the cache at least once


@pytest.mark.parametrize("cached", [False, True])
def test_commit_decodes_rejects_a_bad_batch_before_any_change(cached: bool) -> None:
    # commit_decodes promises every request is checked before any change, on the
    # vectorized path, the one-by-one path of a batch naming a request twice, and the
    # per-request path a prefix cache takes. P = 4: request 0 holds 9 tokens on
    # ceil(9 / 4) = 3 full pages (room for 12), request 2 holds 4 tokens on 1 page (full).
    from kvchain.cache.radix import CacheGeometry, PrefixCache

    layout = plan_layout(SHAPES["window|full"], 200_000_000, 4)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=8) if cached else None
    kv = KVManager(Chain(layout), cache)
    kv.allocate([(0, 9), (2, 4)])
    kv.commit(0, 9)
    kv.commit(2, 4)
    before = kv.reads.block_table([0, 2], kv.geom.full, physical=False).tolist()
    with pytest.raises(InvalidDemandError):  # request 2's 5th token has no page
        kv.commit_decodes([0, 2])
    with pytest.raises(UnknownRequestError):  # request 77 holds nothing
        kv.commit_decodes([0, 77])
    with pytest.raises(InvalidDemandError):  # 9 + 4 = 13 tokens > 12 covered
        kv.commit_decodes([0, 0, 0, 0])
    assert (kv.tokens(0), kv.tokens(2)) == (9, 4)
    assert kv.reads.block_table([0, 2], kv.geom.full, physical=False).tolist() == before
    kv.audit()
    # a batch naming request 0 three times (9 + 3 = 12 would fit) is refused as allocate
    # refuses it: one token per request (it used to commit 3; found by a breaker)
    with pytest.raises(InvalidDemandError, match="request 0 appears twice"):
        kv.commit_decodes([0, 0, 0])
    assert (kv.tokens(0), kv.tokens(2)) == (9, 4)
    # the sibling: the same 3 tokens, one per batch, commit
    for _ in range(3):
        kv.commit_decodes([0])
    assert kv.tokens(0) == 12


def test_bool_request_ids_do_not_alias_requests_0_and_1() -> None:
    # True == 1 and False == 0 as dict keys: before the check, block_table([True]) returned
    # request 1's row and commit_decodes([True]) committed a token to request 1.
    kv = _manager("window|full")
    full = kv.geom.full
    assert full is not None
    kv.allocate([(0, 9), (1, 3)])
    kv.commit(0, 9)
    kv.commit(1, 3)
    assert kv.reads.block_table([1], full, physical=False).tolist() == [[3]]  # warms the memo
    for call in (lambda: kv.reads.block_table([True], full), lambda: kv.decode_demands([False]),
                 lambda: kv.commit_decodes([True]), lambda: kv.reads.block_table([0, False], full)):
        with pytest.raises(InvalidDemandError, match="request ids are ints"):
            call()
    assert (kv.tokens(0), kv.tokens(1)) == (9, 3)
    # the sibling: numpy ints are ids like Python ints
    assert kv.reads.block_table([np.int64(1)], full, physical=False).tolist() == [[3]]
