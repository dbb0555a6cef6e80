"""The values a batch carries through the request layer: its checked ``(request, tokens)``
pairs, its demands and their sum (the batch value itself: :mod:`kvchain.requests.plan`)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np

from kvchain.alloc.snapshot import Demand
from kvchain.errors import InvalidDemandError
from kvchain.field_types import is_whole
from kvchain.requests.lookup import SlotLookup
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



#: Most steps one decode run may price in closed form (:meth:`StepPath.decode_run
#: <kvchain.requests.step.StepPath.decode_run>` builds ``[steps, rows, bands]`` int64
#: arrays: at 256 rows and 3 bands, 2**16 steps are 400 MB). The simulator asks for at most
#: 256 (``kvchain.sim.engine.FAST_FORWARD_MAX_STEPS``).
MAX_RUN_STEPS = 2**16

#: Most tokens one batch entry may compute: a request's token count is an int64 of the
#: request table, and a count and a step's tokens, each at most this, sum below ``2**63``
#: (a larger count raised numpy's bare OverflowError). Far past any chain: a 2**62-token
#: step needs 2**58 pages of 16 tokens.
MAX_BATCH_TOKENS = 2**62

_PAGES = operator.attrgetter("pages")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def not_a_sequence(value: object) -> bool:
    """Whether ``value`` cannot be a batch argument: not iterable (``None``, a number), a
    string or bytes (iterable, but of characters), or a numpy array that is not 1-D (a 0-d
    array is registered iterable but iterating it raises)."""
    return (isinstance(value, str | bytes) or not isinstance(value, Iterable)
            or (isinstance(value, np.ndarray) and value.ndim != 1))


def check_flag(value: object, what: str) -> None:
    """Refuse a flag that is not a bool (``"no"`` or ``1`` would be read by its truth value);
    ``what`` names it.

    Raises:
        InvalidDemandError: ``value`` is not ``True`` or ``False``.
    """
    if type(value) is not bool:
        raise InvalidDemandError(f"{what} must be a bool, got {type(value).__name__} "
                                 f"{value!r}")


def check_count(value: object, what: str, low: int = 0, high: int = MAX_BATCH_TOKENS) -> int:
    """``value`` as a Python int, checked: an int (numpy integers pass and are converted,
    so no later sum wraps around in a small numpy type) in ``[low, high]``; ``what`` names
    it in the error.

    Raises:
        InvalidDemandError: a bool, a float or another type, or a value out of range.
    """
    if type(value) is not int and not is_whole(value):
        raise InvalidDemandError(f"{what} must be an int in [{low}, {high}], got "
                                 f"{type(value).__name__} {value!r}")
    out = int(value)
    if not low <= out <= high:
        raise InvalidDemandError(f"{what} must be an int in [{low}, {high}], got {out}")
    return out


def check_rid(rid: object, what: str = "") -> None:
    """Refuse a request id that is not an int (a ``bool`` would alias request 0 or 1 as a
    dict key, a float ``1.0`` request 1; ``None`` or a string names no request); ``what``
    (the argument) prefixes the message.

    Raises:
        InvalidDemandError: ``rid`` is a bool or not an int (numpy integers pass).
    """
    if type(rid) is not int and not is_whole(rid):
        raise InvalidDemandError(f"{what + ': ' if what else ''}request ids are ints, got "
                                 f"{type(rid).__name__} {rid!r}")


def request_ids(rids: object, what: str) -> tuple[int, ...]:
    """The request ids of a batch argument (``what`` names it in the error), as a tuple,
    checked: a sequence (any iterable but a string) of ints (:func:`check_rid`). One
    C-level type scan for the common all-``int`` batch.

    Raises:
        InvalidDemandError: ``rids`` is not a sequence (``None``, a number, a string), or
            holds an id that is not an int; nothing is read.
    """
    if type(rids) is tuple:
        ids: tuple[int, ...] = rids
    elif not_a_sequence(rids):
        raise InvalidDemandError(f"{what} must be a sequence of request ids (ints), got "
                                 f"{type(rids).__name__} {rids!r}")
    else:
        ids = tuple(rids)  # type: ignore[arg-type]
    if set(map(type, ids)) <= {int}:
        return ids
    for rid in ids:
        check_rid(rid, what)
    return ids


def distinct_rows(lookup: SlotLookup, what: str) -> SlotLookup:
    """``lookup`` (``SlotIndex.known_lookup``'s: every id holds pages), refused when an
    id is named twice: a batch of one token per request (a decode batch, its commit)
    names each request once, as :meth:`KVManager.allocate` requires.

    Raises:
        InvalidDemandError: an id named twice (``what`` names the batch); nothing changed.
    """
    if not lookup.unique:
        seen: set[int] = set()
        for rid in lookup.ids:
            if rid in seen:
                raise InvalidDemandError(f"request {rid} appears twice in one {what}")
            seen.add(rid)
    return lookup


def batch_ids(batch: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Request ids and token counts of an allocation batch, checked: C-speed set checks
    for the common all-``(int, int)`` batch, an entry-by-entry walk otherwise. An iterable
    that is not a sequence (a generator) is read once, into a tuple, first.

    Raises:
        InvalidDemandError: ``batch`` not a sequence (``None``, a number, a string), an
            entry that is not a pair of ints, or a token count that is not an int in
            ``[0, MAX_BATCH_TOKENS]``.
    """
    if not_a_sequence(batch):
        raise InvalidDemandError(f"batch must be a sequence of (request id, tokens) pairs, "
                                 f"got {type(batch).__name__} {batch!r}")
    if not isinstance(batch, Sequence):  # a generator, a set: read once, here
        batch = tuple(batch)
    try:
        if set(map(type, batch)) <= {tuple}:
            if not batch:
                return (), ()
            if set(map(len, batch)) == {2}:
                # two C-level passes (``zip(*batch)`` builds one iterator per pair: about
                # twice the cost at 256 pairs)
                ids, extends = tuple(map(_FIRST, batch)), tuple(map(_SECOND, batch))
                if (set(map(type, ids)) == {int} and set(map(type, extends)) == {int}
                        and min(extends) >= 0 and max(extends) <= MAX_BATCH_TOKENS):
                    return ids, extends
    except (TypeError, ValueError):
        pass
    for entry in batch:
        if (not isinstance(entry, tuple | list) or len(entry) != 2
                or not is_whole(entry[0])):
            raise InvalidDemandError(f"a batch entry is a (request id, tokens) pair of "
                                     f"ints, got {entry!r}")
        rid, extend = entry
        if (not is_whole(extend) or extend < 0
                or extend > MAX_BATCH_TOKENS):
            raise InvalidDemandError(f"request {rid}: {extend!r} tokens (an int in [0, "
                                     f"2**62])")
    return tuple(e[0] for e in batch), tuple(e[1] for e in batch)


def check_demands(ids: Sequence[int], extends: Sequence[int], demands: object,
                  num_bands: int) -> None:
    """Every demand a :class:`Demand` of ``num_bands`` bands whose pages are ints in
    ``[0, MAX_BATCH_TOKENS]`` (a :class:`Demand` does not check its own pages: ``chain.price``
    does, but caller demands are summed here first), one per row of the batch. Two C-level
    scans for the common valid list.

    The demands are the caller's own computation (:meth:`StepPath.demand
    <kvchain.requests.step.StepPath.demand>` at the rows' current state): they are not
    recomputed here to be compared with the rows' token counts (that would be the
    computation the caller saved); pages short of the tokens are refused by the coverage
    check at the commit.

    Raises:
        InvalidDemandError: ``demands`` not a sequence of ``len(ids)`` demands (a
            generator, a single Demand, a number), or one that is not such a Demand.
    """
    if not_a_sequence(demands) or not isinstance(demands, Sequence):
        raise InvalidDemandError(f"demands must be a sequence of Demand, one per batch row, "
                                 f"got {type(demands).__name__} {demands!r}")
    if len(demands) != len(ids):
        raise InvalidDemandError(f"{len(demands)} demands for a batch of {len(ids)}")
    if (set(map(type, demands)) <= {Demand}
            and set(map(len, map(_PAGES, demands))) <= {num_bands}):
        pages = tuple(chain.from_iterable(map(_PAGES, demands)))
        if set(map(type, pages)) <= {int} and (
                not pages or (min(pages) >= 0 and max(pages) <= MAX_BATCH_TOKENS)):
            return
    for rid, extend, d in zip(ids, extends, demands, strict=True):
        if (not isinstance(d, Demand) or len(d.pages) != num_bands
                or not all(type(p) is int and 0 <= p <= MAX_BATCH_TOKENS for p in d.pages)):
            raise InvalidDemandError(f"request {rid}: {extend} tokens, demand {d!r} (one "
                                     f"int in [0, 2**62] per band of {num_bands})")


#: The decode batch's value is the step plan itself (:class:`~kvchain.requests.plan.StepPlan`):
#: one kind of batch value, whose rows all compute ``1 + drafts`` tokens.
DecodeBatch = StepPlan
