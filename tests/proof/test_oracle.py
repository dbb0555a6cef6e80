"""The exhaustive position oracle against the planner on every corner state."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvchain.alloc import Demand, pricing
from kvchain.alloc.band import Band
from kvchain.testing.agreement import check_agreement, check_demand_sweep, unit_directions
from kvchain.testing.corners import BASE_CORNERS, VARIANTS, build_corner, corner_states
from kvchain.testing.geometry import (
    ChainGeometry,
    ClassBytes,
    shape_geometry,
    tiny_geometries,
    tiny_n_band_geometries,
)
from kvchain.testing.oracle import OracleProblem, oracle_fits
from kvchain.testing.streams import ChainRecorder, GateOp, generate_stream

GEOMETRIES = tiny_geometries()


def test_tiny_geometries_cover_every_shape_and_page_size() -> None:
    assert len(GEOMETRIES) == 30
    assert {g.shape for g in GEOMETRIES} == {"full", "window|full", "state|full",
                                             "state|window", "state|window|full"}
    assert {g.page_size for g in GEOMETRIES} == {1, 4, 16}


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g.shape}-P{g.page_size}-"
                         f"{g.buffer_bytes}")
def test_planner_agrees_with_oracle_on_every_corner(geometry: ChainGeometry) -> None:
    has_float = geometry.shape == "state|window|full"
    for corner in corner_states(geometry):
        assert corner.recorder.counts.divergences == 0, corner.name
        assert corner.recorder.counts.violations == 0, corner.name
        result = check_agreement(corner.chain)
        assert result.disagreements == (), (corner.name, corner.chain.snapshot())
        assert result.decisions >= len(unit_directions(corner.chain.num_bands))
        # Grid slack: none on two ENDs (byte-additive), at most one float page per edge.
        if has_float:
            assert result.max_slack_float_pages <= 2, corner.name
        else:
            assert result.max_slack_bytes == 0, corner.name


def test_corners_have_holes_where_named() -> None:
    g = shape_geometry("state|window|full", 4, pages=24, null_pages=False)
    snaps = {b: build_corner(g, b).chain.snapshot() for b in BASE_CORNERS}
    assert all(b.holes == 0 and b.live == 0 for b in snaps["empty"].bands)
    assert snaps["full"].free_bytes < min(b.page_bytes for b in snaps["full"].bands) * 3
    assert all(b.holes > 0 for b in snaps["edge_holes"].bands)
    assert snaps["retired_window"].bands[1].holes > 0
    assert snaps["parked_float"].bands[1].live == 0
    s = snaps["state_off_grid"].bands[0]
    assert (s.live, s.holes, s.hi) == (2, 1, 42) and s.hi % snaps["empty"].bands[1].page_bytes
    closed = build_corner(g, "full", "gate_closed").chain.snapshot()
    assert not any(b.movable for b in closed.bands)
    fenced = build_corner(g, "full", "fence_pending").chain.snapshot()
    assert all(b.fence_pending for b in fenced.bands)


def test_oracle_worked_example_three_bands() -> None:
    # docs/pricing.md §2: P_S = 48, P_W = P_F = 32, B = 6,784, 41 slots held:
    # n window + n full pages fit for n = 75, not 76.
    g = ChainGeometry((ClassBytes("state", 48), ClassBytes("window", 2, 32),
                       ClassBytes("full", 2)), 6_784, 16, null_pages=False)
    rec = ChainRecorder(g.chain())
    rec.take((41, 0, 0))
    problem = OracleProblem.from_chain(rec.chain)
    assert oracle_fits(problem, Demand((0, 75, 75))).fits
    refused = oracle_fits(problem, Demand((0, 76, 76)))
    assert not refused.fits and refused.byte_bound


def test_oracle_without_moves_when_the_gate_is_closed() -> None:
    # Two ENDs of 2-byte pages in 24 B: A holds 6 pages with 4 interior holes, Z 6 pages.
    g = shape_geometry("window|full", 1, mixed=False, pages=24, null_pages=False)
    rec = ChainRecorder(g.chain())
    rec.take((6, 6))
    rec.release(0, [1, 2, 3, 4])
    problem = OracleProblem.from_chain(rec.chain)
    assert oracle_fits(problem, Demand((0, 4))).fits  # A compacts 4 pages away
    rec.run(GateOp(False, realize_moves=False))
    closed = OracleProblem.from_chain(rec.chain)
    assert not closed.movable
    assert not oracle_fits(closed, Demand((0, 1))).fits  # holes are A's only
    assert oracle_fits(closed, Demand((4, 0))).fits
    assert not pricing.fits(rec.chain.snapshot(), Demand((0, 1)))


def test_planted_planner_defect_forgetting_one_hole_is_caught() -> None:
    def forgets_a_hole(snapshot, demand):  # type: ignore[no-untyped-def]
        bands = tuple(replace(b, holes=b.holes - 1) if b.holes else b for b in snapshot.bands)
        return pricing._solve(replace(snapshot, bands=bands), demand)

    g = shape_geometry("window|full", 1, mixed=False, pages=24)
    corner = build_corner(g, "edge_holes", "gate_closed")
    result = check_agreement(corner.chain,
                             capacity=pricing.Planner(forgets_a_hole).max_units)
    assert len(result.disagreements) > 0
    assert any(d.oracle_fits and not d.planner_fits for d in result.disagreements)


def test_planted_planner_defect_overcounting_capacity_is_caught() -> None:
    g = shape_geometry("state|window|full", 4, pages=24)
    corner = build_corner(g, "retired_window", "open")
    result = check_agreement(corner.chain,
                             capacity=lambda s, u: pricing.max_units(s, u) + 1)
    assert any(d.planner_fits and not d.oracle_fits for d in result.disagreements)


def test_planted_executor_defect_skipping_a_rebind_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_apply = Band.apply_moves

    def skips_one_rebind(self, moves):  # type: ignore[no-untyped-def]
        keep = self.v2p.copy()
        real_apply(self, moves)
        if moves.src.size:
            v = self.p2v[moves.dst[0]]
            self.v2p[v] = keep[v]  # the first moved page keeps its stale table entry

    monkeypatch.setattr(Band, "apply_moves", skips_one_rebind)
    rec = generate_stream(shape_geometry("state|window|full", 4, pages=96).chain(), 400, 3)
    assert rec.chain.stats.pages_copied > 0
    assert rec.counts.violations > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_corner_chains_translate_their_held_pages(variant: str) -> None:
    corner = build_corner(shape_geometry("state|window|full", 4, pages=24), "edge_holes",
                          variant)
    for i, held in enumerate(corner.recorder.held):
        phys = corner.chain.translate(i, np.asarray(held, dtype=np.int64))
        assert len(set(phys.tolist())) == len(held)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g.shape}-P{g.page_size}-"
                         f"{g.buffer_bytes}")
def test_planner_agrees_with_oracle_on_every_demand_sweep(geometry: ChainGeometry) -> None:
    for corner in corner_states(geometry, ("open", "gate_closed")):
        result = check_demand_sweep(corner.chain)
        assert result.decisions > 0
        assert result.disagreements == (), corner.name


N_BAND_GEOMETRIES = tiny_n_band_geometries()


def _agrees_on_every_corner(geometry: ChainGeometry) -> int:
    decisions = 0
    for corner in corner_states(geometry):
        assert corner.recorder.counts.divergences == 0, corner.name
        assert corner.recorder.counts.violations == 0, corner.name
        result = check_agreement(corner.chain)
        assert result.disagreements == (), (corner.name, corner.chain.snapshot())
        decisions += result.decisions
    return decisions


def test_n_band_geometries_cover_two_and_three_floats() -> None:
    bands = {len(g.layout().bands) for g in N_BAND_GEOMETRIES}
    assert bands == {3, 4, 5}
    # Floats by bytes per request (equal page bytes at P = 4: window12 24 B, window8 and
    # local 16 B each, windows first on ties; mixed: local 32 B, window8 16 B, window12
    # 12 B), so both orders of two windows are searched.
    assert {g.shape for g in N_BAND_GEOMETRIES if g.page_size == 4} == {
        "window|local|full", "local|window|full", "state|window12|window8|full",
        "state|window8|window12|full", "state|window|local|full", "state|local|window|full",
        "state|window12|window8|local|full"}


@pytest.mark.parametrize("geometry", N_BAND_GEOMETRIES,
                         ids=lambda g: f"{g.shape}-P{g.page_size}-{g.buffer_bytes}")
def test_planner_agrees_with_oracle_on_chains_of_several_floats(geometry: ChainGeometry) -> None:
    # Every corner x gate open / closed / fence pending, every unit direction at and one
    # past the planner's capacity: 0 disagreements.
    assert _agrees_on_every_corner(geometry) > 200


def _equal_page_bytes(g: ChainGeometry) -> bool:
    return len({c.nbytes for c in g.classes if c.lifetime != "state"}) == 1


@pytest.mark.parametrize("geometry", [g for g in N_BAND_GEOMETRIES
                                      if len(g.layout().bands) == 4 and _equal_page_bytes(g)],
                         ids=lambda g: f"{g.shape}-P{g.page_size}-{g.buffer_bytes}")
def test_planner_agrees_with_oracle_on_n_band_demand_sweeps(geometry: ChainGeometry) -> None:
    for corner in corner_states(geometry, ("open", "gate_closed")):
        result = check_demand_sweep(corner.chain, max_pages=3)
        assert result.decisions > 0
        assert result.disagreements == (), corner.name


@pytest.mark.slow
def test_planner_agrees_with_oracle_on_mixed_five_band_chains() -> None:
    for geometry in tiny_n_band_geometries(mixed_five_bands=True):
        if geometry.shape.count("|") == 4 and not _equal_page_bytes(geometry):
            assert _agrees_on_every_corner(geometry) > 200
