"""Field case F4 reached through speculative decoding: the 3 state slots a request claims
are its working slot plus ``k = 2`` checkpoint slots of ``StateRollback.CHECKPOINTS``
(``KVManager(spec_tokens=2)``), not a hand-set ``state_slots_per_request``.

Full + state chain, ``S = 1,000,000 B``, ``E_full = 1,000 B``, ``P = 16`` (16,000 B pages).
Buffer: 5 slots + 33 full pages; an outside holder keeps 3 slots + 15 pages, so 2 slots'
worth of bytes are free beyond the 18 full pages the request's admission prices: request
(256, 16) with the adaptive reserve's warm-up (the whole output, 16 - 1 = 15 tokens) and
the last step's k = 2 drafts: 256 + 15 + 2 = 273 tokens, ceil(273 / 16) = 18 pages
(k = 0: 271 tokens, 17 pages). Expected: it waits holding 0 slots and 0 pages, with no
error; once 1 more slot's worth of bytes is released (step 5) it is admitted and finishes,
peaking at 3 slots and 18 pages, with no retraction.
"""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.layout import plan_layout
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, RequestStatus
from kvchain.sched.scheduler import Scheduler

from .helpers import full_class, run_to_completion, state_class

SLOT = 1_000_000
PAGE_BYTES = 16 * 1_000
CLASSES = (full_class(1_000), state_class(SLOT))
BUFFER = 5 * SLOT + 33 * PAGE_BYTES


def test_f4_checkpoint_slots_claimed_atomically_through_speculation() -> None:
    layout = plan_layout(CLASSES, BUFFER, 16)
    assert layout.reserved_bytes == 0
    chain = Chain(layout)
    held = chain.take(Demand((3, 15))).pages  # state LOW END = band 0, full HIGH END
    assert chain.snapshot().free_bytes == 2 * SLOT + 18 * PAGE_BYTES
    kv = KVManager(chain, spec_tokens=2)
    assert kv.geom.state_slots == 3  # 1 working + k = 2 checkpoints
    sched = Scheduler(kv)
    outside = {"pages": Demand((3, 15))}
    waiting: list[int] = []

    def before(step: int, s: Scheduler) -> None:
        if step == 5:
            s.chain.release(0, [held[0][0]])
            outside["pages"] = Demand((2, 15))
        if 0 in s.requests and s.requests[0].status is RequestStatus.WAITING:
            assert 0 not in s.kv  # 0 slots, 0 pages while it waits
            waiting.append(step)

    result = run_to_completion(sched, [Request(0, 256, 16)], before_step=before,
                               external=lambda: outside["pages"])
    assert waiting == [0, 1, 2, 3, 4, 5]
    assert result.admitted_at[0] == 5
    assert result.peak_pages[0] == [3, 18]
    assert sched.counters.retractions == 0 and sched.counters.spec_decodes > 0
