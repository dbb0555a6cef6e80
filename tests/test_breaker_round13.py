"""A breaker's finds of round 13 at the entry points refactored that round, each refused
with a typed error that changes nothing, beside a sibling where the good input works."""

from __future__ import annotations

import numpy as np
import pytest
from tests.buffer.host_fixtures import FULL_BAND, LAYOUT
from typer.testing import CliRunner

from kvchain.buffer import NumpyBuffer
from kvchain.cache.points import resend_point
from kvchain.catalog.loader import load_model
from kvchain.cli import _load_commands, app
from kvchain.errors import BufferArgumentError, ConfigError, InvalidRequestError
from kvchain.gpu import get_gpu
from kvchain.model.declared import declare_model
from kvchain.sim.engine import SimConfig
from kvchain.sim.run_options import RunOptions
from kvchain.sim.traces import load_trace

runner = CliRunner()
_load_commands()


@pytest.mark.parametrize("page", [2**63, np.uint64(2**63), np.uint64(2**64 - 1), 2**100, -1])
def test_a_page_index_past_int64_is_outside_the_grid(page):
    """Before: OverflowError converting 2**63 to an int64 array."""
    buf = NumpyBuffer(LAYOUT.buffer_bytes)
    with pytest.raises(BufferArgumentError, match="outside the"):
        buf.read_page(FULL_BAND, page)


def test_the_last_page_of_the_grid_reads():
    buf = NumpyBuffer(LAYOUT.buffer_bytes)
    last = (LAYOUT.buffer_bytes - FULL_BAND.grid_base) // FULL_BAND.page_bytes - 1
    assert buf.read_page(FULL_BAND, np.uint64(last)).nbytes == FULL_BAND.page_bytes
    with pytest.raises(BufferArgumentError, match="outside the"):
        buf.read_page(FULL_BAND, last + 1)


@pytest.mark.parametrize("whole", [np.uint64(2**60), np.int64(2**60), 2**60])
def test_resend_point_refuses_numpy_pages_past_the_prompt(whole):
    """Before: NumPy's product 2**60 x 16 wrapped to 0 and the answer was 0 pages."""
    with pytest.raises(InvalidRequestError, match="whole pages"):
        resend_point(16, whole, 5)


@pytest.mark.parametrize("page_size", [0, -16, True, 16.0, np.uint64(2**62) + np.uint64(1)])
def test_resend_point_checks_the_page_size(page_size):
    if isinstance(page_size, np.unsignedinteger):  # huge: no page of the prompt is whole
        assert resend_point(page_size, 0, 100) == 0
        return
    with pytest.raises(InvalidRequestError, match="page_size"):
        resend_point(page_size, 1, 16)


def test_resend_point_by_hand():
    # P = 16: 63 keyed pages of a 1,008-token prompt resume at 62 pages, of 1,009 at 63
    assert resend_point(16, 63, 1_008) == 62
    assert resend_point(np.int64(16), np.uint64(63), np.int32(1_009)) == 63


def _run_inputs():
    return load_model("gpt-oss-120b"), get_gpu("h200"), load_trace("azure-conv", first=2)


@pytest.mark.parametrize("options", [None, {}, "x", 3])
def test_sim_config_of_refuses_what_is_not_run_options(options):
    with pytest.raises(ConfigError, match="RunOptions"):
        SimConfig.of(options, *_run_inputs())


def test_sim_config_of_run_options_carries_them():
    cfg = SimConfig.of(RunOptions(page_size=32, seed=7), *_run_inputs())
    assert (cfg.page_size, cfg.seed) == (32, 7)


@pytest.mark.parametrize("samples", [-1, 0, 5, 6.0, True])
def test_sim_config_refuses_too_few_step_samples_at_construction(samples):
    """Before: constructed, then ``simulate`` refused it."""
    with pytest.raises(ConfigError, match="max_step_samples"):
        SimConfig(*_run_inputs(), max_step_samples=samples)


def test_sim_config_takes_six_step_samples():
    assert SimConfig(*_run_inputs(), max_step_samples=6).max_step_samples == 6


@pytest.mark.parametrize("entry", [{1024: 0, 128: 0}, {1024, 128}, frozenset({1024, 128})])
def test_declare_model_refuses_a_dict_or_set_as_a_class(entry):
    """Before: a dict built a class from its keys, a set in its iteration order."""
    with pytest.raises(ConfigError, match="positive int bytes"):
        declare_model("m", full=1, windows=[entry])


def test_declare_model_takes_tuples_and_lists():
    spec = declare_model("m", full=1, windows=[(1024, 128), [512, 64]])
    assert sorted(c.window for c in spec.classes if c.window) == [64, 128]


def test_simulate_refuses_an_output_name_taken_by_a_folder_before_the_run(tmp_path):
    """Before: IsADirectoryError after the whole run (or metrics.json written and then
    the crash on requests.csv)."""
    out = tmp_path / "S"
    (out / "requests.csv").mkdir(parents=True)
    result = runner.invoke(app, ["simulate", "--requests", "5", "--out", str(out), "--json"])
    assert result.exit_code == 2, result.output
    assert "requests.csv" in result.stderr and "not a file" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv"]
    assert result.stdout == ""


def test_simulate_replaces_an_output_file(tmp_path):
    out = tmp_path / "S"
    out.mkdir()
    (out / "requests.csv").write_text("old\n")
    result = runner.invoke(app, ["simulate", "--requests", "5", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert (out / "requests.csv").read_text().startswith("request_id")
    assert (out / "metrics.json").is_file()
