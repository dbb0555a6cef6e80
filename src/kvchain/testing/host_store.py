"""A reference host store for operation streams: one host pool per band, entries in LRU.

An operation stream's host operations (:mod:`kvchain.testing.streams`) move a request's
pages between the chain and this store. Each band ``i`` has one
:class:`~kvchain.buffer.host_pool.HostPool` of ``slots[i]`` slots (the band's page size: a
host slot holds one device page of its class, so slot counts are in pages). An **entry** is
one offloaded request: the slots it holds per band, under a stable id (``0, 1, 2, ...`` in
the order entries are created, so a replay names the same entries). Entries are kept in LRU
order - oldest offload first; an entry is used once (a load-back removes it), so its age is
its last use - and host eviction drops the oldest entry with all its classes together.

:meth:`ReferenceHostStore.audit` checks from scratch that every host slot is in exactly one
place (held by exactly one entry, or free) and, on a chain with a state band, that no entry
holds KV slots without a state slot (KV whose state was dropped could never be resumed;
the failure sglang #39436 reports).

Planted defects (``defect``; tests of the audit's own power): ``"evict_keeps_kv"`` - a host
eviction frees the entry's state slots but keeps its KV slots in the store.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kvchain.buffer.host_pool import HostPool
from kvchain.errors import AuditError, ConfigError, HostPoolFullError

HOST_DEFECTS: tuple[str, ...] = ("evict_keeps_kv",)
"""Planted host-store defects understood by :class:`ReferenceHostStore`."""


@dataclass(slots=True)
class HostEntry:
    """One offloaded request: host slot ids per band (int64 arrays, one per band)."""

    uid: int
    slots: list[np.ndarray]

    @property
    def counts(self) -> tuple[int, ...]:
        """Slots (= device pages) per band, low -> high."""
        return tuple(int(s.size) for s in self.slots)


class ReferenceHostStore:
    """Host pools per band plus the entries that hold their slots, in LRU order.

    Args:
        labels: band labels, low -> high (``"state"`` marks the state band).
        slots: host slots per band (pages of that band's class), each >= 0.
        defect: a planted defect (:data:`HOST_DEFECTS`) or ``None``.

    Raises:
        ConfigError: ``slots`` and ``labels`` differ in length, or an unknown defect.
        BufferArgumentError: a negative slot count (from :class:`HostPool`).
    """

    def __init__(self, labels: tuple[str, ...], slots: tuple[int, ...], *,
                 defect: str | None = None) -> None:
        if len(labels) != len(slots):
            raise ConfigError(f"host slots name {len(slots)} bands, the chain has "
                              f"{len(labels)}")
        if defect is not None and defect not in HOST_DEFECTS:
            raise ConfigError(f"unknown host defect {defect!r}; known: {HOST_DEFECTS}")
        self.labels = labels
        self.pools = [HostPool(label, n) for label, n in zip(labels, slots, strict=True)]
        self.entries: OrderedDict[int, HostEntry] = OrderedDict()
        self.defect = defect
        self._next_uid = 0
        self._state = labels.index("state") if "state" in labels else None

    def fits(self, counts: tuple[int, ...]) -> bool:
        """Whether ``counts[i]`` slots are free in every band's pool now."""
        return all(n <= pool.free_count for n, pool in zip(counts, self.pools, strict=True))

    def offload(self, counts: tuple[int, ...]) -> HostEntry:
        """Allocate a new entry of ``counts[i]`` slots per band (all bands or none).

        Raises:
            ConfigError: ``counts`` names a different number of bands, or (on a chain
                with a state band) holds KV slots but no state slot.
            HostPoolFullError: some pool has too few free slots (nothing is taken).
        """
        if len(counts) != len(self.pools):
            raise ConfigError(f"host offload names {len(counts)} bands, the store has "
                              f"{len(self.pools)}")
        if self._state is not None and counts[self._state] == 0 and any(counts):
            raise ConfigError("host offload of KV without its state slot (on a state chain "
                              "the state always goes with the KV)")
        for n, pool in zip(counts, self.pools, strict=True):
            if n > pool.free_count:
                raise HostPoolFullError(
                    f"host pool {pool.label!r} has {pool.free_count:,} free slots; {n:,} "
                    f"asked for", label=pool.label, wanted=n, free=pool.free_count)
        entry = HostEntry(self._next_uid, [pool.alloc(n) for n, pool in
                                           zip(counts, self.pools, strict=True)])
        self._next_uid += 1
        self.entries[entry.uid] = entry
        return entry

    def entry(self, uid: int) -> HostEntry:
        """The entry ``uid``.

        Raises:
            ConfigError: no such entry (never created, loaded back or evicted).
        """
        try:
            return self.entries[uid]
        except KeyError:
            raise ConfigError(f"no host entry {uid}") from None

    def drop(self, uid: int) -> None:
        """Free every slot of entry ``uid`` and forget it (a load-back that fit).

        Raises:
            ConfigError: no such entry.
        """
        entry = self.entry(uid)
        for pool, s in zip(self.pools, entry.slots, strict=True):
            pool.free(s)
        del self.entries[uid]

    def evict_lru(self) -> int | None:
        """Drop the least recently used entry, all its classes together; returns its id,
        or ``None`` when the store holds no entry."""
        if not self.entries:
            return None
        uid = next(iter(self.entries))
        if self.defect == "evict_keeps_kv" and self._state is not None:
            entry = self.entries[uid]
            self.pools[self._state].free(entry.slots[self._state])
            entry.slots[self._state] = np.zeros(0, dtype=np.int64)
            self.entries.move_to_end(uid)  # kept (wrongly) as KV without its state
            return uid
        self.drop(uid)
        return uid

    def audit(self) -> None:
        """Every host slot held by exactly one entry or free; no KV without its state.

        Raises:
            AuditError: a pool's own audit fails, a slot held by two entries, a held slot
                no entry holds (leaked), an entry's slot that is free, or an entry with KV
                slots and no state slot on a state chain.
        """
        for i, pool in enumerate(self.pools):
            pool.audit()
            mine = [e.slots[i] for e in self.entries.values()]
            ids = np.concatenate(mine) if mine else np.zeros(0, dtype=np.int64)
            if ids.size != np.unique(ids).size:
                raise AuditError(f"host band {i}: a slot is held by two entries")
            try:
                pool.check_held(ids, "host entry slot")
            except Exception as exc:  # a free slot some entry still names
                raise AuditError(f"host band {i}: {exc}") from None
            if ids.size != pool.held_count:
                raise AuditError(f"host band {i}: {pool.held_count - ids.size} held slots no "
                                 f"entry holds (leaked)")
        if self._state is not None:
            for e in self.entries.values():
                counts = e.counts
                if counts[self._state] == 0 and any(counts):
                    raise AuditError(f"host entry {e.uid} holds KV {counts} without its "
                                     f"state slot")
