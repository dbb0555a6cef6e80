"""The overload hint suggests the fix for what bound: more KV memory only when memory
refused admission (it said "give the KV cache more memory" on a run whose 108.9 GB buffer
never refused anyone: the arrivals outran the compute)."""

from __future__ import annotations

from .helpers import flat, run, spec_file

MORE_MEMORY = "give the KV cache more memory (--buffer-bytes, --mem-fraction)"
COMPUTE = "the arrival rate is above what the GPU computes (memory never refused admission)"


def _trace(tmp_path, count: int, output: int):
    """``count`` requests of 100 prompt tokens and ``output`` output tokens, 10 ms apart
    (the trace spans (count - 1) x 0.01 s)."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{i / 100},100,{output}\n" for i in range(count)))
    return str(path)


def test_compute_bound_overload_does_not_suggest_memory(tmp_path):
    """--max-running 1 on a 50 MB buffer (a request peaks near 200 x 1,000 + 64 x 1,000 B):
    one at a time by the batch limit, memory never refuses; 30 x 100 ticks x 30 ms = 90 s
    of serving > 0.29 + 60 s: overloaded, and the hint blames the rate."""
    result = run("simulate", "--spec", str(spec_file(tmp_path)), "--trace",
                 _trace(tmp_path, 30, 100), "--clock", "steps", "--buffer-bytes", "50000000",
                 "--max-running", "1", "--json")
    assert result.exit_code == 0, result.output
    said = flat(result.stderr)
    assert COMPUTE in said and MORE_MEMORY not in said


def test_memory_bound_overload_suggests_more_memory(tmp_path):
    """A 1,000,000 B buffer: a request of 100 + 100 tokens peaks at 13 full pages of
    16,000 B + the window's 5 = 288,000 B, so about 3 run at once and memory refuses the
    head of the queue; 30 / 3 x 100 ticks x 100 ms = about 100 s > 0.29 + 60 s."""
    result = run("simulate", "--spec", str(spec_file(tmp_path)), "--trace",
                 _trace(tmp_path, 30, 100), "--clock", "steps", "--step-ms", "100",
                 "--buffer-bytes", "1000000", "--json")
    assert result.exit_code == 0, result.output
    said = flat(result.stderr)
    assert MORE_MEMORY in said and COMPUTE not in said
