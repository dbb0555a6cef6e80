"""The values a batch carries through the request layer: its checked ``(request, tokens)``
pairs, its demands and their sum."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any, Self, SupportsIndex

import numpy as np

from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError


def sum_demands(demands: Iterable[Demand], num_bands: int) -> Demand:
    """Element-wise sum of demands of a chain with ``num_bands`` bands (O(1) for an
    unchanged :class:`DecodeDemands`, which carries its sum)."""
    if type(demands) is DecodeDemands and demands.total is not None \
            and len(demands.total.pages) == num_bands:
        return demands.total
    zero = (0,) * num_bands
    total = [0] * num_bands
    for d in demands:
        pages = d.pages
        if pages == zero:  # most decode steps: skip cheaply
            continue
        for i, n in enumerate(pages):
            total[i] += n
    return Demand(tuple(total))



_PAGES = operator.attrgetter("pages")


def batch_ids(batch: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Request ids and token counts of an allocation batch, checked: C-speed set checks
    for the common all-``(int, int)`` batch, an entry-by-entry walk otherwise.

    Raises:
        InvalidDemandError: an entry that is not a pair of ints, or a negative or
            non-integer token count.
    """
    try:
        if set(map(type, batch)) <= {tuple}:
            if not batch:
                return (), ()
            ids, extends = zip(*batch, strict=True)  # all of one length, and that is 2
            if (set(map(type, ids)) == {int} and set(map(type, extends)) == {int}
                    and min(extends) >= 0):
                return ids, extends
    except (TypeError, ValueError):
        pass
    for entry in batch:
        if (not isinstance(entry, tuple | list) or len(entry) != 2
                or isinstance(entry[0], bool) or not isinstance(entry[0], int | np.integer)):
            raise InvalidDemandError(f"a batch entry is a (request id, tokens) pair of "
                                     f"ints, got {entry!r}")
        rid, extend = entry
        if isinstance(extend, bool) or not isinstance(extend, int | np.integer) or extend < 0:
            raise InvalidDemandError(f"request {rid}: {extend!r} tokens")
    return tuple(e[0] for e in batch), tuple(e[1] for e in batch)


def check_demands(ids: Sequence[int], extends: Sequence[int], demands: Sequence[Demand],
                   num_bands: int) -> None:
    """Every demand a :class:`Demand` of ``num_bands`` bands.

    Raises:
        InvalidDemandError: one that is not.
    """
    if (set(map(type, demands)) <= {Demand}
            and set(map(len, map(_PAGES, demands))) <= {num_bands}):
        return
    for rid, extend, d in zip(ids, extends, demands, strict=True):
        if not isinstance(d, Demand) or len(d.pages) != num_bands:
            raise InvalidDemandError(f"request {rid}: {extend} tokens, demand {d!r}")


class DecodeDemands(list[Demand]):
    """The list :meth:`KVManager.decode_demands` returns: one :class:`Demand` per request
    (a plain list to every reader) that also carries their sum, so
    :func:`sum_demands` and :meth:`KVManager.allocate` need not walk it.

    Attributes:
        total: the element-wise sum, or ``None`` once the list was changed in place
            (every mutating list method drops it).
        rids: the request ids it was computed for, in order.
        nonzero: positions whose demand is not empty, ascending.
        matrix: int64 ``[len(nonzero), bands]``, their demands.
    """

    __slots__ = ("matrix", "nonzero", "rids", "total")

    def __init__(self, demands: list[Demand], total: Demand, rids: tuple[int, ...],
                 nonzero: list[int], matrix: np.ndarray) -> None:
        super().__init__(demands)
        self.total: Demand | None = total
        self.rids = rids
        self.nonzero = nonzero
        self.matrix = matrix  # int64 [len(nonzero), bands]: their pages

    def _changed(self) -> None:
        self.total = None

    def __setitem__(self, i: Any, v: Any) -> None:
        self._changed()
        super().__setitem__(i, v)

    def __delitem__(self, i: Any) -> None:
        self._changed()
        super().__delitem__(i)

    def __iadd__(self, other: Iterable[Demand]) -> Self:  # type: ignore[misc,override]  # as list
        self._changed()
        return super().__iadd__(other)

    def __imul__(self, n: SupportsIndex) -> Self:
        self._changed()
        return super().__imul__(n)

    def append(self, v: Demand) -> None:
        self._changed()
        super().append(v)

    def extend(self, vs: Iterable[Demand]) -> None:
        self._changed()
        super().extend(vs)

    def insert(self, i: SupportsIndex, v: Demand) -> None:
        self._changed()
        super().insert(i, v)

    def pop(self, i: SupportsIndex = -1) -> Demand:
        self._changed()
        return super().pop(i)

    def remove(self, v: Demand) -> None:
        self._changed()
        super().remove(v)

    def clear(self) -> None:
        self._changed()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed()
        super().reverse()
