"""What a hit lock keeps: every window tail and state checkpoint of its locked path, not
only the tail and checkpoint the hit resumes from. Admission's "can it finish alone" check
counted only the latter, so a request on a state | local | window | full chain whose hit
path kept 9 checkpoints was admitted, filled the buffer with its own kept tails beside
them, and waited forever for its last 11-token chunk while 288 requests queued (seeded
stream 131 of tests/cache/test_seeded_cache_runs.py). The check's lifetime demand counts
the request's own resume points past the hit only: those at or below it are on the locked
path, counted by what the lock holds."""

from __future__ import annotations

from tests.cache.test_seeded_cache_runs import run as seeded_run

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

P = 16
CLASSES = [declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 96),
           declared_class(LC.FULL, 1_000)]


def test_a_hit_lock_holds_every_tail_and_checkpoint_of_its_path():
    layout = plan_layout(CLASSES, 400_000_000, P)
    cache = PrefixCache(CacheGeometry.of(layout), interval_tokens=64,
                        policy=ResumePolicy.BLOCKS)
    kv = KVManager(Chain(layout), cache)
    sched = Scheduler(kv, SchedulerConfig(max_prefill_tokens=8192, chunk_size=8192))
    first = list(range(640))  # 40 pages: resume points every 4 pages, 4 ... 40
    sched.add(Request(0, 640, 2, 0.0, page_keys=page_keys_from_tokens(first, P)), 0.0)
    now = 0.0
    while not sched.idle:
        batch = sched.step(now)
        now += 0.01
        sched.complete(batch, StepOutcome(0.01, frozenset()), now)
    second = first[:576] + list(range(10_000, 10_200))  # shares 36 pages, then leaves
    assert kv.attach(1, page_keys_from_tokens(second, P), len(second)) == 576
    # The hit resumes after 36 pages (a resume point). Its locked path [0, 36) keeps the
    # checkpoints at 4, 8, ..., 36: 9 slots; and the window tails [q - 6, q) of every
    # point q (W = 96 = 6 pages: the token at 16q reads back to page q - 6), whose union
    # is every page [0, 36): 36 window pages. The hit's own tail and checkpoint alone
    # (what was counted) are 6 pages and 1 slot.
    state, window, full = (b.label for b in layout.bands)
    assert (state, window, full) == ("state", "window", "full")
    assert kv.hit_holds(1) == Demand((9, 36, 0))
    assert sched._hit_extra(576) == Demand((1, 6, 0))
    kv.detach(1)
    assert kv.hit_holds(1) == Demand((0, 0, 0))  # not attached: nothing held


def test_seeded_stream_131_no_longer_stalls():
    # Both fixes end it: the check above, and incremental insertion (a request's kept tails
    # are evictable cache from its chunk's end on, not its own pages). A check planted to
    # count nothing stalls a run still: tests/sched/test_hit_fits_alone.py.
    sched = seeded_run("state|local|window|full", seed=131)
    c = sched.counters
    assert c.divergences == 0 and c.finished + c.rejected == 300
