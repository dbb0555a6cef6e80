"""What a newcomer meets: plain flags, --version, errors naming the flag, hints and
warnings, and tables that fit 80 columns without cutting names."""

from __future__ import annotations

from .helpers import flat, run, spec_file


def fits_80(text: str) -> None:
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text  # rich's ellipsis: something was cut


def generic_trace(tmp_path, count: int, output: int):
    """``count`` requests of 100 prompt tokens, arriving 10 ms apart."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{i / 100},100,{output}\n" for i in range(count)))
    return path



def test_flags_are_plain_flags():
    help_text = run("plan", "--help").output
    assert "--json" in help_text and "<bool>" not in help_text
    assert run("plan", "--json", "true").exit_code == 2  # no value after a flag
    assert run("models", "--json").exit_code == 0


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.output.startswith("kvchain ")


def test_errors_name_the_flag(tmp_path):
    cases = [(("simulate", "--requests", "0"), "--requests must be >= 1, got 0"),
             (("simulate", "--rate-scale", "0"), "--rate-scale must be a finite number > 0"),
             (("compare", "--page-size", "0"), "--page-size must be >= 1, got 0"),
             (("plan", "--slots-held", "-1"), "--slots-held must be >= 0, got -1"),
             (("simulate", "--step-ms", "0"), "--step-ms must be a finite number > 0"),
             (("replay", "--generate", "full", "--ops", "-5", "-o", str(tmp_path / "s")),
              "--ops must be >= 0, got -5"),
             (("replay", "--generate", "full", "--page-size", "0", "-o",
               str(tmp_path / "s")), "--page-size must be >= 1, got 0")]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert message in flat(result.output)


def test_no_room_for_a_buffer_suggests_tp_and_buffer_bytes():
    # Qwen3-Next-80B: 159 GB of bf16 weights on an 80 GB A100
    result = run("plan", "--model", "qwen3-next-80b-a3b", "--gpu", "a100")
    assert result.exit_code == 2
    text = flat(result.output)
    assert "no room for a KV buffer" in text and "--tp N" in text and "--buffer-bytes" in text


def test_buffer_larger_than_the_gpu_is_warned():
    # H200 143,771 MiB = 150,754,820,096 B - gpt-oss-120b's 65,168,179,200 B of weights
    # = 85,586,640,896 B
    result = run("plan", "--buffer-bytes", "90000000000")
    assert result.exit_code == 0
    assert "more than H200-SXM-141GB's 150,754,820,096 B minus 65,168,179,200 B of weights " \
           "(85,586,640,896 B)" in flat(result.output)
    assert "warning" not in run("plan", "--buffer-bytes", "85000000000").output


def test_spec_file_without_weights_says_so(tmp_path):
    result = run("plan", "--spec", str(spec_file(tmp_path)))
    assert result.exit_code == 0
    assert "declares no weights" in flat(result.output)
    weighted = spec_file(tmp_path, weight_bytes=10**9)
    assert "declares no weights" not in run("plan", "--spec", str(weighted)).output
    # the roofline cannot price a model without weights: a typed error that says why
    refused = run("simulate", "--spec", str(spec_file(tmp_path)), "--requests", "2")
    assert refused.exit_code == 2 and "--clock steps" in flat(refused.output)


def test_overloaded_run_ends_with_a_hint(tmp_path):
    """30 requests within 0.29 s, 100 outputs each, one at a time (--max-running 1) on
    30 ms ticks: about 30 x 100 x 0.03 = 90 s of serving > 2 x 0.29 s and 0.29 + 60 s."""
    args = ("simulate", "--spec", str(spec_file(tmp_path)), "--trace",
            str(generic_trace(tmp_path, 30, 100)), "--clock", "steps",
            "--buffer-bytes", "50000000")
    result = run(*args, "--max-running", "1")
    assert result.exit_code == 0, result.output
    assert "hint: overloaded" in flat(result.output) and "--rate-scale" in result.output
    # all 30 at once: 101 ticks = 3.0 s, within the slack: no hint
    assert "hint" not in run(*args).output


def test_simulate_and_compare_fit_80_columns(tmp_path):
    # 1,000,000 B = 62 pages of 16,000 B; a request of 105 tokens peaks at 7 full + 5
    # window pages, so about 5 of the 20 run at once and memory blocks the queue.
    common = ("--spec", str(spec_file(tmp_path)), "--trace",
              str(generic_trace(tmp_path, 20, 5)), "--clock", "steps",
              "--buffer-bytes", "1000000")
    sim = run("simulate", *common)
    assert sim.exit_code == 0, sim.output
    fits_80(sim.output)
    assert "max pages" in sim.output
    out = tmp_path / "cmp"
    result = run("compare", *common, "--out", str(out))
    assert result.exit_code == 0, result.output
    fits_80(result.output)
    header = next(line for line in result.output.splitlines() if "fixed-pools" in line)
    assert header.split()[-4:] == ["kvchain", "fixed-pools", "equal-page", "ideal"]
    assert "mem-blocked U* (%)" in result.output
    assert f"wrote {out / 'compare.json'}, {out / 'compare.png'}" in flat(result.output)
    assert (out / "compare.png").stat().st_size > 0


def test_replay_fits_80_columns(tmp_path):
    stream = tmp_path / "ops.jsonl"
    assert run("replay", "--generate", "all", "--ops", "30", "-o", str(stream)).exit_code == 0
    result = run("replay", str(stream))
    assert result.exit_code == 0, result.output
    fits_80(result.output)
    assert "state|window|full" in result.output  # the longest shape name, whole


def test_replay_of_a_10000_op_section_fits_80_columns(tmp_path):
    """The README's replay (10,000 ops per section) cut the diverged and ops/s columns to
    'diverg…' at 80 columns: the op counts (10,000) and rates widen the numbers past the
    30-op case above. Every header and count must show whole."""
    stream = tmp_path / "ops.jsonl"
    args = ("replay", "--generate", "state|window|full", "--ops", "10000", "--seed", "7")
    assert run(*args, "-o", str(stream)).exit_code == 0
    result = run("replay", str(stream))
    assert result.exit_code == 0, result.output
    fits_80(result.output)
    for header in ("diverged", "violations", "kops/s", "10,000"):
        assert header in result.output
