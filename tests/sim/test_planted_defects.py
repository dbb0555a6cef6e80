"""Every "must be 0" figure can be non-zero: planted defects make the simulator's
admitted-but-unallocatable count and leaked pages, and replay's divergences, count up
while the run still finishes (and ``strict`` still stops at the first one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvchain.alloc import ChainSnapshot, pricing
from kvchain.alloc.pricing import fits
from kvchain.alloc.snapshot import Demand
from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import AdmissionDivergenceError
from kvchain.gpu import get_gpu
from kvchain.requests.manager import KVManager
from kvchain.sched import admission
from kvchain.sched.scheduler import Scheduler, SchedulerConfig
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import load_trace
from kvchain.testing.replay import generate_section, replay_stream, write_stream

# Jet-Nemotron-2B on the first 40 Mooncake requests in 300 MB: memory binds, so a ledger
# that forgets what it reserved admits more than the chain holds.
MODEL, TRACE, FIRST, BUFFER = "jet-nemotron-2b", "mooncake", 40, 300_000_000


def ledger_blind_fits(self: admission.ChainPrefillBudget, demand: Demand) -> bool:
    """The planted defect: admission prices each candidate alone, forgetting the ledger
    (this step's decodes, other admissions and every running request's future)."""
    self.decisions += 1
    return fits(self.snapshot, demand)


def config(strict: bool) -> SimConfig:
    return SimConfig(load_model(MODEL), get_gpu("h200"), load_trace(TRACE, first=FIRST),
                     buffer_bytes=BUFFER, scheduler=SchedulerConfig(strict=strict))


def test_wrong_admission_predicate_is_counted_and_the_run_finishes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission.ChainPrefillBudget, "fits", ledger_blind_fits)
    seen: list[Scheduler] = []
    result = simulate(config(strict=False), audit_every_step=True,
                      on_allocated=lambda sched, _b, _t: seen.append(sched) if not seen else None)
    s = result.summary
    assert s.admitted_but_unallocatable is not None and s.admitted_but_unallocatable > 0
    assert s.admitted_but_unallocatable == len(result.unallocatable)
    assert s.admitted_but_unallocatable == seen[0].counters.divergences
    assert (s.requests_finished, s.requests_rejected, s.leaked_pages) == (FIRST, 0, 0)
    for ev in result.unallocatable:
        assert isinstance(ev.snapshot, ChainSnapshot) and ev.shortfall_bytes > 0
        assert not ev.demand.is_empty and ev.rid >= 0
    # Without the defect, the same run counts none.
    monkeypatch.undo()
    assert simulate(config(strict=False)).summary.admitted_but_unallocatable == 0


def test_strict_stops_at_the_first_unallocatable_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission.ChainPrefillBudget, "fits", ledger_blind_fits)
    with pytest.raises(AdmissionDivergenceError, match="refused by the allocator"):
        simulate(config(strict=True))


def test_cli_reports_the_count_and_strict_exits_1(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(admission.ChainPrefillBudget, "fits", ledger_blind_fits)
    _load_commands()
    runner = CliRunner()
    args = ["simulate", "--model", MODEL, "--trace", TRACE, "--requests", str(FIRST),
            "--buffer-bytes", str(BUFFER)]
    out = tmp_path / "run"
    result = runner.invoke(app, [*args, "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    count = json.loads(result.stdout)["summary"]["admitted_but_unallocatable"]
    assert count > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["summary"]["admitted_but_unallocatable"] == count
    table = runner.invoke(app, args)
    assert table.exit_code == 0
    row = next(line for line in table.output.splitlines() if "admitted but unallocatable" in line)
    assert str(count) in row
    strict = runner.invoke(app, [*args, "--strict"])
    assert strict.exit_code == 1 and "AdmissionDivergenceError" in strict.output


def test_a_kv_manager_that_forgets_a_page_leaks_and_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted defect: every free forgets one full page (it stays bound, held by
    nobody). leaked_pages must equal the number of frees that had a full page."""
    real_free = KVManager.free
    forgotten = [0]

    def forgetful_free(self: KVManager, rid: int) -> int:
        slot, full = self.pages(rid).slot, self.geom.full
        if self._table.rowlen[full, slot]:
            self._table.rowlen[full, slot] -= 1  # its last full page: bound, held by nobody
            forgotten[0] += 1
        return real_free(self, rid)

    monkeypatch.setattr(KVManager, "free", forgetful_free)
    result = simulate(SimConfig(load_model(MODEL), get_gpu("h200"),
                                load_trace(TRACE, first=20), buffer_bytes=900_000_000))
    s = result.summary
    assert s.requests_finished == 20
    assert s.leaked_pages == forgotten[0] >= 20  # every request held a full page


def test_replay_counts_divergences_of_a_mispredicting_planner(tmp_path: Path) -> None:
    """A stream recorded with the real planner, replayed on chains given a planner that
    refuses every demand of more than 3 pages: every recorded fit above that is a
    divergence."""
    section = generate_section("state|window|full", 300, seed=4)
    path = tmp_path / "s.jsonl"
    write_stream(path, [section])

    def refuses_big(snapshot, demand):  # type: ignore[no-untyped-def]
        if sum(demand.pages) > 3:
            return pricing._Refusal(pricing.RefusalReason.BYTES, 1)
        return pricing._solve(snapshot, demand)

    (report,) = replay_stream(path, planner=pricing.Planner(refuses_big))
    assert report.divergences > 0
