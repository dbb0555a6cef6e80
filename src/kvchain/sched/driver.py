"""The model driver interface: who runs a step's batch (a real engine, the simulator's
cost model, or a fake for tests)."""

from __future__ import annotations

from typing import Protocol

from kvchain.sched.request import StepBatch, StepOutcome


class ModelDriver(Protocol):
    """Runs one step's batch and reports its duration and early stops."""

    def run(self, batch: StepBatch) -> StepOutcome:
        """Run ``batch``; return seconds taken and requests that hit end-of-sequence."""
        ...


class FixedStepDriver:
    """A fake driver for tests: every step takes ``step_s`` seconds; requests listed in
    ``stop_after`` stop (end-of-sequence) at the given output count."""

    def __init__(self, step_s: float = 0.01, stop_after: dict[int, int] | None = None) -> None:
        self.step_s = step_s
        self.stop_after = dict(stop_after or {})
        self._generated: dict[int, int] = {}

    def run(self, batch: StepBatch) -> StepOutcome:
        """Count a token for every decode (and for every prefill that completes, as the
        scheduler reports); stop those that reached their ``stop_after`` count."""
        stopped = set()
        for d in batch.decodes:
            n = self._generated.get(d.rid, 1) + 1
            self._generated[d.rid] = n
            if self.stop_after.get(d.rid, 1 << 62) <= n:
                stopped.add(d.rid)
        return StepOutcome(self.step_s, frozenset(stopped))
