"""SimConfig refuses fields of the wrong type where it is built (kvchain.field_types).

Before, ``SimConfig(page_size=16.5)`` and ``buffer_bytes=1.5e10`` ran until the layout's
array code raised a bare ``TypeError``; ``fast_forward="no"`` (a truthy string) ran the
fast-forward; ``cache_points="ends"`` and ``clock="steps"`` (strings where the engine
compares enum members) were accepted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvchain.baselines import ManagerKind
from kvchain.cache.radix import ResumePolicy
from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sched.admission import ReserveConfig
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim.compare import compare_managers
from kvchain.sim.cost import ClockKind
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import load_trace

MODEL = load_model("gpt-oss-120b")
GPU = get_gpu("h200")
TRACE = load_trace("azure-conv", first=2)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"page_size": 16.5}, "page_size must be of type int, got 16.5 (float)"),
    ({"page_size": True}, "page_size must be of type int, got True (bool)"),
    ({"buffer_bytes": 1.5e10}, "buffer_bytes must be of type int"),
    ({"mem_fraction": "0.9"}, "mem_fraction must be a number"),
    ({"clock": "steps"}, "clock must be a ClockKind"),
    ({"cache_points": "ends"}, "cache_points must be a ResumePolicy"),
    ({"fast_forward": "no"}, "fast_forward must be True or False, got 'no'"),
    ({"prefix_cache": 1}, "prefix_cache must be True or False"),
    ({"truncate": "yes"}, "truncate must be True or False"),
])
def test_wrong_types_are_refused_at_construction(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        SimConfig(MODEL, GPU, TRACE, **kwargs)
    assert needle in str(info.value), str(info.value)


def test_the_model_must_be_a_model_spec():
    with pytest.raises(ConfigError, match="model must be of type ModelSpec"):
        SimConfig("gpt-oss-120b", GPU, TRACE)  # type: ignore[arg-type]


def test_numpy_integers_are_refused_where_built():
    # Before: accepted, then the planner refused the run's first demand of np.int64 pages
    # with an InvalidDemandError mid-run.
    with pytest.raises(ConfigError, match="page_size must be of type int"):
        SimConfig(MODEL, GPU, TRACE, page_size=np.int64(32))
    with pytest.raises(ConfigError, match="buffer_bytes must be of type int"):
        SimConfig(MODEL, GPU, TRACE, buffer_bytes=np.int64(10**10))


def test_right_types_pass():
    # An int is a valid float (1 = the whole GPU); None is a valid optional buffer / cache
    # switch.
    cfg = SimConfig(MODEL, GPU, TRACE, page_size=32, mem_fraction=1,
                    buffer_bytes=None, prefix_cache=None, clock=ClockKind.STEPS,
                    cache_points=ResumePolicy.ENDS, fast_forward=False)
    assert cfg.page_size == 32 and cfg.mem_fraction == 1


@pytest.mark.parametrize(("kinds", "needle"), [
    ((), "names no manager"),
    (("kvchain",), "'kvchain' is not a ManagerKind"),
    ((ManagerKind.KVCHAIN, ManagerKind.IDEAL, ManagerKind.KVCHAIN), "kvchain named twice"),
])
def test_compare_managers_refuses_a_bad_list_before_running(kinds, needle):
    """Before, a repeated manager ran the same simulation twice and reported it once
    (``kvchain compare --managers kvchain,kvchain`` exited 0), while ``sweep`` refuses a
    repeated axis value; an empty list returned ``{}``."""
    with pytest.raises(ConfigError, match=needle):
        compare_managers(SimConfig(MODEL, GPU, TRACE), kinds)


@pytest.mark.parametrize(("build", "needle"), [
    # Before, all accepted: the string policy never equals a QueuePolicy member, so
    # "cache-aware" given as text ran FCFS; "no" for strict is truthy.
    (lambda: SchedulerConfig(policy="cache-aware"), "policy must be a QueuePolicy"),
    (lambda: SchedulerConfig(max_running=2.5), "max_running must be of type int"),
    (lambda: SchedulerConfig(strict="no"), "strict must be True or False"),
    (lambda: SchedulerConfig(reserve="full"), "reserve must be of type ReserveConfig"),
    (lambda: ReserveConfig(policy="full"), "policy must be a ReservePolicy"),
    (lambda: ReserveConfig(warmup=2.0), "warmup must be of type int"),
])
def test_scheduler_and_reserve_configs_check_their_types(build, needle):
    with pytest.raises(ConfigError, match=needle):
        build()


def test_the_scheduler_comes_from_the_options_unless_given():
    """SimConfig is a RunOptions (one declaration of every option). Without ``scheduler=``
    the limits are built from the options; the defaults give SchedulerConfig()'s own
    (max_running 256, chunk 8192, prefill budget max(8192, 8192) = 8192, FCFS, strict on,
    the adaptive reservation), as before the merge."""
    assert SimConfig(MODEL, GPU, TRACE).scheduler == SchedulerConfig()
    cfg = SimConfig(MODEL, GPU, TRACE, max_running=7, chunk_size=16_384)
    # max(16,384, 8,192) = 16,384 prefill tokens per step (PREFILL_TOKENS_FLOOR).
    assert (cfg.scheduler.max_running, cfg.scheduler.max_prefill_tokens) == (7, 16_384)
    # A copy with another page size keeps the limits the options and the scheduler share.
    assert replace(cfg, page_size=32).scheduler == cfg.scheduler


def test_a_scheduler_the_options_contradict_is_refused():
    # Sibling of the case above: the same max_running given next to a scheduler that says
    # otherwise is refused instead of one silently winning.
    with pytest.raises(ConfigError, match="given both as scheduler= and as options"):
        SimConfig(MODEL, GPU, TRACE, max_running=7, scheduler=SchedulerConfig())
    given = SchedulerConfig(max_running=7, strict=False)
    assert SimConfig(MODEL, GPU, TRACE, scheduler=given).scheduler is given
