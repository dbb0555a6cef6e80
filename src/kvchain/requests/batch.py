"""The values a batch carries through the request layer: its checked ``(request, tokens)``
pairs, its demands and their sum."""

from __future__ import annotations

import bisect
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
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


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
            if set(map(len, batch)) == {2}:
                # two C-level passes (``zip(*batch)`` builds one iterator per pair: about
                # twice the cost at 256 pairs)
                ids, extends = tuple(map(_FIRST, batch)), tuple(map(_SECOND, batch))
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
    its request ids, its ``[rows, bands]`` demand matrix (kept as its non-empty rows:
    about one request in ``P`` per band needs a page in a step) and its total, priced
    once. It reads as a sequence of :class:`Demand` (one per request, aligned with
    ``rids``); nothing about it changes after it is built, so the total it carries holds
    for as long as the value lives (a batch without one request is a new value:
    :meth:`without`).

    :meth:`KVManager.allocate` trusts ``total`` (no walk of the demands, no second
    validation) when the value was produced by that very manager (``owner``) for the same
    request ids and ``1 + drafts`` tokens each; any other value, or a plain list of
    demands, is validated once at that boundary.

    Attributes:
        owner: the manager that computed it (identity only; not compared or printed).
        rids: request ids, in batch order (``len(rids)`` rows).
        drafts: draft tokens per request it was priced for (each computes ``1 + drafts``).
        demands: one :class:`Demand` per request (pages per band).
        nonzero: rows whose demand is not empty, ascending.
        needs: int64 ``[len(nonzero), bands]``, read-only: ``needs[j]`` is
            ``demands[nonzero[j]].pages`` (the matrix's non-empty rows).
        total: the column sums of ``needs`` (pages per band), the batch's one take.
    """

    owner: object = field(repr=False)
    rids: tuple[int, ...]
    drafts: int
    demands: tuple[Demand, ...]
    nonzero: tuple[int, ...]
    needs: np.ndarray
    total: Demand

    @classmethod
    def of(cls, owner: object, rids: tuple[int, ...], drafts: int,
           demands: Sequence[Demand], num_bands: int,
           nonzero: Sequence[int] | None = None, needs: np.ndarray | None = None,
           ) -> DecodeBatch:
        """Build the value from per-request demands (aligned with ``rids``, each of
        ``num_bands`` bands). ``nonzero`` (the rows with a non-empty demand, ascending)
        and ``needs`` (int64 ``[len(nonzero), bands]``, their pages; may be omitted when
        ``nonzero`` is empty), when the caller has them, save walking ``demands``.

        Raises:
            InvalidDemandError: ``demands`` not aligned with ``rids``, or ``needs``
                missing or not ``[len(nonzero), num_bands]``.
        """
        if len(demands) != len(rids):
            raise InvalidDemandError(f"{len(demands)} demands for {len(rids)} requests")
        if nonzero is None:
            zero = (0,) * num_bands
            nonzero = [i for i, d in enumerate(demands) if d.pages != zero]
            needs = np.array([demands[i].pages for i in nonzero], dtype=np.int64)
        if not len(nonzero):
            needs = np.zeros((0, num_bands), dtype=np.int64)
        elif needs is None or needs.shape != (len(nonzero), num_bands):
            raise InvalidDemandError(f"the non-empty rows' pages must be "
                                     f"[{len(nonzero)}, {num_bands}], got "
                                     f"{None if needs is None else needs.shape}")
        return cls._frozen(owner, rids, drafts, tuple(demands), tuple(nonzero), needs)

    @classmethod
    def _frozen(cls, owner: object, rids: tuple[int, ...], drafts: int,
                demands: tuple[Demand, ...], nonzero: tuple[int, ...],
                needs: np.ndarray) -> DecodeBatch:
        """The value over ``needs`` (made read-only), its total their column sums."""
        needs.setflags(write=False)
        total = Demand(tuple(needs.sum(axis=0).tolist()))
        return cls(owner, rids, drafts, demands, nonzero, needs, total)

    @property
    def matrix(self) -> np.ndarray:
        """int64 ``[rows, bands]``, a new read-only array: ``matrix[i]`` is
        ``demands[i].pages`` (O(rows x bands); the hot path reads ``needs``)."""
        out = np.zeros((len(self.rids), self.needs.shape[1]), dtype=np.int64)
        if self.nonzero:
            out[list(self.nonzero)] = self.needs
        out.setflags(write=False)
        return out

    def without(self, row: int) -> DecodeBatch:
        """The same batch less the request at ``row`` (a retracted or dropped decode):
        a new value whose total is recomputed from the matrix without that row.

        Raises:
            IndexError: ``row`` not in ``[0, rows)``.
        """
        if not 0 <= row < len(self.rids):
            raise IndexError(f"row {row} of a decode batch of {len(self.rids)}")
        at = bisect.bisect_left(self.nonzero, row)
        needs, nonzero = self.needs, self.nonzero
        if at < len(nonzero) and nonzero[at] == row:
            needs = np.delete(needs, at, axis=0)
            nonzero = nonzero[:at] + nonzero[at + 1:]
        nonzero = nonzero[:at] + tuple(i - 1 for i in nonzero[at:])
        return DecodeBatch._frozen(self.owner, self.rids[:row] + self.rids[row + 1:],
                                   self.drafts, self.demands[:row] + self.demands[row + 1:],
                                   nonzero, needs)

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
