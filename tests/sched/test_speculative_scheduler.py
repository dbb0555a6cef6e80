"""The scheduler's speculative steps by hand (issue 24 item 3): decodes of ``1 + k`` tokens,
the verify's accepted drafts capped by the output left, and the admission that counts
``k``. Chain: ``P = 4``; a window of 8 tokens, a full class, 16 B state slots; ``k = 3``."""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, RequestStatus, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig


def scheduler(k: int = 3, buffer: int = 4_096) -> Scheduler:
    layout = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 8),
                          declared_class(LC.STATE, 16)], buffer, 4)
    kv = KVManager(Chain(layout, debug_audit=True), spec_tokens=k)
    return Scheduler(kv, SchedulerConfig(audit_every_step=True, chunk_size=8,
                                         max_prefill_tokens=8))


def test_decodes_keep_the_accepted_drafts_capped_by_the_output() -> None:
    sched = scheduler()
    r = Request(0, 8, 4)  # 8 prompt tokens, 4 output tokens
    assert sched.add(r, 0.0)
    batch = sched.step(0.0)  # the whole prompt: 1 + 3 = 4 state slots claimed
    assert [p.tokens for p in batch.prefills] == [8] and not batch.decodes
    assert sched.kv.held(0).span(0) == (0, 4)
    sched.complete(batch, StepOutcome(0.01), 0.01)
    assert (r.computed, r.output_done) == (8, 1)  # the last chunk sampled token 1
    batch = sched.step(0.01)
    assert [(d.rid, d.context, d.drafts) for d in batch.decodes] == [(0, 8, 3)]
    # tokens 8..11 in the cache: full pages ceil(12 / 4) = 3; window [1, 12): pages 0..2
    assert sched.kv.held(0).span(2) == (0, 3)
    # the verify accepts 1 of 3: keeps 2 tokens (L = 10), page 2 stays (token 9 on it)
    sched.complete(batch, StepOutcome(0.01, accepted={0: 1}), 0.02)
    assert (r.computed, r.output_done) == (10, 3)
    assert sched.kv.held(0).span(2) == (0, 3)
    assert sched.counters.accepted_tokens == 1 and sched.counters.drafted_tokens == 3
    batch = sched.step(0.02)
    # 1 output token left: the verify keeps at most 1 token whatever it accepted
    sched.complete(batch, StepOutcome(0.01, accepted={0: 3}), 0.03)
    assert r.status is RequestStatus.FINISHED and r.output_done == 4
    assert sched.counters.accepted_tokens == 1 and sched.counters.spec_decodes == 2
    assert sched.kv.num_requests == 0


def test_admission_counts_k() -> None:
    # an 8-token prompt with 4 output tokens, first chunk of one page (4 tokens), then 10
    # more KV tokens (8 + 4 - 1 - 4 + k): full ceil(14 / 4) = 4 pages (k = 0: ceil(11 / 4)
    # = 3); window: later pages min(ceil(14 / 4) - 0, later peak) with later peak
    # max(ceil(4 / 4) + ceil(7 / 4), ceil((8 + 3 - 1) / 4) + 1) = max(3, 4) = 4 -> 4
    # (k = 0: min(3, 3) = 3: the slack costs one page); state 1 + k slots
    with_k, without = scheduler(3), scheduler(0)
    assert with_k._lifetime_demand(8, 4) == Demand((4, 4, 4))
    assert without._lifetime_demand(8, 4) == Demand((1, 3, 3))
