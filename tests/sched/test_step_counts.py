"""One demand, one price, one validation per scheduler step (issue 20, item 4), counted by
``kvchain.testing.step_counts`` on the two steps the issue names; each count has a
planted sibling (a scheduler variant that does it twice) that the same count catches."""

from __future__ import annotations

import pytest

from kvchain.sched.scheduler import ScheduledStep, Scheduler
from kvchain.testing.step_counts import decode_step, mixed_step


@pytest.mark.parametrize("three", [False, True])
def test_one_demand_one_price_one_validation_per_step(three: bool) -> None:
    # One waiting 300-token prompt (one chunk: chunk_size 2,048) beside three decodes:
    # the chunk's demand is computed once (the admission search's value, reused as the
    # plan's row), each decode's once (the decode check's batch), the take priced once
    # (KVManager.plan) and validated once (KVManager.plan; allocate trusts the plan).
    c = mixed_step(three)
    assert len(c.rows) == 4
    assert (c.demand_per_row, c.price, c.validations) == (1, 1, 1)
    # 64 decodes, nothing waiting: the decode check's batch is the plan's rows.
    d = decode_step(three, running=64)
    assert len(d.rows) == 64
    assert (d.demand_per_row, d.price, d.validations) == (1, 1, 1)


def _recomputes(sched: Scheduler) -> None:
    """Planted: the plan's prefill demands computed again (as before the step plan)."""
    real = sched._plan_step

    def again(step: ScheduledStep, pin: bool = True) -> None:
        step.prefill_demands = [sched.kv.demand(p.rid, p.tokens) for p in step.prefills]
        real(step, pin)

    sched._plan_step = again  # type: ignore[method-assign]


def _prices_twice(sched: Scheduler) -> None:
    """Planted: the step's take priced once more after its plan."""
    real = sched._plan_step

    def again(step: ScheduledStep, pin: bool = True) -> None:
        real(step, pin)
        if step.plan is not None:
            sched.chain.price(step.plan.taken)

    sched._plan_step = again  # type: ignore[method-assign]


def _revalidates(sched: Scheduler) -> None:
    """Planted: allocate distrusts the plan schedule() built (checks the step and plans
    it again, as a changed step is)."""
    real = sched.allocate

    def again(step: ScheduledStep, now: float):  # type: ignore[no-untyped-def]
        step.basis = None
        return real(step, now)

    sched.allocate = again  # type: ignore[method-assign]


def test_planted_second_demand_is_counted() -> None:
    assert mixed_step(step_fn=_recomputes).demand_per_row == 2


def test_planted_second_price_is_counted() -> None:
    assert mixed_step(step_fn=_prices_twice).price == 2
    assert decode_step(running=16, step_fn=_prices_twice).price == 2


def test_planted_second_validation_is_counted() -> None:
    # _check_step, then KVManager.plan once more: 1 + 2 = 3
    assert mixed_step(step_fn=_revalidates).validations == 3
    assert decode_step(running=16, step_fn=_revalidates).validations == 3
