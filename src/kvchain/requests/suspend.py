"""Retraction by host copy, the request layer's part: a request suspended to the host tier
and resumed (issue 23, item 5).

A **suspension** takes a running request off the device without losing its KV: every page
and state slot it reads is given a host slot of its class (one :class:`HostPool` per band
label), its device pages are released exactly as a retraction releases them
(:meth:`KVManager.free <kvchain.requests.manager.KVManager.free>`: the prefix cache's
pages are unlocked, the request's own pages freed), and what it held is kept as counts in
a :class:`Suspended` record. With a :class:`HostSide` that has a host buffer and a device
backend, the bytes move too (:func:`kvchain.cache.host_copy.offload_request`); without
(the simulator's bookkeeping-only chain), only the host slots are accounted.

A **resume** is a load-back demand for exactly the pages it held (:attr:`Suspended.demand`,
pages per band):

==================  ======================================================================
band                pages loaded back (row entries ``[first, end)`` as it held them)
==================  ======================================================================
full attention      all of them: ``ceil(L / P)`` pages (``L`` its tokens)
sliding window /    its live tail ``[first, end)`` (the pages before its window were
chunked local       released before the suspension, their entries are the null page)
state               its slots (the working slot, and speculative checkpoints if any)
==================  ======================================================================

priced like any demand by the one snapshot pricing and realized in the step's one take
(:meth:`KVManager.allocate <kvchain.requests.manager.KVManager.allocate>` with
``resumes``): the take's quote is its price, so price == outcome; the new pages go to the
same row entries, the host bytes are copied into them and the host slots are freed. A
refused take changes nothing: the request stays suspended with its host slots.

What a resumed request no longer has: its prefix-cache facts. It comes back holding every
page it reads as its own (a hit's shared pages were copied to host with the rest; the cache
still holds its own copies), with no resume points still to save and no prompt to insert: a
request suspended before its prompt was inserted never inserts it. This keeps the cache's
locks and pins out of the host tier (a suspended request holds none), at the price of host
bytes for pages the cache may also keep (the hit), and of a prompt the cache does not learn.

Which slots: :func:`host_side_for` builds the pools from a byte budget with the host tier's
own split (:func:`kvchain.cache.host_tier.host_tier_plan`: whole resume intervals per class),
the one place to point at another host-tier object's pools later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from kvchain.alloc.snapshot import Demand, Quote
from kvchain.buffer.host import HostBuffer
from kvchain.buffer.host_pool import HostPool
from kvchain.buffer.numpy_buffer import NumpyBuffer
from kvchain.buffer.torch_buffer import TorchBuffer
from kvchain.cache.host_cache import HostTier
from kvchain.cache.host_copy import (
    PageTables,
    RequestHostCopy,
    free_host_copy,
    load_back_request,
    offload_request,
)
from kvchain.cache.host_tier import host_tier_plan
from kvchain.errors import (
    AuditError,
    BufferArgumentError,
    ConfigError,
    HostPoolFullError,
    InvalidDemandError,
    UnknownRequestError,
)
from kvchain.layout import ChainLayout
from kvchain.requests.batch import check_rid, request_ids
from kvchain.requests.demand import HeldPages
from kvchain.requests.rows import Rows


class SlotPool(Protocol):
    """What a suspension needs of one class's host slots (:class:`HostPool` has it all)."""

    @property
    def slots(self) -> int:
        """Slots of the pool."""
        ...

    @property
    def held_count(self) -> int:
        """Slots held by suspended requests."""
        ...

    @property
    def free_count(self) -> int:
        """Slots a suspension could take now."""
        ...

    def alloc(self, n: int) -> np.ndarray:
        """``n`` free slot ids (raises ``HostPoolFullError`` taking nothing when short)."""
        ...

    def free(self, slots: Any) -> None:
        """Give held slots back."""
        ...

    def check_held(self, slots: Any, what: str = "host slot") -> np.ndarray:
        """The slots as ids, checked held."""
        ...

    def audit(self) -> None:
        """The pool's own invariant."""
        ...


class LentPool:
    """One band's slots of a host prefix cache (:class:`HostTier`) lent to suspensions:
    :meth:`alloc` takes through :meth:`HostTier.take_slots` (evicting host cache units when
    the pool is short), :meth:`free` gives back through :meth:`HostTier.give_slots`, and
    :attr:`held_count` counts only the lent slots, so the suspension audit and the host
    cache's audit each see their own.

    Args:
        tier: the run's host tier.
        band: the band index (chain order).
    """

    def __init__(self, tier: HostTier, band: int) -> None:
        self.tier = tier
        self.band = band
        self.pool = tier.pools[band]

    @property
    def slots(self) -> int:
        """Slots of the band's host pool (shared with the host cache)."""
        return self.pool.slots

    @property
    def held_count(self) -> int:
        """Slots lent out (held by suspended requests)."""
        return self.tier.outside_count(self.band)

    @property
    def free_count(self) -> int:
        """Slots :meth:`alloc` can hand out: free, or freed by evicting host cache units."""
        return self.tier.available_count(self.band)

    def alloc(self, n: int) -> np.ndarray:
        """``n`` slots, evicting host cache units as needed.

        Raises:
            HostPoolFullError: fewer than ``n`` even with every unlocked unit evicted.
        """
        return self.tier.take_slots(self.band, n)

    def free(self, slots: Any) -> None:
        """Give lent slots back to the tier."""
        self.tier.give_slots(self.band, np.asarray(slots, dtype=np.int64))

    def check_held(self, slots: Any, what: str = "host slot") -> np.ndarray:
        """As :meth:`HostPool.check_held` on the shared pool."""
        return self.pool.check_held(slots, what)

    def audit(self) -> None:
        """The shared pool's own invariant."""
        self.pool.audit()


@dataclass(frozen=True, slots=True)
class HostSide:
    """Where suspended requests' pages go: one host slot pool per band label.

    Attributes:
        pools: band label -> its :class:`HostPool` (every band of the chain needs one, of
            any size, 0 slots included).
        buffer: the host buffer whose pools these are, when bytes move (``None``: slots
            are accounted only, as in the simulator).
        device: the chain's byte backend (with ``buffer``).
        page_bytes: band label -> bytes of one slot (the band's page bytes), for byte
            counts.

    Raises:
        ConfigError: ``buffer`` without ``device`` or the reverse.
    """

    pools: Mapping[str, SlotPool]
    page_bytes: Mapping[str, int]
    buffer: HostBuffer | None = None
    device: NumpyBuffer | TorchBuffer | None = None

    def __post_init__(self) -> None:
        if (self.buffer is None) != (self.device is None):
            raise ConfigError("a host side that moves bytes needs both its host buffer and "
                              "the chain's device backend")

    @staticmethod
    def of_buffer(buffer: HostBuffer, device: NumpyBuffer | TorchBuffer) -> HostSide:
        """The host side of a host buffer's own pools, copying bytes to and from
        ``device`` (the chain's backend)."""
        return HostSide({r.label: buffer.pool(r.label) for r in buffer.regions},
                        {r.label: r.page_bytes for r in buffer.regions}, buffer, device)

    @staticmethod
    def of_tier(tier: HostTier) -> HostSide:
        """The host side of a host prefix cache's pools, lent band by band
        (:class:`LentPool`): one host budget for the cache and the suspensions (slots are
        accounted only, as in the simulator)."""
        return HostSide({c.label: LentPool(tier, b) for b, c in enumerate(tier.plan.classes)},
                        {c.label: c.page_bytes for c in tier.plan.classes})

    @property
    def slots(self) -> dict[str, int]:
        """Slots per band label."""
        return {label: pool.slots for label, pool in self.pools.items()}

    @property
    def held(self) -> dict[str, int]:
        """Slots held per band label."""
        return {label: pool.held_count for label, pool in self.pools.items()}

    def held_bytes(self) -> int:
        """Bytes of the held slots: ``sum(held x page_bytes)``."""
        return sum(pool.held_count * self.page_bytes[label]
                   for label, pool in self.pools.items())

    def pool(self, label: str) -> SlotPool:
        """The pool of band ``label``.

        Raises:
            BufferArgumentError: no pool for that label.
        """
        try:
            return self.pools[label]
        except KeyError:
            raise BufferArgumentError(f"no host pool for cache class {label!r} (pools: "
                                      f"{', '.join(self.pools)})") from None

    def audit(self) -> None:
        """Every pool's own invariant (:meth:`HostPool.audit`)."""
        for pool in self.pools.values():
            pool.audit()


def host_side_for(layout: ChainLayout, host_bytes: int, interval_tokens: int) -> HostSide:
    """Host slot pools for retraction by host copy from a byte budget: one
    :class:`HostPool` per band, sized by the host tier's split of ``host_bytes``
    (:func:`kvchain.cache.host_tier.host_tier_plan` with resume intervals of
    ``interval_tokens``: every class gets the same number of whole intervals), no bytes
    allocated (accounting only).

    The one helper that decides where retraction's host slots come from: a run that also
    keeps a host prefix cache can hand its host tier's pools to :class:`HostSide`
    instead.

    Example: the three-band test chain (``P = 4``; state 48 B, window 8 B, full 16 B
    pages) with ``K = 16`` tokens and 10,000 B: 76 intervals, so 76 state, 152 window and
    304 full slots (tests/requests/test_suspend.py).

    Raises:
        ConfigError: as :func:`host_tier_plan` (``host_bytes`` not a whole number >= 0,
            ``interval_tokens`` not one >= 1).
    """
    plan = host_tier_plan(layout, host_bytes, interval_tokens)
    return HostSide({c.label: HostPool(c.label, c.slots) for c in plan.classes},
                    {c.label: c.page_bytes for c in plan.classes})


@dataclass(slots=True, eq=False)
class Suspended:
    """A request suspended to host (:meth:`Suspensions.suspend`).

    Attributes:
        rid: the request.
        tokens: tokens whose KV it held (``L``; it resumes at ``L``).
        held: the spans ``(first, end)`` per band it held and holds again once resumed.
        demand: pages per band its resume loads back: ``end - first`` per band.
        slots: per band (band order), the host slots holding its pages, int64 ``[n]`` in
            entry order (entry ``first + i`` in slot ``slots[band][i]``).
        labels: the band labels (the pools the slots are in).
        nbytes: bytes of those slots (``sum(n x page_bytes)``).
        host: the host side holding them.
        copy: the byte copy's record, when bytes moved (``None``: accounting only).
    """

    rid: int
    tokens: int
    held: HeldPages
    demand: Demand
    slots: tuple[np.ndarray, ...]
    labels: tuple[str, ...]
    nbytes: int
    host: HostSide
    copy: RequestHostCopy | None = field(default=None)

    @property
    def pages(self) -> int:
        """Pages and slots held on host, all bands."""
        return sum(int(s.size) for s in self.slots)

    def check_held(self) -> None:
        """Check that every host slot of this record is still held in its pool.

        Raises:
            BufferArgumentError: a slot freed (a defect: the record lost its copy).
        """
        for label, slots in zip(self.labels, self.slots, strict=True):
            self.host.pool(label).check_held(slots)

    def free_slots(self) -> None:
        """Return its host slots to their pools (after the load-back read them)."""
        for label, slots in zip(self.labels, self.slots, strict=True):
            if slots.size:
                self.host.pool(label).free(slots)


class Suspensions:
    """A manager's requests suspended to host: the only record of them (request id ->
    :class:`Suspended`, in suspension order), the suspension, the load-back's checks and
    restore, and their audit. The manager owns one (``kv.suspensions``) and its
    ``allocate(..., resumes=...)`` loads records back in the step's one take.

    Args:
        rows: the manager's requests and their table.
        pages: the manager's page tables and chain (what the byte copy reads).
        release: the manager's release of a retracted request (``free`` without
            insert): ``release(rid) -> pages released``.
        load: the manager's take that loads one suspended request back:
            ``load(rid, quote) -> demand taken`` (``allocate([], resumes=[rid])``).
    """

    def __init__(self, rows: Rows, pages: PageTables, release: Callable[[int], int],
                 load: Callable[[int, Quote | None], Demand]) -> None:
        self._rows, self._pages, self._chain = rows, pages, pages.chain
        self._release, self._load = release, load
        self.records: dict[int, Suspended] = {}

    def suspend(self, rid: int, host: HostSide) -> Suspended:
        """Suspend running request ``rid`` to host: give every page and state slot it holds
        (row entries ``[first, end)`` per band, a prefix-cache hit's shared pages
        included) a host slot of its class, copy the bytes when ``host`` has a buffer,
        then release its device pages as a retraction does (``KVManager.free`` without
        insert: the cache's pages unlocked, its own released). It holds no device page
        afterwards and comes back with :meth:`resume` (or ``allocate(..., resumes=[rid])``).

        Returns:
            Its :class:`Suspended` record (also kept here: :meth:`suspended`).

        Raises:
            UnknownRequestError: ``rid`` holds no pages.
            HostPoolFullError: a class's pool has fewer free slots than ``rid`` holds
                pages there (checked for every band first: nothing taken or released).
            BufferArgumentError: ``host`` not a :class:`HostSide` (``None`` included), no
                pool in it for a band, or its slots not the band's page bytes (nothing
                changed).
        """
        slot = self._rows.of(rid).slot
        if not isinstance(host, HostSide):
            raise BufferArgumentError(f"request {rid}: suspend needs a HostSide (its host "
                                      f"slot pools), got {type(host).__name__}")
        held = self._rows.table.held(slot)
        bands = self._chain.layout.bands
        counts = tuple(end - first for first, end in held.spans)
        self._check_room(rid, host, counts)
        labels = tuple(b.label for b in bands)
        copy: RequestHostCopy | None = None
        if host.buffer is not None and host.device is not None:
            copy, fence = offload_request(self._pages, host.device, host.buffer, rid)
            fence.wait()  # the device pages are released below: the copy must be done
            host_slots = tuple(part.slots for part in copy.bands)
        else:
            host_slots = tuple(host.pool(label).alloc(n)
                               for label, n in zip(labels, counts, strict=True))
        tokens = int(self._rows.table.tokens[slot])
        self._release(rid)
        sus = Suspended(rid, tokens, held, Demand(counts), host_slots, labels,
                        sum(n * b.page_bytes for n, b in zip(counts, bands, strict=True)),
                        host, copy)
        self.records[rid] = sus
        return sus

    def _check_room(self, rid: int, host: HostSide, counts: tuple[int, ...]) -> None:
        """That ``host`` has, per band, a pool of the band's page bytes with ``counts``
        free slots (errors: :meth:`suspend`)."""
        for layout, n in zip(self._chain.layout.bands, counts, strict=True):
            pool = host.pool(layout.label)
            if host.page_bytes.get(layout.label) != layout.page_bytes:
                raise BufferArgumentError(
                    f"the {layout.label} band has pages of {layout.page_bytes:,} B but its "
                    f"host slots hold {host.page_bytes.get(layout.label)} B")
            if n > pool.free_count:
                raise HostPoolFullError(
                    f"request {rid} holds {n:,} {layout.label} pages but the host pool has "
                    f"{pool.free_count:,} free slots", label=layout.label, wanted=n,
                    free=pool.free_count)

    def suspend_bytes(self, rid: int) -> int:
        """Bytes :meth:`suspend` of ``rid`` would copy to host now: ``sum((end - first) x
        page_bytes)`` over its bands (0 if it holds nothing)."""
        facts = self._rows.get(rid)
        if facts is None:
            return 0
        spans = self._rows.table.held(facts.slot).spans
        return sum((end - first) * b.page_bytes
                   for (first, end), b in zip(spans, self._chain.layout.bands, strict=True))

    def is_suspended(self, rid: int) -> bool:
        """Whether ``rid`` is suspended to host.

        Raises:
            InvalidDemandError: ``rid`` not an int id (:func:`check_rid`).
        """
        check_rid(rid)
        return rid in self.records

    def suspended(self, rid: int) -> Suspended:
        """The record of suspended ``rid``.

        Raises:
            UnknownRequestError: it is not suspended.
            InvalidDemandError: ``rid`` not an int id (:func:`check_rid`).
        """
        check_rid(rid)
        try:
            return self.records[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid} is not suspended to host") from None

    @property
    def ids(self) -> tuple[int, ...]:
        """Requests suspended to host, in suspension order."""
        return tuple(self.records)

    def resume_demand(self, rid: int) -> Demand:
        """The load-back demand of suspended ``rid``: pages per band it held
        (:attr:`Suspended.demand`).

        Raises:
            UnknownRequestError: it is not suspended.
        """
        return self.suspended(rid).demand

    def resume(self, rid: int, quote: Quote | None = None) -> Demand:
        """Load suspended ``rid`` back on its own: the manager's ``allocate([],
        resumes=[rid])`` (the injected ``load``), one
        take of :meth:`resume_demand` (``quote``: its price from ``chain.price``, if the
        caller has it).

        Raises:
            UnknownRequestError: ``rid`` is not suspended (nothing changed).
            CapacityError: the load-back does not fit (nothing changed: it stays
                suspended).
        """
        self.suspended(rid)
        return self._load(rid, quote)

    def check_resumes(self, resumes: Sequence[int], ids: tuple[int, ...]
                      ) -> tuple[Suspended, ...]:
        """The records of ``resumes``, each suspended, named once, not in ``ids`` (the
        take's batch), with its host slots held (before any change).

        Raises:
            InvalidDemandError: ``resumes`` not a sequence of int ids, a resume not
                suspended, named twice or also in ``ids``.
            BufferArgumentError: a resume whose host slots are no longer held.
        """
        rids = request_ids(resumes, "resumes")
        if len(set(rids)) != len(rids) or not set(rids).isdisjoint(ids):
            raise InvalidDemandError("a resume is named twice or is also in the batch")
        out = []
        for rid in rids:
            if isinstance(rid, bool) or rid not in self.records:
                raise InvalidDemandError(f"request {rid!r} is not suspended to host")
            sus = self.records[rid]
            sus.check_held()
            out.append(sus)
        return tuple(out)

    def restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        """Give resumed ``sus`` its new pages ``vids`` (per band, entry order) at the row
        entries it held, load its host bytes into them and free its host slots."""
        del self.records[sus.rid]
        slot = self._rows.register(sus.rid).slot
        table = self._rows.table
        table.tokens[slot] = sus.tokens
        for band, ((first, _), got) in enumerate(zip(sus.held.spans, vids, strict=True)):
            table.set_row(band, slot, first, got)
        table.refresh_need(np.asarray([slot], dtype=np.int64))
        host, copy = sus.host, sus.copy
        if copy is not None and host.buffer is not None and host.device is not None:
            rebased = RequestHostCopy(copy.rid, tuple(
                replace(part, vids=np.asarray(got, dtype=np.int64), table_pages=end)
                for part, got, (_, end) in zip(copy.bands, vids, sus.held.spans,
                                               strict=True)))
            fence = load_back_request(self._pages, host.device, host.buffer, rebased)
            free_host_copy(host.buffer, rebased, after=fence)
        else:
            sus.free_slots()

    def audit(self, host: HostSide) -> None:
        """Every suspended request's pages are in exactly one place, on host: it holds no
        device page (no row), each of its pages has one held host slot of its class (none
        shared with another request), and every held host slot of ``host`` belongs to a
        suspended request (no leaked host slot); then each pool's own invariant.

        Raises:
            AuditError: a suspended request that also holds device pages, a record whose
                slots do not match its demand, a host slot held twice, freed, or leaked.
        """
        host.audit()
        per_label: dict[str, list[np.ndarray]] = {label: [] for label in host.pools}
        for rid, sus in self.records.items():
            self._audit_record(rid, sus, host, per_label)
        for label, parts in per_label.items():
            got = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            if np.unique(got).size != got.size:
                raise AuditError(f"host pool {label!r}: a slot is held by two suspended "
                                 f"requests")
            held = host.pools[label].held_count
            if held != got.size:
                raise AuditError(f"host pool {label!r}: {held} slots held, {got.size} by "
                                 f"suspended requests: {held - got.size} leaked")

    def _audit_record(self, rid: int, sus: Suspended, host: HostSide,
                      per_label: dict[str, list[np.ndarray]]) -> None:
        """One record of :meth:`audit`: off the device, slots matching its demand and
        held; its slots in ``host`` added to ``per_label``."""
        if rid in self._rows:
            raise AuditError(f"request {rid} is suspended to host and holds device pages")
        if tuple(int(s.size) for s in sus.slots) != sus.demand.pages:
            raise AuditError(f"request {rid}: {[int(s.size) for s in sus.slots]} host "
                             f"slots for a load-back of {sus.demand.pages}")
        if sus.host is not host:
            return
        try:
            sus.check_held()
        except BufferArgumentError as exc:
            raise AuditError(f"suspended request {rid}: {exc}") from None
        for label, s in zip(sus.labels, sus.slots, strict=True):
            per_label[label].append(s)
