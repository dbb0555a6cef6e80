"""Stateful fuzzing of the request layer: a hypothesis state machine drives the scheduler,
KV manager and chain (random arrivals, steps, early stops, gate flips between admission and
allocation, fences) and checks after every step: the chain and KV-manager audits, zero
admitted-but-unallocatable batches, and no leaked page once idle."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvchain.alloc.chain import Chain
from kvchain.buffer import ManualFence
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import QueuePolicy, Scheduler, SchedulerConfig

SHAPES = {
    "window|full": [declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
    "state|full": [declared_class(LC.STATE, 96), declared_class(LC.FULL, 32)],
    "state|window|full": [declared_class(LC.STATE, 48), declared_class(LC.WINDOW, 32, 8),
                          declared_class(LC.FULL, 32)],
    "local|full": [declared_class(LC.LOCAL, 32, 12), declared_class(LC.FULL, 32)],
    # Chains of two and three floats: two window sizes, window + chunked-local, both.
    "state|window8|window20|full": [declared_class(LC.STATE, 48),
                                    declared_class(LC.WINDOW, 32, 8),
                                    declared_class(LC.WINDOW, 16, 20),
                                    declared_class(LC.FULL, 32)],
    "state|window|local|full": [declared_class(LC.STATE, 48), declared_class(LC.WINDOW, 32, 8),
                                declared_class(LC.LOCAL, 16, 12), declared_class(LC.FULL, 32)],
    "state|window8|window20|local|full": [declared_class(LC.STATE, 48),
                                          declared_class(LC.WINDOW, 32, 8),
                                          declared_class(LC.WINDOW, 16, 20),
                                          declared_class(LC.LOCAL, 16, 12),
                                          declared_class(LC.FULL, 32)],
}


class SchedulerMachine(RuleBasedStateMachine):
    """Random serving histories on small memory-bound chains."""

    @initialize(shape=st.sampled_from(sorted(SHAPES)), page=st.sampled_from([1, 4]),
                pages=st.integers(24, 80), policy=st.sampled_from(list(QueuePolicy)))
    def build(self, shape, page, pages, policy):
        layout = plan_layout(SHAPES[shape], pages * 32 * page, page)
        self.chain = Chain(layout)
        self.sched = Scheduler(KVManager(self.chain),
                               SchedulerConfig(max_prefill_tokens=16 * page, chunk_size=8 * page,
                                               max_running=8, policy=policy))
        self.now = 0.0
        self.next_id = 0
        self.fence: ManualFence | None = None

    @rule(prompt=st.integers(1, 60), output=st.integers(1, 20))
    def arrive(self, prompt, output):
        self.sched.add(Request(self.next_id, prompt, output, self.now), self.now)
        self.next_id += 1

    @rule(close_gate=st.booleans(), stop=st.booleans())
    def step(self, close_gate, stop):
        scheduled = self.sched.schedule(self.now)
        if close_gate:
            self.chain.set_move_gate(False)  # a transfer starts before the allocation
        batch = self.sched.allocate(scheduled, self.now)
        self.now += 1.0
        stopped = frozenset([batch.decodes[0].rid]) if stop and batch.decodes else frozenset()
        self.sched.complete(batch, StepOutcome(1.0, stopped), self.now)

    @rule()
    def open_gate(self):
        self.chain.set_move_gate(True)

    @rule()
    def forward_in_flight(self):
        self.fence = ManualFence()
        self.chain.begin_forward(self.fence)

    @rule()
    def forward_done(self):
        if self.fence is not None:
            self.fence.complete()

    @invariant()
    def audits_hold(self):
        if hasattr(self, "sched"):
            self.sched.audit()
            assert self.sched.counters.divergences == 0
            if self.sched.idle:
                bound = sum(self.chain.bound_pages(b) for b in range(self.chain.num_bands))
                assert bound == sum(b.reserved_pages for b in self.chain.layout.bands)


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
