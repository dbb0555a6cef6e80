"""The manager's requests by id: each one's :class:`~kvchain.requests.view.CacheFacts`
(its row ``slot`` in the :class:`~kvchain.requests.table.RequestTable` and its
prefix-cache facts), the table itself and the slot index over it.

This is what the request layer's collaborators (the audits, the read views, the verify,
the suspensions, the commits, the attach) read and write of a manager's requests: they
get a :class:`Rows`, never the manager.
"""

from __future__ import annotations

from kvchain.errors import UnknownRequestError
from kvchain.requests.batch import check_rid
from kvchain.requests.demand import NOTHING_HELD, HeldPages
from kvchain.requests.lookup import SlotIndex
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts


class Rows:
    """Requests holding pages: request id -> :class:`CacheFacts`, over one request table.

    Args:
        table: the request table whose rows the requests are bound to.

    Attributes:
        table: that table.
        facts: request id -> its facts, in registration order (the one record: the
            manager reads the same dict).
        index: the slot index over ``table`` (:class:`SlotIndex`: request ids -> slots).
    """

    __slots__ = ("facts", "index", "table")

    def __init__(self, table: RequestTable) -> None:
        self.table = table
        self.facts: dict[int, CacheFacts] = {}
        self.index = SlotIndex(table)

    def __contains__(self, rid: object) -> bool:
        """Whether ``rid`` holds pages.

        Raises:
            InvalidDemandError: ``rid`` is not an int request id (:func:`check_rid`: a
                ``bool`` or a float would alias an int id).
        """
        check_rid(rid)
        return rid in self.facts

    def __len__(self) -> int:
        return len(self.facts)

    def of(self, rid: int) -> CacheFacts:
        """The facts of ``rid``.

        Raises:
            UnknownRequestError: it holds no pages.
            InvalidDemandError: ``rid`` is not an int request id (:func:`check_rid`).
        """
        check_rid(rid)
        try:
            return self.facts[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid} holds no pages") from None

    def get(self, rid: int) -> CacheFacts | None:
        """The facts of ``rid``, or ``None`` if it holds no pages.

        Raises:
            InvalidDemandError: ``rid`` is not an int request id (:func:`check_rid`).
        """
        check_rid(rid)
        return self.facts.get(rid)

    def held(self, rid: int) -> HeldPages:
        """The ``(first, end)`` page spans ``rid`` holds per band (:data:`NOTHING_HELD` if
        it holds nothing).

        Raises:
            InvalidDemandError: ``rid`` is not an int request id (:func:`check_rid`).
        """
        facts = self.get(rid)
        return self.table.held(facts.slot) if facts is not None else NOTHING_HELD

    def tokens(self, rid: int) -> int:
        """Tokens of ``rid`` in the cache (0 if it holds nothing).

        Raises:
            InvalidDemandError: ``rid`` is not an int request id (:func:`check_rid`).
        """
        facts = self.get(rid)
        return int(self.table.tokens[facts.slot]) if facts is not None else 0

    def register(self, rid: int) -> CacheFacts:
        """Bind ``rid`` to a fresh (empty) table row and return its new facts."""
        facts = self.facts[rid] = CacheFacts(self.table.bind(rid))
        return facts

    def unregister(self, rid: int) -> None:
        """Unbind ``rid``'s row and drop its facts (it holds nothing any more).

        Raises:
            KeyError: ``rid`` is not registered (callers check with :meth:`of` first).
        """
        del self.facts[rid]
        self.table.unbind(rid)
