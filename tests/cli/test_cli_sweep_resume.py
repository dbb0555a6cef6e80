"""`kvchain sweep --resume` of SLO searches and of malformed result files, and the SLO
flags' finite-number rules, through the real CLI: bad input exits 2 and touches nothing."""

from __future__ import annotations

import csv
import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()

BASE = ["sweep", "--managers", "kvchain", "--requests", "5", "--workers", "1", "--no-plots"]


def _slo_rows(out):
    with (out / "slo.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_resume_reruns_an_slo_search_with_other_targets_range_or_tolerance(tmp_path):
    # Before: the search was keyed on the configuration alone; the 1 ms resume said
    # "0 to run" and showed the 2 s search's answer (a silent wrong answer).
    out = tmp_path / "o"
    args = [*BASE, "--out", str(out), "--slo"]
    result = runner.invoke(app, [*args, "ttft_p99=2s"])
    assert result.exit_code == 0, result.output
    assert _slo_rows(out)[0]["slo"] == "ttft_p99<=2000ms"
    assert _slo_rows(out)[0]["max_rate_scale"] == "64.0"
    for extra, slo_text in [(["ttft_p99=1ms"], "ttft_p99<=1ms"),
                            (["ttft_p99=2s", "--slo-range", "1,4"], "ttft_p99<=2000ms"),
                            (["ttft_p99=2s", "--slo-tol", "0.5"], "ttft_p99<=2000ms")]:
        result = runner.invoke(app, [*args, *extra, "--resume"])
        assert result.exit_code == 0, (extra, result.output)
        assert "1 searches, 1 to run (0 already in slo.jsonl)" in result.output, extra
        (row,) = _slo_rows(out)
        assert row["slo"] == slo_text, extra
    # a ~20 ms TTFT misses 1 ms even at the lowest rate: not met
    assert json.loads((out / "slo.jsonl").read_text().splitlines()[1])["max_rate_scale"] is None
    (row,) = _slo_rows(out)
    assert (row["max_rate_scale"], row["rel_tol"]) == ("64.0", "0.5")
    # the same settings again: nothing runs, the row written by that search is shown
    result = runner.invoke(app, [*args, "ttft_p99=1ms", "--resume"])
    assert result.exit_code == 0, result.output
    assert "1 searches, 0 to run (1 already in slo.jsonl)" in result.output
    (row,) = _slo_rows(out)
    assert (row["slo"], row["max_rate_scale"]) == ("ttft_p99<=1ms", "")
    assert len((out / "slo.jsonl").read_text().splitlines()) == 4


def _snapshot(out):
    """Everything a refused run must leave as it was: names, bytes and the folder's mtime
    (a write-probe file created and deleted changes it)."""
    files = {p.name: (p.read_bytes() if p.is_file() else None) for p in out.iterdir()}
    return files, os.stat(out).st_mtime_ns


@pytest.mark.parametrize("args, needle", [
    (["--slo", "ttft_p99=2s", "--target-rate", "inf"], "finite number > 0 requests/s"),
    (["--slo", "ttft_p99=2s", "--target-rate", "nan"], "finite number > 0 requests/s"),
    (["--slo", "ttft_p99=2s", "--slo-tol", "inf"], "finite rel_tol > 0"),
    (["--slo", "ttft_p99=1e400s"], "the target must be a finite number > 0"),
])
def test_sweep_refuses_slo_numbers_that_are_not_finite(tmp_path, args, needle):
    # Before: --target-rate inf ran every search then crashed (OverflowError); --slo-tol
    # inf stopped after 2 evaluations; 1e400s was an infinite target. All exited 0 or 1.
    out = tmp_path / "o"
    result = runner.invoke(app, [*BASE, "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and result.stdout == ""
    assert not out.exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished plain sweep and a finished SLO search (one row each)."""
    root = tmp_path_factory.mktemp("done")
    for name, extra in (("sweep", []), ("slo", ["--slo", "ttft_p99=2s"])):
        result = runner.invoke(app, [*BASE, "--out", str(root / name), *extra])
        assert result.exit_code == 0, result.output
    return root


def _edit(name, **changes):
    def apply(path):
        row = json.loads(path.read_text())
        row.update(changes)
        path.write_text(json.dumps(row) + "\n")
    return name, apply


def _write(name, data):
    return name, lambda path: path.write_bytes(data + path.read_bytes())


def _folder(name):
    def apply(path):
        path.unlink()
        path.mkdir()
    return name, apply


@pytest.mark.parametrize("case, needle", [
    (_write("sweep", b"\xff\xfe{}\n"), "sweep.jsonl:1: not UTF-8 text"),
    (_folder("sweep"), "sweep.jsonl: cannot read"),
    (_write("sweep", b'{"key": [1]}\n'), "sweep.jsonl:1: a row needs a string \"key\", got [1]"),
    (_write("sweep", b'{"manager": "kvchain"}\n'), "sweep.jsonl:1: a row needs a string \"key\""),
    (_write("sweep", b'[1, 2]\n'), "sweep.jsonl:1: not a JSON object"),
    (_edit("sweep", requests_finished=None), "sweep.jsonl:1: 'requests_finished' is None"),
    (_edit("sweep", ttft_p99_s="slow"), "sweep.jsonl:1: 'ttft_p99_s' is 'slow', expected int"),
    (_edit("sweep", requests_total=True), "sweep.jsonl:1: 'requests_total' is True"),
    (_edit("slo", tp="x"), "slo.jsonl:1: 'tp' is 'x', expected int"),
    (_edit("slo", max_rate_rps="fast"), "slo.jsonl:1: 'max_rate_rps' is 'fast'"),
    (_edit("slo", at_best_ttft_p99_s=[1]), "slo.jsonl:1: 'at_best_ttft_p99_s' is [1]"),
])
def test_resume_refuses_a_malformed_result_file_and_touches_nothing(tmp_path, finished, case,
                                                                   needle):
    # Before: each of these crashed with a traceback (exit 1: UnicodeDecodeError,
    # IsADirectoryError, unhashable key, TypeError formatting the table, ValueError on
    # int(tp)) or, for a keyless row, resumed silently; and the out folder got a
    # write-probe file before the resume file was read.
    name, apply = case
    out = tmp_path / name
    shutil.copytree(finished / name, out)
    apply(out / f"{name}.jsonl")
    before = _snapshot(out)
    extra = ["--slo", "ttft_p99=2s"] if name == "slo" else []
    result = runner.invoke(app, [*BASE, "--out", str(out), *extra, "--resume"])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr, result.stderr
    assert str(out) in result.stderr and result.stdout == ""
    assert _snapshot(out) == before


def test_sweep_jsonl_that_is_a_folder_is_refused_without_resume(tmp_path, finished):
    out = tmp_path / "sweep"
    shutil.copytree(finished / "sweep", out)
    _folder("sweep")[1](out / "sweep.jsonl")
    before = _snapshot(out)
    result = runner.invoke(app, [*BASE, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "sweep.jsonl: a folder" in result.stderr
    assert _snapshot(out) == before


def test_resume_of_good_rows_still_reads_them(tmp_path, finished):
    out = tmp_path / "sweep"
    shutil.copytree(finished / "sweep", out)
    (out / "sweep.jsonl").write_bytes((out / "sweep.jsonl").read_bytes() + b'{"key": "ot')
    result = runner.invoke(app, [*BASE, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert "1 points, 0 to run (1 already in sweep.jsonl)" in result.output
