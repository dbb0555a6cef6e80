"""``StepPlan.priced`` builds its copy field by field (the decode step's hot path): every
field but ``quote`` and ``epoch`` is the plan's own object; a planted field list that
misses one is caught by the same comparison."""

from __future__ import annotations

import dataclasses

import numpy as np

from kvchain.alloc.snapshot import Demand
from kvchain.requests.plan import StepPlan


def _plan() -> StepPlan:
    return StepPlan.frozen("owner", (4, 7), 1, (Demand((0, 0)), Demand((1, 2))), (1,),
                           np.array([[1, 2]], dtype=np.int64), extends=(2, 2),
                           version=5, at=np.array([30, 47], dtype=np.int64), epoch=9)


def _differs(a: StepPlan, b: StepPlan) -> list[str]:
    return [f.name for f in dataclasses.fields(StepPlan)
            if getattr(a, f.name) is not getattr(b, f.name)]


def test_priced_keeps_every_other_field() -> None:
    plan = _plan()
    out = plan.priced(None, 11)
    assert out is not plan and out.epoch == 11 and out.total == Demand((1, 2))
    assert _differs(plan, out) == ["epoch"]  # quote None -> None: the same object
    assert plan.priced(None).epoch == 9


def test_planted_lost_field_is_caught() -> None:
    plan = _plan()
    lost = StepPlan(plan.owner, plan.rids, plan.drafts, plan.demands, plan.nonzero,
                    plan.needs, plan.total, None, plan.resumes, plan.loads, None,
                    plan.version, plan.at, 11)  # extends dropped
    assert _differs(plan, lost) == ["extends", "epoch"]
