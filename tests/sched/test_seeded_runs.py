"""Seeded random workloads on every chain shape, memory bound: admitted => allocatable over
thousands of admission decisions, audits after every step, no leak, determinism, and no
retraction in the step right after an admission."""

from __future__ import annotations

import hashlib
import random

import pytest

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import EventKind, Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

SHAPES = {
    "full": [declared_class(LC.FULL, 1_000)],
    "window": [declared_class(LC.WINDOW, 1_000, 64)],
    "window|full": [declared_class(LC.WINDOW, 1_000, 128), declared_class(LC.FULL, 1_000)],
    "local|full": [declared_class(LC.LOCAL, 1_000, 256), declared_class(LC.FULL, 1_000)],
    "state|full": [declared_class(LC.STATE, 48_000), declared_class(LC.FULL, 1_000)],
    "state|window|full": [declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 96),
                          declared_class(LC.FULL, 1_000)],
}


def run(shape: str, seed: int, gate_flips: bool = False) -> tuple[Scheduler, str]:
    layout = plan_layout(SHAPES[shape], 2_400_000, 16)
    chain = Chain(layout)
    sched = Scheduler(KVManager(chain), SchedulerConfig(max_prefill_tokens=512, chunk_size=256,
                                                        max_running=64))
    rng = random.Random(seed)
    now, rid, log = 0.0, 0, hashlib.sha256()
    admitted_last_step = False
    for step in range(40_000):
        for _ in range(rng.choice((0, 0, 1, 2))):
            if rid < 400:
                sched.add(Request(rid, rng.randint(1, 900), rng.randint(1, 250), now), now)
                rid += 1
        if gate_flips and step % 7 == 0:
            chain.set_move_gate(not chain.gate.open)
        scheduled = sched.schedule(now)
        if gate_flips and step % 5 == 0:
            chain.set_move_gate(False)  # a transfer starts between admission and allocation
        batch = sched.allocate(scheduled, now)
        now += 0.01
        stopped = frozenset(d.rid for d in batch.decodes if rng.random() < 0.01)
        sched.complete(batch, StepOutcome(0.01, stopped), now)
        sched.audit()
        events = sched.drain_events()
        kinds = {e.kind for e in events}
        if admitted_last_step and not gate_flips:
            assert EventKind.RETRACTED not in kinds, "retraction right after an admission"
        admitted_last_step = EventKind.ADMITTED in kinds
        for e in events:
            log.update(f"{e.kind}:{e.rid}:{e.time_s:.2f};".encode())
        if rid >= 400 and sched.idle:
            break
    assert sched.idle, "every request ends (finished, stopped or rejected)"
    bound = sum(chain.bound_pages(b) for b in range(len(layout.bands)))
    assert bound == sum(b.reserved_pages for b in layout.bands)  # only null pages remain
    return sched, log.hexdigest()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_admitted_is_allocatable_over_thousands_of_decisions(shape):
    sched, _ = run(shape, seed=11)
    c = sched.counters
    assert c.divergences == 0
    assert c.admission_decisions >= 5_000, c.admission_decisions
    assert c.finished + c.rejected == 400
    assert sched.kv.num_requests == 0  # nothing leaked: every page went back


@pytest.mark.parametrize("shape", ["window|full", "state|window|full"])
def test_gate_flips_never_break_an_admitted_allocation(shape):
    sched, _ = run(shape, seed=5, gate_flips=True)
    assert sched.counters.divergences == 0
    assert sched.counters.finished + sched.counters.rejected == 400


def test_same_seed_same_decision_log():
    assert run("state|window|full", seed=3)[1] == run("state|window|full", seed=3)[1]
