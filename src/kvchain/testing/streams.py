"""Operation streams: typed chain operations, a checking recorder, seeded generators.

An operation stream is what a serving engine does to a chain, one call at a time:

==================  ==================================================================
``TakeOp``          ``chain.take(Demand(pages))`` (a prefill, chunk or window-tail
                    extension, a decode step, a state slot); ``expect``: the recorded
                    outcome (``"fit"``/``"refuse"``), checked on replay
``ReleaseOp``       ``chain.release(band, vids)`` (a finished request, a window-tail
                    release, a state slot)
``GateOp``          ``chain.set_move_gate(open)``
``FenceHoldOp``     ``chain.begin_forward(fence)`` with a fence that stays pending
``FenceCompleteOp`` the held fence completes (then the chain polls it)
``FlushOp``         ``chain.flush_idle()``
``CacheInsertOp``   held pages (per band) move into the prefix cache as one eviction
                    unit (a :class:`~kvchain.testing.evictor.ReferenceEvictor`, attached
                    to the chain at the first cache op); takes may then evict
``CacheLockOp``     a request matches a cached unit: it is locked (not evictable)
``CacheUnlockOp``   the request finishes: one lock dropped
==================  ==================================================================

With a cache, the recorder's audit also checks page ownership after every operation:
every bound page of every band is held by exactly one of the recorder (requests), the
cache, or the chain (its null page) - a leaked or doubly owned page is a violation.

:class:`ChainRecorder` runs operations on a chain, checks every take against its price
(docs/design.md contracts 1-2: after a take ``snapshot() == quote.after``; a refusal changes
nothing), audits after every operation, and records what it ran. :func:`generate_stream`
drives a recorder with a seeded request workload (prefills, chunked extensions with
window-tail release, decode steps, finishes, extra state slots, gate toggles, fences,
idle flushes, probes at and just past capacity).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from kvchain.alloc import Chain, Demand
from kvchain.alloc.pricing import max_units
from kvchain.buffer import ManualFence
from kvchain.errors import AuditError, CapacityError, ConfigError, KVChainError
from kvchain.model.layers import LifetimeClass
from kvchain.testing.evictor import ReferenceEvictor


@dataclass(frozen=True, slots=True)
class TakeOp:
    """Take ``pages`` per band (low -> high); ``expect`` ``"fit"``, ``"refuse"`` or ``None``."""

    pages: tuple[int, ...]
    expect: str | None = None


@dataclass(frozen=True, slots=True)
class ReleaseOp:
    """Release virtual ids ``vids`` of band ``band``."""

    band: int
    vids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GateOp:
    """Open (``True``) or close the move gate; a close realizes moves first (compaction)
    unless ``realize_moves`` is False (see :meth:`Chain.set_move_gate`)."""

    open: bool
    realize_moves: bool = True


@dataclass(frozen=True, slots=True)
class FenceHoldOp:
    """Begin a forward whose fence stays pending until a :class:`FenceCompleteOp`."""


@dataclass(frozen=True, slots=True)
class FenceCompleteOp:
    """Complete the held fence (no-op if none is held)."""


@dataclass(frozen=True, slots=True)
class FlushOp:
    """Idle-time compaction (``chain.flush_idle()``)."""


@dataclass(frozen=True, slots=True)
class CacheInsertOp:
    """Move held virtual ids (per band) into the prefix cache as one unit."""

    pages: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class CacheLockOp:
    """Lock the cached unit with stable id ``unit`` (a hit of a running request)."""

    unit: int


@dataclass(frozen=True, slots=True)
class CacheUnlockOp:
    """Drop one lock of the cached unit ``unit``."""

    unit: int


Op = (TakeOp | ReleaseOp | GateOp | FenceHoldOp | FenceCompleteOp | FlushOp | CacheInsertOp
      | CacheLockOp | CacheUnlockOp)


def op_to_json(op: Op) -> dict[str, object]:
    """One operation as a JSON-ready dict (one line of a replay stream)."""
    if isinstance(op, TakeOp):
        out: dict[str, object] = {"op": "take", "pages": list(op.pages)}
        if op.expect is not None:
            out["expect"] = op.expect
        return out
    if isinstance(op, ReleaseOp):
        return {"op": "release", "band": op.band, "vids": list(op.vids)}
    if isinstance(op, GateOp):
        return {"op": "gate", "open": op.open, "realize_moves": op.realize_moves}
    if isinstance(op, FenceHoldOp):
        return {"op": "fence_hold"}
    if isinstance(op, FenceCompleteOp):
        return {"op": "fence_complete"}
    if isinstance(op, CacheInsertOp):
        return {"op": "cache_insert", "pages": [list(p) for p in op.pages]}
    if isinstance(op, CacheLockOp):
        return {"op": "cache_lock", "unit": op.unit}
    if isinstance(op, CacheUnlockOp):
        return {"op": "cache_unlock", "unit": op.unit}
    return {"op": "flush_idle"}


def op_from_json(data: dict[str, object]) -> Op:
    """Inverse of :func:`op_to_json`.

    Raises:
        ConfigError: unknown ``op`` or a missing/mistyped field.
    """
    try:
        kind = data["op"]
        if kind == "take":
            expect = data.get("expect")
            if expect not in (None, "fit", "refuse"):
                raise ValueError(f"expect must be 'fit' or 'refuse', got {expect!r}")
            return TakeOp(tuple(_int(x) for x in _list(data["pages"])), expect)
        if kind == "release":
            return ReleaseOp(_int(data["band"]),
                             tuple(_int(x) for x in _list(data["vids"])))
        if kind == "gate":
            return GateOp(_bool(data["open"]), _bool(data.get("realize_moves", True)))
        if kind == "fence_hold":
            return FenceHoldOp()
        if kind == "fence_complete":
            return FenceCompleteOp()
        if kind == "flush_idle":
            return FlushOp()
        if kind == "cache_insert":
            bands = data["pages"]
            if not isinstance(bands, list) or not all(isinstance(b, list) for b in bands):
                raise ValueError(f"pages must be a list of id lists, got {bands!r}")
            return CacheInsertOp(tuple(tuple(_int(x) for x in band) for band in bands))
        if kind == "cache_lock":
            return CacheLockOp(_int(data["unit"]))
        if kind == "cache_unlock":
            return CacheUnlockOp(_int(data["unit"]))
        raise ValueError(f"unknown op {kind!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad operation {data!r}: {exc}") from exc


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {value!r}")
    return value


def _bool(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError(f"expected true or false, got {value!r}")
    return value


@dataclass(slots=True)
class RecorderCounts:
    """Counters of a recorder (mutable; read :meth:`ChainRecorder.counts`).

    Attributes:
        operations: operations run.
        decisions: takes priced (each take is one pricing decision).
        fits: takes that fit.
        divergences: price != outcome (a fit refused, a refusal that took, an after
            snapshot other than the quote's, a refusal that changed the chain, a recorded
            outcome that differs, a plan mismatch).
        violations: audit failures and operations that raised unexpectedly.
        messages: the first few divergence/violation descriptions.
    """

    operations: int = 0
    decisions: int = 0
    fits: int = 0
    divergences: int = 0
    violations: int = 0
    messages: list[str] = field(default_factory=list)


class ChainRecorder:
    """Runs operations on a chain, checks price == outcome, audits, records.

    Args:
        chain: the chain (it is mutated).
        audit: run ``chain.audit()`` after every operation.

    Attributes:
        ops: the operations run, in order (a replayable stream).
        held: per band, the virtual ids this recorder holds (taken, not released),
            null pages excluded.
        counts: the counters.
    """

    MAX_MESSAGES = 20

    def __init__(self, chain: Chain, *, audit: bool = True) -> None:
        self.chain = chain
        self.audit = audit
        self.ops: list[Op] = []
        self.held: list[list[int]] = [[] for _ in range(chain.num_bands)]
        self.counts = RecorderCounts()
        self._fence: ManualFence | None = None
        self.cache: ReferenceEvictor | None = None
        self.cache_defect: str | None = None

    def _cache(self) -> ReferenceEvictor:
        """The prefix cache, created and attached to the chain on first use."""
        if self.cache is None:
            self.cache = ReferenceEvictor(self.chain.num_bands, defect=self.cache_defect)
            self.chain.set_evictor(self.cache)
        return self.cache

    def check_ownership(self) -> None:
        """Every bound page is owned exactly once: by a request, the cache or the chain.

        Raises:
            AuditError: a bound page nobody owns (leaked), or one owned twice.
        """
        cached = self.cache.held() if self.cache is not None else [
            set() for _ in range(self.chain.num_bands)]
        for i in range(self.chain.num_bands):
            band = self.chain.band(i)
            bound = set(np.flatnonzero(band.v2p >= 0).tolist())
            mine = set(self.held[i])
            null = {self.chain.null_page(i)} if self.chain.layout.bands[i].reserved_pages \
                else set()
            if mine & cached[i]:
                raise AuditError(f"band {i}: pages owned by a request and the cache "
                                 f"{sorted(mine & cached[i])[:8]}")
            owned = mine | cached[i] | null
            if owned != bound:
                raise AuditError(f"band {i}: leaked {sorted(bound - owned)[:8]}, "
                                 f"owned but unbound {sorted(owned - bound)[:8]}")

    def _note(self, kind: str, text: str) -> None:
        if kind == "divergence":
            self.counts.divergences += 1
        else:
            self.counts.violations += 1
        if len(self.counts.messages) < self.MAX_MESSAGES:
            self.counts.messages.append(f"op {self.counts.operations}: {kind}: {text}")

    def take(self, pages: tuple[int, ...], expect: str | None = None) -> tuple[tuple[int, ...],
                                                                                ...] | None:
        """Run a :class:`TakeOp`; returns the granted ids per band, or ``None`` if refused."""
        return self.run(TakeOp(tuple(pages), expect))

    def release(self, band: int, vids: list[int] | tuple[int, ...]) -> None:
        """Run a :class:`ReleaseOp` (ids must be held)."""
        self.run(ReleaseOp(band, tuple(vids)))

    def run(self, op: Op) -> tuple[tuple[int, ...], ...] | None:
        """Run one operation, check and audit it, and record it.

        Returns:
            For a take that fit, the granted virtual ids per band; else ``None``.
        """
        chain = self.chain
        self.counts.operations += 1
        self.ops.append(op)
        granted = None
        try:
            if isinstance(op, TakeOp):
                granted = self._take(op)
            elif isinstance(op, ReleaseOp):
                chain.release(op.band, np.asarray(op.vids, dtype=np.int64))
                gone = set(op.vids)
                self.held[op.band] = [v for v in self.held[op.band] if v not in gone]
            elif isinstance(op, GateOp):
                chain.set_move_gate(op.open, realize_moves=op.realize_moves)
            elif isinstance(op, FenceHoldOp):
                self._fence = ManualFence()
                chain.begin_forward(self._fence)
            elif isinstance(op, FenceCompleteOp):
                if self._fence is not None:
                    self._fence.complete()
                    self._fence = None
                    chain.snapshot()  # polls the fence
            elif isinstance(op, CacheInsertOp):
                for i, vids in enumerate(op.pages):
                    missing = set(vids) - set(self.held[i])
                    if missing:
                        raise ConfigError(f"cache_insert of pages not held {sorted(missing)}")
                self._cache().insert(op.pages)
                for i, vids in enumerate(op.pages):
                    gone = set(vids)
                    self.held[i] = [v for v in self.held[i] if v not in gone]
            elif isinstance(op, CacheLockOp):
                self._cache().lock(op.unit)
            elif isinstance(op, CacheUnlockOp):
                self._cache().unlock(op.unit)
            else:
                chain.flush_idle()
        except KVChainError as exc:
            self._note("violation", f"{op} raised {type(exc).__name__}: {exc}")
        if self.audit:
            try:
                chain.audit()
                if self.cache is not None:
                    self.check_ownership()
            except AuditError as exc:
                self._note("violation", f"audit after {op}: {exc}")
        return granted

    def _take(self, op: TakeOp) -> tuple[tuple[int, ...], ...] | None:
        chain = self.chain
        demand = Demand(op.pages)
        before = chain.snapshot()
        epoch = chain.epoch
        quote = chain.price(demand)
        self.counts.decisions += 1
        outcome = "refuse"
        granted = None
        try:
            grant = chain.take(demand, quote)
        except CapacityError:
            if quote.fits:
                self._note("divergence", f"{op.pages}: priced to fit, take refused")
            if chain.snapshot() != before or chain.epoch != epoch:
                self._note("divergence", f"{op.pages}: a refusal changed the chain")
        else:
            outcome = "fit"
            self.counts.fits += 1
            granted = grant.pages
            for i, vids in enumerate(grant.pages):
                self.held[i].extend(vids)
            if not quote.fits:
                self._note("divergence", f"{op.pages}: priced as refused, take fit")
            elif chain.snapshot() != quote.after:
                self._note("divergence", f"{op.pages}: snapshot {chain.snapshot()} != "
                                         f"quote.after {quote.after}")
        if op.expect is not None and op.expect != outcome:
            self._note("divergence", f"{op.pages}: recorded {op.expect}, replayed {outcome}")
        return granted


# --- seeded generation -------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    tokens: int
    pages: dict[int, list[int]]  # band -> held ids (full and state in order taken)
    window_pages: dict[int, list[tuple[int, int]]]  # band -> (token page, vid), oldest first


def _band_of(chain: Chain, label: str) -> int | None:
    for i, b in enumerate(chain.layout.bands):
        if b.label == label:
            return i
    return None


def generate_stream(chain: Chain, n_ops: int, seed: int, *,
                    audit: bool = True, cache: bool = False,
                    cache_defect: str | None = None) -> ChainRecorder:
    """Drive ``chain`` with ``n_ops`` seeded operations; returns the recorder (its ``ops``
    is the stream, its ``counts`` the checks).

    The workload: requests of 1 to ``max(4, capacity / 6)`` prompt tokens arrive
    (prefill: full pages ``ceil(L / P)``, window pages covering ``[L - W + 1, L)``,
    one state slot), extend by chunks of 1..2P tokens or decode one token (window pages
    wholly before ``L - W + 1`` released after), finish (everything released), take or
    drop an extra state slot; the gate toggles, fences are held and completed, the idle
    flush runs, and probes take ``n`` and ``n + 1`` units at capacity (``max_units``).
    A refused extension finishes its request (as a retraction would). ``expect`` is filled
    in on every take, so the stream replays as a regression check.

    With ``cache``, a finishing request gives half the time its pages to the prefix cache
    (one unit, as a finished prompt's cached path) instead of releasing them, a prefill
    may lock a cached unit (a hit) that its finish unlocks, and every take may evict
    (``cache_defect`` plants a defect in the cache: see
    :class:`~kvchain.testing.evictor.ReferenceEvictor`). Without ``cache`` the stream is
    the same as before the cache existed.

    Raises:
        ConfigError: ``n_ops < 0``.
    """
    if n_ops < 0:
        raise ConfigError(f"n_ops must be >= 0, got {n_ops}")
    rng = random.Random(seed)
    rec = ChainRecorder(chain, audit=audit)
    rec.cache_defect = cache_defect
    locks: dict[int, int] = {}  # id(request) -> the unit it locked
    layout = chain.layout
    nb = chain.num_bands
    p = layout.page_size
    i_state, i_full = (_band_of(chain, x) for x in ("state", "full"))
    # Every window and chunked-local band, each with its own window (band, tokens, local).
    wins = [(i, b.cache_class.window or 1, b.lifetime is LifetimeClass.LOCAL)
            for i, b in enumerate(layout.bands)
            if b.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]
    token_bytes = sum(b.page_bytes for b in layout.bands if b.label != "state")
    cap_tokens = max(4, layout.buffer_bytes // max(token_bytes, 1) * p // 6)
    requests: list[_Request] = []

    def take(pages: list[int]) -> tuple[tuple[int, ...], ...] | None:
        quote = chain.price(Demand(tuple(pages)))
        return rec.run(TakeOp(tuple(pages), "fit" if quote.fits else "refuse"))

    def win_start(tokens: int, window: int, local: bool) -> int:
        return tokens // window * window if local else max(0, tokens - window + 1)

    def extend(req: _Request, c: int) -> bool:
        pages = [0] * nb
        new_tokens = req.tokens + c
        if i_full is not None:
            pages[i_full] = -(-new_tokens // p) - -(-req.tokens // p)
        want: dict[int, list[int]] = {}
        for i_win, window, local in wins:
            held = {t for t, _ in req.window_pages.get(i_win, [])}
            lo = win_start(req.tokens, window, local) // p if req.tokens else 0
            want[i_win] = [t for t in range(lo, -(-new_tokens // p)) if t not in held]
            pages[i_win] = len(want[i_win])
        if i_state is not None and not req.pages.get(i_state):
            pages[i_state] = 1
        got = take(pages) if any(pages) else tuple(() for _ in range(nb))
        if got is None:
            return False
        for i in range(nb):
            if i in want:
                req.window_pages.setdefault(i, []).extend(zip(want[i], got[i], strict=True))
            elif got[i]:
                req.pages.setdefault(i, []).extend(got[i])
        req.tokens = new_tokens
        for i_win, window, local in wins:  # window-tail release after the forward
            keep = set(range(win_start(new_tokens, window, local) // p, -(-new_tokens // p)))
            held_pages = req.window_pages.get(i_win, [])
            old = [v for t, v in held_pages if t not in keep]
            if old:
                rec.release(i_win, old)
                req.window_pages[i_win] = [(t, v) for t, v in held_pages if t in keep]
        return True

    def finish(req: _Request) -> None:
        requests.remove(req)
        if cache:
            unit = locks.pop(id(req), None)
            if unit is not None and rec.cache is not None and any(
                    u.uid == unit for u in rec.cache.units):
                rec.run(CacheUnlockOp(unit))
            if rng.random() < 0.5:
                pages = [list(req.pages.get(i, [])) for i in range(nb)]
                for band, held_pages in req.window_pages.items():
                    pages[band] = [v for _, v in held_pages]
                if any(pages):
                    rec.run(CacheInsertOp(tuple(tuple(p) for p in pages)))
                return
        for i, vids in req.pages.items():
            if vids:
                rec.release(i, vids)
        for i_win, held_pages in req.window_pages.items():
            if held_pages:
                rec.release(i_win, [v for _, v in held_pages])

    kinds = ["prefill", "chunk", "decode", "decode", "finish", "slot", "gate", "fence",
             "flush", "probe"]
    weights = [6, 4, 10, 0, 4, 1, 1, 2, 1, 1]
    while rec.counts.operations < n_ops:
        kind = rng.choices(kinds, weights)[0]
        if kind == "prefill" or (kind in ("chunk", "decode", "finish") and not requests):
            req = _Request(0, {}, {})
            requests.append(req)
            if cache and rec.cache is not None and rec.cache.units and rng.random() < 0.3:
                uid = rng.choice(rec.cache.units).uid  # a hit locks before pricing
                rec.run(CacheLockOp(uid))
                locks[id(req)] = uid
            if not extend(req, rng.randint(1, cap_tokens)):
                finish(req) if cache else requests.remove(req)
        elif kind in ("chunk", "decode"):
            req = rng.choice(requests)
            if not extend(req, 1 if kind == "decode" else rng.randint(1, 2 * p)):
                finish(req)
        elif kind == "finish":
            finish(rng.choice(requests))
        elif kind == "slot" and i_state is not None:
            if requests and rng.random() < 0.5:
                req = rng.choice(requests)
                slots = req.pages.get(i_state, [])
                if len(slots) > 1:
                    rec.release(i_state, [slots.pop()])
                else:
                    pages = [0] * nb
                    pages[i_state] = 1
                    got = take(pages)
                    if got is not None:
                        req.pages.setdefault(i_state, []).extend(got[i_state])
        elif kind == "gate":
            rec.run(GateOp(not chain.gate.open if rng.random() < 0.7 else True,
                           realize_moves=rng.random() < 0.5))
        elif kind == "fence":
            rec.run(FenceHoldOp() if rng.random() < 0.5 else FenceCompleteOp())
        elif kind == "flush":
            rec.run(FlushOp())
        elif kind == "probe":
            unit = [rng.randint(0, 1) for _ in range(nb)]
            if not any(unit):
                unit[rng.randrange(nb)] = 1
            n = max_units(chain.snapshot(), Demand(tuple(unit)))
            got = take([(n + 1) * u for u in unit])  # just past capacity: refused
            if n and rng.random() < 0.5:
                got = take([n * u for u in unit])  # at capacity: fits
                if got is not None:
                    for i in range(nb):
                        if got[i]:
                            rec.release(i, list(got[i]))
    return rec
