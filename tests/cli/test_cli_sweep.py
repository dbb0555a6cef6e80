"""`kvchain sweep` through the real CLI: grid file, resume, SLO table, bad input."""

from __future__ import annotations

import csv
import json
import math

from typer.testing import CliRunner

from kvchain.cli import _load_commands, app

_load_commands()
runner = CliRunner()

GRID = """models = ["gpt-oss-120b"]
rate_scales = [1, 2]
managers = ["kvchain", "fixed-pools"]
requests = 12
"""


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sweep_grid_file_then_resume(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(out),
                                 "--workers", "1"])
    assert result.exit_code == 0, result.output
    rows = _rows(out / "sweep.jsonl")
    assert len(rows) == 4  # 2 scales x 2 managers
    with (out / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [(r["rate_scale"], r["manager"]) for r in table] == [
        ("1.0", "kvchain"), ("1.0", "fixed-pools"), ("2.0", "kvchain"), ("2.0", "fixed-pools")]
    assert (out / "sweep-1.png").stat().st_size > 0
    # --resume with one more scale on the command line: only the 2 new points run
    result = runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(out), "--workers",
                                 "1", "--resume", "--rate-scales", "1,2,3", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "6 points, 2 to run (4 already in sweep.jsonl)" in result.output
    assert len(_rows(out / "sweep.jsonl")) == 6
    assert _rows(out / "sweep.jsonl")[:4] == rows


def test_resume_of_rows_written_before_the_prefix_cache_axis(tmp_path):
    # Rows of an older kvchain have no prefix_cache (their points ran with the default
    # auto, and their keys leave it out). Resumed next to a fresh auto row they must read as
    # auto: one configuration, so no prefix_cache column, one plot, "auto" in every CSV
    # cell. Before the fix they read as None: a prefix_cache column (None / auto), two
    # plots of one rate each, and empty CSV cells.
    out = tmp_path / "old"
    args = ["sweep", "--requests", "12", "--managers", "kvchain", "--out", str(out),
            "--workers", "1"]
    result = runner.invoke(app, [*args, "--rate-scales", "1", "--no-plots"])
    assert result.exit_code == 0, result.output
    old = _rows(out / "sweep.jsonl")
    for row in old:
        del row["prefix_cache"]
    (out / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    result = runner.invoke(app, [*args, "--rate-scales", "1,2", "--resume"])
    assert result.exit_code == 0, result.output
    assert "2 points, 1 to run (1 already in sweep.jsonl)" in result.output
    # the table (stdout; the note on stderr names the axes at their defaults)
    assert "prefix_cache" not in result.stdout and "None" not in result.stdout
    with (out / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [(r["rate_scale"], r["prefix_cache"]) for r in table] == [("1.0", "auto"),
                                                                       ("2.0", "auto")]
    assert sorted(p.name for p in out.glob("*.png")) == ["sweep-1.png"]


def test_sweep_slo_table_and_csv(tmp_path):
    out = tmp_path / "slo"
    result = runner.invoke(app, ["sweep", "--requests", "12", "--managers", "kvchain",
                                 "--out", str(out), "--workers", "1", "--slo",
                                 "ttft_p99=10s", "--target-rate", "100", "--slo-range",
                                 "1,4", "--slo-tol", "0.1"])
    assert result.exit_code == 0, result.output
    with (out / "slo.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))
    # 12 short requests meet a 10 s TTFT even at 4x their rate: the answer is the cap
    assert row["max_rate_scale"] == "4.0" and row["fail_rate_scale"] == ""
    assert row["evaluations"] == "2"
    rps = float(row["max_rate_rps"])
    # GPUs = ceil(100 / rate per replica) x tp 1
    assert int(row["gpus_needed"]) == math.ceil(100 / rps)
    assert "highest rate meeting" in result.output


def test_sweep_bad_input_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "bad"
    for args, needle in [(["--managers", "vllm"], "unknown managers"),
                         (["--slo", "ttft_p99=2h"], "unit"),
                         (["--target-rate", "5"], "needs --slo"),
                         (["--models", "no-such-model"], "no-such-model"),
                         (["--rate-scales", "fast"], "not a number"),
                         (["--workers", "0"], "workers"),
                         (["--prefix-caches", "maybe"], "unknown prefix_caches"),
                         # the default trace (azure-conv) has no content keys to cache by
                         (["--prefix-caches", "on"], "content keys"),
                         # Before: the search bounds were checked in the first search, after
                         # the out folder was made and "1 searches, 1 to run" was printed;
                         # --slo-tol / --slo-range without --slo were ignored (exit 0).
                         (["--slo", "ttft_p99=2s", "--slo-tol", "0"], "rel_tol > 0"),
                         (["--slo", "ttft_p99=2s", "--slo-range", "5,1"], "0 < lo < hi"),
                         (["--slo-tol", "0.5"], "--slo-tol needs --slo"),
                         (["--slo-range", "1,4"], "--slo-range needs --slo")]:
        result = runner.invoke(app, ["sweep", "--out", str(out), "--requests", "5", *args])
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.output, (args, result.output)
        assert result.stdout == "", (args, result.stdout)
        assert not out.exists()


def test_slo_table_of_two_managers_cuts_nothing_at_80_columns():
    """The README's SLO search (two managers, --target-rate) printed 'gpt-os…', 'azure-…'
    and 'fixed-p…' at 80 columns, then folded them mid-word; shared settings now go to the
    title and headers take two lines, so every cell shows whole."""
    from rich.console import Console

    from kvchain.report.sweep import slo_table

    base = {"model": "gpt-oss-120b", "gpu": "h200", "tp": 1, "trace": "azure-conv",
            "mem_fraction": 0.9, "slo": "ttft_p99<=2000ms,tpot_p99<=50ms",
            "max_rate_scale": 6.24, "max_rate_rps": 20.36, "fail_rate_scale": 6.3,
            "gpus_needed": 1}
    rows = [{**base, "manager": "kvchain"}, {**base, "manager": "fixed-pools"}]
    console = Console(record=True, width=80, color_system=None)
    console.print(slo_table(rows, 20.0))
    text = console.export_text()
    assert "…" not in text, text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    # whole cells: the rate (by hand: the row's 20.36 at scale 6.24) and names in one piece
    assert "20.36" in text and "6.24" in text and "fixed-pools" in text
    assert "model=gpt-oss-120b, gpu=h200, tp=1, trace=azure-conv, mem_fraction=0.9" in text
    # a second configuration makes its varying setting a column
    table = slo_table([*rows, {**base, "manager": "kvchain", "tp": 2, "max_rate_scale": None,
                                       "gpus_needed": None}],
                      20.0)
    assert table.columns[0].header == "tp"
    console = Console(record=True, width=80, color_system=None)
    console.print(table)
    assert "not met" in console.export_text()


def test_sweep_table_shows_only_the_axes_that_vary():
    """Rows built by hand: rate_scale and manager vary, the rest go to the title; the
    metrics are formatted from the row (0.1234 s -> 123.4 ms; no finished request -> '-')."""
    from rich.console import Console

    from kvchain.report.sweep import sweep_table

    base = {"model": "gpt-oss-120b", "gpu": "H200", "tp": 1, "trace": "mooncake",
            "mem_fraction": 0.9, "requests": 12, "end_s": None, "page_size": 16,
            "max_running": 256, "chunk_size": 8192, "seed": 0, "requests_total": 12,
            "offered_rate_rps": 0.5, "output_tokens_per_s": 1234.4, "prefix_hit_rate_pct": 3.5}
    rows = [{**base, "manager": "kvchain", "rate_scale": 1.0, "requests_finished": 12,
             "ttft_p99_s": 0.1234, "tpot_p99_s": 0.02},
            {**base, "manager": "fixed-pools", "rate_scale": 2.0, "requests_finished": 0,
             "ttft_p99_s": None, "tpot_p99_s": None}]
    table = sweep_table(rows)
    headers = [c.header for c in table.columns]
    assert headers == ["manager", "rate\nscale", "done", "req/s", "out\ntok/s",
                       "TTFT\np99", "TPOT\np99", "hit\n%"]
    assert table.title == "sweep: model=gpt-oss-120b, gpu=H200, tp=1, trace=mooncake"
    console = Console(width=80, record=True)
    console.print(table)
    text = console.export_text()
    assert "12/12" in text and "0/12" in text and "123.4" in text and "20.0" in text
    assert "1,234" in text and "…" not in text
    # every cell whole at 80 columns: grid values are never folded mid-word
    assert "fixed-pools" in text and "TTFT and TPOT p99 in ms" in text


def test_plain_sweep_prints_its_results_table(tmp_path):
    out = tmp_path / "plain"
    result = runner.invoke(app, ["sweep", "--requests", "12", "--managers", "kvchain",
                                 "--rate-scales", "1,2", "--out", str(out), "--workers", "1",
                                 "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "rate" in result.output and "scale" in result.output and "TTFT" in result.output
    assert "12/12" in result.output


def test_sweep_over_the_prefix_cache(tmp_path):
    out = tmp_path / "cache"
    result = runner.invoke(app, ["sweep", "--requests", "12", "--managers", "kvchain",
                                 "--traces", "mooncake", "--prefix-caches", "on,off",
                                 "--out", str(out), "--workers", "1", "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = _rows(out / "sweep.jsonl")
    assert [r["prefix_cache"] for r in rows] == ["on", "off"]
    assert rows[0]["prefix_hit_tokens"] > 0 and rows[1].get("prefix_hit_tokens", 0) == 0
    # the axis that varies is a column (its header in two lines)
    assert "prefix" in result.output and "cache " in result.output


def _sweep_rows(**axes):
    """Sweep rows by hand: one per combination of ``axes`` (name -> values), a TPOT p99 of
    0.2138 s (213.8 ms) and a hit rate of 3.37 % each, the rest shared."""
    import itertools

    base = {"model": "gpt-oss-120b", "gpu": "h200", "tp": 1, "trace": "mooncake",
            "rate_scale": 1.0, "mem_fraction": 0.9, "prefix_cache": "auto",
            "manager": "kvchain", "requests": 30, "end_s": None, "page_size": 16,
            "max_running": 256, "chunk_size": 8192, "seed": 0, "requests_total": 30,
            "requests_finished": 30, "offered_rate_rps": 13.33, "output_tokens_per_s": 527.0,
            "ttft_p99_s": 11.5041, "tpot_p99_s": 0.2138, "prefix_hit_rate_pct": 3.37}
    names = list(axes)
    return [{**base, **dict(zip(names, combo, strict=True))}
            for combo in itertools.product(*axes.values())]


def test_sweep_table_of_three_settings_with_hits_fits_80_columns():
    """`--rate-scales 1,4 --prefix-caches on,off --managers kvchain,fixed-pools` on mooncake
    (the README's use of the axis) printed at 80 columns cut off the TPOT and hit columns
    whole: the 'prefix_cache' and 'rate_scale' headers were one line each and the table
    had blank edges. Settings' headers now take two lines and the table has no edges."""
    from rich.console import Console

    from kvchain.report.sweep import sweep_table, table_width

    rows = _sweep_rows(rate_scale=[1.0, 4.0], prefix_cache=["on", "off"],
                       manager=["kvchain", "fixed-pools"])
    rows = [{**r, "requests_total": 200, "requests_finished": 200} for r in rows]
    table = sweep_table(rows)
    # by hand: cells manager 11 (fixed-pools) + rate 5 (scale) + prefix 6 + done 7
    # (200/200) + req/s 5 + tok/s 5 + TTFT 8 (11,504.1) + TPOT 5 + hit 4 = 56, and a
    # blank, the box's (blank) rule and a blank between each of the 9 columns:
    # 56 + 8 x 3 = 80 (with the old one-line headers 'rate_scale' and 'prefix_cache', 11
    # more, and 4 for the edges: 95 > 80)
    assert table_width(table) == 80
    console = Console(width=80, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "…" not in text
    # the last columns whole on every line: TPOT 213.8 ms and the hit rate 3.37 %
    assert text.count("213.8   3.37") == 8, text
    assert "fixed-pools" in text and "11,504.1" in text and "200/200" in text


def test_print_whole_prints_a_table_wider_than_the_console_uncut():
    """Six settings vary: no layout fits 80 columns. rich would crop the columns past the
    console's edge (the sibling: a plain print loses the hit column); print_whole prints
    the table at its own width, every cell whole."""
    from rich.console import Console

    from kvchain.report.sweep import print_whole, sweep_table, table_width

    rows = _sweep_rows(gpu=["h100", "h200"], trace=["mooncake", "azure-code"],
                       mem_fraction=[0.8, 0.9], prefix_cache=["on", "off"],
                       rate_scale=[1.0, 4.0], manager=["kvchain", "fixed-pools"])
    table = sweep_table(rows)
    assert table_width(table) > 80
    plain = Console(width=80, record=True, color_system=None)
    plain.print(table)
    assert "213.8   3.37" not in plain.export_text()  # the planted cut: columns lost
    whole = Console(width=80, record=True, color_system=None)
    print_whole(whole, table)
    text = whole.export_text()
    assert text.count("213.8   3.37") == len(rows) == 64
    assert max(len(line) for line in text.splitlines()) == table_width(table)


def test_slo_table_over_the_prefix_cache_prints_whole():
    """`--slo --prefix-caches on,off` with two managers and --target-rate: the one-line
    'prefix_cache' header made the table 88 columns and rich cropped the last manager's
    GPUs at 80. By hand now: prefix 6 + kvchain 7 x 3 + fixed-pools 11 x 3 = 60, two
    blanks and a rule between the 7 columns (18) and a blank and an edge each side (4):
    82, printed whole by print_whole."""
    from rich.console import Console

    from kvchain.report.sweep import print_whole, slo_table, table_width

    base = {"model": "gpt-oss-120b", "gpu": "h200", "tp": 1, "trace": "mooncake",
            "mem_fraction": 0.9, "slo": "ttft_p99<=2000ms", "max_rate_scale": 6.24,
            "max_rate_rps": 20.36, "fail_rate_scale": 6.3, "gpus_needed": 1}
    rows = [{**base, "prefix_cache": pc, "manager": m}
            for pc in ("on", "off") for m in ("kvchain", "fixed-pools")]
    table = slo_table(rows, 20.0)
    assert table.columns[0].header == "prefix\ncache"
    assert table_width(table) == 82
    console = Console(width=80, record=True, color_system=None)
    print_whole(console, table)
    lines = console.export_text().splitlines()
    # both configurations: kvchain and fixed-pools rate, scale and GPUs, all six cells
    assert sum(line.split() == [pc, "20.36", "6.24", "1", "20.36", "6.24", "1"]
               for line in lines for pc in ("on", "off")) == 2


def test_sweep_table_title_names_a_shared_prefix_cache_setting():
    # A sweep run only with --prefix-caches off says so in the title (it is no column).
    from kvchain.report.sweep import sweep_table

    rows = [{"model": "m", "gpu": "h200", "tp": 1, "trace": "mooncake", "manager": "kvchain",
             "prefix_cache": "off", "rate_scale": r, "requests_finished": 1,
             "requests_total": 1} for r in (1.0, 2.0)]
    assert sweep_table(rows).title == ("sweep: model=m, gpu=h200, tp=1, trace=mooncake, "
                                       "manager=kvchain, prefix_cache=off")


def test_slo_table_says_what_was_measured_where_the_slo_is_not_met():
    """A 'not met' cell had no numbers; the table now gives the lowest scale searched and
    the caption the targets' values measured there (by hand: 3.2 s and 41.0 ms)."""
    from rich.console import Console

    from kvchain.report.sweep import not_met_lines, slo_table

    row = {"model": "gpt-oss-120b", "gpu": "h100", "tp": 1, "trace": "azure-conv",
           "mem_fraction": 0.9, "prefix_cache": "auto", "manager": "kvchain",
           "slo": "ttft_p99<=2000ms",
           "max_rate_scale": None, "max_rate_rps": None, "fail_rate_scale": 0.25,
           "fail_rate_rps": 1.3125, "at_best_ttft_p99_s": None, "at_fail_ttft_p99_s": 3.2,
           "at_fail_tpot_p99_s": 0.041}
    assert not_met_lines([row]) == [
        "not met, kvchain, gpt-oss-120b, h100, azure-conv: at rate scale 0.25 (1.31 req/s) "
        "ttft_p99 3.20 s, tpot_p99 41.0 ms"]
    console = Console(record=True, width=80, color_system=None)
    console.print(slo_table([row], None))
    text = " ".join(console.export_text().split())
    assert "not met <0.25" in text and "ttft_p99 3.20 s" in text
    # the default prefix-cache setting stays out of the title, as in the sweep table
    assert "prefix_cache" not in text


def test_sweep_takes_simulates_run_options_and_says_what_it_chose(tmp_path):
    """sweep had no --reserve, --policy, --clock or --buffer-bytes; now every run option of
    simulate applies to every point, enters the rows (away from its default) and the
    table's title, and the axes left at their defaults are named on stderr."""
    import json

    out = tmp_path / "s"
    result = runner.invoke(app, ["sweep", "--out", str(out), "--requests", "5",
                                 "--managers", "kvchain", "--reserve", "full",
                                 "--clock", "steps", "--buffer-bytes", "2000000000",
                                 "--workers", "1", "--no-plots"])
    assert result.exit_code == 0, result.output
    row = json.loads((out / "sweep.jsonl").read_text().splitlines()[0])
    assert (row["reserve"], row["clock"], row["buffer_bytes"]) == ("full", "steps",
                                                                   2_000_000_000)
    assert row["requests"] == 5 and "policy" not in row  # defaults stay out of the row
    assert "reserve=full" in result.stdout and "clock=steps" in result.stdout
    note = " ".join(result.stderr.split())
    assert "note: chosen for this sweep: models gpt-oss-120b, gpus h200, tp 1," in note
    assert "traces azure-conv" in note and "managers" not in note
    assert "all requests of each trace" not in note


def test_sweep_warns_of_cache_aware_order_where_the_cache_is_off(tmp_path):
    """simulate warned that --policy cache-aware has no effect with the prefix cache off;
    sweep ran it silently. Now each inert option is warned once, naming the configurations
    it is inert on: here the default trace, azure-conv, has no content keys, so the cache is
    off (auto) on gpt-oss-120b and the order is FCFS."""
    out = tmp_path / "s"
    result = runner.invoke(app, ["sweep", "--out", str(out), "--requests", "4",
                                 "--managers", "kvchain", "--policy", "cache-aware",
                                 "--rate-scales", "1,2", "--workers", "1", "--no-plots"])
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    assert err.count("warning: --policy cache-aware") == 1  # once for both rate scales
    assert "the order is FCFS (gpt-oss-120b/azure-conv)" in err
    # the sibling: with a cache that is on (mooncake has keys), no warning
    result = runner.invoke(app, ["sweep", "--out", str(tmp_path / "m"), "--requests", "4",
                                 "--managers", "kvchain", "--policy", "cache-aware",
                                 "--traces", "mooncake", "--workers", "1", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "cache-aware" not in result.stderr


def test_sweep_title_names_only_options_every_point_shares():
    """Regression: a sweep over h100 and h200 titled itself with the h100 row's
    buffer_bytes (8579324160) though the h200 rows carry 67289933312. A figure that
    differs between points is not in the title; one every point shares is, with thousands
    separators."""
    from kvchain.report.sweep import sweep_table

    rows = [{**r, "buffer_bytes": 8_579_324_160 if r["gpu"] == "h100" else 67_289_933_312}
            for r in _sweep_rows(gpu=["h100", "h200"])]
    assert sweep_table(rows).title == ("sweep: model=gpt-oss-120b, tp=1, trace=mooncake, "
                                       "manager=kvchain")
    same = [{**r, "buffer_bytes": 67_289_933_312} for r in _sweep_rows(rate_scale=[1.0, 2.0])]
    assert sweep_table(same).title == ("sweep: model=gpt-oss-120b, gpu=h200, tp=1, "
                                       "trace=mooncake, manager=kvchain, "
                                       "buffer_bytes=67,289,933,312")


def test_sweep_ray_without_ray_keeps_the_finished_sweep(tmp_path, monkeypatch):
    # Regression: `--ray` without ray installed cleared sweep.jsonl (4 finished points here)
    # before it failed on the import, so a re-run without --resume lost them.
    import builtins

    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    assert runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(out), "--workers",
                               "1", "--no-plots"]).exit_code == 0
    before = (out / "sweep.jsonl").read_text()
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    result = runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(out), "--ray"])
    assert result.exit_code == 2
    assert "--ray needs the optional ray package" in result.output
    assert (out / "sweep.jsonl").read_text() == before
