"""The scheduler's clock readings (``add``'s and ``schedule``'s ``now``, in seconds) must be
finite numbers >= 0: NaN, infinity, a negative time or a bool were accepted and ordered
events wrongly. Each is refused with InvalidRequestError and changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvchain.errors import InvalidRequestError
from kvchain.sched.request import Request

from ..cases.helpers import full_class, make_scheduler, window_class

BAD = [math.nan, math.inf, -math.inf, -1.0, True, "0", None]


def _sched():  # type: ignore[no-untyped-def]
    return make_scheduler([window_class(1_000, 64), full_class(1_000)], 1_600_000, 16)


@pytest.mark.parametrize("now", BAD, ids=repr)
def test_a_bad_arrival_time_is_refused_and_queues_nothing(now: object) -> None:
    sched = _sched()
    with pytest.raises(InvalidRequestError, match="finite number of seconds"):
        sched.add(Request(1, 40, 4, 0.0), now)  # type: ignore[arg-type]
    assert sched.requests == {} and sched.drain_events() == []
    assert sched.add(Request(1, 40, 4, 0.0), 0.0)  # the same request, a good time


@pytest.mark.parametrize("now", BAD, ids=repr)
def test_a_bad_step_time_is_refused_and_schedules_nothing(now: object) -> None:
    sched = _sched()
    sched.add(Request(1, 40, 4, 0.0), 0.0)
    sched.drain_events()
    with pytest.raises(InvalidRequestError, match="finite number of seconds"):
        sched.step(now)  # type: ignore[arg-type]
    assert sched.drain_events() == [] and sched.kv.num_requests == 0
    batch = sched.step(np.float64(0.5))  # numpy reals are times too
    assert [c.rid for c in batch.prefills] == [1] and sched.kv.num_requests == 1
