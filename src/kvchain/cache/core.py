"""The prefix cache's state: what every part of :class:`~kvchain.cache.radix.PrefixCache`
reads and writes, and nothing that computes with it.

Owns :class:`CacheCore`: the validated settings (geometry, interval, policy, junctions,
audit flag), the tree's root and node ids, the logical clock, the Evictor's ``version``,
the incremental eviction order's heap and counters (worked by
:mod:`kvchain.cache.order`), the held and evicted page counters, and the reference counts
of the pages running requests read (:class:`~kvchain.cache.page_refs.PageRefs`, worked by
:mod:`kvchain.cache.pins`); plus the tree's plain walks (:meth:`CacheCore.nodes`, the node
of a path holding a page).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvchain.alloc.snapshot import EvictionOrder
from kvchain.audit import resolve_audit
from kvchain.cache.nodes import Node
from kvchain.cache.page_refs import PageRefs
from kvchain.cache.points import CacheGeometry, ResumePolicy, cache_refusal
from kvchain.errors import AuditError, ConfigError, InvalidRequestError


class CacheCore:
    """The state of a prefix cache (its arguments and errors:
    :class:`~kvchain.cache.radix.PrefixCache`, which is this state with the operations of
    :mod:`kvchain.cache.order`, :mod:`~kvchain.cache.tree`, :mod:`~kvchain.cache.insert`,
    :mod:`~kvchain.cache.pins`, :mod:`~kvchain.cache.audit` and :mod:`~kvchain.cache.evict`
    over it)."""

    def __init__(self, geom: CacheGeometry, interval_tokens: int = 512,
                 policy: ResumePolicy = ResumePolicy.BLOCKS, junctions: bool = True,
                 junction_min_tokens: int | None = None, *,
                 audit: bool | None = None) -> None:
        refused = cache_refusal(geom)
        if refused is not None:
            raise ConfigError(f"no prefix cache on this chain: {refused}; run without it "
                              f"(--no-prefix-cache)")
        p = geom.page_size
        if type(interval_tokens) is not int or interval_tokens < p or interval_tokens % p:
            raise InvalidRequestError(f"interval_tokens must be a positive multiple of the page "
                                      f"size {p}, got {interval_tokens!r}")
        if junction_min_tokens is None:
            junction_min_tokens = interval_tokens
        if type(junction_min_tokens) is not int or junction_min_tokens < 1:
            raise InvalidRequestError(f"junction_min_tokens must be an int >= 1, got "
                                      f"{junction_min_tokens!r}")
        self.geom = geom
        self.interval_pages = interval_tokens // p
        self.policy = ResumePolicy(policy).resolve(geom)
        self.junctions = bool(junctions)
        self.junction_min_pages = -(-junction_min_tokens // p)
        self._next_id = 1
        # The window and chunked-local bands, in the order of ``geom.windows``: every
        # node keeps one id list per band (``Node.win[k]`` is band ``self._wbands[k]``).
        self._wbands = tuple(pol.band for pol in geom.windows)
        # The full-attention bands: every node keeps one id list per band
        # (``Node.full[k]`` is band ``self._fbands[k]``), all as long as its keys.
        self._fbands = geom.fulls
        self.root = Node(0, None, 0, [], [[] for _ in self._fbands],
                         [[] for _ in self._wbands], {}, 0)
        self._clock = 0
        # The Evictor's version, a plain attribute (read on the chain memo's hot path):
        # bumped by every change that may change the eviction order: a change of the
        # tree, and a lock, unlock, touch or pin that changes some node's share of the
        # order (a touch of a path only running hits lock, say, changes none and bumps
        # nothing).
        self.version = 0
        self.audit_walks = resolve_audit(audit)
        self.full_walks = 0
        # The incremental eviction order (see "Eviction order, kept incrementally" below).
        self._ready: list[tuple[int, int, int, int, Node]] = []  # heap: (key, kind, nid, ser)
        self._serial = 0
        self._entries = 0  # live entries of the ready heap (the rest are stale)
        self._units = 0  # eviction units of the whole walk
        self._total = [0] * geom.num_bands  # pages per band the whole walk frees
        self._published: tuple[int, EvictionOrder, list[tuple[int, Node]]] | None = None
        self.evicted_pages = [0] * geom.num_bands
        self.evictions = 0
        self._held = [0] * geom.num_bands  # pages / slots held per band (held_counts)
        # Running readers per cached page id (reference counts), one PageRefs per window
        # band (``geom.windows``' order) and, last, the state band's (checkpoint slots a
        # hit resumes from, until copied): one mechanism for every tail a request reads.
        self._refs = [PageRefs() for _ in range(len(self._wbands) + 1)]

    # --- tree walks ----------------------------------------------------------------------

    def nodes(self) -> Iterator[Node]:
        """Every node but the root (depth first)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _bump(self) -> None:
        self.version += 1

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _new_id(self) -> int:
        nid = self._next_id
        self._next_id += 1
        return nid

    @staticmethod
    def _node_of(handle: Node, page: int) -> Node:
        """The node of ``handle``'s path (root..handle) holding page index ``page``.

        Raises:
            AuditError: no node of the path holds it.
        """
        n: Node | None = handle
        while n is not None and n.nid:
            if n.start <= page < n.end:
                return n
            n = n.parent
        raise AuditError(f"page {page} is not on the locked path ending at node {handle.nid}")

