"""How often one scheduler step computes, prices and validates its take (issue 20, item 4).

:func:`count_step` runs one :meth:`Scheduler.step` with counters wrapped around the
request layer's demand entry points, the chain's ``price`` and the batch validations, and
returns a :class:`StepCounts`. :func:`mixed_step` and :func:`decode_step` build the two
steps the issue names (one prefill chunk beside three decodes; 256 decodes) on a fresh
scheduler. The wrappers are attributes of the objects in hand (the manager, the chain,
the scheduler) or of the request layer's modules, restored on exit, so the counts read
the same on any version of the code that has those names (``benchmarks/count_step.py``
prints them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import CacheClass
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.sched.request import Request, StepBatch, StepOutcome
from kvchain.sched.scheduler import Scheduler, SchedulerConfig

#: module functions that validate a batch (counted where the module has them)
_VALIDATORS = (("kvchain.requests.manager", "batch_ids"),
               ("kvchain.requests.manager", "check_demands"),
               ("kvchain.requests.step", "batch_ids"),
               ("kvchain.requests.step", "check_demands"),
               ("kvchain.requests.plan", "check_rows"))
#: the modules that call the pure demand function by name
_DEMAND_USERS = ("kvchain.requests.manager", "kvchain.requests.step",
                 "kvchain.sched.scheduler")


@dataclass
class StepCounts:
    """What one step did.

    Attributes:
        rows: the step's take, ``(request id, tokens)`` per prefill chunk and decode.
        row_demands: per row, how many times its demand for this step's ``tokens`` was
            computed: by ``KVManager.demand`` / ``demand_pair`` of those tokens (with or
            without the future admission reserves), ``Scheduler._admission_demand`` of
            that chunk, or as a row of ``KVManager.decode_demands``; calls nested inside
            another counted one, and a running request's future (``Scheduler._future``:
            its reservation beyond this step), are not counted.
        demand_calls: calls of the pure ``request_demand`` (or ``request_demands``: a
            chunk's take and reservation in one) in all, admission's chunk search and the
            running requests' futures included.
        price: calls of the chain's ``price`` (a take without a usable quote prices
            inside ``take``: counted too).
        validations: batch validations at top level: ``Scheduler._check_step``,
            ``KVManager.plan``, and ``batch_ids`` / ``check_demands`` / ``check_rows``
            not inside one of those.
    """

    rows: tuple[tuple[int, int], ...] = ()
    row_demands: dict[tuple[int, int], int] = field(default_factory=dict)
    demand_calls: int = 0
    price: int = 0
    validations: int = 0

    @property
    def demand_per_row(self) -> int:
        """The most times any row's take demand was computed (0 for an empty step)."""
        return max((self.row_demands.get(r, 0) for r in self.rows), default=0)


class _Depth:
    """Nesting depth of counted calls (a call inside a counted one is not counted)."""

    def __init__(self) -> None:
        self.n = 0


def _wrap(fn: Callable[..., Any], depth: _Depth, on_call: Callable[..., None]
          ) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not depth.n:
            on_call(*args, **kwargs)
        depth.n += 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth.n -= 1
    return wrapped


@contextlib.contextmanager
def counting(sched: Scheduler) -> Iterator[StepCounts]:
    """Count, while the block runs, what :class:`StepCounts` says for ``sched``."""
    out = StepCounts()
    patches = _Patches()
    try:
        _install(patches, sched, out)
        yield out
    finally:
        patches.restore()


class _Patches:
    """Attributes set on objects and modules, each restored (or deleted, where it was not
    the owner's own) by :meth:`restore`, last first."""

    def __init__(self) -> None:
        self._done: list[tuple[object, str, object]] = []

    def set(self, owner: object, name: str, wrapped: object) -> None:
        self._done.append((owner, name, owner.__dict__.get(name, _MISSING)
                           if isinstance(owner, type) or hasattr(owner, "__dict__")
                           else _MISSING))
        setattr(owner, name, wrapped)

    def restore(self) -> None:
        for owner, name, old in reversed(self._done):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._done.clear()


def _install(patches: _Patches, sched: Scheduler, out: StepCounts) -> None:
    """Wrap what :class:`StepCounts` counts on ``sched``, its KV manager, its chain and the
    modules that validate or compute demands, each wrapper adding to ``out``."""
    kv, chain = sched.kv, sched.chain
    demand_depth, valid_depth = _Depth(), _Depth()

    def row(rid: int, extend: int) -> None:
        out.row_demands[(rid, extend)] = out.row_demands.get((rid, extend), 0) + 1

    def on_demand(rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
                  horizon: int = 0) -> None:
        if not headroom and not horizon:
            row(rid, extend)

    def on_decode(rids: Sequence[int], drafts: int = 0) -> None:
        for rid in rids:
            row(rid, 1 + drafts)

    def on_valid(*_: Any, **__: Any) -> None:
        out.validations += 1

    def on_price(*_: Any, **__: Any) -> None:
        out.price += 1

    def on_pure(*_: Any, **__: Any) -> None:
        out.demand_calls += 1

    patch = patches.set
    patch(kv, "demand", _wrap(kv.demand, demand_depth, on_demand))
    patch(kv, "decode_demands", _wrap(kv.decode_demands, demand_depth, on_decode))
    if hasattr(kv, "demand_pair"):
        patch(kv, "demand_pair", _wrap(kv.demand_pair, demand_depth,
                                       lambda rid, extend, *_, **__: row(rid, extend)))
    patch(sched, "_admission_demand", _wrap(sched._admission_demand, demand_depth,
                                            lambda r, chunk: row(r.rid, chunk)))
    # a running request's future (its reservation beyond this step) is not its take
    patch(sched, "_future", _wrap(sched._future, demand_depth, lambda *a, **k: None))
    patch(chain, "price", _wrap(chain.price, _Depth(), on_price))
    patch(sched, "_check_step", _wrap(sched._check_step, valid_depth, on_valid))
    if hasattr(kv, "plan"):
        patch(kv, "plan", _wrap(kv.plan, valid_depth, on_valid))
    for mod_name, name in _VALIDATORS:
        with contextlib.suppress(ImportError):
            mod = importlib.import_module(mod_name)
            if hasattr(mod, name):
                patch(mod, name, _wrap(getattr(mod, name), valid_depth, on_valid))
    pure_depth = _Depth()
    for mod_name in _DEMAND_USERS:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # a tree without that module (counted where it exists)
            continue
        for name in ("request_demand", "request_demands"):
            if hasattr(mod, name):
                patch(mod, name, _wrap(getattr(mod, name), pure_depth, on_pure))


_MISSING = object()


def count_step(sched: Scheduler, now: float) -> tuple[StepCounts, StepBatch]:
    """One ``sched.step(now)`` under :func:`counting`; the counts and the batch."""
    with counting(sched) as out:
        batch = sched.step(now)
    out.rows = (tuple((p.rid, p.tokens) for p in batch.prefills)
                + tuple((d.rid, 1 + d.drafts) for d in batch.decodes))
    return out, batch


#: a 128-token window and a full band, 16-token pages (gpt-oss-120b's shape, bytes per
#: token rounded); with ``three``, a state band below them (Jet-Nemotron-2B's shape)
def _classes(three: bool) -> list[CacheClass]:
    out = [declared_class(LC.WINDOW, 36_864, 128), declared_class(LC.FULL, 36_864)]
    if three:
        out.insert(0, declared_class(LC.STATE, 4_000_000))
    return out


def _scheduler(three: bool, buffer_bytes: int = 80_000_000_000) -> Scheduler:
    kv = KVManager(Chain(plan_layout(_classes(three), buffer_bytes, 16)))
    return Scheduler(kv, SchedulerConfig(max_running=1_024, chunk_size=2_048,
                                         max_prefill_tokens=1 << 20))


def _decoding(sched: Scheduler, n: int) -> float:
    """Admit ``n`` requests (prompts 100-115 tokens, 1,000 output tokens) and run them
    until all decode; returns the clock."""
    now = 0.0
    for rid in range(n):
        sched.add(Request(rid, 100 + rid % 16, 1_000, 0.0), now)
    while any(r.in_prefill for r in sched.running.values()) or sched.waiting:
        batch = sched.step(now)
        now += 0.01
        sched.complete(batch, StepOutcome(0.01), now)
    return now


def mixed_step(three: bool = False, step_fn: Callable[[Scheduler], Any] | None = None,
               ) -> StepCounts:
    """Counts of one step of one prefill chunk (a waiting 300-token prompt, one chunk)
    beside three decodes. ``step_fn`` (if given) is called on the scheduler first (a
    test's planted variant)."""
    sched = _scheduler(three)
    if step_fn is not None:
        step_fn(sched)
    now = _decoding(sched, 3)
    sched.add(Request(99, 300, 10, now), now)
    counts, batch = count_step(sched, now)
    assert len(batch.prefills) == 1 and len(batch.decodes) == 3, batch
    return counts


def decode_step(three: bool = False, running: int = 256,
                step_fn: Callable[[Scheduler], Any] | None = None) -> StepCounts:
    """Counts of one decode step of ``running`` requests (nothing waiting)."""
    sched = _scheduler(three)
    if step_fn is not None:
        step_fn(sched)
    now = _decoding(sched, running)
    counts, batch = count_step(sched, now)
    assert not batch.prefills and len(batch.decodes) == running, batch
    return counts
