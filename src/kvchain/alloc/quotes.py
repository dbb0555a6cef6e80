"""Which quotes an allocator may realize: the ones its own ``price`` issued for its
current snapshot (docs/architecture.md, "Quotes are tokens").

A :class:`~kvchain.alloc.snapshot.Quote` is a plain frozen value anyone can build. To keep
"``take`` realizes exactly the planner's quote" true under attack, an allocator registers
every quote its ``price`` returns in a :class:`QuoteRegistry`: the quote object itself
(its identity is the unforgeable token) and a fingerprint of what it says (demand, before
snapshot, fits, ordered actions). ``take`` accepts a quote only if the same object is
registered, its fingerprint is unchanged, and it was priced for the demand taken. The
registry is emptied on every capacity-epoch bump, so a quote priced before a change is
stale (the quote's own ``before.epoch`` is compared with the allocator's epoch as well, so
an epoch bump that forgets to empty the registry still makes it stale). A refused quote
raises before anything changes.

The registry is also the allocator's price memo: :meth:`QuoteRegistry.issued_for` finds
the quote issued for a demand on the current snapshot object, so a repeated capacity query
is a dictionary lookup, not a planner run; :meth:`QuoteRegistry.repeat` is that lookup with
the demand's validation folded in, for the allocator's fast path. It belongs to one
allocator, holds at most :data:`MAX_ISSUED_PER_EPOCH` quotes, and dies with the epoch
(emptied on every bump; a quote of another snapshot object is never served).
"""

from __future__ import annotations

from typing import Final

from kvchain.alloc.snapshot import Action, ChainSnapshot, Demand, LazyPlan, Quote
from kvchain.errors import ForgedQuoteError, StaleQuoteError

#: Quotes remembered per epoch (oldest dropped first); a caller that prices more demands
#: than this without taking any must price the one it takes again.
MAX_ISSUED_PER_EPOCH = 64

_NOTHING: Final = object()  # in ``QuoteRegistry.last``: no answer (never a snapshot or pages)


def plan_actions(quote: Quote) -> tuple[Action, ...]:
    """The ordered actions of ``quote``'s plan (no predicted snapshot is built)."""
    steps = quote.steps
    if isinstance(steps, LazyPlan):
        return steps.actions
    return tuple(s.action for s in steps)


#: What the registry records of an issued quote, as it was issued: ``(quote, demand,
#: before, fits, steps, actions)`` (a plain tuple: a first price on every epoch builds
#: one, and a frozen dataclass costs twice as much to build).
_Issued = tuple[Quote, Demand, ChainSnapshot, bool, object, tuple[Action, ...]]


class QuoteRegistry:
    """The quotes an allocator issued on its current epoch.

    Args:
        owner: a short name for messages (e.g. ``"chain"``).
    """

    __slots__ = ("_by_pages", "_issued", "_owner", "last")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._issued: dict[int, _Issued] = {}
        #: The memo's latest answer, ``(snapshot, pages, quote)``: the quote issued (or
        #: served) last, the snapshot object it was priced on and the very tuple object
        #: of pages it was asked with (validated). An allocator reads it with two
        #: identity tests (``snapshot is`` its current one, ``demand.pages is`` these
        #: pages) to answer the same query asked again without a call. It is an entry of
        #: this memo, not a second one: set where the memo answers, emptied with it.
        self.last: tuple[object, object, Quote | None] = (_NOTHING, _NOTHING, None)
        # the memo: per demand's pages (a validated tuple of ints, its own key object), the
        # latest quote issued for it; keyed by the tuple, not the Demand, so a lookup hashes
        # and compares at C speed (a frozen dataclass's __hash__ / __eq__ are Python calls)
        self._by_pages: dict[tuple[int, ...], tuple[tuple[int, ...], Quote]] = {}

    def issue(self, quote: Quote, memo: bool = True) -> Quote:
        """Register ``quote`` (just priced on the current snapshot) and return it; a quote
        already registered (a memo hit of :meth:`issued_for`) is returned as it is. With
        ``memo`` off it is registered as a token only, never served by
        :meth:`issued_for` or :meth:`repeat` (a quote with copies appended,
        :func:`~kvchain.alloc.pricing.with_copies`: a plain price of the same pages must
        not be answered with it)."""
        issued = self._issued
        rec = issued.get(id(quote))
        if rec is not None and rec[0] is quote:
            return quote
        if len(issued) >= MAX_ISSUED_PER_EPOCH:
            old = issued.pop(next(iter(issued)))
            latest = self._by_pages.get(old[1].pages)
            if latest is not None and latest[1] is old[0]:
                del self._by_pages[old[1].pages]
        demand = quote.demand
        pages = demand.pages
        issued[id(quote)] = (quote, demand, quote.before, quote.fits, quote.steps,
                             plan_actions(quote))
        if not memo:
            return quote
        self._by_pages[pages] = (pages, quote)
        self.last = (quote.before, pages, quote)
        return quote

    def issued_for(self, snapshot: ChainSnapshot, demand: Demand) -> Quote | None:
        """The quote issued for ``demand`` on this very ``snapshot`` object, or ``None``
        (the memo of the allocator's ``price``; ``demand`` already validated, so an equal
        demand is the same demand).

        Snapshots are immutable and an allocator builds a new one after every epoch bump,
        so identity with the quote's ``before`` is what ties the memo to the epoch even if
        a bump forgot :meth:`clear`. The quote returned may have been altered since it was
        issued; a caller that realizes it passes it through :meth:`check` first."""
        hit = self._by_pages.get(demand.pages)
        if hit is not None and hit[1].before is snapshot:
            self.last = (snapshot, demand.pages, hit[1])
            return hit[1]
        return None

    def repeat(self, snapshot: ChainSnapshot, pages: object) -> Quote | None:
        """The quote issued on this very ``snapshot`` object for a demand whose pages are
        ``pages``, or ``None`` (ask the slow path, which validates and prices): the
        allocator's O(1) answer to a repeated capacity query, for a demand *not yet
        validated*.

        A hit is served only when ``pages`` is a tuple of exactly-``int`` elements equal
        to the key of a quote issued here: that key was validated when it was priced
        (right length, ints >= 0), and equal ints are the same ints, so ``pages`` is
        valid too. ``(True, 0)`` or ``(1.0, 0)`` equal a validated ``(1, 0)`` and hash
        alike, but are not all ``int``: they miss, and the slow path refuses them typed.
        The identity of the key object (the same demand asked again) skips even the type
        scan. Pure: nothing changes, nothing raises (an unhashable element misses)."""
        if type(pages) is not tuple:
            return None
        try:
            hit = self._by_pages.get(pages)
        except TypeError:  # an unhashable element: not a demand this memo has seen
            return None
        if hit is None:
            return None
        key, quote = hit
        if quote.before is not snapshot:
            return None
        if key is not pages:
            for x in pages:  # an explicit loop: cheapest exact-int scan of a few bands
                if type(x) is not int:
                    return None
        self.last = (snapshot, pages, quote)
        return quote

    def clear(self) -> None:
        """Forget every quote (the capacity epoch moved)."""
        self.last = (_NOTHING, _NOTHING, None)
        if self._issued:
            self._issued.clear()
            self._by_pages.clear()

    def check(self, quote: Quote, demand: Demand, epoch: int) -> None:
        """Accept ``quote`` for ``demand`` at capacity epoch ``epoch`` or raise.

        Raises:
            StaleQuoteError: the quote was priced at another epoch.
            ForgedQuoteError: not issued here, altered since, or priced for another demand.
        """
        rec = self._issued.get(id(quote))
        if rec is None or rec[0] is not quote:
            before = getattr(quote, "before", None)
            if isinstance(before, ChainSnapshot) and before.epoch != epoch:
                raise StaleQuoteError(f"quote priced at epoch {before.epoch}, the {self._owner} "
                                      f"is at epoch {epoch}: price the demand again")
            raise ForgedQuoteError(f"the {self._owner} did not issue this quote for its "
                                   f"current snapshot (epoch {epoch})")
        _, rec_demand, rec_before, rec_fits, rec_steps, rec_actions = rec
        if rec_before.epoch != epoch:  # whichever path bumped the epoch without clear()
            raise StaleQuoteError(f"quote priced at epoch {rec_before.epoch}, the "
                                  f"{self._owner} is at epoch {epoch}: price the demand again")
        if quote.demand != demand or rec_demand != demand:
            raise ForgedQuoteError(f"quote priced for {rec_demand.pages}, taken for "
                                   f"{getattr(demand, 'pages', demand)!r}")
        if (quote.fits != rec_fits or quote.before is not rec_before
                or quote.steps is not rec_steps
                or plan_actions(quote) != rec_actions):
            raise ForgedQuoteError(f"the {self._owner}'s quote was altered after pricing")
