"""Memory-bound seeded runs finish under every reservation policy and chain shape family;
the running requests' reserved futures by hand; the waiting queue keeps the exact admission
order of a full sort (SPF) and of a plain list (FCFS)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.admission import ReserveConfig, ReservePolicy
from kvchain.sched.queue import QueuePolicy, WaitingQueue, spf_key
from kvchain.sched.request import EventKind, Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

SHAPES = {
    "window|full": [declared_class(LC.WINDOW, 1_000, 128), declared_class(LC.FULL, 1_000)],
    "state|window|full": [declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 96),
                          declared_class(LC.FULL, 1_000)],
}
POLICIES = [ReserveConfig(ReservePolicy.ADAPTIVE, warmup=5), ReserveConfig(ReservePolicy.FULL),
            ReserveConfig(ReservePolicy.SGLANG)]


class ReferenceSortScheduler(Scheduler):
    """The old SPF walk: sort every waiting request each step (the reference order)."""

    def _waiting_order(self):  # type: ignore[no-untyped-def]
        return iter(sorted(list(self.waiting), key=lambda r: (r.remaining_prefill,
                                                               r.arrival_s, r.rid)))


def _run(shape: str, seed: int, *, reserve: ReserveConfig = POLICIES[0],
         policy: QueuePolicy = QueuePolicy.FCFS, cls: type[Scheduler] = Scheduler,
         audit: bool = True, requests: int = 120,
         ) -> tuple[Scheduler, list[int]]:
    """A seeded memory-bound workload (2.4 MB buffer: retractions happen); returns the
    scheduler and the admitted request ids in order."""
    layout = plan_layout(SHAPES[shape], 2_400_000, 16)
    sched = cls(KVManager(Chain(layout)), SchedulerConfig(
        max_prefill_tokens=512, chunk_size=256, max_running=32, policy=policy,
        reserve=reserve, audit_every_step=audit))
    rng = random.Random(seed)
    now, rid, admitted = 0.0, 0, []
    for _ in range(20_000):
        for _ in range(rng.choice((0, 0, 1, 2))):
            if rid < requests:
                sched.add(Request(rid, rng.randint(1, 600), rng.randint(1, 200), now), now)
                rid += 1
        batch = sched.step(now)
        now += 0.01
        stopped = frozenset(d.rid for d in batch.decodes if rng.random() < 0.02)
        sched.complete(batch, StepOutcome(0.01, stopped), now)
        admitted += [e.rid for e in sched.drain_events() if e.kind is EventKind.ADMITTED]
        if rid >= requests and sched.idle:
            break
    assert sched.idle
    return sched, admitted


# --- the running requests' futures -----------------------------------------------------------


@pytest.mark.parametrize("reserve", POLICIES, ids=lambda c: c.policy.value)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_memory_bound_runs_finish_under_every_policy(shape: str, reserve: ReserveConfig) -> None:
    # audit_every_step: the chain and KV-manager audits after every step.
    sched, _ = _run(shape, seed=3, reserve=reserve)
    assert sched.counters.finished == 120  # every request of the workload finished
    assert sched.counters.divergences == 0
    if reserve.policy is ReservePolicy.SGLANG and shape == "window|full":  # retractions too
        assert sched.counters.retractions > 0


def test_running_futures_by_hand() -> None:
    # One full band, 16-token pages, the whole output reserved (FULL). Step 1 prefills both
    # prompts (40 + 100 tokens <= 512) and samples each one's first output token, so after
    # it request 0 holds ceil(40 / 16) = 3 pages with 9 output tokens left and request 1
    # holds ceil(100 / 16) = 7 pages with 29 left. In the next step each decodes one token
    # (41 <= 48 and 101 <= 112 tokens: no new page, this step's demand 0) and reserves the
    # rest of its output but the last sampled token (never fed back): 8 and 28 tokens.
    # Full pages to cover [0, 40 + 1 + 8) = 49 tokens: 4, minus 3 held -> 1; to cover
    # [0, 100 + 1 + 28) = 129 tokens: 9, minus 7 held -> 2. Their sum: 3 pages.
    layout = plan_layout([declared_class(LC.FULL, 1_000)], 10_000_000, 16)
    sched = Scheduler(KVManager(Chain(layout)), SchedulerConfig(
        max_prefill_tokens=512, chunk_size=256, reserve=ReserveConfig(ReservePolicy.FULL)))
    sched.add(Request(0, 40, 10, 0.0), 0.0)
    sched.add(Request(1, 100, 30, 0.0), 0.0)
    batch = sched.step(0.0)
    assert [p.tokens for p in batch.prefills] == [40, 100]
    sched.complete(batch, StepOutcome(0.01, frozenset()), 0.01)
    running = list(sched.running.values())
    zero = Demand((0,))
    this_step = {0: (1, zero), 1: (1, zero)}
    assert sched.running_futures(running[:1], this_step) == Demand((1,))
    assert sched.running_futures(running[1:], this_step) == Demand((2,))
    assert sched.running_futures(running, this_step) == Demand((3,))
    assert sched.running_futures([], this_step) == zero


# --- the queue -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", list(SHAPES))
def test_spf_heap_admits_in_the_reference_sort_order(shape: str) -> None:
    # SGLang's ratio retracts on the window|full workload: retracted requests re-enter the
    # heap with a new key (prompt + generated tokens).
    retracted = 0
    for seed in (1, 2, 3):
        sched, order = _run(shape, seed, policy=QueuePolicy.SPF, audit=False,
                            reserve=POLICIES[2])
        _, reference = _run(shape, seed, policy=QueuePolicy.SPF, audit=False,
                            reserve=POLICIES[2], cls=ReferenceSortScheduler)
        assert order == reference
        assert len(order) == 120 + sched.counters.retractions  # each admission once more
        retracted += sched.counters.retractions
    assert retracted > 0 or shape != "window|full"


_OPS = st.lists(st.tuples(st.sampled_from(("add", "front", "remove", "walk")),
                          st.integers(0, 40), st.integers(1, 50)), max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, spf=st.booleans())
def test_queue_matches_a_plain_list(ops: list[tuple[str, int, int]], spf: bool) -> None:
    # Reference: a Python list in FCFS order (append / insert at 0 / remove), walked as is
    # (FCFS) or fully sorted by spf_key (SPF).
    policy = QueuePolicy.SPF if spf else QueuePolicy.FCFS
    queue, ref = WaitingQueue(policy), []
    pool: dict[int, Request] = {}
    for op, rid, prompt in ops:
        r = pool.setdefault(rid, Request(rid, prompt, 1, float(rid % 7)))
        if op in ("add", "front"):
            if r in ref:
                with pytest.raises(InvalidRequestError):
                    queue.append(r)
                continue
            r.prefill_target = prompt  # a retracted request comes back with a new target
            (queue.append if op == "add" else queue.appendleft)(r)
            if op == "add":
                ref.append(r)
            else:
                ref.insert(0, r)
        elif op == "remove":
            if r not in ref:
                with pytest.raises(InvalidRequestError):
                    queue.remove(r)
                continue
            queue.remove(r)
            ref.remove(r)
        expected = sorted(ref, key=spf_key) if spf else ref
        assert [q.rid for q in queue] == [q.rid for q in expected]
        assert len(queue) == len(ref) and bool(queue) == bool(ref)
        assert all(q in queue for q in ref)
