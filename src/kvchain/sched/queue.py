"""The waiting queue: FCFS in ``O(1)`` per operation, SPF on a heap in ``O(log n)``,
cache-aware (FCFS with a bounded look-ahead for cached prefixes).

The scheduler walks waiting requests in policy order and stops at the first that does not
fit, so a step reads only the head of the order. Neither policy copies or sorts the queue:

* ``FCFS`` (arrival order, retracted requests back to the front): a deque; ``append``,
  ``appendleft`` and removing the head are ``O(1)``; the walk iterates the deque itself.
* ``SPF`` (shortest remaining prefill first, ties by arrival time, then id): a binary heap
  of ``(remaining prefill, arrival, id)`` keys with lazy deletion. Insert is
  ``O(log n)``; removal marks the entry dead in ``O(1)`` (dead entries are dropped when they
  reach the top, amortized ``O(log n)``). The walk reads the heap in key order without
  popping it: a best-first search over heap positions (the children of a yielded position
  enter a small frontier heap), ``O(k log k)`` for the first ``k`` requests.
* ``CACHE_AWARE`` (longest cached prefix first within a look-ahead, no starvation): the FCFS
  deque; :meth:`WaitingQueue.cache_aware_order` reorders only its first ``lookahead``
  requests (default 32) by the prefix-cache hit each would get now (most hit tokens first,
  ties in queue order), after any request already passed over ``max_passes`` times
  (default 8), in queue order; the rest follows in queue order. A request is *passed over*
  when a request behind it in the queue is admitted before it (counted by
  :meth:`WaitingQueue.remove`, ``O(lookahead)``). Bound: since admission walks the order
  and stops at the first request that does not fit, nothing is admitted after a request
  it did not admit; so once a request has been passed over ``max_passes`` times it leads
  the order and no later request is admitted before it: at most ``max_passes`` requests
  that arrived after it are admitted before it (FCFS: none). A step costs one pure cache
  match per look-ahead request (``O(lookahead x pages matched)``). The same idea as
  SGLang's longest-prefix-match policy (``--schedule-policy lpm``), bounded here so a cold
  request cannot starve.

A waiting request's key does not change while it waits: ``computed`` is 0 for every
waiting request (a prefix-cache hit attached during a walk is detached again unless the
request is admitted, and admission removes it), and ``prefill_target`` changes only when a
running request is retracted, before it re-enters the queue.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from enum import StrEnum

from kvchain.errors import InvalidRequestError
from kvchain.sched.request import Request


class QueuePolicy(StrEnum):
    """Order in which waiting requests are considered (module docstring)."""

    FCFS = "fcfs"
    SPF = "spf"
    CACHE_AWARE = "cache-aware"


CACHE_LOOKAHEAD = 32
"""Waiting requests (from the queue's head) the cache-aware order may reorder."""

CACHE_MAX_PASSES = 8
"""Times a waiting request may be passed over before the cache-aware order puts it first."""


def spf_key(r: Request) -> tuple[int, float, int]:
    """SPF order of a waiting request: remaining prefill (tokens), arrival (seconds), id."""
    return (r.remaining_prefill, r.arrival_s, r.rid)


class WaitingQueue:
    """Waiting requests in policy order.

    Args:
        policy: ``FCFS``, ``SPF`` or ``CACHE_AWARE``.
        lookahead: ``CACHE_AWARE``: requests from the head it may reorder (>= 1).
        max_passes: ``CACHE_AWARE``: passes over a request before it goes first (>= 0).

    Iterating yields the requests in the order admission walks them (FCFS and
    ``CACHE_AWARE``: queue order, see :meth:`cache_aware_order`; SPF: ascending
    :func:`spf_key`); the queue must not change during an iteration.
    ``len``, truth value and ``in`` (by request identity) are ``O(1)``.

    Raises:
        InvalidRequestError: a ``lookahead`` below 1 or ``max_passes`` below 0.
    """

    def __init__(self, policy: QueuePolicy = QueuePolicy.FCFS,
                 lookahead: int = CACHE_LOOKAHEAD, max_passes: int = CACHE_MAX_PASSES) -> None:
        if type(lookahead) is not int or lookahead < 1:
            raise InvalidRequestError(f"lookahead must be an int >= 1, got {lookahead!r}")
        if type(max_passes) is not int or max_passes < 0:
            raise InvalidRequestError(f"max_passes must be an int >= 0, got {max_passes!r}")
        self.policy = QueuePolicy(policy)
        self.lookahead = lookahead
        self.max_passes = max_passes
        self.passes: dict[int, int] = {}  # CACHE_AWARE: rid -> times passed over
        self._members: dict[int, Request] = {}  # rid -> request, for O(1) membership
        self._fifo: deque[Request] = deque()
        # SPF: (key, entry number, request); an entry is live while _entry[rid] is its
        # number (a request that left and came back has a new entry, the old one is dead).
        self._heap: list[tuple[tuple[int, float, int], int, Request]] = []
        self._entry: dict[int, int] = {}
        self._next_entry = 0
        self._dead = 0  # heap entries whose request left the queue

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __contains__(self, r: object) -> bool:
        return isinstance(r, Request) and self._members.get(r.rid) is r

    def __iter__(self) -> Iterator[Request]:
        if self.policy is not QueuePolicy.SPF:
            return iter(self._fifo)
        return self._heap_order()

    def cache_aware_order(self, hit_tokens: Callable[[Request], int]) -> Iterator[Request]:
        """The ``CACHE_AWARE`` walk (module docstring): of the first ``lookahead`` queued
        requests, those passed over ``max_passes`` times or more in queue order, then the
        others by ``hit_tokens`` (prefix-cache hit now, tokens) descending, ties in queue
        order; then the rest of the queue in order. Calls ``hit_tokens`` once per
        look-ahead request (not for starved ones, nor for a queue of one).
        """
        fifo = self._fifo
        head = list(itertools.islice(fifo, self.lookahead))
        if len(head) < 2:  # nothing to reorder: no match needed
            yield from fifo
            return
        limit = self.max_passes
        starved = [r for r in head if self.passes.get(r.rid, 0) >= limit]
        ranked = sorted(((-hit_tokens(r), i, r) for i, r in enumerate(head)
                         if self.passes.get(r.rid, 0) < limit), key=lambda e: e[:2])
        yield from starved
        yield from (r for _, _, r in ranked)
        yield from itertools.islice(fifo, len(head), None)

    def append(self, r: Request) -> None:
        """Queue ``r`` at the back (FCFS, ``CACHE_AWARE``) or by its key (SPF).

        Raises:
            InvalidRequestError: a request with this id is already queued (nothing changes).
        """
        self._add(r)
        if self.policy is not QueuePolicy.SPF:
            self._fifo.append(r)

    def appendleft(self, r: Request) -> None:
        """Queue a retracted request at the front (FCFS, ``CACHE_AWARE``) or by its key
        (SPF).

        Raises:
            InvalidRequestError: a request with this id is already queued (nothing changes).
        """
        self._add(r)
        if self.policy is not QueuePolicy.SPF:
            self._fifo.appendleft(r)

    def remove(self, r: Request) -> None:
        """Take ``r`` out of the queue: ``O(1)`` at the FCFS head (admission takes a prefix
        of the queue) and for SPF (lazy deletion), ``O(n)`` elsewhere in a FCFS queue.

        Raises:
            InvalidRequestError: ``r`` is not queued (nothing changes).
        """
        if r not in self:
            raise InvalidRequestError(f"request {r.rid} is not waiting")
        del self._members[r.rid]
        if self.policy is not QueuePolicy.SPF:
            fifo = self._fifo
            if fifo[0] is r:
                fifo.popleft()
            else:
                if self.policy is QueuePolicy.CACHE_AWARE:  # each one ahead is passed over
                    passes = self.passes
                    for ahead in fifo:
                        if ahead is r:
                            break
                        passes[ahead.rid] = passes.get(ahead.rid, 0) + 1
                fifo.remove(r)
            self.passes.pop(r.rid, None)
            return
        del self._entry[r.rid]
        self._dead += 1
        heap, entry = self._heap, self._entry
        while heap and entry.get(heap[0][2].rid) != heap[0][1]:
            heapq.heappop(heap)
            self._dead -= 1
        if self._dead > len(self._members):  # mostly dead: rebuild, O(n) amortized
            self._heap = [e for e in heap if entry.get(e[2].rid) == e[1]]
            heapq.heapify(self._heap)
            self._dead = 0

    def _add(self, r: Request) -> None:
        if r.rid in self._members:
            raise InvalidRequestError(f"request {r.rid} is already waiting")
        self._members[r.rid] = r
        if self.policy is QueuePolicy.SPF:
            number = self._next_entry
            self._next_entry += 1
            self._entry[r.rid] = number
            heapq.heappush(self._heap, (spf_key(r), number, r))

    def _heap_order(self) -> Iterator[Request]:
        """The live heap entries in key order, without popping the heap: positions enter a
        frontier heap when their parent is yielded (a heap's order is a tree order)."""
        heap, entry = self._heap, self._entry
        n = len(heap)
        if not n:
            return
        frontier: list[tuple[tuple[int, float, int], int, int]] = [(heap[0][0], heap[0][1], 0)]
        while frontier:
            _, number, i = heapq.heappop(frontier)
            r = heap[i][2]
            if entry.get(r.rid) == number:
                yield r
            for c in (2 * i + 1, 2 * i + 2):
                if c < n:
                    heapq.heappush(frontier, (heap[c][0], heap[c][1], c))
