"""What the manager keeps of a request beside its table row (its prefix-cache facts), and
the read-only view of one request that :meth:`KVManager.pages` returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvchain.cache.radix import Node
from kvchain.requests.demand import HeldPages, Spans
from kvchain.requests.table import RequestTable


@dataclass(slots=True)
class CacheFacts:
    """A request's prefix-cache facts (its pages are in the request table, row ``slot``).

    Attributes:
        slot: its row in the request table.
        keys: the prompt's page keys (prefix cache), or ``None``.
        handle: the cache node whose path the request locked (``None``: no hit).
        points: resume points still to come (page counts > its shared pages): a state
            checkpoint is saved at each, and the window pages of their tails are kept.
        tails: per band, the window pages kept for those points (``(lo, hi)`` ranges).
        retain: per window or chunked-local band (by band index), the page indices kept
            for the cache instead of being released.
        kept: per window band, its pages moved out of the window but kept (band ->
            page index -> id).
        ckpts: state checkpoint slots saved (point -> id).
        cow_src: the cache's checkpoint to copy into the working slot once it is taken
            (-1: none).
        cut: the junction checkpoint's token position (0: none): a prefill chunk that
            would pass it ends there instead, so the state after it is a chunk's end state.
        cow_at: the page count ``cow_src`` was saved at: the hit's pages, or for a partial
            hit the point ``C`` its state resumes from (0: a fresh state).
        gap: tokens of a partial hit still to recompute (``[C P, shared P)``), run by its
            first chunk before the chunk's own tokens and cleared by that chunk's commit
            (0: none).
    """

    slot: int
    keys: tuple[int, ...] | None = None
    handle: Node | None = None
    points: tuple[int, ...] = ()
    tails: tuple[Spans, ...] = ()
    retain: dict[int, frozenset[int]] = field(default_factory=dict)
    kept: dict[int, dict[int, int]] = field(default_factory=dict)
    ckpts: dict[int, int] = field(default_factory=dict)
    cow_src: int = -1
    cut: int = 0
    cow_at: int = 0
    gap: int = 0


class RequestView:
    """One request as the table holds it, read-only (what :meth:`KVManager.pages` returns;
    valid until the request's pages next change).

    Attributes:
        slot: its row in the request table.
        tokens: tokens whose KV is in the cache (``L``).
        shared: pages ``[0, shared)`` of the full and window bands that are the prefix
            cache's (its hit, later its inserted prompt).
        keys, handle, points, tails, retain, cow_src, cut: as :class:`CacheFacts`.
        kept, ckpts: read-only mappings (band -> page index -> id, point -> slot id).
    """

    __slots__ = ("_facts", "_table")

    def __init__(self, table: RequestTable, facts: CacheFacts) -> None:
        self._table = table
        self._facts = facts

    @property
    def slot(self) -> int:
        return self._facts.slot

    @property
    def tokens(self) -> int:
        return int(self._table.tokens[self._facts.slot])

    @property
    def shared(self) -> int:
        return int(self._table.shared[self._facts.slot])

    def band(self, band: int) -> tuple[int, ...]:
        """Virtual page ids held in ``band``, first live page to last (state: slots,
        working slot first)."""
        return tuple(self._table.live(band, self._facts.slot).tolist())

    def first(self, band: int) -> int:
        """Page index of the first live page of ``band`` (0 where nothing is released)."""
        return int(self._table.first[band, self._facts.slot])

    def held(self) -> HeldPages:
        """Counts for :func:`~kvchain.requests.demand.request_demand`."""
        return self._table.held(self._facts.slot)

    @property
    def keys(self) -> tuple[int, ...] | None:
        return self._facts.keys

    @property
    def handle(self) -> Node | None:
        return self._facts.handle

    @property
    def points(self) -> tuple[int, ...]:
        return self._facts.points

    @property
    def tails(self) -> tuple[Spans, ...]:
        return self._facts.tails

    @property
    def retain(self) -> Mapping[int, frozenset[int]]:
        return MappingProxyType(self._facts.retain)

    @property
    def kept(self) -> Mapping[int, Mapping[int, int]]:
        return MappingProxyType({b: MappingProxyType(k) for b, k in self._facts.kept.items()})

    @property
    def ckpts(self) -> Mapping[int, int]:
        return MappingProxyType(self._facts.ckpts)

    @property
    def cow_src(self) -> int:
        return self._facts.cow_src

    @property
    def cut(self) -> int:
        return self._facts.cut
