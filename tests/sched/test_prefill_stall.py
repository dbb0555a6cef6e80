"""A step that would run nothing while two requests are running: the scheduler retracts
the youngest and decides the step again (``counters.stall_retractions``).

Seeded breaker streams 39 and 79 (a window|full chain, ``sglang`` reservation) stalled
for ever: the estimated reservation over-admitted, two running prefills ended up each a
page short of their next chunk with nothing decoding, and only the decode check ever
retracted. Here an outside holder makes the same state by hand on a one-band chain.
"""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass
from kvchain.requests.manager import KVManager
from kvchain.sched.admission import ReserveConfig, ReservePolicy
from kvchain.sched.request import PrefillChunk, Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

# One full band of 1 B a token, P = 4: 96 B = 24 pages. Two requests (arrival 0 and 1 s),
# prompt 36, output 1: a lifetime of 36 tokens = 9 pages each (18 <= 24, so the FULL
# reservation admits both). Chunks of 4 tokens: the first step prefills 4 tokens of each
# (1 page each, 2 held, 22 free).
LAYOUT = plan_layout([declared_class(LifetimeClass.FULL, 1)], 96, 4)


def _two_prefills() -> Scheduler:
    kv = KVManager(Chain(LAYOUT))
    cfg = SchedulerConfig(max_prefill_tokens=8, chunk_size=4,
                          reserve=ReserveConfig(ReservePolicy.FULL))
    sched = Scheduler(kv, cfg)
    sched.add(Request(0, 36, 1, 0.0), 0.0)
    sched.add(Request(1, 36, 1, 1.0), 0.0)
    batch = sched.step(1.0)
    assert [(c.rid, c.start, c.tokens) for c in batch.prefills] == [(0, 0, 4), (1, 0, 4)]
    sched.complete(batch, StepOutcome(1.0), 2.0)
    kv.chain.take(Demand((22,)))  # an outside holder takes every free page
    return sched


def test_a_stalled_step_retracts_the_youngest_and_runs() -> None:
    sched = _two_prefills()
    step = sched.schedule(2.0)
    # Neither 4-token chunk finds its page: a stall. Request 1 (arrival 1 s) is retracted
    # (recompute: its 1 page freed, its 4 tokens to prefill again); the retry gives request
    # 0 that page for its next chunk [4, 8), and request 1 waits (no page for it).
    assert step.prefills == [PrefillChunk(0, 4, 4)]
    assert step.decodes == []
    c = sched.counters
    assert (c.stall_retractions, c.retractions, c.recomputed_tokens) == (1, 1, 36)
    assert list(sched.running) == [0] and [r.rid for r in sched.waiting] == [1]


def test_a_lone_request_is_not_retracted() -> None:
    sched = _two_prefills()
    sched._retract(sched.requests[1], 2.0)  # only request 0 runs now, still a page short
    sched.kv.chain.take(Demand((1,)))  # and the freed page goes to the holder too
    step = sched.schedule(2.0)
    # Nothing to retract for: retracting the only request frees pages it needs itself
    # (an outside holder that never gives back is outside the scheduler's reach).
    assert step.prefills == [] and step.decodes == []
    assert sched.counters.stall_retractions == 0 and list(sched.running) == [0]


def test_planted_one_try_schedule_stalls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sibling: with the retry loop planted out (one try, as before the fix), the same
    state gives an empty step with both requests still running: the check above can fail."""
    sched = _two_prefills()

    def one_try(now: float):
        step = sched._schedule_once(now)
        sched._plan_step(step)
        return step

    monkeypatch.setattr(sched, "schedule", one_try)
    step = sched.schedule(2.0)
    assert step.prefills == [] and step.decodes == []
    assert sched.counters.stall_retractions == 0 and sorted(sched.running) == [0, 1]
