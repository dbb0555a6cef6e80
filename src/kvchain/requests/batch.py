"""The values a batch carries through the request layer: its checked ``(request, tokens)``
pairs, its demands and their sum (the batch value itself: :mod:`kvchain.requests.plan`)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import numpy as np

from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError
from kvchain.requests.plan import StepPlan


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


#: The decode batch's value is the step plan itself (:class:`~kvchain.requests.plan.StepPlan`):
#: one kind of batch value, whose rows all compute ``1 + drafts`` tokens.
DecodeBatch = StepPlan
