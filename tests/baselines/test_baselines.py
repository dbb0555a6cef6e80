"""Baseline memory managers: capacity rules with exact numbers, a shared trace, the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import fits
from kvchain.alloc.snapshot import Demand
from kvchain.baselines import (
    CapacityRule,
    ManagerKind,
    PoolAllocator,
    build_manager,
    equal_page_geometry,
    fixed_pool_shares,
)
from kvchain.catalog import load_model
from kvchain.errors import CapacityError, ConfigError, ReservedPageError, UnknownPageError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass
from kvchain.sim.compare import NeededBytes, compare_managers
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import load_trace

WIN = declared_class(LifetimeClass.WINDOW, 1_000, 32)
FULL = declared_class(LifetimeClass.FULL, 1_000)


def test_fixed_pools_refuse_window_demand_while_full_pool_has_room():
    # B = 1.8 MB, E_full = E_win = 1,000 B, P = 16 (16,000 B pages): SGLang ratio 0.8 ->
    # window 800,000 B = 50 pages (1 null), full 1,000,000 B = 62 pages.
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    assert isinstance(alloc, PoolAllocator)
    assert alloc.pool_pages == (50, 62)
    alloc.take(Demand((49, 0)))
    before = alloc.snapshot()
    assert fits(before, Demand((0, 62)))
    assert not fits(before, Demand((1, 0)))
    with pytest.raises(CapacityError) as err:
        alloc.take(Demand((1, 0)))
    assert err.value.shortfall_bytes > 0
    assert alloc.snapshot() == before
    # kvchain's chain on the same layout lends the full band's bytes to the window.
    chain = Chain(setup.layout)
    chain.take(Demand((49, 0)))
    assert fits(chain.snapshot(), Demand((1, 0)))


def test_fixed_pool_shares_follow_sglang_defaults():
    assert fixed_pool_shares([WIN, FULL]) == pytest.approx((0.8 / 1.8, 1 / 1.8))
    state = declared_class(LifetimeClass.STATE, 5_000)
    assert fixed_pool_shares([state, FULL]) == pytest.approx((0.9 / 1.9, 1 / 1.9))


def test_equal_page_pool_one_block_size_for_every_class():
    # S_layer = 1,000 B, 10 B/token: block = 16 x ceil(1000 / 160) = 112 tokens,
    # L = 1,120 B; B = 11,200 B -> 10 blocks shared by state slots and full pages.
    state = declared_class(LifetimeClass.STATE, 1_000)
    full = declared_class(LifetimeClass.FULL, 10)
    geo = equal_page_geometry([state, full], 16)
    assert (geo.group_size, geo.page_tokens, geo.layer_page_bytes) == (1, 112, 1_120)
    assert geo.page_bytes == (1_120, 1_120)
    alloc = build_manager(ManagerKind.EQUAL_PAGE, [state, full], 11_200, 16).allocator
    alloc.take(Demand((4, 6)))
    assert not fits(alloc.snapshot(), Demand((1, 0)))
    assert not fits(alloc.snapshot(), Demand((0, 1)))
    alloc.release(0, [0])
    assert fits(alloc.snapshot(), Demand((0, 1)))


def test_equal_page_geometry_of_qwen3_next():
    model = load_model("qwen3-next-80b-a3b")
    geo = equal_page_geometry(model.classes, 16)
    # 12 full layers (2,048 B/token each), 36 Gated DeltaNet layers (1,097,728 B each).
    assert geo.group_size == 12
    assert geo.page_tokens == 544
    assert geo.layer_page_bytes == 1_114_112
    assert geo.groups == (3, 1)
    assert geo.page_bytes == (40_108_032, 13_369_344)


def test_ideal_admits_exact_bytes():
    # 10 B/token, S = 1,000 B, B = 5,000 B: one request of 400 tokens fills it exactly.
    state = declared_class(LifetimeClass.STATE, 1_000)
    full = declared_class(LifetimeClass.FULL, 10)
    alloc = build_manager(ManagerKind.IDEAL, [state, full], 5_000).allocator
    assert fits(alloc.snapshot(), Demand((1, 400)))
    assert not fits(alloc.snapshot(), Demand((1, 401)))


def test_pool_allocator_errors_change_nothing():
    setup = build_manager(ManagerKind.FIXED_POOLS, [WIN, FULL], 1_800_000, 16)
    alloc = setup.allocator
    assert isinstance(alloc, PoolAllocator)
    grant = alloc.take(Demand((2, 3)))
    assert grant.pages == ((1, 2), (0, 1, 2))  # window id 0 is the null page
    snap = alloc.snapshot()
    with pytest.raises(ReservedPageError):
        alloc.release(0, [alloc.null_page(0)])
    with pytest.raises(UnknownPageError):
        alloc.release(1, [7])
    assert alloc.snapshot() == snap
    with pytest.raises(ConfigError):
        PoolAllocator(setup.layout, CapacityRule.FIXED, (10**6, 10**6))
    alloc.audit()


def test_needed_bytes_formula():
    needed = NeededBytes(e_full=10, e_win=3, window=128, e_local=0, chunk=0, state=0)
    assert needed.of_request(1_000, holds_state=False) == 1_000 * 10 + 128 * 3
    local = NeededBytes(e_full=0, e_win=0, window=0, e_local=5, chunk=100, state=70)
    assert local.of_request(250, holds_state=True) == 50 * 5 + 70


@pytest.fixture(scope="module")
def tiny_runs():
    config = SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"),
                       load_trace("azure-conv", first=25, rate_scale=8.0),
                       buffer_bytes=600_000_000)
    return compare_managers(config, audit_every_step=True)


def test_same_trace_every_manager_no_leaks(tiny_runs):
    assert list(tiny_runs) == list(ManagerKind)
    for run in tiny_runs.values():
        s = run.summary
        assert s.requests_finished == 25
        assert s.leaked_pages == 0
        assert s.admitted_but_unallocatable == 0
        assert run.alloc_efficiency is not None and 0 < run.alloc_efficiency <= 1


def test_compare_cli_json(tmp_path):
    import kvchain.cli as cli

    cli._load_commands()
    result = CliRunner().invoke(cli.app, [
        # compare's old default trace, named: without --trace compare runs simulate's demo
        "compare", "--trace", "azure-conv", "--requests", "12", "--rate-scale", "8",
        "--buffer-bytes", "600000000",
        "--managers", "kvchain,fixed-pools", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # "wrote ..." goes to stderr
    assert list(data) == ["kvchain", "fixed-pools"]
    assert data["kvchain"]["summary"]["requests_finished"] == 12
    assert (tmp_path / "compare.png").stat().st_size > 0
    bad = CliRunner().invoke(cli.app, ["compare", "--managers", "nope"])
    assert bad.exit_code != 0


def test_baselines_on_a_model_with_two_window_sizes():
    # Windows of 32 (E 1,000) and 128 tokens (E 500), full E 1,000: each window pool holds
    # 0.8 x the full pool's tokens, so full gets 1,000 / (1,000 + 0.8 x 1,500) = 1 / 2.2.
    wide = declared_class(LifetimeClass.WINDOW, 500, 128).labelled("window128")
    win = WIN.labelled("window32")
    # Band order by bytes per request: window128 (64,000 B) | window32 (32,000 B) | full.
    shares = fixed_pool_shares([FULL, wide, win])
    assert shares == pytest.approx((0.4 / 2.2, 0.8 / 2.2, 1 / 2.2))
    for kind in ManagerKind:
        setup = build_manager(kind, [FULL, wide, win], 4_000_000, 16)
        assert setup.layout.shape_name == "window128|window32|full"
        snap = setup.allocator.snapshot()
        assert len(snap.bands) == 3
    # A request of 200 tokens needs 200 x 1,000 (full) + 32 x 1,000 + 128 x 500 B.
    needed = NeededBytes.of([FULL, wide, win])
    assert needed.of_request(200, False) == 200_000 + 32_000 + 64_000


@pytest.mark.parametrize("kind", list(ManagerKind))
def test_every_manager_is_an_allocator(kind: ManagerKind) -> None:
    """The chain and every baseline implement the one Allocator interface (checked
    statically by mypy on ManagerSetup.allocator; here at run time, member by member)."""
    setup = build_manager(kind, load_model("gemma-3-27b").classes, 2_000_000_000)
    alloc = setup.allocator
    assert isinstance(alloc, Allocator)
    quote = alloc.price(Demand((1, 1)))
    grant = alloc.take(Demand((1, 1)), quote)
    assert grant.quote is quote and alloc.stats.takes >= 1
    with alloc.pin_moves() as pin:
        assert pin.held
    assert not pin.held


def test_needed_bytes_count_a_draft_models_full_and_state_bands() -> None:
    """Regression (round 6): a second full or state class (a draft model's) was filed as a
    window of 1 token (``min(L, 1) x E``) and a second state class likewise; each full
    class holds all ``L`` tokens and each state class one slot."""
    from kvchain.model import declare_model, with_draft

    joined = with_draft(declare_model("t", full=1_000, state=50_000),
                        declare_model("d", full=300, state=7_000))
    needed = NeededBytes.of(joined.classes)
    # 200 tokens x (1,000 + 300) B + the two slots 50,000 + 7,000 B.
    assert needed.of_request(200, True) == 200 * 1_300 + 57_000
    assert needed.of_request(200, False) == 260_000
    # The fixed pools split the state share 50 : 7 and the rest 1,000 : 300.
    shares = fixed_pool_shares(joined.classes)
    state_share = 0.9 / 1.9
    assert shares == pytest.approx((state_share * 50 / 57, state_share * 7 / 57,
                                    (1 - state_share) * 300 / 1_300,
                                    (1 - state_share) * 1_000 / 1_300), rel=1e-6)
