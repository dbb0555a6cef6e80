"""The host tier's prefix cache: a second radix tree below the device's, over host slots.

The host tier (:class:`HostTier`) is the device prefix cache's machinery run a second time:
a :class:`~kvchain.cache.radix.PrefixCache` with the same page keys, the same resume
rules (a hit ends where every class resumes: full pages, every window band's tail, a
state checkpoint) and the same LRU walk with its cascade (``LEAF`` and ``TAILS`` units,
dead leaves first), whose "virtual ids" are host slot ids of one
:class:`~kvchain.buffer.host_pool.HostPool` per band. The pools are sized by
:func:`~kvchain.cache.host_tier.host_tier_plan` (every class gets the same number of resume
intervals). So the rules the device cache keeps hold on the host by construction: a
checkpoint is dropped only by a unit that the walk orders as on the device, and a host
leaf left without a checkpoint is dead and goes next (:meth:`HostTier.evict_for`).

Write policy: **write-through at insert** (docs/host-tier.md, "Write policy"): when the
device cache inserts a prompt's pages (at the commit of each prefill chunk that completes
whole pages), the host tier gets a copy of what that insert offers and the host does not
hold yet - the full pages past the host's
own matched prefix, the window tails of its resume points, the checkpoints. On a state
chain only the prefix up to the deepest checkpoint offered is written (full pages past it
could never be resumed from: the 0-of-8 host hits of sglang #39436). A write that cannot
find room even after evicting every unlocked host unit is skipped (counted).

Eviction order and invariants are the device cache's; :meth:`HostTier.audit` adds the
host's own: every host slot is held by exactly one host node or is free, and on a state
chain no host full page lacks a checkpoint at or after it (:meth:`HostTier.stranded_full_pages`
must be 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvchain.buffer.host_pool import HostPool
from kvchain.cache.host_tier import HostTierPlan, host_tier_plan
from kvchain.cache.radix import CacheGeometry, Hit, Node, PrefixCache, ResumePolicy
from kvchain.errors import AuditError, ConfigError
from kvchain.field_types import is_whole
from kvchain.layout import ChainLayout


class HostPrefixCache(PrefixCache):
    """A :class:`PrefixCache` over host slots, with what the host tier needs of its walk:
    the first unit of the eviction order and a lock of a matched prefix."""

    def first_unit(self) -> tuple[int, Node] | None:
        """``(kind, node)`` of the first unit of the eviction order (``LEAF`` or
        ``TAILS``), ``None`` when nothing is evictable. O(log nodes)."""
        order = self.eviction_order()
        if not order.units:
            return None
        order.walk_to(1)
        published = self._published
        assert published is not None and published[1] is order
        return published[2][0]

    def lock_prefix(self, keys: Sequence[int]) -> tuple[Node | None, int]:
        """Lock (with tails) the longest prefix of ``keys`` the tree holds full pages for;
        returns the handle (for :meth:`unlock`) and its length in pages (0: nothing)."""
        path, matched = self._path(keys)
        if not matched:
            return None, 0
        return self.lock(Hit(matched, path[-1][0])), matched

    def path_of(self, keys: Sequence[int]) -> list[tuple[Node, int]]:
        """The matched ``(node, pages matched in it)`` pairs of ``keys`` from the root
        (pure; read with :func:`window_id` and :func:`checkpoint_id`)."""
        return self._path(keys)[0]


def window_id(path: Sequence[tuple[Node, int]], k: int, i: int) -> int:
    """The id of page ``i`` of window band ``k`` (its place in ``geom.windows``) on a
    matched path (:meth:`HostPrefixCache.path_of`, or the device tree's), -1 if absent."""
    for node, j in path:
        if node.start <= i < node.start + j:
            win = node.win[k]
            return win[i - node.start] if win else -1
    return -1


def checkpoint_id(path: Sequence[tuple[Node, int]], point: int) -> int:
    """The slot of the checkpoint after ``point`` pages on a matched path, -1 if none."""
    for node, j in path:
        if node.start < point <= node.start + j:
            return node.ckpts.get(point, -1)
    return -1


def host_tier_refusal(geom: CacheGeometry) -> str | None:
    """Why the host tier cannot serve a chain of ``geom``, in words, or ``None`` when it
    can: its writes, its load plans (:meth:`kvchain.cache.tiered.TieredPrefixCache.plan_load`)
    and its split of the host bytes keep one full-attention band, so a chain with several
    (a target's and a speculative-decoding draft model's) is refused rather than written
    in part; the device prefix cache serves such a chain (one page list per full band)."""
    if len(geom.fulls) <= 1:
        return None
    return (f"it has {len(geom.fulls)} full-attention bands (e.g. a draft model's), and "
            f"the host tier keeps one; run without --host-bytes (the device prefix cache "
            f"serves it), or with --no-prefix-cache for host retraction alone")


@dataclass(slots=True)
class HostTierStats:
    """What the host tier did, for the run's metrics.

    Attributes:
        pages_written: per band, pages (slots) written to host (the bytes of
            ``host_bytes_written``).
        bytes_written: bytes copied device -> host by write-through.
        writes: prompts written (some pages new to the host).
        writes_skipped: prompts not written: no room even after evicting every unlocked
            host unit.
        pages_loaded: per band, pages loaded back host -> device.
        bytes_loaded: bytes copied host -> device by load-backs.
        loads: load-backs realized.
        tokens_loaded: tokens of prefix those load-backs made resumable on the device
            (``h - d`` summed).
        evicted: per band, host slots freed by host eviction.
        peak_held_bytes: most host bytes held at once.
    """

    pages_written: list[int]
    bytes_written: int = 0
    writes: int = 0
    writes_skipped: int = 0
    pages_loaded: list[int] | None = None
    bytes_loaded: int = 0
    loads: int = 0
    tokens_loaded: int = 0
    evicted: list[int] | None = None
    peak_held_bytes: int = 0


class HostTier:
    """The host tier of one chain: a host pool per band and the host prefix cache over them.

    The one object the rest of the system holds for the host tier (built by
    :func:`kvchain.sim.engine.simulate` when ``host_bytes`` is set): the device cache
    writes through it (:meth:`write`), admission matches it and realizes load-backs from
    it (:class:`~kvchain.cache.tiered.TieredPrefixCache`), and whoever copies a retracted
    request to host later may take slots from the same :attr:`pools` (``take_slots`` /
    ``give_slots``: slots it holds are not the cache's, so they are left out of the
    cache's audit but counted by the pools').

    Args:
        layout: the device chain's layout (band order, page bytes).
        host_bytes: bytes of host memory (``H``), split per class by
            :func:`host_tier_plan`.
        interval_tokens: tokens between resume points (the device cache's interval; a
            positive multiple of the page size).
        geom: the cache geometry (default: read off ``layout``).
        audit: as :class:`PrefixCache` (rebuild-and-compare the eviction order before every
            host eviction; ``None``: the suite's default).

    Attributes:
        plan: the split of ``host_bytes``.
        pools: one :class:`HostPool` per band (chain order).
        cache: the host prefix cache (ids are host slot ids of the band's pool).
        stats: counters (:class:`HostTierStats`).

    Raises:
        ConfigError: ``host_bytes`` not a whole number >= 1 (a NumPy integer is one, as
            in :func:`host_tier_plan`; a bool or float is not), or a bad interval (as
            :func:`host_tier_plan`; an interval that is not a multiple of the page size);
            a chain with several full-attention bands (a target's and a draft model's:
            the host tier's writes, loads and split keep one full band; the device prefix
            cache serves such a chain, run it without ``--host-bytes``).
    """

    def __init__(self, layout: ChainLayout, host_bytes: int, interval_tokens: int,
                 geom: CacheGeometry | None = None, *, audit: bool | None = None) -> None:
        if not is_whole(host_bytes) or host_bytes < 1:
            raise ConfigError(f"host bytes must be a whole number >= 1, got {host_bytes!r}")
        p = layout.page_size
        if not is_whole(interval_tokens) or interval_tokens < p or interval_tokens % p:
            raise ConfigError(f"the host tier's resume interval must be a positive multiple "
                              f"of the page size {p}, got {interval_tokens!r}")
        host_bytes, interval_tokens = int(host_bytes), int(interval_tokens)
        self.layout = layout
        self.geom = geom if geom is not None else CacheGeometry.of(layout)
        refused = host_tier_refusal(self.geom)
        if refused is not None:
            raise ConfigError(f"no host tier on this chain: {refused}")
        self.plan: HostTierPlan = host_tier_plan(layout, host_bytes, interval_tokens)
        self.pools = tuple(HostPool(c.label, c.slots) for c in self.plan.classes)
        self.page_bytes = tuple(b.page_bytes for b in layout.bands)
        self.cache = HostPrefixCache(self.geom, interval_tokens=interval_tokens,
                                     policy=ResumePolicy.BLOCKS, junctions=False, audit=audit)
        nb = len(layout.bands)
        self.stats = HostTierStats([0] * nb, pages_loaded=[0] * nb, evicted=[0] * nb)
        self._outside = [0] * nb  # slots held by callers other than the cache (take_slots)

    # --- occupancy ----------------------------------------------------------------------

    @property
    def held_bytes(self) -> int:
        """Host bytes held (the cache's slots and any taken by :meth:`take_slots`)."""
        return sum(pool.held_count * b for pool, b in zip(self.pools, self.page_bytes,
                                                         strict=True))

    @property
    def capacity_bytes(self) -> int:
        """Bytes of every host slot (``plan.used_bytes`` less the regions' alignment)."""
        return sum(pool.slots * b for pool, b in zip(self.pools, self.page_bytes, strict=True))

    def held_slots(self) -> tuple[int, ...]:
        """Host slots held per band (O(bands))."""
        return tuple(pool.held_count for pool in self.pools)

    # --- slots for other users (retraction by host copy) --------------------------------

    def take_slots(self, band: int, n: int) -> np.ndarray:
        """Take ``n`` free host slots of ``band`` for a caller outside the cache (e.g. a
        retracted request's copy), evicting host cache units as needed; returns the slot
        ids. Give them back with :meth:`give_slots`.

        Raises:
            HostPoolFullError: even with every unlocked unit evicted there are fewer than
                ``n`` free (nothing is taken; what was evicted stays evicted).
        """
        need = [0] * len(self.pools)
        need[band] = n
        self.evict_for(need)
        slots = self.pools[band].alloc(n)
        self._outside[band] += n
        self._note_held()
        return slots

    def available_count(self, band: int) -> int:
        """Slots of ``band`` a caller could take now: the free ones plus every one the host
        cache's whole LRU walk would free (evicting never lowers another band's count)."""
        order = self.cache.eviction_order()
        freed = order.freed(order.units)[band] if order.units else 0
        return self.pools[band].free_count + int(freed)

    def outside_count(self, band: int) -> int:
        """Slots of ``band`` held by callers outside the cache (:meth:`take_slots`)."""
        return self._outside[band]

    def give_slots(self, band: int, slots: np.ndarray) -> None:
        """Return slots of ``band`` taken by :meth:`take_slots`.

        Raises:
            BufferArgumentError: a slot not held (nothing is freed).
        """
        self.pools[band].free(slots)
        self._outside[band] -= len(slots)

    # --- eviction -----------------------------------------------------------------------

    def evict_for(self, need: Sequence[int]) -> bool:
        """Make ``need[b]`` slots free in every band ``b``, evicting the least prefix of the
        host cache's LRU walk that frees enough (then every dead leaf it leaves: see
        :meth:`_drop_dead`). Returns False, evicting nothing, when even the whole walk would
        not free enough."""
        short = [max(0, n - pool.free_count) for n, pool in zip(need, self.pools, strict=True)]
        if not any(short):
            return True
        order = self.cache.eviction_order()
        units = order.units
        if not units or any(f < s for f, s in zip(order.freed(units), short, strict=True)):
            return False
        # The least k with freed(k) >= short in every band: rows are monotone, and a lazy
        # order grows its rows only as far as asked, so search by doubling, then halving.
        def enough(k: int) -> bool:
            return all(f >= s for f, s in zip(order.freed(k), short, strict=True))

        hi = 1
        while hi < units and not enough(hi):
            hi = min(units, 2 * hi)
        lo = hi // 2 + 1 if hi > 1 else 1
        while lo < hi:
            mid = (lo + hi) // 2
            if enough(mid):
                hi = mid
            else:
                lo = mid + 1
        self._evict(lo)
        self._drop_dead()
        return True

    def _evict(self, units: int) -> None:
        freed = self.cache.evict(units)
        ev = self.stats.evicted
        assert ev is not None
        for b, ids in enumerate(freed):
            if ids.size:
                self.pools[b].free(ids)
                ev[b] += int(ids.size)

    def _drop_dead(self) -> None:
        """Evict every dead leaf a partial walk left (on a state chain: a leaf whose
        ``TAILS`` unit dropped its checkpoints; its full pages can never be resumed from).
        Dead units sort before every live one, so they are the walk's first units."""
        if self.geom.state is None:
            return
        while True:
            first = self.cache.first_unit()
            if first is None:
                return
            _, node = first
            if node.lock or node.children or node.ckpts:
                return
            self._evict(1)

    # --- write-through ------------------------------------------------------------------

    def write(self, keys: Sequence[int], window: Mapping[int, Mapping[int, int]],
              ckpts: Mapping[int, int]) -> int:
        """Write a prompt the device cache just inserted: its page keys (pages ``[0, n)``),
        the window pages it offered per window band (page index -> device id) and the
        checkpoints (page count -> device slot). The host takes the full pages past the
        prefix it holds, the window pages and checkpoints it lacks; on a state chain only
        pages ``[0, q)``, ``q`` the deepest checkpoint offered (nothing without one).
        Returns the bytes written (0: nothing new, or skipped for lack of room).

        Device ids are not read here (the simulator accounts bytes; the byte path is
        :class:`~kvchain.buffer.HostBuffer`'s ``to_host``).
        """
        g = self.geom
        n = len(keys)
        if g.state is not None:
            n = max((p for p in ckpts if p <= n), default=0)
        if n <= 0:
            return 0
        keys = list(keys[:n])
        cache = self.cache
        handle, held = cache.lock_prefix(keys)
        try:
            # What the host lacks: window pages and checkpoints absent from its path.
            path = cache.path_of(keys) if held else []
            slot_of = {pol.band: k for k, pol in enumerate(g.windows)}
            offered_win = {band: [i for i in sorted(pages) if i < n and (
                i >= held or window_id(path, slot_of[band], i) < 0)]
                for band, pages in window.items()}
            offered_ck = [p for p in sorted(ckpts) if p <= n and (
                p > held or checkpoint_id(path, p) < 0)]
            need = [0] * len(self.pools)
            if g.full is not None:
                need[g.full] = n - held
            for band, idx in offered_win.items():
                need[band] += len(idx)
            if g.state is not None:
                need[g.state] += len(offered_ck)
            if not any(need):
                return 0
            if not self.evict_for(need):
                self.stats.writes_skipped += 1
                return 0
            got = [self.pools[b].alloc(k).tolist() if k else [] for b, k in enumerate(need)]
            full: list[int] = []
            if g.full is not None:
                full = [-1] * held + got[g.full]
            win = {band: dict(zip(idx, got[band], strict=True))
                   for band, idx in offered_win.items()}
            ck = dict(zip(offered_ck, got[g.state], strict=True)) if g.state is not None else {}
            dups = cache.insert(keys, held, full, win, ck)
        finally:
            cache.unlock(handle)
        written = 0
        for b, (taken, dup) in enumerate(zip(got, dups, strict=True)):
            if dup:
                self.pools[b].free(np.asarray(dup, dtype=np.int64))
            kept = len(taken) - len(dup)
            self.stats.pages_written[b] += kept
            written += kept * self.page_bytes[b]
        self.stats.bytes_written += written
        self.stats.writes += 1 if written else 0
        self._drop_dead()  # none expected: every written path ends at a checkpoint
        self._note_held()
        return written

    def _note_held(self) -> None:
        held = self.held_bytes
        if held > self.stats.peak_held_bytes:
            self.stats.peak_held_bytes = held

    # --- hits ----------------------------------------------------------------------------

    def match(self, keys: Sequence[int], prompt_tokens: int) -> Hit:
        """The host's longest resumable prefix of a prompt (pure; as
        :meth:`PrefixCache.match`, ids are host slots)."""
        return self.cache.match(keys, prompt_tokens)

    def touch(self, hit: Hit) -> None:
        """LRU touch of a host hit that was loaded back (its path and tails are used)."""
        if hit.node is None:
            return
        handle = self.cache.lock(hit)
        try:
            first = min(hit.window_first.values(), default=0)
            self.cache.touch(handle, first)
        finally:
            self.cache.unlock(handle)

    def count_load(self, pages: Sequence[int], tokens: int) -> int:
        """Count a load-back of ``pages[b]`` pages per band making ``tokens`` tokens of
        prefix resumable on the device; returns its bytes."""
        nbytes = sum(k * b for k, b in zip(pages, self.page_bytes, strict=True))
        loaded = self.stats.pages_loaded
        assert loaded is not None
        for b, k in enumerate(pages):
            loaded[b] += k
        self.stats.bytes_loaded += nbytes
        self.stats.loads += 1
        self.stats.tokens_loaded += tokens
        return nbytes

    # --- integrity -----------------------------------------------------------------------

    def stranded_full_pages(self) -> int:
        """Host full pages no hit can resume from: on a state chain, those without a
        checkpoint at or after them in their node or subtree
        (:meth:`PrefixCache.dead_full_pages`); 0 without a state band. O(nodes); the
        target is 0 (issue 23: "0 host-resident full pages without a resumable state")."""
        if self.geom.state is None:
            return 0
        return self.cache.dead_full_pages()[0]

    def audit(self) -> None:
        """The host tier from scratch: the host cache's own audit (tree, counters, order;
        no locks are held between calls), every pool's audit, every slot a host node holds
        held in its pool and held once, the pools' held counts equal to the cache's plus
        the slots taken by :meth:`take_slots`, and no stranded full page on a state chain.

        Raises:
            AuditError: naming the first thing found wrong.
        """
        self.cache.audit([])
        held = self.cache.held_pages()
        for b, (pool, ids) in enumerate(zip(self.pools, held, strict=True)):
            pool.audit()
            if len(set(ids)) != len(ids):
                raise AuditError(f"host band {b}: a slot held by two host nodes")
            try:
                pool.check_held(np.asarray(ids, dtype=np.int64), "host cache slot")
            except Exception as exc:
                raise AuditError(f"host band {b}: {exc}") from exc
            if pool.held_count != len(ids) + self._outside[b]:
                raise AuditError(f"host band {b}: the pool holds {pool.held_count} slots, "
                                 f"the host cache {len(ids)} and other users "
                                 f"{self._outside[b]} (leaked host slots)")
        stranded = self.stranded_full_pages()
        if stranded:
            raise AuditError(f"{stranded} host full pages without a checkpoint at or after "
                             f"them (KV that can never be resumed)")

    def __repr__(self) -> str:
        return (f"HostTier({self.held_bytes:,} of {self.capacity_bytes:,} B held, "
                f"{self.plan.intervals:,} intervals)")

