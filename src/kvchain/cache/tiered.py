"""The device prefix cache with a host tier below it: write-through and load-back plans.

:class:`TieredPrefixCache` is the device's :class:`~kvchain.cache.radix.PrefixCache`
(the chain's evictor, unchanged) that also

* **writes through** every prompt it inserts to its :class:`~kvchain.cache.host_cache.HostTier`
  (:meth:`HostTier.write <kvchain.cache.host_cache.HostTier.write>`);
* **plans load-backs** (:meth:`TieredPrefixCache.plan_load`): a prompt that resumes after
  ``d`` pages on the device and after ``h > d`` pages on the host can be served from
  ``h`` once the device holds what a device hit at ``h`` reads: full pages ``[0, h)``,
  every window band's tail ``[resume_start(h), h)``, and the checkpoint after ``h``
  pages. The plan's :class:`LoadPlan.demand` is exactly the device pages and slots of
  what is missing (pages per band, the chain's :class:`~kvchain.alloc.snapshot.Demand`),
  priced by admission like any demand;
* **realizes** a priced load (:meth:`TieredPrefixCache.realize_load`): the granted device
  pages take the loaded bytes and are inserted into the device tree, so the request then
  attaches to an ordinary device hit of ``h`` pages (its locks, pins and checkpoint copy
  are the device hit's own).

While a load is priced and taken, the device prefix the plan counts on (full pages
``[0, q)`` and their tails) is locked (:meth:`lock_prefix`), so the take's own evictions
cannot remove a page the plan did not load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvchain.alloc.snapshot import Demand
from kvchain.cache.host_cache import HostTier, checkpoint_id, window_id
from kvchain.cache.radix import CacheGeometry, Hit, Node, PrefixCache, ResumePolicy
from kvchain.errors import PlanMismatchError


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """A load-back of a prompt's prefix from the host tier (:meth:`TieredPrefixCache.plan_load`).

    Attributes:
        device_pages: ``d``, pages the prompt resumes after on the device alone.
        host_pages: ``h > d``, pages it resumes after once the load is done.
        full_from: ``q``: the device holds full pages ``[0, q)`` of the prompt's path
            (``q = min(matched, h)``); the load brings full pages ``[q, h)``.
        window: per window band (by band index), the page indices of the tail
            ``[resume_start(h), h)`` the device lacks (the load brings them).
        checkpoint: whether the load brings the checkpoint after ``h`` pages.
        demand: device pages (state slots) per band the load takes.
        host_hit: the host's hit (its ids are host slots) the bytes come from.
    """

    device_pages: int
    host_pages: int
    full_from: int
    window: Mapping[int, tuple[int, ...]]
    checkpoint: bool
    demand: Demand
    host_hit: Hit


class TieredPrefixCache(PrefixCache):
    """The device prefix cache with a host tier (module docstring).

    Args:
        geom, interval_tokens, policy, junctions, junction_min_tokens, audit: as
            :class:`PrefixCache`.
        host: the host tier it writes through to and loads back from.

    Raises:
        as :class:`PrefixCache`.
    """

    def __init__(self, geom: CacheGeometry, host: HostTier, interval_tokens: int = 512,
                 policy: ResumePolicy = ResumePolicy.BLOCKS, junctions: bool = True,
                 junction_min_tokens: int | None = None, *, audit: bool | None = None) -> None:
        super().__init__(geom, interval_tokens, policy, junctions, junction_min_tokens,
                         audit=audit)
        self.host = host

    def insert(self, keys: Sequence[int], shared: int,
               full: Sequence[int] | Mapping[int, Sequence[int]],
               window: Mapping[int, Mapping[int, int]],
               ckpts: Mapping[int, int]) -> list[list[int]]:
        """:meth:`PrefixCache.insert`, then write the prompt through to the host tier
        (:meth:`HostTier.write`)."""
        dups = super().insert(keys, shared, full, window, ckpts)
        self.host.write(keys, window, ckpts)
        return dups

    def audit(self, handles: Sequence[Node],
              pins: tuple[Sequence[tuple[int, int]], Sequence[int]] | None = None,
              prompt_handles: Sequence[Node] = ()) -> None:
        """:meth:`PrefixCache.audit` of the device tree, then the host tier's own
        (:meth:`HostTier.audit`: host slots each held once or free, no stranded full page).

        Raises:
            AuditError: naming the first thing found wrong.
        """
        super().audit(handles, pins, prompt_handles)
        self.host.audit()

    # --- load-back ------------------------------------------------------------------------

    def plan_load(self, keys: Sequence[int], prompt_tokens: int,
                  below: int | None = None) -> LoadPlan | None:
        """The load-back that serves the deepest host resume point ``h`` (pages) past the
        device's own hit ``d``, with ``h < below`` when given (a shorter load after a
        longer one did not fit); ``None`` when the host resumes no deeper than the device
        (pure: nothing is locked, touched or taken).

        Demand per band: full ``h - q`` pages (``q``: the device's matched full pages, at
        most ``h``); each window band the pages of ``[resume_start(h), h)`` absent from
        the device path; state 1 slot unless the device already holds the checkpoint
        after ``h`` pages.
        """
        g = self.geom
        p = g.page_size
        cap_tokens = prompt_tokens
        if below is not None:
            cap_tokens = min(cap_tokens, (below - 1) * p + 1)
        if cap_tokens <= p:  # a hit covers at most (tokens - 1) // P pages
            return None
        hh = self.host.match(keys, cap_tokens)  # first: most prompts miss on the host
        h = hh.pages
        if not h:
            return None
        d = self.match(keys, prompt_tokens).pages
        if h <= d:
            return None
        path, matched = self._path(keys[:h])
        q = min(matched, h)
        pages = [0] * g.num_bands
        if g.full is not None:
            pages[g.full] = h - q
        window: dict[int, tuple[int, ...]] = {}
        for k, pol in enumerate(g.windows):
            missing = []
            for i in range(pol.resume_start(h), h):
                if i >= q or window_id(path, k, i) < 0:
                    missing.append(i)
            window[pol.band] = tuple(missing)
            pages[pol.band] = len(missing)
        checkpoint = False
        if g.state is not None:
            checkpoint = not (h <= q and checkpoint_id(path, h) >= 0)
            pages[g.state] = int(checkpoint)
        return LoadPlan(d, h, q, window, checkpoint, Demand(tuple(pages)), hh)

    def lock_prefix(self, keys: Sequence[int], pages: int) -> Node | None:
        """Lock (with tails) the device path of ``keys``'s first ``pages`` pages (a plan's
        ``full_from``), so that a take's evictions keep what a load plan counts on;
        ``None`` for 0 pages. Undo with ``unlock(handle)``.

        Raises:
            PlanMismatchError: the device no longer holds those pages.
        """
        if pages <= 0:
            return None
        path, matched = self._path(keys[:pages])
        if matched < pages:
            raise PlanMismatchError(f"lock of {pages} device pages: the path holds {matched}")
        return self.lock(Hit(pages, path[-1][0]))

    def realize_load(self, keys: Sequence[int], plan: LoadPlan,
                     granted: Sequence[Sequence[int]]) -> list[list[int]]:
        """Insert a priced load into the device tree: ``granted`` are the device ids the
        chain bound for ``plan.demand`` (per band, ``len(granted[b]) ==
        plan.demand.pages[b]``), which take the host's bytes (full pages ``[q, h)``, the
        missing window tail pages, the checkpoint). Not written through (the host holds
        it). Counts the load on the host tier and touches its host path. Returns the
        duplicates the caller must release (none while the plan's prefix is locked).

        Raises:
            PlanMismatchError: a grant that does not match the plan's demand.
        """
        g = self.geom
        if tuple(len(ids) for ids in granted) != plan.demand.pages:
            raise PlanMismatchError(f"load grant of {[len(i) for i in granted]} pages for a "
                                    f"demand of {list(plan.demand.pages)}")
        h, q = plan.host_pages, plan.full_from
        full: list[int] = []
        if g.full is not None:
            full = [-1] * q + [int(v) for v in granted[g.full]]
        window = {band: dict(zip(idx, (int(v) for v in granted[band]), strict=True))
                  for band, idx in plan.window.items()}
        ckpts = {h: int(granted[g.state][0])} if plan.checkpoint and g.state is not None \
            else {}
        dups = PrefixCache.insert(self, list(keys[:h]), q, full, window, ckpts)
        self.host.touch(plan.host_hit)
        self.host.count_load(plan.demand.pages,
                             (h - plan.device_pages) * g.page_size)
        return dups

