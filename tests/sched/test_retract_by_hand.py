"""Retraction by host copy in the scheduler, by hand: two requests on a 16-page chain, the
later one suspended to host when decode outgrows the buffer and resumed when the first
finishes, against the same run with recompute."""

from __future__ import annotations

import pytest

from kvchain.alloc.chain import Chain
from kvchain.errors import ConfigError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import host_side_for
from kvchain.sched.admission import ReserveConfig, ReservePolicy, parse_new_token_ratio
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.retraction import RetractTo
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

# One full band of 1 B a token, P = 4: 4 B pages, 64 B = 16 pages. Requests 0 and 1 (arrival
# 0 and 1 s): prompt 8, output 40, a lifetime of 8 + 40 - 1 = 47 tokens = 12 pages each (both:
# 24 > 16). A new-token ratio of 0.01 reserves almost no future output, so both are admitted.
LAYOUT = plan_layout([declared_class(LifetimeClass.FULL, 1)], 64, 4)


def _run(mode: RetractTo, host_bytes: int = 1_024) -> tuple[Scheduler, list[tuple[str, int, float,
                                                                               int, int]]]:
    kv = KVManager(Chain(LAYOUT))
    cfg = SchedulerConfig(retract_to=mode, audit_every_step=True, reserve=ReserveConfig(
        ReservePolicy.SGLANG, parse_new_token_ratio("0.01,0.01,0")))
    sched = Scheduler(kv, cfg, host=host_side_for(LAYOUT, host_bytes, 4))
    sched.add(Request(0, 8, 40, 0.0), 0.0)
    sched.add(Request(1, 8, 40, 1.0), 0.0)
    t, log = 0.0, []
    while not sched.idle:  # one step per second
        batch = sched.step(t)
        t += 1
        sched.complete(batch, StepOutcome(1.0), t)
        for ev in sched.drain_events():
            if ev.kind.value in ("retracted", "admitted", "finished"):
                r = sched.requests[ev.rid]
                log.append((ev.kind.value, ev.rid, ev.time_s, r.computed, r.output_done))
    return sched, log


def test_the_later_arrival_goes_to_host_and_comes_back_when_room_is_free() -> None:
    sched, log = _run(RetractTo.HOST)
    # Step at t = 0 prefills both (8 tokens, 2 pages each; each samples its first token).
    # Decodes at L = 8 .. 31 fit (both hold ceil(L / 4) <= 8 pages); at L = 32 each needs
    # page 8: 2 x 9 = 18 > 16, so the step planned at t = 25 (the 26th) retracts request 1
    # (the later arrival) with 32 tokens = 8 pages = 32 B, after 25 output tokens. Request 0
    # decodes to its 47th token (its 40th output) at t = 40 and frees its 12 pages; the
    # step at t = 40 loads request 1 back (its 8 pages + 1 for its next decode fit only
    # then), which then decodes 15 tokens: it finishes at t = 40 + 1 + 15 = 56.
    assert log == [("admitted", 0, 0.0, 8, 1), ("admitted", 1, 0.0, 8, 1),
                   ("retracted", 1, 25.0, 32, 25), ("finished", 0, 40.0, 47, 40),
                   ("admitted", 1, 40.0, 32, 25), ("finished", 1, 56.0, 47, 40)]
    c = sched.counters
    assert (c.retractions, c.retractions_to_host, c.resumes) == (1, 1, 1)
    assert (c.host_bytes_retracted, c.resume_bytes_loaded, c.recompute_tokens_saved) == (32, 32, 32)
    assert c.recomputed_tokens == 0 and c.host_retract_fallbacks == 0
    assert sched.host is not None and sched.host.held_bytes() == 0


def test_recompute_prefills_the_prompt_and_the_output_again() -> None:
    sched, log = _run(RetractTo.RECOMPUTE)
    # The same retraction; at t = 40 request 1 prefills 8 + 25 = 33 tokens in one chunk
    # (sampling its 26th output token), then decodes 14: it finishes at t = 55 (the host
    # copy's resume step computes nothing, so it ends one step later on a step clock).
    assert log[2] == ("retracted", 1, 25.0, 0, 25)
    assert log[4:] == [("admitted", 1, 40.0, 33, 26), ("finished", 1, 55.0, 47, 40)]
    c = sched.counters
    assert (c.retractions, c.retractions_to_host, c.recomputed_tokens) == (1, 0, 33)


def test_a_host_without_room_recomputes() -> None:
    # 16 B of host memory: 4 full slots, fewer than the victim's 8 pages
    sched, log = _run(RetractTo.HOST, host_bytes=16)
    c = sched.counters
    assert (c.retractions, c.retractions_to_host, c.host_retract_fallbacks) == (1, 0, 1)
    assert c.recomputed_tokens == 33 and log[4] == ("admitted", 1, 40.0, 33, 26)


def test_host_modes_need_their_inputs() -> None:
    kv = KVManager(Chain(LAYOUT))
    with pytest.raises(ConfigError, match="host slots"):
        Scheduler(kv, SchedulerConfig(retract_to=RetractTo.HOST))
    with pytest.raises(ConfigError, match="cost model"):
        Scheduler(kv, SchedulerConfig(retract_to=RetractTo.AUTO),
                  host=host_side_for(LAYOUT, 1_024, 4))
    with pytest.raises(ConfigError):
        SchedulerConfig(retract_to="host")  # type: ignore[arg-type]
