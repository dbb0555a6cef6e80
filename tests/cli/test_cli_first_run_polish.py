"""Rough edges a fresh user met in the README's commands: rejected requests explained on
screen, ``compare --wide`` cells whole, the run's chosen-settings note in plain words, and
errors naming the flags and trace columns a user knows."""

from __future__ import annotations

from .helpers import flat, run, spec_file


def rejecting_trace(tmp_path):
    """Six requests 10 ms apart, 10 output tokens each; requests 2 and 4 have 5,000-token
    prompts and request 5 a 9,000-token one; the others 100 tokens."""
    path = tmp_path / "t.csv"
    prompts = [100, 100, 5_000, 100, 5_000, 9_000]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{i / 100},{p},10\n" for i, p in enumerate(prompts)))
    return path


def test_rejected_requests_are_explained_on_stderr(tmp_path):
    """A 2,000,000 B buffer has 1,984,000 B free on the empty chain (one 16-token page of
    1,000 B/token is the null page). Request 2 peaks at 5,010 tokens: full band
    ceil(5,010 / 16) = 314 pages = 5,024 tokens, window 64 tokens straddling pages = 5 pages
    = 80 tokens; (5,024 + 80) x 1,000 = 5,104,000 B > 1,984,000 B: rejected, and so are 4
    (same figures) and 5 (9,104,000 B): one kind of reason, three requests, the first is 2.
    Before, only requests.csv said why."""
    args = ("--spec", str(spec_file(tmp_path)), "--trace", str(rejecting_trace(tmp_path)),
            "--clock", "steps", "--buffer-bytes", "2000000")
    result = run("simulate", *args)
    assert result.exit_code == 0, result.output
    err = flat(result.stderr)
    assert ("note: 3 requests rejected: needs 5,104,000 B of pages at its peak, which can "
            "never fit on the empty chain (1,984,000 B free)") in err, err
    # the policy's name is no longer read into the sentence ("which none admission ...")
    assert "none admission" not in err and "joint admission" not in err
    assert "(first: request 2; the others' figures differ)" in err
    assert err.count("requests rejected:") == 1  # one line per kind of reason
    # the figures once: the reason used to repeat them ("...: it needs 5,104,000 B of pages
    # and joint admission fits at most the 1,984,000 B free")
    assert err.count("5,104,000") == 1 and "fits at most" not in err, err
    compared = run("compare", *args, "--managers", "kvchain,fixed-pools")
    assert compared.exit_code == 0, compared.output
    err = flat(compared.stderr)
    for manager in ("kvchain", "fixed-pools"):
        assert (f"note: {manager}: 3 requests rejected: needs 5,104,000 B of pages") in err


def test_rejection_notes_group_reasons_by_kind():
    """Reasons equal but for their figures are one line; a different wording is another."""
    from kvchain.cli.common import rejection_notes

    notes = rejection_notes([(7, "needs 10 B"), (9, "needs 10 B"), (3, "past the context"),
                             (11, "needs 2,000 B")])
    assert notes == ["3 requests rejected: needs 10 B (first: request 7; the others' "
                     "figures differ)", "1 request rejected: past the context (first: "
                     "request 3)"]
    assert rejection_notes([(1, "needs 10 B"), (2, "needs 10 B")]) == [
        "2 requests rejected: needs 10 B (first: request 1)"]
    assert rejection_notes([]) == []


def test_compare_wide_prints_whole_cells(tmp_path):
    """``compare --wide`` at 80 columns: four value columns and long labels need more than 80,
    and rich used to cut every value to "…"; now the table is printed at its own width (a
    terminal wraps it) with every cell whole. The narrow table still fits 80 columns."""
    args = ("compare", "--spec", str(spec_file(tmp_path)), "--trace",
            str(rejecting_trace(tmp_path)), "--clock", "steps", "--buffer-bytes", "2000000")
    wide = run(*args, "--wide")
    assert wide.exit_code == 0, wide.output
    assert "…" not in wide.stdout, wide.stdout
    assert "requests (finished / total)" in wide.stdout
    # 3 of the 6 requests finish (the three 100-token ones), for each of the four managers
    row = next(line for line in wide.stdout.splitlines() if "finished / total" in line)
    assert row.count("3 / 6") == 4, row
    narrow = run(*args)
    assert narrow.exit_code == 0 and "…" not in narrow.stdout
    assert max(len(line.rstrip()) for line in narrow.stdout.splitlines()) <= 80


def test_chosen_note_names_the_poisson_rate_and_seed(tmp_path):
    """sharegpt has no arrival times: they are a Poisson process at 5.53 requests/s
    (traces.DEFAULT_POISSON_RATE_RPS) x --rate-scale, with --seed. Before, the note said
    "its own arrival rate (--rate-scale 1)", which names neither."""
    base = ("simulate", "--spec", str(spec_file(tmp_path)), "--trace", "sharegpt",
            "--requests", "3", "--clock", "steps", "--buffer-bytes", "50000000")
    err = flat(run(*base).stderr)
    assert ("Poisson arrivals at 5.53 requests/s, seed 0 (the trace has no arrival times; "
            "--rate-scale, --seed)") in err, err
    assert "its own arrival rate" not in err
    # 5.53 x 2 = 11.06 requests/s; the seed as given
    err = flat(run(*base, "--rate-scale", "2", "--seed", "7").stderr)
    assert "Poisson arrivals" not in err  # both said: nothing chosen
    err = flat(run(*base, "--seed", "7").stderr)
    assert "Poisson arrivals at 5.53 requests/s, seed 7" in err
    err = flat(run(*base, "--rate-scale", "2").stderr)
    assert "Poisson arrivals at 11.06 requests/s, seed 0" in err


def test_chosen_note_says_the_cache_is_off_plainly(tmp_path):
    """A trace without content keys: the auto prefix cache is off, said plainly, and no
    cache points are named for a cache that does not run; with keys (mooncake) it is on
    and its cache points follow."""
    err = flat(run("simulate", "--spec", str(spec_file(tmp_path)), "--trace",
                   str(rejecting_trace(tmp_path)), "--clock", "steps",
                   "--buffer-bytes", "2000000").stderr)
    assert "prefix cache off (auto: the trace has no content keys)" in err, err
    assert "cache points" not in err and "on when the trace has content keys" not in err
    err = flat(run("simulate", "--spec", str(spec_file(tmp_path)), "--trace", "mooncake",
                   "--requests", "2", "--clock", "steps", "--buffer-bytes", "50000000").stderr)
    assert ("prefix cache on (auto: the trace has content keys; --no-prefix-cache), "
            "cache points auto:") in err, err


def test_errors_use_the_flags_and_trace_columns_users_know(tmp_path):
    """Before: ``prefix_cache=True: ... (prefix_block_ids)`` (the library's names), Python
    tuple and list reprs of the known names, and ``bound by: kv_bytes``."""
    cached = run("simulate", "--spec", str(spec_file(tmp_path)), "--trace", "azure-code",
                 "--requests", "3", "--clock", "steps", "--prefix-cache")
    assert cached.exit_code == 2
    err = flat(cached.stderr)
    assert ("error: --prefix-cache: trace 'azure-code' carries no content keys (no request "
            "has hash_ids), so no prompt could hit; run it without --prefix-cache") in err, err
    assert "prefix_cache=True" not in err and "prefix_block_ids" not in err
    slo = flat(run("sweep", "--out", str(tmp_path / "s"), "--slo", "nope=1s").stderr)
    assert ("SLO metric 'nope' unknown; known: ttft_p50, ttft_p90, ttft_p99, tpot_p50, "
            "tpot_p90, tpot_p99, e2e_p50, e2e_p90, e2e_p99, queueing_p50, queueing_p90, "
            "queueing_p99") in slo, slo
    managers = flat(run("sweep", "--out", str(tmp_path / "s"), "--managers", "nope").stderr)
    assert "unknown managers nope; known: equal-page, fixed-pools, ideal, kvchain" in managers
    compared = flat(run("compare", "--managers", "nope", columns=200).stderr)
    assert "managers must be among kvchain, fixed-pools, equal-page, ideal; got 'nope'" \
        in compared, compared


def test_plan_says_what_bounds_the_longest_request_in_words():
    """gpt-oss-20b on an H100 with a 2,000,000,000 B buffer: its full-attention layers
    (12 of 24, 8 KV heads x 64 dims, K and V in bf16: 12 x 2 x 8 x 64 x 2 = 24,576 B/token)
    alone fill 2e9 B within 2e9 / 24,576 = 81,380 tokens, under its 131,072-token context,
    so the buffer binds for both layouts."""
    out = flat(run("plan", "--model", "gpt-oss-20b", "--gpu", "h100", "--buffer-bytes",
                   "2000000000").stdout)
    assert ("longest lone request bound by: the KV buffer (chain), the KV buffer (fixed "
            "pools)") in out, out
    assert "kv_bytes" not in out


def test_readme_and_help_say_what_max_tokens_and_a_weightless_spec_need(tmp_path):
    """``max_tokens`` below ``output_tokens`` is refused, so it is not an output cap: it is
    the client's output limit, which admission reserves against while the request stops
    at ``output_tokens``; a spec without weights is refused unless ``--clock steps``
    (the README read as if that clock were chosen for it)."""
    from pathlib import Path

    readme = flat((Path(__file__).parents[2] / "README.md").read_text())
    assert "per-request output cap" not in readme
    assert ("optional `max_tokens` (the output limit the client asked for, tokens, >= "
            "`output_tokens`: admission reserves pages up to it, the request stops after "
            "`output_tokens`)") in readme
    assert "a spec without weights needs `--clock steps`" in readme
    help_text = flat(run("simulate", "--help", columns=120).stdout)
    assert "per-request output cap" not in help_text
    assert "max_tokens: optional output limit the client asked for" in help_text
    refused = run("simulate", "--spec", str(spec_file(tmp_path)), "--requests", "2")
    assert refused.exit_code == 2 and "--clock steps" in flat(refused.stderr)
