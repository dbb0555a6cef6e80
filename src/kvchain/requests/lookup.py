"""Request ids -> their rows in the request table, memoized per batch of ids.

A decode step asks for the slots of one batch of request ids several times (its demands,
its take, its commit); :class:`SlotIndex` answers a repeat of the same tuple of ids at the
same slot version of the :class:`~kvchain.requests.table.RequestTable` from the one
:class:`SlotLookup` it keeps, and checks the ids once: no ``bool`` id where request 0 or
1 holds pages (``False == 0`` and ``True == 1`` as dict keys would read that request's
row), every id registered, none named twice, each asked only when a caller needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvchain.errors import InvalidDemandError, UnknownRequestError
from kvchain.requests.table import RequestTable


class SlotLookup:
    """The slots of one tuple of request ids at one slot version of the request table
    (int64, read-only; 0 for an id that holds nothing), with two facts about them that
    are computed on first ask from its own immutable ids and slots: every id holds pages
    (``known``), no id is named twice (``unique``)."""

    __slots__ = ("_ints", "_known", "_unique", "ids", "slots", "version", "zero_one")

    def __init__(self, version: int, ids: tuple[int, ...], slots: np.ndarray,
                 zero_one: tuple[int, ...] | None) -> None:
        slots.setflags(write=False)
        self.version = version
        self.ids = ids
        self.slots = slots
        #: where an equal tuple of ids could hold a ``bool`` (``True == 1``, ``False ==
        #: 0``): the positions of ids 0 and 1 in ``ids`` (checked free of bools), ``()``
        #: when neither request was registered (a bool then reads no row), ``None`` when
        #: 0 or 1 is named more than once (an equal tuple is scanned whole)
        self.zero_one = zero_one
        self._known: bool | None = None
        self._unique: bool | None = None
        self._ints: bool | None = None

    @property
    def known(self) -> bool:
        """Every id holds pages (no slot 0)."""
        if self._known is None:
            self._known = bool(self.slots.all())
        return self._known

    @property
    def ints(self) -> bool:
        """Every id is exactly an ``int`` (no ``bool``, no numpy integer): of this
        lookup's own ``ids`` tuple (an equal tuple handed to :meth:`SlotIndex.lookup`
        may hold other integer types)."""
        if self._ints is None:
            self._ints = set(map(type, self.ids)) <= {int}
        return self._ints

    @property
    def unique(self) -> bool:
        """No id appears twice."""
        if self._unique is None:
            self._unique = len(set(self.ids)) == len(self.ids)
        return self._unique


def positions_of_zero_one(ids: tuple[int, ...]) -> tuple[int, ...] | None:
    """The positions of the ids 0 and 1 in ``ids`` (bool-free), or ``None`` when one of
    them appears more than once (C-level scans: ``count`` and ``index``)."""
    out = []
    for v in (0, 1):
        n = ids.count(v)
        if n > 1:
            return None
        if n:
            out.append(ids.index(v))
    return tuple(out)


class SlotIndex:
    """The slots of request ids in one request table, with the last lookup kept.

    Args:
        table: the request table whose ``slot_of`` and ``version`` it reads.
    """

    def __init__(self, table: RequestTable) -> None:
        self._table = table
        self._memo: SlotLookup | None = None  # the last lookup (:meth:`lookup`)

    def lookup(self, ids: tuple[int, ...], ints: bool = False) -> SlotLookup:
        """The slots of request ids at the table's slot version, as one immutable
        :class:`SlotLookup`. The last one is kept and handed back for the same ids at the
        same version (a decode step asks for one batch three times): a pure memo, as a
        request's slot changes only in :meth:`RequestTable.bind` / ``unbind``, which bump
        the version, and ``ids`` is a tuple; its slots array is read-only.

        A hit on the kept tuple itself (the step plan's rows: ``lookup.ids``) is one
        identity test; a hit on an equal tuple costs one tuple comparison and a look at
        the (at most two) positions where
        the kept ids are 0 or 1, the only places an equal tuple can hold a bool; a miss
        scans ``ids`` for bools (skipped when the caller proved that no id is a bool:
        ``ints``, as :func:`~kvchain.requests.batch.batch_ids` does).

        Raises:
            InvalidDemandError: a ``bool`` id while request 0 or 1 holds pages (it would
                alias that request).
        """
        table = self._table
        memo = self._memo
        if memo is not None and memo.version == table.version and memo.ids is ids:
            return memo  # the very tuple (the step plan's rows): checked when it was kept
        if memo is not None and memo.version == table.version and memo.ids == ids:
            # ids[i] == memo.ids[i]: only where memo.ids holds 0 or 1 can ids hold a bool
            at: Sequence[int] = (memo.zero_one if memo.zero_one is not None
                                 else range(len(ids)))
            for i in at:
                if type(ids[i]) is bool:
                    raise InvalidDemandError(f"request ids are ints, got {ids!r}")
            return memo
        slot_of = table.slot_of
        zero_one: tuple[int, ...] | None = ()
        if 0 in slot_of or 1 in slot_of:
            if not ints and bool in map(type, ids):  # C-level scan
                raise InvalidDemandError(f"request ids are ints, got {ids!r}")
            zero_one = positions_of_zero_one(ids)
        memo = self._memo = SlotLookup(table.version, ids, table.slots_of(ids), zero_one)
        return memo

    def slots_of(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of request ids (0, the empty slot, for one that holds nothing), int64,
        read-only (:meth:`lookup`).

        Raises:
            InvalidDemandError: as :meth:`lookup`.
        """
        return self.lookup(ids).slots

    def known_lookup(self, ids: tuple[int, ...]) -> SlotLookup:
        """:meth:`lookup` of ``ids``, every one registered.

        Raises:
            UnknownRequestError: an id that holds no pages.
            InvalidDemandError: as :meth:`lookup`.
        """
        lookup = self.lookup(ids)
        if not lookup.known:
            rid = ids[int((lookup.slots == 0).nonzero()[0][0])]
            raise UnknownRequestError(f"request {rid} holds no pages")
        return lookup

    def known_slots(self, ids: tuple[int, ...]) -> np.ndarray:
        """Slots of ``ids``, every one registered (errors: :meth:`known_lookup`)."""
        return self.known_lookup(ids).slots

    def checked_slots(self, ids: tuple[int, ...], what: str = "decode run") -> np.ndarray:
        """Slots of ``ids``, every one registered and named once.

        Raises:
            InvalidDemandError: an id named twice (``what`` names the operation), or as
                :meth:`lookup`.
            UnknownRequestError: as :meth:`known_lookup`.
        """
        lookup = self.known_lookup(ids)
        if not lookup.unique:
            raise InvalidDemandError(f"a request appears twice in one {what}")
        return lookup.slots
