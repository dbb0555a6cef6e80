"""Draft model bands under proof (round 6): a speculative-decoding draft's own cache classes
are bands of the chain that follow the request's tokens like the target's, so the request
layer's speculative stream, its audits after every rollback, the exhaustive position oracle
and the simulator's admitted-but-unallocatable count all hold on chains with draft bands.
Planted siblings: a planner that over-counts capacity disagrees with the oracle, and an
admission that ignores the draft's bands admits what the allocator then refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import max_units
from kvchain.alloc.snapshot import Demand
from kvchain.bands.geometry import StateRollback
from kvchain.catalog.loader import load_model_source
from kvchain.errors import CapacityError
from kvchain.gpu import get_gpu
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model import DRAFT, declare_model, with_draft
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched import admission
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace
from kvchain.testing.agreement import check_agreement

# Declared pairs (bytes per token / per slot; P = 4 tokens per page):
#   state + full target (S = 16 B, E = 2 B) with a full draft (E = 1 B);
#   window + full target (W = 6 tokens) with a full draft;
#   state + full target with a state + full draft (two state bands and two full bands).
PAIRS = {
    "state+full | full draft": (declare_model("t", full=2, state=16),
                                declare_model("d", full=1)),
    "window+full | full draft": (declare_model("t", full=2, window=1, window_tokens=6),
                                 declare_model("d", full=1)),
    "state+full | state+full draft": (declare_model("t", full=2, state=16),
                                      declare_model("d", full=1, state=8)),
}


def layout_of(pair: str, buffer: int) -> ChainLayout:
    target, draft = PAIRS[pair]
    return plan_layout(with_draft(target, draft).classes, buffer, 4)


def test_the_pairs_lay_out_as_named() -> None:
    # Largest slot at the LOW END, the target's full band (2 B/token > 1 B/token) the HIGH
    # END, the draft's full band floating lowest (next to the states), windows above it.
    shapes = {pair: layout_of(pair, 4_096).shape_name for pair in PAIRS}
    assert shapes == {
        "state+full | full draft": "state|draft.full|full",
        "window+full | full draft": "draft.full|window|full",
        "state+full | state+full draft": "state|draft.state|draft.full|full",
    }


def run_stream(pair: str, seed: int, k: int, p: float, steps: int = 60, buffer: int = 4_096,
               rollback: StateRollback = StateRollback.CHECKPOINTS,
               oracle_every: int = 0) -> tuple[int, int]:
    """Requests prefill, take speculative extends of ``1 + k`` tokens on every band (the
    draft's too), verify a random ``a``, finish; refused extends change nothing. After
    every rollback: no page or slot leaked, no rejected draft's page, slack or checkpoint
    kept, and the draft's full band holds exactly the pages of the target's full band
    (both cover the request's tokens ``[0, L)`` at ``P = 4``). Returns ``(rollbacks
    audited, oracle checks)``; ``oracle_every`` > 0 compares the planner with the
    exhaustive oracle every that many steps."""
    rng = np.random.default_rng(seed)
    layout = layout_of(pair, buffer)
    kv = KVManager(Chain(layout, debug_audit=True), spec_tokens=k, rollback=rollback)
    full, draft_full = layout.index_of(LC.FULL), layout.index_of(LC.FULL, DRAFT)
    states = layout.indices_of(LC.STATE)
    decoding: list[int] = []
    audited = oracles = next_rid = 0
    for step in range(steps):
        if oracle_every and step % oracle_every == 0:
            result = check_agreement(kv.chain)
            assert result.disagreements == (), (step, kv.chain.snapshot())
            oracles += 1
        if rng.random() < 0.3 or not decoding:  # a new request's whole prompt
            rid, n = next_rid, int(rng.integers(1, 20))
            next_rid += 1
            try:
                kv.allocate([(rid, n)])
            except CapacityError:
                continue
            kv.commit(rid, n)
            decoding.append(rid)
            continue
        if rng.random() < 0.15:  # one finishes
            kv.free(decoding.pop(int(rng.integers(len(decoding)))))
            kv.audit()
            continue
        batch = [rid for rid in decoding if rng.random() < 0.8] or decoding[:1]
        before = [(kv.held(rid), kv.tokens(rid)) for rid in batch]
        try:
            kv.allocate([(rid, 1 + k) for rid in batch], kv.decode_demands(batch, k))
        except CapacityError:  # refused: nothing changed
            assert [(kv.held(rid), kv.tokens(rid)) for rid in batch] == before
            kv.free(decoding.pop())
            kv.audit()
            continue
        accepted = (np.cumprod(rng.random((len(batch), k)) < p, axis=1).sum(axis=1)
                    if k else np.zeros(len(batch), dtype=np.int64))
        kv.verify(batch, accepted, k)
        for rid, (_, tokens), a in zip(batch, before, accepted.tolist(), strict=True):
            assert kv.tokens(rid) == tokens + 1 + a
        kv.audit()
        kv.audit_settled(decoding)
        for rid in decoding:
            held = kv.held(rid)
            # ceil(L / 4) pages in both full bands: the draft follows the target's tokens.
            assert held.span(draft_full) == held.span(full) == (0, -(-kv.tokens(rid) // 4))
            # Every state band holds the same slots: 1 + k checkpoints, or 2 under REPLAY.
            assert len({held.span(s) for s in states}) <= 1
        audited += 1
    for rid in decoding:
        kv.free(rid)
    kv.audit()
    assert all(kv.chain.bound_pages(b) == kv.chain.layout.bands[b].reserved_pages
               for b in range(kv.geom.num_bands))  # everything back: nothing leaked
    return audited, oracles


@settings(max_examples=30, deadline=None)
@given(pair=st.sampled_from(sorted(PAIRS)), seed=st.integers(0, 2**16), k=st.integers(0, 4),
       p=st.floats(0.0, 1.0), rollback=st.sampled_from(StateRollback))
def test_every_rollback_on_draft_bands_is_audited_clean(pair: str, seed: int, k: int,
                                                        p: float,
                                                        rollback: StateRollback) -> None:
    run_stream(pair, seed, k, p, rollback=rollback)


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_seeded_streams_roll_back_and_the_oracle_agrees(pair: str) -> None:
    # Seeded: the stream really rolls back (>= 10 verifies audited) and the planner agrees
    # with the exhaustive oracle on every visited state of the chain with draft bands.
    audited, oracles = run_stream(pair, 7, 3, 0.5, steps=80, buffer=1_536, oracle_every=8)
    assert audited >= 10 and oracles == 10


def test_the_draft_state_band_keeps_the_checkpoints() -> None:
    # k = 3 under CHECKPOINTS: 1 + 3 slots in the target's 16 B band and in the draft's
    # 8 B band, claimed by the first chunk (4 x 16 + 4 x 8 = 96 B of state per request).
    layout = layout_of("state+full | state+full draft", 4_096)
    kv = KVManager(Chain(layout), spec_tokens=3)
    kv.allocate([(0, 5)])
    kv.commit(0, 5)
    held = kv.held(0)
    assert [held.span(i) for i in layout.indices_of(LC.STATE)] == [(0, 4), (0, 4)]
    # ceil(5 / 4) = 2 pages in each full band.
    assert [held.span(i) for i in layout.indices_of(LC.FULL)] == [(0, 2), (0, 2)]


def test_a_planner_that_overcounts_is_caught_on_draft_bands() -> None:
    # Planted sibling of the oracle check: one unit more than the planner's capacity.
    layout = layout_of("state+full | full draft", 1_536)
    kv = KVManager(Chain(layout), spec_tokens=2)
    kv.allocate([(0, 9)])
    kv.commit(0, 9)
    result = check_agreement(kv.chain, capacity=lambda snap, u: max_units(snap, u) + 1)
    assert result.disagreements


# --- the simulator: admission prices the draft's bands ---------------------------------------

# Qwen3-8B with its Qwen3-0.6B draft (114,688 B/token of draft KV beside the target's
# 147,456: 262,144 B/token, so 8 GB hold about 30,500 tokens) on the first 40 Mooncake
# requests (prompts of 13,800 tokens on average): memory binds.
BUFFER = 8_000_000_000


def draft_config() -> SimConfig:
    model = load_model_source("Qwen3-8B", draft_model="Qwen3-0.6B")
    return SimConfig(model, get_gpu("h200"), load_trace("mooncake", first=40),
                     buffer_bytes=BUFFER, scheduler=SchedulerConfig(strict=False),
                     prefix_cache=False, spec_tokens=3, spec_acceptance=0.7)


_FITS = admission.ChainPrefillBudget.fits


def draft_blind_fits(self: admission.ChainPrefillBudget, demand: Demand) -> bool:
    """The planted defect: admission prices a demand without its draft bands' pages (as
    an engine that sizes admission by the target's KV alone would)."""
    bands = self.snapshot.bands
    blind = tuple(0 if b.label.startswith("draft.") else n
                  for n, b in zip(demand.pages, bands, strict=True))
    return _FITS(self, Demand(blind))


def test_admission_counts_the_draft_bands_and_a_blind_sibling_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate(draft_config(), audit_every_step=True)
    s = result.summary
    assert s.admitted_but_unallocatable == 0 and s.leaked_pages == 0
    assert s.requests_finished + s.requests_rejected == 40
    assert result.layout.shape_name == "draft.full|full"
    extra = dict(s.extra)
    assert extra["draft_peak_bytes"] > 0 and extra["draft_forward_s"] > 0
    monkeypatch.setattr(admission.ChainPrefillBudget, "fits", draft_blind_fits)
    blind = simulate(draft_config()).summary  # not strict: counted, retracted, run on
    assert blind.admitted_but_unallocatable is not None
    assert blind.admitted_but_unallocatable > 0


def test_the_prefix_cache_refuses_several_state_bands_and_nothing_else() -> None:
    from kvchain.cache.radix import CacheGeometry, PrefixCache, cache_refusal
    from kvchain.errors import ConfigError

    # Two full bands (a target's and its full draft's) are cached, one list per band
    # (tests/cache/test_draft_chain_cache.py); only two state bands are refused.
    for pair in ("state+full | full draft", "window+full | full draft"):
        geom = CacheGeometry.of(layout_of(pair, 4_096))
        assert cache_refusal(geom) is None
        assert PrefixCache(geom).geom is geom
    two_states = CacheGeometry.of(layout_of("state+full | state+full draft", 4_096))
    with pytest.raises(ConfigError, match="keeps one state checkpoint per resume point"):
        PrefixCache(two_states)
    assert cache_refusal(two_states) == (
        "the chain has 2 state bands (e.g. a draft model's), and the prefix cache keeps one "
        "state checkpoint per resume point")
    # The rule is about bands, not owners: a draft with only a window band (one full band,
    # the target's) is cached like any chain with two window bands.
    window_draft = with_draft(declare_model("t", full=2, window=1, window_tokens=6),
                              declare_model("d", window=1, window_tokens=10))
    geom = CacheGeometry.of(plan_layout(window_draft.classes, 4_096, 4))
    assert cache_refusal(geom) is None
    assert PrefixCache(geom).geom is geom
