"""Retraction by host copy on the request layer, proved on a replayable stream and a
hypothesis machine (issue 23 items 5 and 7): admit, decode, suspend to host, resume,
finish, with every page and slot of a request in exactly one place (device, host or free),
no leaked host slot, and price == outcome with the request's own bytes back on every resume
(kvchain.testing.host_retract). Each "must be 0" figure has a planted sibling that makes it
non-zero."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvchain.alloc.snapshot import Demand
from kvchain.errors import CapacityError
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import HostSide, Suspended
from kvchain.testing.host_retract import (
    HostRetractDriver,
    dump_stream,
    host_stream,
    load_stream,
    replay_host_stream,
)

SEEDS = range(8)


def test_seeded_streams_have_no_violation_and_reach_every_path() -> None:
    total = {"resumed": 0, "resumes_refused": 0, "suspensions_refused": 0, "suspended": 0}
    for seed in SEEDS:
        counts = replay_host_stream(host_stream(seed))
        assert counts.violations == 0, (seed, counts)
        for key in total:
            total[key] += getattr(counts, key)
    # every path taken somewhere: suspensions, refused ones (host full), resumes that fit
    # and resumes refused (the device full)
    assert all(v > 0 for v in total.values()), total


def test_stream_replays_from_json_lines() -> None:
    ops = host_stream(3)
    text = dump_stream(ops)
    assert list(load_stream(text)) == ops
    assert replay_host_stream(load_stream(text)).as_dict() == replay_host_stream(ops).as_dict()


class _LosingResume(KVManager):
    """Planted: a resume that loses its last full page (the page stays bound, in no row)."""

    def _restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        super()._restore(sus, vids)
        full = self.geom.full
        assert full is not None
        slot = np.asarray([self._requests[sus.rid].slot], dtype=np.int64)
        self._table.truncate(full, slot, self._table.rowlen[full][slot] - 1)


class _LeakingSuspend(KVManager):
    """Planted: a suspension that takes one host slot more than it records."""

    def suspend(self, rid: int, host: HostSide) -> Suspended:
        sus = super().suspend(rid, host)
        if host.pool("full").free_count:
            host.pool("full").alloc(1)
        return sus


class _GreedyResume(KVManager):
    """Planted: a resume that takes one full page more than its quote."""

    def _restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        super()._restore(sus, vids)
        pages = [0] * self.geom.num_bands
        assert self.geom.full is not None
        pages[self.geom.full] = 1
        with contextlib.suppress(CapacityError):
            self.chain.take(Demand(tuple(pages)))


@pytest.mark.parametrize(("manager", "figure"), [
    (_LosingResume, "lost_pages"),
    (_LosingResume, "device_audit_failures"),
    (_LeakingSuspend, "host_audit_failures"),
    (_GreedyResume, "price_mismatches"),
])
def test_planted_defects_make_the_figures_non_zero(manager: type[KVManager],
                                                   figure: str) -> None:
    counts = [replay_host_stream(host_stream(seed), manager) for seed in SEEDS]
    assert sum(getattr(c, figure) for c in counts) > 0


class HostRetractMachine(RuleBasedStateMachine):
    """Any interleaving of the stream's operations; the driver raises at the first
    violation (``strict``)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver = HostRetractDriver(strict=True)
        self.next_rid = 0

    @rule(tokens=st.integers(1, 40))
    def admit(self, tokens: int) -> None:
        self.driver.apply({"op": "admit", "rid": self.next_rid, "tokens": tokens})
        self.next_rid += 1

    @rule()
    def step(self) -> None:
        self.driver.apply({"op": "step"})

    @rule(pick=st.integers(0, 15))
    def suspend(self, pick: int) -> None:
        self.driver.apply({"op": "suspend", "pick": pick})

    @rule(pick=st.integers(0, 15))
    def resume(self, pick: int) -> None:
        self.driver.apply({"op": "resume", "pick": pick})

    @rule(pick=st.integers(0, 15))
    def finish(self, pick: int) -> None:
        self.driver.apply({"op": "finish", "pick": pick})

    @invariant()
    def no_violation(self) -> None:
        assert self.driver.counts.violations == 0


HostRetractMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40,
                                                deadline=None)
TestHostRetractMachine = HostRetractMachine.TestCase
