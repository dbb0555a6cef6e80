"""One immutable step plan: what one step takes, computed, validated and priced once.

A :class:`StepPlan` is the value the request layer's :meth:`KVManager.plan` builds for a
batch (validated there, once: ``StepPath.plan`` in :mod:`kvchain.requests.step`) and
:meth:`KVManager.apply` realizes as one chain take,
trusting it (no second validation, no demand computed again), as ``Chain.take`` trusts a
registered quote. :meth:`KVManager.decode_demands` returns the same kind of value for a
decode batch (``DecodeBatch`` in :mod:`kvchain.requests.batch` is this class).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from kvchain.alloc.snapshot import Demand, Quote
from kvchain.errors import InvalidDemandError


@dataclass(frozen=True, slots=True, eq=False)
class StepPlan(Sequence[Demand]):
    """One step's take as a value: its rows (request ids), tokens per row, the ``[rows,
    bands]`` demand matrix (kept as its non-empty rows: about one decode in ``P`` per
    band needs a page in a step), its total, the suspended requests it loads back, the
    take's summed demand and its quote, and what it was built against. It reads as a
    sequence of :class:`Demand` (one per row, aligned with ``rids``); nothing about it
    changes after it is built (a plan without one row is a new value: :meth:`without`).

    :meth:`KVManager.apply` takes it as priced when it is a value that manager issued
    (the object itself, as a quote is the chain's token: a ``dataclasses.replace`` copy is
    not one) and the rows are as they were at the build (``at``: the rows' token counts;
    past a move of ``version``, the request table's slot version, or of ``epoch``, the
    chain's epoch after the plan's price, the rows' demands are computed again and
    compared, and the take re-prices a stale quote); otherwise it raises
    :class:`~kvchain.errors.StalePlanError` and changes nothing.

    Attributes:
        owner: the step path that built it (a manager's ``kv.steps``; identity only;
            not compared or printed).
        rids: request ids, in batch order (``len(rids)`` rows).
        drafts: draft tokens per decode it was priced for (a decode batch: every row
            computes ``1 + drafts`` tokens).
        demands: one :class:`Demand` per row (pages per band).
        nonzero: rows whose demand is not empty, ascending.
        needs: int64 ``[len(nonzero), bands]``, read-only: ``needs[j]`` is
            ``demands[nonzero[j]].pages``.
        total: the column sums of ``needs`` (pages per band): the rows' take.
        extends: tokens per row (``None``: ``1 + drafts`` each, a decode batch).
        resumes: suspended requests the take loads back (none of them a row).
        loads: their load-back demand, summed (pages per band; ``None``: none).
        quote: the chain's price of :attr:`taken` (``None``: the take prices it).
        version: the request table's slot version at the build (``-1``: built by hand,
            not by a manager: a foreign value).
        at: int64 ``[rows]``, read-only: each row's tokens in the cache at the build.
        epoch: the chain's epoch at the build.
    """

    owner: object = field(repr=False)
    rids: tuple[int, ...]
    drafts: int
    demands: tuple[Demand, ...]
    nonzero: tuple[int, ...]
    needs: np.ndarray
    total: Demand
    extends: tuple[int, ...] | None = None
    resumes: tuple[int, ...] = ()
    loads: Demand | None = None
    quote: Quote | None = field(default=None, repr=False)
    version: int = -1
    at: np.ndarray | None = field(default=None, repr=False)
    epoch: int = -1

    @classmethod
    def of(cls, owner: object, rids: tuple[int, ...], drafts: int,
           demands: Sequence[Demand], num_bands: int,
           nonzero: Sequence[int] | None = None, needs: np.ndarray | None = None,
           ) -> StepPlan:
        """A decode batch's value from per-request demands (aligned with ``rids``, each of
        ``num_bands`` bands), without a build basis (``version = -1``: a manager
        validates it as any list of demands). ``nonzero`` (the rows with a non-empty
        demand, ascending) and ``needs`` (int64 ``[len(nonzero), bands]``, their pages;
        may be omitted when ``nonzero`` is empty), when the caller has them, save walking
        ``demands``.

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
        return cls.frozen(owner, rids, drafts, tuple(demands), tuple(nonzero), needs)

    @classmethod
    def frozen(cls, owner: object, rids: tuple[int, ...], drafts: int,
               demands: tuple[Demand, ...], nonzero: tuple[int, ...], needs: np.ndarray,
               **basis: object) -> StepPlan:
        """The value over ``needs`` (made read-only; ``at`` too, if given), its total
        their column sums (or ``basis["total"]``, when the caller has them); ``basis``: the
        other fields (``extends``, ``resumes``, ``loads``, ``quote``, ``version``, ``at``,
        ``epoch``)."""
        needs.setflags(write=False)
        at = basis.get("at")
        if isinstance(at, np.ndarray):
            at.setflags(write=False)
        total = basis.pop("total", None)
        if not isinstance(total, Demand):
            total = (Demand(tuple(needs.sum(axis=0).tolist())) if len(nonzero)
                     else Demand.zeros(needs.shape[1]))
        return cls(owner, rids, drafts, demands, nonzero, needs, total,
                   **basis)  # type: ignore[arg-type]

    @property
    def tokens(self) -> tuple[int, ...]:
        """Tokens each row computes (``1 + drafts`` each for a decode batch)."""
        return self.extends if self.extends is not None else (1 + self.drafts,) * len(
            self.rids)

    @property
    def taken(self) -> Demand:
        """The take's demand: :attr:`total` plus the resumes' load-backs."""
        return self.total if self.loads is None else self.total.plus(self.loads)

    @property
    def matrix(self) -> np.ndarray:
        """int64 ``[rows, bands]``, a new read-only array: ``matrix[i]`` is
        ``demands[i].pages`` (O(rows x bands); the hot path reads ``needs``)."""
        out = np.zeros((len(self.rids), self.needs.shape[1]), dtype=np.int64)
        if self.nonzero:
            out[list(self.nonzero)] = self.needs
        out.setflags(write=False)
        return out

    def priced(self, quote: Quote | None, epoch: int | None = None) -> StepPlan:
        """The same plan with ``quote`` as the price of its take (a new value), built
        against the chain at ``epoch`` (``None``: the same). Built field by field (the
        decode step's hot path: ``dataclasses.replace`` reads the fields' metadata on
        every call)."""
        return StepPlan(self.owner, self.rids, self.drafts, self.demands, self.nonzero,
                        self.needs, self.total, self.extends, self.resumes, self.loads,
                        quote, self.version, self.at,
                        self.epoch if epoch is None else epoch)

    def without(self, row: int) -> StepPlan:
        """The same plan less the row ``row`` (a retracted or dropped request): a new
        value whose total is recomputed from the matrix without that row, unpriced
        (``quote = None``), its resumes kept.

        Raises:
            IndexError: ``row`` not in ``[0, rows)``.
        """
        if not 0 <= row < len(self.rids):
            raise IndexError(f"row {row} of a step plan of {len(self.rids)}")
        at = bisect.bisect_left(self.nonzero, row)
        needs, nonzero = self.needs, self.nonzero
        if at < len(nonzero) and nonzero[at] == row:
            needs = np.delete(needs, at, axis=0)
            nonzero = nonzero[:at] + nonzero[at + 1:]
        nonzero = nonzero[:at] + tuple(i - 1 for i in nonzero[at:])
        tokens = self.at if self.at is None else np.delete(self.at, row)
        extends = self.extends if self.extends is None else (self.extends[:row]
                                                             + self.extends[row + 1:])
        return StepPlan.frozen(self.owner, self.rids[:row] + self.rids[row + 1:],
                               self.drafts, self.demands[:row] + self.demands[row + 1:],
                               nonzero, needs, extends=extends, resumes=self.resumes,
                               loads=self.loads, version=self.version, at=tokens,
                               epoch=self.epoch)

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
