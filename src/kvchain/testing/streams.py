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
``HostOffloadOp``   a request's held pages of every band leave the chain (released) into
                    one new entry of the recorder's host store (a
                    :class:`~kvchain.testing.host_store.ReferenceHostStore`: one
                    :class:`~kvchain.buffer.host_pool.HostPool` per band); on a chain
                    with a state band the state slot always goes with the KV; no host
                    room: refused, nothing moves
``HostLoadOp``      load-back of a host entry: a take of exactly its pages per band,
                    priced and checked like every ``TakeOp`` (``expect`` recorded); a fit
                    frees the entry, a refusal changes nothing and keeps the host copy
``HostEvictOp``     the host store drops its least recently used entry, all classes
==================  ==================================================================

With a cache or a host store, the recorder's audit also checks page ownership after every
operation: every bound page of every band is held by exactly one of the recorder
(requests), the cache, or the chain (its null page), the rest free - a leaked or doubly
owned page is a violation; and the host store's audit: every host slot held by exactly one
entry or free, no entry on a state chain holding KV without its state slot.

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
from kvchain.errors import (
    AuditError,
    CapacityError,
    ConfigError,
    HostPoolFullError,
    KVChainError,
)
from kvchain.model.layers import LifetimeClass
from kvchain.testing.evictor import ReferenceEvictor
from kvchain.testing.host_store import HOST_DEFECTS, ReferenceHostStore


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


@dataclass(frozen=True, slots=True)
class HostOffloadOp:
    """Offload held virtual ids (per band) into one new host entry; the chain releases them."""

    pages: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class HostLoadOp:
    """Load host entry ``entry`` back: a take of its slot counts per band; ``expect`` as
    :class:`TakeOp`'s."""

    entry: int
    expect: str | None = None


@dataclass(frozen=True, slots=True)
class HostEvictOp:
    """The host store drops its least recently used entry (all its classes together)."""


Op = (TakeOp | ReleaseOp | GateOp | FenceHoldOp | FenceCompleteOp | FlushOp | CacheInsertOp
      | CacheLockOp | CacheUnlockOp | HostOffloadOp | HostLoadOp | HostEvictOp)

RECORDER_HOST_DEFECTS: tuple[str, ...] = ("load_drops", "offload_keeps")
"""Planted defects of the recorder's own host path (tests of its audit): ``"load_drops"``
- a load-back takes one page fewer than its entry holds (the entry is freed all the same);
``"offload_keeps"`` - an offload leaves one device page bound (the request forgets it)."""


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
    if isinstance(op, HostOffloadOp):
        return {"op": "host_offload", "pages": [list(p) for p in op.pages]}
    if isinstance(op, HostLoadOp):
        out = {"op": "host_load", "entry": op.entry}
        if op.expect is not None:
            out["expect"] = op.expect
        return out
    if isinstance(op, HostEvictOp):
        return {"op": "host_evict"}
    return {"op": "flush_idle"}


#: the keys each operation's JSON object may carry (:func:`op_to_json`'s, ``op`` included);
#: any other key is refused (a typo such as ``"expcet"`` would drop a check silently)
OP_KEYS: dict[str, frozenset[str]] = {
    kind: frozenset(("op", *keys)) for kind, keys in (
        ("take", ("pages", "expect")), ("release", ("band", "vids")),
        ("gate", ("open", "realize_moves")), ("fence_hold", ()), ("fence_complete", ()),
        ("flush_idle", ()), ("cache_insert", ("pages",)), ("cache_lock", ("unit",)),
        ("cache_unlock", ("unit",)), ("host_offload", ("pages",)),
        ("host_load", ("entry", "expect")), ("host_evict", ()))}


def op_from_json(data: dict[str, object]) -> Op:
    """Inverse of :func:`op_to_json`.

    Raises:
        ConfigError: unknown ``op``, a key the op does not carry (:data:`OP_KEYS`), or a
            missing/mistyped field (counts, ids, bands and entries are ints >= 0).
    """
    try:
        kind = data["op"]
        allowed = OP_KEYS.get(kind) if isinstance(kind, str) else None
        if allowed is not None and not allowed.issuperset(data):
            raise ValueError(f"unknown key(s) {sorted(set(data) - allowed)} for op {kind!r} "
                             f"(it carries {sorted(allowed - {'op'})})")
        if kind == "take":
            return TakeOp(tuple(_int(x) for x in _list(data["pages"])), _expect(data))
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
            return CacheInsertOp(_band_lists(data["pages"]))
        if kind == "host_offload":
            return HostOffloadOp(_band_lists(data["pages"]))
        if kind == "host_load":
            return HostLoadOp(_int(data["entry"]), _expect(data))
        if kind == "host_evict":
            return HostEvictOp()
        if kind == "cache_lock":
            return CacheLockOp(_int(data["unit"]))
        if kind == "cache_unlock":
            return CacheUnlockOp(_int(data["unit"]))
        raise ValueError(f"unknown op {kind!r}")
    except KeyError as exc:  # its str() is the bare key: "'pages'"
        raise ConfigError(f"bad operation {data!r}: it lacks the field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad operation {data!r}: {exc}") from exc


def _expect(data: dict[str, object]) -> str | None:
    expect = data.get("expect")
    if expect is not None and expect not in ("fit", "refuse"):
        raise ValueError(f"expect must be 'fit' or 'refuse', got {expect!r}")
    return expect


def _band_lists(bands: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(bands, list) or not all(isinstance(b, list) for b in bands):
        raise ValueError(f"pages must be a list of id lists, got {bands!r}")
    return tuple(tuple(_int(x) for x in band) for band in bands)


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
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
        host_slots: host slots per band (pages of each band's class) of the host store
            the host operations use; ``None``: no host store (a host operation is then a
            violation).
        host_defect: a planted host defect (:data:`RECORDER_HOST_DEFECTS` in the
            recorder, :data:`~kvchain.testing.host_store.HOST_DEFECTS` in the store).

    Attributes:
        ops: the operations run, in order (a replayable stream).
        held: per band, the virtual ids this recorder holds (taken, not released),
            null pages excluded.
        counts: the counters.
        host: the host store, or ``None``.
        last_offload: the entry id the last successful offload created.
        last_evicted: the entry id the last host eviction dropped (``None``: store empty).

    Raises:
        ConfigError: an unknown ``host_defect`` or ``host_slots`` of the wrong length.
    """

    MAX_MESSAGES = 20

    def __init__(self, chain: Chain, *, audit: bool = True,
                 host_slots: tuple[int, ...] | None = None,
                 host_defect: str | None = None) -> None:
        self.chain = chain
        self.audit = audit
        self.ops: list[Op] = []
        self.held: list[list[int]] = [[] for _ in range(chain.num_bands)]
        self.counts = RecorderCounts()
        self._fence: ManualFence | None = None
        self.cache: ReferenceEvictor | None = None
        self.cache_defect: str | None = None
        if host_defect is not None and host_defect not in RECORDER_HOST_DEFECTS \
                + HOST_DEFECTS:
            raise ConfigError(f"unknown host defect {host_defect!r}; known: "
                              f"{RECORDER_HOST_DEFECTS + HOST_DEFECTS}")
        self.host_defect = host_defect
        self.host: ReferenceHostStore | None = None
        if host_slots is not None:
            labels = tuple(b.label for b in chain.layout.bands)
            self.host = ReferenceHostStore(
                labels, tuple(host_slots),
                defect=host_defect if host_defect in HOST_DEFECTS else None)
        self.last_offload: int | None = None
        self.last_evicted: int | None = None

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
                granted = self._take(op.pages, op.expect)
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
            elif isinstance(op, HostOffloadOp):
                self._offload(op)
            elif isinstance(op, HostLoadOp):
                granted = self._load(op)
            elif isinstance(op, HostEvictOp):
                self.last_evicted = self._host().evict_lru()
            else:
                chain.flush_idle()
        except KVChainError as exc:
            self._note("violation", f"{op} raised {type(exc).__name__}: {exc}")
        if self.audit:
            try:
                chain.audit()
                if self.cache is not None or self.host is not None:
                    self.check_ownership()
                if self.host is not None:
                    self.host.audit()
            except AuditError as exc:
                self._note("violation", f"audit after {op}: {exc}")
        return granted

    def _host(self) -> ReferenceHostStore:
        if self.host is None:
            raise ConfigError("a host operation on a recorder without a host store "
                              "(host_slots)")
        return self.host

    def _offload(self, op: HostOffloadOp) -> None:
        """Host entry first (all bands or nothing), then the chain releases the pages."""
        host = self._host()
        if len(op.pages) != self.chain.num_bands:
            raise ConfigError(f"host_offload names {len(op.pages)} bands, the chain has "
                              f"{self.chain.num_bands}")
        for i, vids in enumerate(op.pages):
            missing = set(vids) - set(self.held[i])
            if missing or len(set(vids)) != len(vids):
                raise ConfigError(f"host_offload of pages not held (or named twice) in band "
                                  f"{i}: {sorted(missing) or list(vids)}")
        try:
            entry = host.offload(tuple(len(v) for v in op.pages))
        except HostPoolFullError:
            return  # the host has no room: refused, nothing moved (the pages stay held)
        self.last_offload = entry.uid
        for i, vids in enumerate(op.pages):
            gone = set(vids)
            self.held[i] = [v for v in self.held[i] if v not in gone]
            keep = vids[:1] if self.host_defect == "offload_keeps" else ()
            rest = [v for v in vids if v not in keep]  # planted: ``keep`` stays bound
            if rest:
                self.chain.release(i, np.asarray(rest, dtype=np.int64))

    def _load(self, op: HostLoadOp) -> tuple[tuple[int, ...], ...] | None:
        """A take of exactly the entry's pages; a fit frees the entry, a refusal keeps it."""
        host = self._host()
        entry = host.entry(op.entry)
        counts = list(entry.counts)
        if self.host_defect == "load_drops":  # planted: one page short
            first = next((i for i, n in enumerate(counts) if n), None)
            if first is not None:
                counts[first] -= 1
        free_before = tuple(p.free_count for p in host.pools)
        granted = self._take(tuple(counts), op.expect)
        if granted is None:
            if op.entry not in host.entries or free_before != tuple(
                    p.free_count for p in host.pools):
                self._note("divergence", f"load-back of entry {op.entry} refused but the "
                                         f"host copy changed")
            return None
        got = tuple(len(g) for g in granted)
        host.drop(op.entry)
        if got != entry.counts:
            self._note("violation", f"load-back of entry {op.entry}: {got} pages loaded, "
                                    f"the entry held {entry.counts}")
        return granted

    def _take(self, pages: tuple[int, ...],
              expect: str | None) -> tuple[tuple[int, ...], ...] | None:
        op = TakeOp(pages, expect)
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

HOST_FRACTION = 0.25
"""Host slots of a generated host stream, as a fraction of each class's device pages
(:func:`host_slots_for`): a quarter, so a few suspended requests fill the store."""


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


def host_slots_for(chain: Chain, fraction: float = HOST_FRACTION) -> tuple[int, ...]:
    """Default host slots per band of a generated host stream: ``fraction`` of the pages of
    that band's class the whole device buffer could hold (``buffer_bytes // page_bytes``),
    at least 1 - small enough that a long stream fills the store and evicts."""
    return tuple(max(1, int(chain.layout.buffer_bytes // max(b.page_bytes, 1) * fraction))
                 for b in chain.layout.bands)


def generate_stream(chain: Chain, n_ops: int, seed: int, *,
                    audit: bool = True, cache: bool = False,
                    cache_defect: str | None = None, host: bool = False,
                    host_slots: tuple[int, ...] | None = None,
                    host_defect: str | None = None) -> ChainRecorder:
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

    With ``host``, the recorder gets a host store of ``host_slots`` per band (default
    :func:`host_slots_for`) and the workload suspends to it: a request whose extension is
    refused (pressure) is offloaded to host (:class:`HostOffloadOp`, all its pages, state
    with the KV) instead of finishing, seven times in ten; a running request is also
    offloaded now and then; suspended requests resume oldest first by a load-back
    (:class:`HostLoadOp`, priced like every take: a refusal keeps it suspended); when the
    store has no room for an offload, host evictions (:class:`HostEvictOp`, LRU) drop the
    oldest suspended requests (they would be recomputed) until it fits. ``host_defect``
    plants a defect (:class:`ChainRecorder`). Without ``host`` the stream is the same as
    before host operations existed.

    Raises:
        ConfigError: ``n_ops < 0``, or a bad ``host_slots``/``host_defect``.
    """
    if n_ops < 0:
        raise ConfigError(f"n_ops must be >= 0, got {n_ops}")
    if host and host_slots is None:
        host_slots = host_slots_for(chain)
    rec = ChainRecorder(chain, audit=audit, host_slots=host_slots if host else None,
                        host_defect=host_defect)
    rec.cache_defect = cache_defect
    work = _Workload(chain, rec, random.Random(seed), cache, host)
    kinds = list(_WEIGHTS)
    weights = [w if host or k not in _HOST_KINDS else 0 for k, w in _WEIGHTS.items()]
    while rec.counts.operations < n_ops:
        getattr(work, work.rng.choices(kinds, weights)[0])()
    return rec


#: The workload's operation kinds -> their draw weights; one :class:`_Workload` method each.
_WEIGHTS: dict[str, int] = {"prefill": 6, "chunk": 4, "decode": 10, "finish": 4, "slot": 1,
                            "gate": 1, "fence": 2, "flush": 1, "probe": 1, "offload": 2,
                            "load": 3}
_HOST_KINDS = frozenset({"offload", "load"})  # drawn only with a host store


class _Workload:
    """The seeded request workload of :func:`generate_stream` over one recorder: its
    running requests, its suspended ones (host entry id -> request) and the prefix-cache
    unit each request locked; one method per operation kind, each drawing from ``rng`` in
    a fixed order (the streams replay)."""

    def __init__(self, chain: Chain, rec: ChainRecorder, rng: random.Random, cache: bool,
                 host: bool) -> None:
        self.chain, self.rec, self.rng, self.cache, self.host = chain, rec, rng, cache, host
        self.suspended: dict[int, _Request] = {}  # host entry id -> the suspended request
        self.locks: dict[int, int] = {}  # id(request) -> the unit it locked
        self.requests: list[_Request] = []
        layout = chain.layout
        self.nb = chain.num_bands
        self.p = layout.page_size
        self.i_state, self.i_full = (_band_of(chain, x) for x in ("state", "full"))
        # Every window and chunked-local band, each with its own window (band, tokens, local).
        self.wins = [(i, b.cache_class.window or 1, b.lifetime is LifetimeClass.LOCAL)
                     for i, b in enumerate(layout.bands)
                     if b.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]
        token_bytes = sum(b.page_bytes for b in layout.bands if b.label != "state")
        self.cap_tokens = max(4, layout.buffer_bytes // max(token_bytes, 1) * self.p // 6)

    # --- the requests' pages ------------------------------------------------------------

    def take(self, pages: list[int]) -> tuple[tuple[int, ...], ...] | None:
        """A take of ``pages`` per band, its expectation from the chain's price."""
        quote = self.chain.price(Demand(tuple(pages)))
        return self.rec.run(TakeOp(tuple(pages), "fit" if quote.fits else "refuse"))

    @staticmethod
    def win_start(tokens: int, window: int, local: bool) -> int:
        """The first token a window (or chunked-local) band keeps after ``tokens``."""
        return tokens // window * window if local else max(0, tokens - window + 1)

    def extend(self, req: _Request, c: int) -> bool:
        """Grow ``req`` by ``c`` tokens (one take), then release its window tails;
        False: the take was refused (nothing changed)."""
        nb, p, rec = self.nb, self.p, self.rec
        pages = [0] * nb
        new_tokens = req.tokens + c
        if self.i_full is not None:
            pages[self.i_full] = -(-new_tokens // p) - -(-req.tokens // p)
        want: dict[int, list[int]] = {}
        for i_win, window, local in self.wins:
            held = {t for t, _ in req.window_pages.get(i_win, [])}
            lo = self.win_start(req.tokens, window, local) // p if req.tokens else 0
            want[i_win] = [t for t in range(lo, -(-new_tokens // p)) if t not in held]
            pages[i_win] = len(want[i_win])
        if self.i_state is not None and not req.pages.get(self.i_state):
            pages[self.i_state] = 1
        got = self.take(pages) if any(pages) else tuple(() for _ in range(nb))
        if got is None:
            return False
        for i in range(nb):
            if i in want:
                req.window_pages.setdefault(i, []).extend(zip(want[i], got[i], strict=True))
            elif got[i]:
                req.pages.setdefault(i, []).extend(got[i])
        req.tokens = new_tokens
        for i_win, window, local in self.wins:  # window-tail release after the forward
            keep = set(range(self.win_start(new_tokens, window, local) // p,
                             -(-new_tokens // p)))
            held_pages = req.window_pages.get(i_win, [])
            old = [v for t, v in held_pages if t not in keep]
            if old:
                rec.release(i_win, old)
                req.window_pages[i_win] = [(t, v) for t, v in held_pages if t in keep]
        return True

    def order(self, req: _Request) -> list[list[int]]:
        """The request's held ids per band, in a fixed order (full/state as taken, window
        pages oldest first) - the order a load-back's grant maps back onto."""
        pages = [list(req.pages.get(i, [])) for i in range(self.nb)]
        for band, held_pages in req.window_pages.items():
            pages[band] = [v for _, v in held_pages]
        return pages

    def unlock(self, req: _Request) -> None:
        """Drop the prefix-cache lock ``req`` holds, if its unit is still cached."""
        rec = self.rec
        unit = self.locks.pop(id(req), None)
        if unit is not None and rec.cache is not None and any(
                u.uid == unit for u in rec.cache.units):
            rec.run(CacheUnlockOp(unit))

    def end(self, req: _Request) -> None:
        """``req`` finishes: with a cache, half the time its pages become one cached unit;
        else every page is released."""
        self.requests.remove(req)
        rec = self.rec
        if self.cache:
            self.unlock(req)
            if self.rng.random() < 0.5:
                pages = self.order(req)
                if any(pages):
                    rec.run(CacheInsertOp(tuple(tuple(p) for p in pages)))
                return
        for i, vids in req.pages.items():
            if vids:
                rec.release(i, vids)
        for i_win, held_pages in req.window_pages.items():
            if held_pages:
                rec.release(i_win, [v for _, v in held_pages])

    def suspend(self, req: _Request) -> bool:
        """Suspend ``req`` to host (evicting LRU entries for room); False: not offloaded."""
        rec = self.rec
        assert rec.host is not None
        pages = self.order(req)
        counts = tuple(len(x) for x in pages)
        if not any(counts) or any(n > pool.slots for n, pool in
                                  zip(counts, rec.host.pools, strict=True)):
            return False
        for _ in range(len(rec.host.entries)):  # bounded: an eviction may free nothing
            if rec.host.fits(counts):
                break
            rec.run(HostEvictOp())
            if rec.last_evicted is not None:
                self.suspended.pop(rec.last_evicted, None)
        if not rec.host.fits(counts):
            return False
        if self.cache:
            self.unlock(req)
        before = rec.last_offload
        rec.run(HostOffloadOp(tuple(tuple(x) for x in pages)))
        if rec.last_offload is None or rec.last_offload == before:
            return False  # (a violation was counted)
        self.requests.remove(req)
        self.suspended[rec.last_offload] = req
        return True

    def resume(self, uid: int) -> None:
        """Resume the suspended request of entry ``uid`` by a priced load-back."""
        rec = self.rec
        assert rec.host is not None
        req = self.suspended[uid]
        counts = rec.host.entry(uid).counts
        quote = self.chain.price(Demand(counts))
        got = rec.run(HostLoadOp(uid, "fit" if quote.fits else "refuse"))
        if got is None:
            return
        del self.suspended[uid]
        for i in range(self.nb):
            if i in req.window_pages:
                req.window_pages[i] = [(t, v) for (t, _), v in
                                       zip(req.window_pages[i], got[i], strict=False)]
            elif i in req.pages:
                req.pages[i] = list(got[i])
        self.requests.append(req)

    # --- the operation kinds (one draw of the stream each) -------------------------------

    def prefill(self) -> None:
        """A new request: maybe a cache hit (a lock), then its prompt in one take."""
        rng, rec = self.rng, self.rec
        req = _Request(0, {}, {})
        self.requests.append(req)
        if self.cache and rec.cache is not None and rec.cache.units and rng.random() < 0.3:
            uid = rng.choice(rec.cache.units).uid  # a hit locks before pricing
            rec.run(CacheLockOp(uid))
            self.locks[id(req)] = uid
        if not self.extend(req, rng.randint(1, self.cap_tokens)):
            if self.cache:
                self.end(req)
            else:
                self.requests.remove(req)

    def _grow(self, decode: bool) -> None:
        if not self.requests:
            self.prefill()
            return
        rng = self.rng
        req = rng.choice(self.requests)
        grew = self.extend(req, 1 if decode else rng.randint(1, 2 * self.p))
        if not grew and not (self.host and rng.random() < 0.7 and self.suspend(req)):
            self.end(req)  # refused: suspended to host, or finished (retracted)

    def chunk(self) -> None:
        """A running request's prefill chunk of 1..2P tokens (no request: a prefill)."""
        self._grow(decode=False)

    def decode(self) -> None:
        """A running request's decode token (no request: a prefill)."""
        self._grow(decode=True)

    def finish(self) -> None:
        """A running request finishes (no request: a prefill)."""
        if not self.requests:
            self.prefill()
            return
        self.end(self.rng.choice(self.requests))

    def offload(self) -> None:
        """A running request is suspended to host."""
        if self.requests:
            self.suspend(self.rng.choice(self.requests))

    def load(self) -> None:
        """The oldest suspended request is loaded back."""
        if self.suspended:
            self.resume(min(self.suspended))

    def slot(self) -> None:
        """Half the time, a request drops its extra state slot or takes one."""
        i_state, rng = self.i_state, self.rng
        if i_state is None or not (self.requests and rng.random() < 0.5):
            return
        req = rng.choice(self.requests)
        slots = req.pages.get(i_state, [])
        if len(slots) > 1:
            self.rec.release(i_state, [slots.pop()])
            return
        pages = [0] * self.nb
        pages[i_state] = 1
        got = self.take(pages)
        if got is not None:
            req.pages.setdefault(i_state, []).extend(got[i_state])

    def gate(self) -> None:
        """The move gate toggles (or opens), realizing moves half the time."""
        rng = self.rng
        self.rec.run(GateOp(not self.chain.gate.open if rng.random() < 0.7 else True,
                            realize_moves=rng.random() < 0.5))

    def fence(self) -> None:
        """A fence is held, or the held one completes."""
        self.rec.run(FenceHoldOp() if self.rng.random() < 0.5 else FenceCompleteOp())

    def flush(self) -> None:
        """The idle flush runs."""
        self.rec.run(FlushOp())

    def probe(self) -> None:
        """Takes of a random unit just past capacity (refused) and, half the time, at it
        (fits; released at once)."""
        rng, nb = self.rng, self.nb
        unit = [rng.randint(0, 1) for _ in range(nb)]
        if not any(unit):
            unit[rng.randrange(nb)] = 1
        n = max_units(self.chain.snapshot(), Demand(tuple(unit)))
        self.take([(n + 1) * u for u in unit])  # just past capacity: refused
        if n and rng.random() < 0.5:
            got = self.take([n * u for u in unit])  # at capacity: fits
            if got is not None:
                for i in range(nb):
                    if got[i]:
                        self.rec.release(i, list(got[i]))
