"""Stateful fuzzing of the chain: takes, releases, gates, fences, idle flushes.

Every step runs through :class:`ChainRecorder`, which checks price == outcome on every take
(after a take ``snapshot() == quote.after``; a refusal changes nothing) and audits the
chain after every operation. The CI profile is small; the ``slow`` profile (``pytest -m
slow``) runs more than 200,000 operations over every shape and page size, and 216,000
more with host offload / load-back / host eviction.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvchain.testing.geometry import N_BAND_SHAPES, SHAPES, ChainGeometry, shape_geometry
from kvchain.testing.streams import (
    CacheInsertOp,
    CacheLockOp,
    CacheUnlockOp,
    ChainRecorder,
    FenceCompleteOp,
    FenceHoldOp,
    FlushOp,
    GateOp,
    HostEvictOp,
    HostLoadOp,
    HostOffloadOp,
    generate_stream,
    host_slots_for,
)

MACHINE_GEOMETRIES: tuple[ChainGeometry, ...] = tuple(
    shape_geometry(shape, p, mixed=mixed, pages=40)
    for shape in SHAPES for p in (1, 4, 16) for mixed in (False, True)) + tuple(
    # Chains of two and three floats (4 and 5 bands), window + local on one float.
    shape_geometry(shape, p, mixed=mixed, pages=48)
    for shape in N_BAND_SHAPES for p in (1, 4) for mixed in (False, True))


class ChainMachine(RuleBasedStateMachine):
    """Random operations on one chain; the recorder checks and audits each."""

    rec: ChainRecorder

    @initialize(geometry=st.sampled_from(MACHINE_GEOMETRIES))
    def start(self, geometry: ChainGeometry) -> None:
        self.rec = ChainRecorder(geometry.chain())

    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        nb = self.rec.chain.num_bands
        pages = data.draw(st.tuples(*[st.integers(0, 5)] * nb))
        self.rec.take(pages)

    @precondition(lambda self: any(self.rec.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        band = data.draw(st.sampled_from([i for i, h in enumerate(self.rec.held) if h]))
        vids = data.draw(st.lists(st.sampled_from(self.rec.held[band]), min_size=1,
                                  max_size=6, unique=True))
        self.rec.release(band, vids)

    @rule(open_=st.booleans())
    def gate(self, open_: bool) -> None:
        self.rec.run(GateOp(open_))

    @rule()
    def fence_hold(self) -> None:
        self.rec.run(FenceHoldOp())

    @rule()
    def fence_complete(self) -> None:
        self.rec.run(FenceCompleteOp())

    @rule()
    def flush_idle(self) -> None:
        self.rec.run(FlushOp())

    @invariant()
    def checked(self) -> None:
        if hasattr(self, "rec"):
            assert self.rec.counts.divergences == 0, self.rec.counts.messages
            assert self.rec.counts.violations == 0, self.rec.counts.messages
            self.rec.chain.audit()


ChainMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestChainMachine = ChainMachine.TestCase


class CachedChainMachine(ChainMachine):
    """The same operations plus a prefix cache: held pages become cached units, units are
    locked and unlocked, and every take may evict; the recorder also checks that every
    bound page is owned exactly once (request, cache or null page)."""

    @precondition(lambda self: any(self.rec.held))
    @rule(data=st.data())
    def cache_insert(self, data: st.DataObject) -> None:
        pages = []
        for held in self.rec.held:
            chosen = data.draw(st.lists(st.sampled_from(held), max_size=4, unique=True)) \
                if held else []
            pages.append(tuple(chosen))
        if any(pages):
            self.rec.run(CacheInsertOp(tuple(pages)))

    @precondition(lambda self: self.rec.cache is not None and bool(self.rec.cache.units))
    @rule(data=st.data())
    def cache_lock(self, data: st.DataObject) -> None:
        assert self.rec.cache is not None
        self.rec.run(CacheLockOp(data.draw(st.sampled_from(self.rec.cache.units)).uid))

    @precondition(lambda self: self.rec.cache is not None
                  and any(u.locks for u in self.rec.cache.units))
    @rule(data=st.data())
    def cache_unlock(self, data: st.DataObject) -> None:
        assert self.rec.cache is not None
        locked = [u for u in self.rec.cache.units if u.locks]
        self.rec.run(CacheUnlockOp(data.draw(st.sampled_from(locked)).uid))

    @invariant()
    def cache_consistent(self) -> None:
        if hasattr(self, "rec") and self.rec.cache is not None:
            self.rec.check_ownership()
            snap = self.rec.chain.snapshot()
            assert snap.evictable == self.rec.cache.eviction_order()


CachedChainMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCachedChainMachine = CachedChainMachine.TestCase


class HostChainMachine(ChainMachine):
    """The same operations plus a host store: held pages (state with the KV on a state
    chain) are offloaded to host entries, loaded back by priced takes, and evicted LRU;
    the recorder checks page ownership and the host store's audit after every step."""

    @initialize(geometry=st.sampled_from(MACHINE_GEOMETRIES))
    def start(self, geometry: ChainGeometry) -> None:
        chain = geometry.chain()
        self.rec = ChainRecorder(chain, host_slots=host_slots_for(chain))

    @precondition(lambda self: any(self.rec.held))
    @rule(data=st.data())
    def host_offload(self, data: st.DataObject) -> None:
        labels = [b.label for b in self.rec.chain.layout.bands]
        pages = []
        for held in self.rec.held:
            chosen = data.draw(st.lists(st.sampled_from(held), max_size=4, unique=True)) \
                if held else []
            pages.append(tuple(chosen))
        if "state" in labels and any(pages) and not pages[labels.index("state")]:
            state_held = self.rec.held[labels.index("state")]
            if not state_held:
                return  # KV alone never goes to host on a state chain
            pages[labels.index("state")] = (data.draw(st.sampled_from(state_held)),)
        if any(pages):
            self.rec.run(HostOffloadOp(tuple(pages)))

    @precondition(lambda self: self.rec.host is not None and bool(self.rec.host.entries))
    @rule(data=st.data())
    def host_load(self, data: st.DataObject) -> None:
        assert self.rec.host is not None
        self.rec.run(HostLoadOp(data.draw(st.sampled_from(list(self.rec.host.entries)))))

    @rule()
    def host_evict(self) -> None:
        self.rec.run(HostEvictOp())


HostChainMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestHostChainMachine = HostChainMachine.TestCase


@pytest.mark.parametrize("shape", SHAPES + N_BAND_SHAPES)
def test_seeded_streams_with_a_host_store(shape: str) -> None:
    kinds: set[str] = set()
    for p in (1, 4, 16):
        rec = generate_stream(shape_geometry(shape, p, pages=160).chain(), 400, seed=p,
                              host=True, cache=p == 4)
        kinds |= {type(op).__name__ for op in rec.ops}
        assert rec.counts.decisions > 50
        assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages
    assert {"HostOffloadOp", "HostLoadOp"} <= kinds


@pytest.mark.parametrize("shape", SHAPES + N_BAND_SHAPES)
def test_seeded_streams_with_a_prefix_cache(shape: str) -> None:
    for p in (1, 4, 16):
        rec = generate_stream(shape_geometry(shape, p, pages=160).chain(), 400, seed=p,
                              cache=True)
        assert rec.cache is not None and rec.chain.stats.pages_evicted > 0
        assert rec.counts.decisions > 50
        assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages


@pytest.mark.parametrize("defect", ["short", "order"])
def test_planted_cache_defects_are_counted(defect: str) -> None:
    """A cache that hands back a page fewer (a leak) or publishes a wrong order (a wrong
    prediction) makes the recorder count divergences or violations, and the run goes on."""
    bad = 0
    for p in (1, 4):
        rec = generate_stream(shape_geometry("state|window|full", p, pages=160).chain(), 400,
                              seed=p, cache=True, cache_defect=defect)
        bad += rec.counts.divergences + rec.counts.violations
        assert rec.counts.operations >= 400
    assert bad > 0


@pytest.mark.parametrize("shape", SHAPES + N_BAND_SHAPES)
def test_seeded_streams_every_shape(shape: str) -> None:
    for p in (1, 4, 16):
        rec = generate_stream(shape_geometry(shape, p, pages=160).chain(), 300, seed=p)
        assert rec.counts.operations >= 300
        assert rec.counts.decisions > 50
        assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages


@pytest.mark.slow
def test_slow_profile_200k_operations() -> None:
    ops = decisions = divergences = violations = evicted = 0
    t0 = time.perf_counter()
    for shape in SHAPES + N_BAND_SHAPES:
        for p in (1, 4, 16):
            for mixed in (False, True):
                geometry = shape_geometry(shape, p, mixed=mixed, pages=256)
                for cache in (False, True):
                    rec = generate_stream(geometry.chain(), 7_000, seed=p * 2 + mixed,
                                          cache=cache)
                    ops += rec.counts.operations
                    decisions += rec.counts.decisions
                    divergences += rec.counts.divergences
                    violations += rec.counts.violations
                    evicted += rec.chain.stats.pages_evicted
    seconds = time.perf_counter() - t0
    print(f"\nslow profile: {ops:,} operations, {decisions:,} decisions, "
          f"{divergences} divergences, {violations} violations, {evicted:,} pages evicted, "
          f"{ops / seconds:,.0f} ops/s (streams, audit after every op)")
    t1 = time.perf_counter()
    run_state_machine_as_test(ChainMachine, settings=settings(
        max_examples=400, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    print(f"hypothesis machine: 400 runs x <= 60 steps in {time.perf_counter() - t1:.1f} s")
    t2 = time.perf_counter()
    run_state_machine_as_test(CachedChainMachine, settings=settings(
        max_examples=400, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    print(f"cached machine: 400 runs x <= 60 steps in {time.perf_counter() - t2:.1f} s")
    assert ops >= 400_000 and evicted > 0
    assert (divergences, violations) == (0, 0)


@pytest.mark.slow
def test_slow_profile_host_216k_operations() -> None:
    """9 shapes x 3 page sizes x 2 page-byte mixes x 2 (cache off/on) x 2,000 ops = 216,000
    operations with host offload / load-back / host eviction, audit after every op."""
    ops = decisions = divergences = violations = 0
    kinds: dict[str, int] = {}
    t0 = time.perf_counter()
    for shape in SHAPES + N_BAND_SHAPES:
        for p in (1, 4, 16):
            for mixed in (False, True):
                geometry = shape_geometry(shape, p, mixed=mixed, pages=256)
                for cache in (False, True):
                    rec = generate_stream(geometry.chain(), 2_000, seed=p * 2 + mixed,
                                          cache=cache, host=True)
                    ops += rec.counts.operations
                    decisions += rec.counts.decisions
                    divergences += rec.counts.divergences
                    violations += rec.counts.violations
                    for op in rec.ops:
                        kinds[type(op).__name__] = kinds.get(type(op).__name__, 0) + 1
    seconds = time.perf_counter() - t0
    print(f"\nhost slow profile: {ops:,} operations, {decisions:,} decisions, "
          f"{divergences} divergences, {violations} violations, "
          f"{kinds.get('HostOffloadOp', 0):,} offloads, {kinds.get('HostLoadOp', 0):,} "
          f"load-backs, {kinds.get('HostEvictOp', 0):,} host evictions, "
          f"{ops / seconds:,.0f} ops/s")
    t1 = time.perf_counter()
    run_state_machine_as_test(HostChainMachine, settings=settings(
        max_examples=300, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    print(f"host machine: 300 runs x <= 60 steps in {time.perf_counter() - t1:.1f} s")
    assert ops >= 200_000 and kinds.get("HostEvictOp", 0) > 0
    assert (divergences, violations) == (0, 0)
