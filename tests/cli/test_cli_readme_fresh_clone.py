"""What a fresh user read in the README from a clean clone: the torch install command
spelled out, speculative decoding and the host tier with a command each, the spec file's
several window sizes (README and --help), the default run's measured time, and the jet
example's outputs (it runs with --no-prefix-cache, so no hit_rate.png)."""

from __future__ import annotations

import re
from pathlib import Path

from .helpers import flat, run

README = (Path(__file__).parents[2] / "README.md").read_text()


def _section(title: str) -> str:
    """From the heading ``title`` to the next heading of its level or above."""
    start = README.index(title)
    level = title.split(" ")[0]
    ends = [README.find(f"\n{h} ", start + 1) for h in ("#" * n for n in range(2, len(level) + 1))]
    ends = [e for e in ends if e != -1]
    return README[start:min(ends) if ends else len(README)]


def test_setup_gives_the_torch_command_before_the_test_install():
    setup = _section("## Set-up")
    torch_at = setup.index("pip install torch==2.13.0\n")
    assert setup.index('pip install -e ".[test]" && pytest', torch_at) > torch_at


def test_spec_file_with_several_window_sizes_in_readme_and_help():
    text = flat(README)
    assert "several window sizes as `windows` / `locals`" in text
    for command in ("plan", "simulate", "compare"):
        help_text = flat(run(command, "--help", columns=200).stdout)
        assert "several window sizes as windows / locals" in help_text, command


def test_speculative_and_host_tier_commands_are_in_the_readme_and_run():
    section = _section("### Speculative decoding and the host tier")
    commands = re.findall(r"^kvchain (.+)$", section, re.M)
    assert commands == ["simulate --spec-tokens 3 --spec-acceptance 0.7",
                        "plan --spec-tokens 3",
                        "plan --model Qwen3-8B --draft-model Qwen3-0.6B --spec-tokens 3",
                        "plan --host-bytes 274877906944",
                        "simulate --requests 200 --rate-scale 1 --buffer-bytes 4000000000 "
                        "--host-bytes 64000000000",
                        "simulate --trace azure-conv --rate-scale 4 --buffer-bytes 1000000000 "
                        "--requests 400 --reserve sglang --retract-to host "
                        "--host-bytes 68719476736"]
    assert "docs/prefix-cache.md" in section and "docs/design.md" in section
    assert "docs/host-tier.md" in section
    # the host-tier simulate runs in tests/sim/test_host_runs.py (the same slice)
    for args in commands[1:3]:
        result = run(*args.split())
        assert result.exit_code == 0, result.output
    assert "docs/prefix-cache.md" in _section("## Where things are")


def test_default_run_time_and_jet_outputs_are_stated_honestly():
    text = flat(README)
    assert "15-30 s" not in text and "about 6 s on one core" in text
    # the jet example runs with --no-prefix-cache: hit_rate.png is not among its outputs
    assert "`requests.csv`, `hit_rate.png`" not in text
    assert "a run with the prefix cache on (the default run's `--out`, not this one: " \
           "`--no-prefix-cache`) adds `hit_rate.png`" in text
