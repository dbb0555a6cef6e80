"""Host operations in chain operation streams: offload, load-back, host eviction.

The recorder's audits (every device page held by a request, the cache, the null page or
free; every host slot held by exactly one host entry or free; no host KV on a state chain
without its state slot), the replay format carrying host ops, planted defects that each make
the counts non-zero, and the oracle's agreement with the planner on load-back demands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvchain.cli.replay  # noqa: F401  (registers the command)
from kvchain.alloc import Demand
from kvchain.cli import app
from kvchain.errors import ConfigError
from kvchain.testing.geometry import ChainGeometry, ClassBytes, tiny_geometries
from kvchain.testing.oracle import OracleProblem, oracle_fits
from kvchain.testing.replay import (
    StreamSection,
    generate_section,
    read_stream,
    replay_section,
    write_stream,
)
from kvchain.testing.streams import (
    ChainRecorder,
    HostEvictOp,
    HostLoadOp,
    HostOffloadOp,
    TakeOp,
    generate_stream,
    op_from_json,
    op_to_json,
)

# One full band, 1 token a page, 2 B a token: a page is 2 B; 40 B hold 20 pages, no null.
FULL = ChainGeometry((ClassBytes("full", 2),), 40, 1, null_pages=False)
# A state band (slot 6 B) below a full band (2 B pages): 60 B, no null pages.
STATE_FULL = ChainGeometry((ClassBytes("state", 6), ClassBytes("full", 2)), 60, 1,
                           null_pages=False)
# state|window|full, 4 tokens a page, mixed page bytes (the generator's default chain).
STATE_FULL_BIG = generate_section("state|window|full", 0, 0).geometry


def test_offload_then_load_back_moves_exactly_the_pages() -> None:
    rec = ChainRecorder(FULL.chain(), host_slots=(4,))
    got = rec.take((3,))
    assert got is not None
    rec.run(HostOffloadOp(got))
    assert rec.host is not None
    # The 3 pages left the chain (20 pages, 0 live) into 3 of the 4 host slots.
    assert rec.held == [[]] and rec.chain.snapshot().bands[0].live == 0
    assert (rec.host.pools[0].held_count, rec.host.pools[0].free_count) == (3, 1)
    assert rec.last_offload == 0
    # A second offload of 2 pages needs 2 host slots, 1 is free: refused, nothing moves.
    got2 = rec.take((2,))
    assert got2 is not None
    rec.run(HostOffloadOp(got2))
    assert rec.last_offload == 0 and len(rec.held[0]) == 2
    # Load-back of entry 0: a take of 3 pages (2 + 3 = 5 live), the host entry is freed.
    loaded = rec.run(HostLoadOp(0, "fit"))
    assert loaded is not None and len(loaded[0]) == 3
    assert rec.chain.snapshot().bands[0].live == 5 and rec.host.pools[0].held_count == 0
    assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages


def test_a_refused_load_back_keeps_the_host_copy() -> None:
    rec = ChainRecorder(FULL.chain(), host_slots=(8,))
    got = rec.take((6,))
    assert got is not None
    rec.run(HostOffloadOp(got))
    assert rec.take((20,)) is not None  # the chain is full again: 20 of 20 pages
    assert rec.run(HostLoadOp(0, "refuse")) is None  # 6 more pages: 26 > 20
    assert rec.host is not None and list(rec.host.entries) == [0]
    assert rec.host.pools[0].held_count == 6
    assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages


def test_kv_without_its_state_never_goes_to_host() -> None:
    rec = ChainRecorder(STATE_FULL.chain(), host_slots=(2, 8))
    got = rec.take((1, 4))
    assert got is not None
    before = rec.chain.snapshot()
    rec.run(HostOffloadOp(((), got[1])))  # KV alone: refused as bad input
    assert rec.counts.violations == 1 and rec.chain.snapshot() == before
    assert rec.host is not None and not rec.host.entries
    rec.run(HostOffloadOp(got))  # state with the KV: fine
    assert rec.host.entries[0].counts == (1, 4)
    assert rec.counts.violations == 1


def test_host_eviction_is_lru_and_drops_every_class() -> None:
    rec = ChainRecorder(STATE_FULL.chain(), host_slots=(2, 8))
    for n in (2, 3):
        got = rec.take((1, n))
        assert got is not None
        rec.run(HostOffloadOp(got))
    rec.run(HostEvictOp())
    assert rec.host is not None and rec.last_evicted == 0 and list(rec.host.entries) == [1]
    # Entry 1 (1 state slot + 3 pages) is all that is left on the host.
    assert tuple(p.held_count for p in rec.host.pools) == (1, 3)
    rec.run(HostEvictOp())
    rec.run(HostEvictOp())  # an empty store: nothing to drop
    assert rec.last_evicted is None and tuple(p.held_count for p in rec.host.pools) == (0, 0)
    assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages


@pytest.mark.parametrize("defect", ["load_drops", "offload_keeps", "evict_keeps_kv"])
def test_planted_host_defects_are_counted(defect: str) -> None:
    """A load-back one page short, an offload that leaves a device page bound, a host
    eviction that drops the state but keeps the KV: each makes the counts non-zero."""
    rec = generate_stream(STATE_FULL_BIG.chain(), 1_000, seed=4, host=True,
                          host_defect=defect)
    assert rec.counts.operations >= 1_000
    assert rec.counts.divergences + rec.counts.violations > 0
    clean = generate_stream(STATE_FULL_BIG.chain(), 1_000, seed=4, host=True)
    assert (clean.counts.divergences, clean.counts.violations) == (0, 0)



def test_host_ops_json_round_trip_and_bad_input() -> None:
    for op in (HostOffloadOp(((1,), (), (4, 5))), HostLoadOp(3, "fit"), HostLoadOp(0),
               HostEvictOp()):
        assert op_from_json(json.loads(json.dumps(op_to_json(op)))) == op
    for bad in ({"op": "host_load"}, {"op": "host_load", "entry": 1, "expect": "maybe"},
                {"op": "host_offload", "pages": [1, 2]}):
        with pytest.raises(ConfigError):
            op_from_json(bad)


def test_host_stream_replay_round_trip(tmp_path: Path) -> None:
    section = generate_section("state|window|full", 2_000, seed=3, host=True, cache=True)
    kinds = {type(op).__name__ for op in section.ops}
    assert {"HostOffloadOp", "HostLoadOp", "HostEvictOp", "CacheInsertOp"} <= kinds
    assert section.host_slots is not None
    path = tmp_path / "host.jsonl"
    write_stream(path, [section])
    assert '"host_slots"' in path.read_text().splitlines()[0]
    (back,) = read_stream(path)
    assert back == section
    report = replay_section(back)
    assert report.operations == len(section.ops)
    assert (report.divergences, report.violations) == (0, 0), report.messages
    # The same stream with a planted defect on replay is caught.
    assert not replay_section(back, host_defect="load_drops").ok


def test_old_streams_replay_and_host_ops_need_host_slots(tmp_path: Path) -> None:
    plain = generate_section("window|full", 300, seed=1)
    path = tmp_path / "old.jsonl"
    write_stream(path, [plain])
    assert "host_slots" not in path.read_text()
    (back,) = read_stream(path)
    assert back.host_slots is None and replay_section(back).ok
    # A host op in a stream without host slots: a violation, the replay goes on.
    ops = (TakeOp((1, 1), "fit"), HostEvictOp())
    report = replay_section(StreamSection(plain.geometry, ops, None))
    assert (report.operations, report.violations) == (2, 1)
    header = json.loads(path.read_text().splitlines()[0]) | {"host_slots": [1]}
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(ConfigError, match="host_slots"):
        read_stream(path)


def test_cli_generates_and_replays_host_streams(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "ops.jsonl"
    result = runner.invoke(app, ["replay", "--generate", "state|full", "--ops", "400",
                                 "--host", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert '"op":"host_offload"' in out.read_text()
    assert runner.invoke(app, ["replay", str(out)]).exit_code == 0
    assert runner.invoke(app, ["replay", str(out), "--host"]).exit_code == 2


@pytest.mark.parametrize("geometry", tiny_geometries()[::3],
                         ids=lambda g: f"{g.shape}-P{g.page_size}")
def test_oracle_agrees_with_the_planner_on_load_back_demands(geometry: ChainGeometry) -> None:
    """A load-back is an ordinary demand (pages per band, state with the KV): before every
    load-back of a seeded host stream, the planner's verdict equals the exhaustive oracle's
    on exactly that demand."""
    stream = generate_stream(geometry.chain(), 250, seed=geometry.page_size, host=True,
                             audit=False)
    assert stream.host is not None
    rec = ChainRecorder(geometry.chain(), host_slots=tuple(p.slots for p in stream.host.pools))
    checked = 0
    for op in stream.ops:
        if isinstance(op, HostLoadOp):
            assert rec.host is not None
            demand = Demand(rec.host.entry(op.entry).counts)
            planner = rec.chain.price(demand).fits
            assert oracle_fits(OracleProblem.from_chain(rec.chain), demand).fits == planner
            checked += 1
        rec.run(op)
    assert checked > 0
    assert (rec.counts.divergences, rec.counts.violations) == (0, 0), rec.counts.messages
