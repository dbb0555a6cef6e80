"""The waiting queue: FCFS in ``O(1)`` per operation, SPF on a heap in ``O(log n)``.

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

A waiting request's key does not change while it waits: ``computed`` is 0 for every
waiting request (a prefix-cache hit attached during a walk is detached again unless the
request is admitted, and admission removes it), and ``prefill_target`` changes only when a
running request is retracted, before it re-enters the queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from enum import StrEnum

from kvchain.errors import InvalidRequestError
from kvchain.sched.request import Request


class QueuePolicy(StrEnum):
    """Order in which waiting requests are considered."""

    FCFS = "fcfs"
    SPF = "spf"


def spf_key(r: Request) -> tuple[int, float, int]:
    """SPF order of a waiting request: remaining prefill (tokens), arrival (seconds), id."""
    return (r.remaining_prefill, r.arrival_s, r.rid)


class WaitingQueue:
    """Waiting requests in policy order.

    Args:
        policy: ``FCFS`` or ``SPF``.

    Iterating yields the requests in the order admission walks them (FCFS: queue order;
    SPF: ascending :func:`spf_key`); the queue must not change during an iteration.
    ``len``, truth value and ``in`` (by request identity) are ``O(1)``.
    """

    def __init__(self, policy: QueuePolicy = QueuePolicy.FCFS) -> None:
        self.policy = policy
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
        if self.policy is QueuePolicy.FCFS:
            return iter(self._fifo)
        return self._heap_order()

    def append(self, r: Request) -> None:
        """Queue ``r`` at the back (FCFS) or by its key (SPF).

        Raises:
            InvalidRequestError: a request with this id is already queued (nothing changes).
        """
        self._add(r)
        if self.policy is QueuePolicy.FCFS:
            self._fifo.append(r)

    def appendleft(self, r: Request) -> None:
        """Queue a retracted request at the front (FCFS) or by its key (SPF).

        Raises:
            InvalidRequestError: a request with this id is already queued (nothing changes).
        """
        self._add(r)
        if self.policy is QueuePolicy.FCFS:
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
        if self.policy is QueuePolicy.FCFS:
            fifo = self._fifo
            if fifo[0] is r:
                fifo.popleft()
            else:
                fifo.remove(r)
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
