"""The prefix cache as the request layer sees it: the 11 methods (and no attribute) of
:class:`~kvchain.cache.radix.PrefixCache` that :class:`~kvchain.requests.cache_glue.CacheGlue`
and :mod:`~kvchain.requests.cache_audit` call, and nothing else (docs/architecture.md,
"The prefix cache as the request layer sees it"). The glue holds its cache as a
:class:`CachePort`, so a call of any other cache method from the request layer fails the
type check. ``PrefixCache`` has them all; the chain's side (the eviction order, ``evict``)
is the chain's, through ``set_evictor``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from kvchain.cache.radix import Adopted, Hit, Node


class CachePort(Protocol):
    """What the request layer calls of a prefix cache (units: pages unless said).

    Reads no attribute: the resume points (geometry, interval, policy, junctions) are the
    cache's own computation, :meth:`resume_points`.
    """

    def resume_points(self, whole_pages: int, hit: int = 0, matched: int = 0,
                      prompt_tokens: int | None = None) -> tuple[tuple[int, ...], int]:
        """``(points, junction)`` a prompt of ``whole_pages`` pages saves (in pages)."""
        ...

    def match(self, keys: Sequence[int], prompt_tokens: int, max_gap: int = 0) -> Hit:
        """Match page keys -> the hit (pure: nothing locked)."""
        ...

    def acquire(self, hit: Hit) -> Node | None:
        """Lock a hit's path and reference what it reads; the lock's node."""
        ...

    def lock_holds(self, handle: Node | None) -> tuple[int, ...]:
        """Pages per band a hit lock keeps beyond its full pages."""
        ...

    def touch(self, handle: Node | None, window_first: int) -> None:
        """LRU touch of a locked path."""
        ...

    def adopt(self, keys: Sequence[int], shared: int,
              full: Sequence[int] | Mapping[int, Sequence[int]],
              window: Mapping[int, Mapping[int, int]], ckpts: Mapping[int, int],
              reading: Mapping[int, Iterable[int]], own_from: int | None = None,
              ) -> Adopted:
        """Insert a running request's prompt pages so far and hand them over."""
        ...

    def unpin_pages(self, band: int, vids: np.ndarray | Sequence[int]) -> None:
        """Drop one reference to each of these page ids of ``band``."""
        ...

    def unlock(self, handle: Node | None, tails: bool = True) -> None:
        """Release a lock (and, with ``tails``, its tail references)."""
        ...

    def held_pages(self) -> list[list[int]]:
        """The pages the cache holds, per band (audits only)."""
        ...

    def checkpoint_at(self, handle: Node, point: int) -> int:
        """The checkpoint slot saved at ``point`` pages on a locked path, or -1 (audits
        only)."""
        ...

    def audit(self, handles: Sequence[Node],
              pins: tuple[Sequence[tuple[int, int]], Sequence[int]] | None = None,
              prompt_handles: Sequence[Node] = ()) -> None:
        """The cache's own audit with the requests' locks and pins (AuditError)."""
        ...
