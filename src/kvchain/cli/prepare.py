"""The setup ``kvchain simulate`` and ``kvchain compare`` share before they run: resolve
the run options, load the model, GPU and trace, build and check the simulation, and say
what the run chose (notes and warnings on stderr)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvchain.cli.common import (
    fail,
    load_spec,
    note,
    note_defaults,
    prepare_out_dir,
    warn,
    warn_buffer,
)
from kvchain.cli.run_options import GivenOptions, chosen_note, inert_warnings
from kvchain.errors import KVChainError
from kvchain.gpu import GPUSpec, get_gpu
from kvchain.layout import ChainLayout
from kvchain.model.spec import ModelSpec
from kvchain.sim.cost import ClockKind, GPUCostModel
from kvchain.sim.engine import SimConfig
from kvchain.sim.run_options import ResolvedRun, RunOptions, check_values, resolve_run
from kvchain.sim.traces import Trace


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A run ready to simulate: what :func:`prepare_run` resolved and built."""

    resolved: ResolvedRun
    model: ModelSpec
    gpu: GPUSpec
    trace: Trace
    config: SimConfig
    layout: ChainLayout

    @property
    def options(self) -> RunOptions:
        """The run options (the demo's where no trace was named)."""
        return self.resolved.options


def prepare_run(*, model: str, config: Path | None, spec: Path | None, gpu: str, tp: int,
                trace: str | None, given: GivenOptions, out: Path | None,
                writes: Sequence[str] = ()) -> PreparedRun:
    """Check ``tp``, resolve the options (:func:`kvchain.sim.run_options.resolve_run`),
    load the model, GPU and trace, build the :class:`SimConfig` and its layout, check the
    prefix-cache settings and that the cost model can price the model (roofline clock),
    prepare ``out`` for the files ``writes`` names
    (:func:`~kvchain.cli.common.prepare_out_dir`); then print the chosen-settings note, the
    buffer warning, the defaulted config fields and the options this run cannot act on
    (stderr).

    Exits 2 (:func:`kvchain.cli.common.fail`) on any typed error, before anything ran.
    """
    try:
        check_values(tp=tp)
        resolved = resolve_run(trace, given.values)
        run = resolved.options
        model_spec = load_spec(model, config, spec_file=spec, tp=tp,
                               kv_dtype=run.kv_dtype, state_dtype=run.state_dtype,
                               weight_format=run.weight_format,
                               draft_model=run.draft_model)
        gpu_spec = get_gpu(gpu)
        tr = run.load_trace(resolved.trace)
        sim_config = SimConfig.of(run, model_spec, gpu_spec, tr)
        layout = sim_config.layout()
        sim_config.check_cache(layout)
        if run.clock is ClockKind.ROOFLINE:
            GPUCostModel(model_spec, gpu_spec)  # a model it cannot price fails here, typed
        prepare_out_dir(out, writes)
    except KVChainError as exc:
        fail(exc)
    chosen = chosen_note(resolved, given, tr, layout)
    if chosen is not None:
        note(chosen)
    warn_buffer(model_spec, gpu_spec, run.buffer_bytes, spec_file=spec,
                reads_weights=run.clock is ClockKind.ROOFLINE)
    note_defaults(model_spec, config)
    for message in inert_warnings(run, given, sim_config.cache_on(layout), layout):
        warn(message)
    return PreparedRun(resolved, model_spec, gpu_spec, tr, sim_config, layout)
