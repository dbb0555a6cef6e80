"""The values a batch carries through the request layer: its checked ``(request, tokens)``
pairs, its demands and their sum."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError


def sum_demands(demands: Iterable[Demand], num_bands: int) -> Demand:
    """Element-wise sum of demands of a chain with ``num_bands`` bands (a
    :class:`DecodeBatch` carries its own: ``batch.total``)."""
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


@dataclass(frozen=True, slots=True, eq=False)
class DecodeBatch(Sequence[Demand]):
    """The immutable value :meth:`KVManager.decode_demands` returns for one decode batch:
    its request ids, the ``[rows, bands]`` demand matrix and its total, priced once.
    It reads as a sequence of :class:`Demand` (one per request, aligned with ``rids``);
    nothing about it changes after it is built, so the total it carries holds for as long
    as the value lives (a batch without one request is a new value: :meth:`without`).

    :meth:`KVManager.allocate` trusts ``total`` (no walk of the demands, no second
    validation) when the value was produced by that very manager (``owner``) for the same
    request ids and ``1 + drafts`` tokens each; any other value, or a plain list of
    demands, is validated once at that boundary.

    Attributes:
        owner: the manager that computed it (identity only; not compared or printed).
        rids: request ids, in batch order (``rows`` of them).
        drafts: draft tokens per request it was priced for (each computes ``1 + drafts``).
        demands: one :class:`Demand` per request (pages per band).
        matrix: int64 ``[rows, bands]``, read-only: ``matrix[i]`` is ``demands[i].pages``.
        nonzero: rows whose demand is not empty, ascending.
        total: the column sums of ``matrix`` (pages per band), the batch's one take.
    """

    owner: object = field(repr=False)
    rids: tuple[int, ...]
    drafts: int
    demands: tuple[Demand, ...]
    matrix: np.ndarray
    nonzero: tuple[int, ...]
    total: Demand

    @classmethod
    def of(cls, owner: object, rids: tuple[int, ...], drafts: int,
           demands: Sequence[Demand], num_bands: int,
           nonzero: Sequence[int] | None = None, rows: np.ndarray | None = None,
           ) -> DecodeBatch:
        """Build the value from per-request demands (aligned with ``rids``, each of
        ``num_bands`` bands). ``nonzero`` (the rows with a non-empty demand, ascending)
        and ``rows`` (int64 ``[len(nonzero), bands]``, their pages; may be omitted when
        ``nonzero`` is empty), when the caller has them, save walking ``demands``.

        Raises:
            InvalidDemandError: ``demands`` not aligned with ``rids``.
        """
        if len(demands) != len(rids):
            raise InvalidDemandError(f"{len(demands)} demands for {len(rids)} requests")
        if nonzero is None:
            zero = (0,) * num_bands
            nonzero = [i for i, d in enumerate(demands) if d.pages != zero]
            rows = np.array([demands[i].pages for i in nonzero], dtype=np.int64)
        matrix = np.zeros((len(rids), num_bands), dtype=np.int64)
        if len(nonzero):
            if rows is None:
                raise InvalidDemandError("the rows of the non-empty demands are missing")
            matrix[list(nonzero)] = rows
        return cls._frozen(owner, rids, drafts, tuple(demands), matrix, tuple(nonzero))

    @classmethod
    def _frozen(cls, owner: object, rids: tuple[int, ...], drafts: int,
                demands: tuple[Demand, ...], matrix: np.ndarray,
                nonzero: tuple[int, ...]) -> DecodeBatch:
        """The value over ``matrix`` (made read-only), its total the column sums."""
        matrix.setflags(write=False)
        total = Demand(tuple(matrix.sum(axis=0).tolist()))
        return cls(owner, rids, drafts, demands, matrix, nonzero, total)

    def without(self, row: int) -> DecodeBatch:
        """The same batch less the request at ``row`` (a retracted or dropped decode):
        a new value whose total is recomputed from the matrix without that row.

        Raises:
            IndexError: ``row`` not in ``[0, rows)``.
        """
        if not 0 <= row < len(self.rids):
            raise IndexError(f"row {row} of a decode batch of {len(self.rids)}")
        matrix = np.delete(self.matrix, row, axis=0)
        nonzero = tuple(i - (i > row) for i in self.nonzero if i != row)
        return DecodeBatch._frozen(self.owner, self.rids[:row] + self.rids[row + 1:],
                                   self.drafts, self.demands[:row] + self.demands[row + 1:],
                                   matrix, nonzero)

    def __len__(self) -> int:
        return len(self.demands)

    @overload
    def __getitem__(self, i: int) -> Demand: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Demand]: ...

    def __getitem__(self, i: int | slice) -> Demand | Sequence[Demand]:
        return self.demands[i]

    def __iter__(self) -> Iterator[Demand]:
        return iter(self.demands)
