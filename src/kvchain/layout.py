"""Chain layout: buffer bytes + cache classes -> ordered bands, page sizes, validation.

The chain (docs/design.md §2)::

     byte 0                                                        byte B
     | state band  ->|    low gap    |<- window band ->|   high gap   |<- full band |
       END (LOW), grows up            FLOAT (middle)                   END (HIGH), grows down

Band order is fixed by lifetime: state < window and chunked-local < full; several window
or chunked-local classes (one per window size) lie in order of bytes per request, largest
first; several state or full classes (a target's and its draft's) are bands of their own:
the largest state slot is the LOW END, the full class with the most bytes per token the
HIGH END, other full classes float lowest (:func:`band_order_key`, :func:`chain_order`).
One class is a plain pool (a LOW END); two classes are two ENDs; three or more are LOW END
| FLOAT ... FLOAT | HIGH END. The ENDs hold what is costly to move or grows without bound
(state slots, full-attention pages); window and chunked-local bands are capped per request
and cheapest to move, so they float. The order among floats is a fixed, deterministic
function of the classes (same labels and order on every rank); it barely changes capacity
(with moves, whether a demand fits depends on live pages plus at most one page of grid
rounding per float edge) but decides which float the full END runs into and copies: the
smallest (docs/pricing.md, "Chains of N bands").

Page grids: a LOW END and the FLOAT use the absolute grid (physical page ``j`` at bytes
``[j * P, (j + 1) * P)``); a HIGH END is anchored at ``B``, so its grid starts at
``grid_base = B mod P``. Physical page ``j`` of any band lies at
``[grid_base + j * P, grid_base + (j + 1) * P)``.

Reserved pages: one **null page** per band whose pages are released while their request
still runs (window and chunked-local), so page tables can point released entries at zeros
of the same band. Full-attention pages are only released with their request, so the full
band reserves nothing (this keeps F8/F10 capacities exact: ``15,520`` and
``1,150,000`` tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvchain.errors import BufferTooSmallError, LayoutError
from kvchain.field_types import is_whole
from kvchain.model.layers import TARGET, CacheClass, LayerCache, LifetimeClass, owner_label

MAX_PAGES_PER_BAND = 1 << 28
"""Most pages one band may address: its virtual and physical page tables are int64 arrays
sized by the index space (about 32 B per page), so 2^28 pages cost ~8 GiB of host memory;
kernels' int32 page indices stop at 2^31 anyway."""


class Anchor(StrEnum):
    """Where a band is pinned: ``LOW`` END (grows up), ``HIGH`` END (grows down), ``FLOAT``."""

    LOW = "low"
    HIGH = "high"
    FLOAT = "float"


@dataclass(frozen=True, slots=True)
class BandLayout:
    """Geometry of one band.

    Attributes:
        cache_class: the lifetime class the band holds.
        anchor: LOW, HIGH or FLOAT.
        page_tokens: tokens per page (``P``) for token bands; 1 for the state band (one
            slot per page).
        page_bytes: bytes per page: ``P * E`` for token bands, ``S`` for the state band.
        grid_base: byte offset of physical page 0 (see module docstring).
        cap: index-space cap: the most pages the band may address (physical indices
            ``0 .. cap - 1`` on its grid).
        reserved_pages: null pages the chain holds in this band from construction on.
    """

    cache_class: CacheClass
    anchor: Anchor
    page_tokens: int
    page_bytes: int
    grid_base: int
    cap: int
    reserved_pages: int

    @property
    def lifetime(self) -> LifetimeClass:
        """The band's lifetime class."""
        return self.cache_class.lifetime

    @property
    def label(self) -> str:
        """Short name: ``"state"``, ``"window"``, ``"local"`` or ``"full"``; with several
        classes of one lifetime, its window in tokens too (``"window128"``)."""
        return self.cache_class.label


@dataclass(frozen=True, slots=True)
class ChainLayout:
    """A validated chain layout.

    Attributes:
        buffer_bytes: ``B``.
        page_size: tokens per page of every token band (``P``).
        bands: band layouts ordered low -> high in the buffer.
        state_slots_per_request: slots a new request claims (1 working + checkpoints).
    """

    buffer_bytes: int
    page_size: int
    bands: tuple[BandLayout, ...]
    state_slots_per_request: int = 1

    def index_of(self, lifetime: LifetimeClass, owner: str | None = TARGET) -> int | None:
        """Band index (low -> high) of the lowest band of a lifetime class owned by
        ``owner`` (default: the target's; ``None``: any owner's), or ``None`` if absent."""
        found = self.indices_of(lifetime, owner)
        return found[0] if found else None

    def indices_of(self, lifetime: LifetimeClass, owner: str | None = None
                   ) -> tuple[int, ...]:
        """Band indices (low -> high) of every band of a lifetime class owned by
        ``owner`` (default ``None``: every owner's)."""
        return tuple(i for i, band in enumerate(self.bands) if band.lifetime is lifetime
                     and (owner is None or band.cache_class.owner == owner))

    def band(self, lifetime: LifetimeClass, owner: str | None = TARGET) -> BandLayout | None:
        """The lowest band of a lifetime class owned by ``owner`` (as :meth:`index_of`),
        or ``None``."""
        i = self.index_of(lifetime, owner)
        return None if i is None else self.bands[i]

    def band_of(self, layer: LayerCache) -> int:
        """Index (low -> high) of the band that holds ``layer``'s cache: the band whose
        class has the layer's ``(owner, lifetime, window)``. A draft's layer (``owner =
        "draft"``, its own 0-based index) finds its draft band.

        Raises:
            LayoutError: no band of the chain holds such a layer.
        """
        for i, band in enumerate(self.bands):
            if band.cache_class.holds(layer):
                return i
        raise LayoutError(f"no band of {self.shape_name} holds layer {layer.index} "
                          f"({layer.owner} {layer.lifetime}, window {layer.window})")

    @property
    def reserved_bytes(self) -> int:
        """Bytes of all null pages."""
        return sum(b.reserved_pages * b.page_bytes for b in self.bands)

    @property
    def shape_name(self) -> str:
        """E.g. ``"state|window|full"`` (low -> high)."""
        return "|".join(b.label for b in self.bands)


def min_window_pages(window: int, page_size: int) -> int:
    """Fewest pages a request's sliding window can span: ``ceil((W - 1) / P) + 1``.

    A window of ``W`` tokens ending anywhere may straddle a page boundary, e.g. ``W = 32``,
    ``P = 32``: at length 32 the window covers pages 0 and 1 (field case F9).

    The one copy of the window peak: a window or chunked-local band's peak for a chunk of
    ``c`` tokens (:meth:`kvchain.bands.policies.WindowPolicy.peak_pages`) is this formula
    at ``W + c`` tokens, and at ``c = 0`` this value.
    """
    return -(-(window - 1) // page_size) + 1


def smallest_request_pages(layout_bands: Sequence[BandLayout], state_slots: int
                           ) -> tuple[int, ...]:
    """Pages per band (low -> high) of the smallest request: the one formula of kvchain
    (the layout's minimum-viable check, the scheduler's construction check and the
    baselines' all use it).

    One full page, one chunked-local page, ``state_slots`` state slots, and the fewest
    pages a sliding window can span, ``ceil((W - 1) / P) + 1`` (:func:`min_window_pages`):
    a request whose window straddles a page boundary must be able to run (field cases F1,
    F9). E.g. ``W = 128``, ``P = 256``: 2 window pages; ``W = 4,096``, ``P = 16``
    (Mistral-7B): 257 window pages, i.e. one window of ``W`` tokens plus one page.

    Raises:
        AssertionError: a window band without a window (``plan_layout`` refuses those).
    """
    pages = []
    for b in layout_bands:
        if b.lifetime is LifetimeClass.STATE:
            pages.append(state_slots)
        elif b.lifetime is LifetimeClass.WINDOW:
            assert b.cache_class.window is not None
            pages.append(min_window_pages(b.cache_class.window, b.page_tokens))
        else:
            pages.append(1)
    return tuple(pages)


def smallest_request_bytes(layout_bands: Sequence[BandLayout], state_slots: int) -> int:
    """Bytes of :func:`smallest_request_pages` (page-rounded, null pages excluded)."""
    pages = smallest_request_pages(layout_bands, state_slots)
    return sum(n * b.page_bytes for n, b in zip(pages, layout_bands, strict=True))


def smallest_request_reach(layout_bands: Sequence[BandLayout], state_slots: int) -> int:
    """Bytes a buffer needs for the smallest request (:func:`smallest_request_pages`) plus
    the null pages on the empty chain's page grids: the planner's packing of an empty
    chain, stated once (``docs/pricing.md``, "Chains of N bands": the maximal candidate,
    ENDs and floats packed leftmost, each float on its own grid).

    The LOW END's pages start at byte 0; each FLOAT starts on the first page of its own
    grid (``grid_base + j x P_b``) at or above the end of the band below and takes its
    null page plus its smallest-request pages; the HIGH END is anchored at the buffer's end,
    so its pages need exactly their bytes above that. With ``x`` the end of the last float
    and ``n_z x P_z`` the HIGH END's pages, the buffer needs ``x + n_z x P_z`` bytes: at
    least the pages' bytes, more by each float's grid rounding.

    Example (gemma-3-27b with gemma-3-1b as its draft, ``P = 16``): draft.full 1 x 65,536
    B ends at 65,536; the window float starts at 6,815,744 (its grid's page 1) and takes
    (1 null + 65) x 6,815,744 B, ending at 456,654,848; the draft.window float starts at
    1,267 x 360,448 = 456,687,616 and takes (1 + 33) x 360,448 B, ending at 468,942,848;
    the full END's 1,310,720 B: 470,253,568 B, against 463,470,592 B of pages.

    Returns:
        Bytes (the smallest buffer for this packing: the floats' grids do not depend on
        ``B``, the HIGH END's pages always fit their bytes below ``B``).
    """
    pages = smallest_request_pages(layout_bands, state_slots)
    x = 0
    last = len(layout_bands) - 1
    for i, (n, b) in enumerate(zip(pages, layout_bands, strict=True)):
        span = (b.reserved_pages + n) * b.page_bytes
        if b.anchor is Anchor.FLOAT:
            x = -(-(x - b.grid_base) // b.page_bytes) * b.page_bytes + b.grid_base
        elif i == last and b.anchor is Anchor.HIGH:
            return x + span
        x += span
    return x


def band_order_key(c: CacheClass, end: bool = True) -> tuple[int, int, int, int, bool, str]:
    """Sort key of a class in the chain, low -> high: state first (largest slot first),
    the full END last, and between them the floats: full classes that are not the END
    (a draft's, :func:`chain_order`) first, then the window and chunked-local classes by
    their bytes per request, largest first (``W x E`` for a window, ``C x E`` for a local
    chunk; ties: windows before local, then by size); last ties: the target's class
    first, then by owner.

    Args:
        c: the class.
        end: for a full class, whether it is the chain's full END (the HIGH END); a full
            class that is not floats, lowest of the floats.

    Why: the full END grows the most per step and runs into the float next to it most
    often; the planner then relocates or compacts that float, copying its live pages, so
    the float with the fewest bytes per request belongs there. The state END grows by a
    few slots per admission, so the largest float sits next to it: a floating full band
    (unbounded bytes per request) sits lowest, next to the states. Example: windows of
    128 (16,384 B/token) and 1,024 tokens (8,192 B/token): ``window1024 (8 MiB) |
    window128 (2 MiB) | full``; with a draft's full band, ``draft.full | window1024 |
    window128 | full``.
    """
    if c.lifetime is LifetimeClass.STATE:
        rank, size = 0, c.bytes_per_slot
    elif c.lifetime is LifetimeClass.FULL:
        rank, size = (3, 0) if end else (1, c.bytes_per_token)
    else:
        rank, size = 2, (c.window or 0) * c.bytes_per_token
    return (rank, -size, list(LifetimeClass).index(c.lifetime), c.window or 0,
            c.owner != TARGET, c.owner)


def chain_order(classes: Sequence[CacheClass]) -> list[CacheClass]:
    """The classes in chain order, low -> high (:func:`band_order_key`): the full END is
    the full class with the most bytes per token (ties: the target's), the one that grows
    fastest; other full classes float."""
    fulls = [c for c in classes if c.lifetime is LifetimeClass.FULL]
    top = max(fulls, key=lambda c: (c.bytes_per_token, c.owner == TARGET)) if fulls else None
    return sorted(classes, key=lambda c: band_order_key(c, c is top))


def chain_anchors(n: int) -> list[Anchor]:
    """Anchors of a chain of ``n >= 1`` bands: ``[LOW]``, ``[LOW, HIGH]``, or ``LOW``,
    ``n - 2`` FLOATs, ``HIGH``."""
    if n == 1:
        return [Anchor.LOW]
    return [Anchor.LOW, *([Anchor.FLOAT] * (n - 2)), Anchor.HIGH]


def plan_layout(
    classes: Sequence[CacheClass],
    buffer_bytes: int,
    page_size: int = 16,
    *,
    state_slots_per_request: int = 1,
    null_pages: bool = True,
) -> ChainLayout:
    """Lay out cache classes as a chain in a buffer of ``buffer_bytes``.

    Args:
        classes: the model's cache classes (any order; one per ``(owner, lifetime,
            window)``: several state, full, window or chunked-local classes are several
            bands, e.g. a target's and its draft's, :func:`kvchain.model.with_draft`).
        buffer_bytes: ``B``, bytes of the KV buffer.
        page_size: ``P``, tokens per page of every token band.
        state_slots_per_request: state slots a request claims (1 + checkpoint slots).
        null_pages: reserve one null page in each window/local band.

    Returns:
        The layout, bands ordered low -> high.

    Raises:
        LayoutError: no classes, two classes of one owner, lifetime and window (or chunk)
            size, a zero or negative size, a window below 1, a size, ``page_size``,
            ``buffer_bytes`` or ``state_slots_per_request`` that is not a whole number
            (a float, ``bool`` or NaN: :func:`kvchain.field_types.is_whole`), a
            ``null_pages`` that is not a bool,
            or more than :data:`MAX_PAGES_PER_BAND` pages in a band.
        BufferTooSmallError: the buffer cannot hold one smallest request
            (:func:`smallest_request_pages`: one full page, ``ceil((W - 1) / P) + 1``
            pages of every window band, one page of every local band, its state slots) plus
            the null pages, counted in bytes, or placed on the bands' page grids
            (:func:`smallest_request_reach`, the planner's packing of the empty chain);
            the message names bytes needed and available. Example (field case F1):
            ``E_full = E_win = 1,000 B``, ``W = 128``, ``P = 256``, ``B = 600,000``:
            needs ``256,000 + 2 x 256,000 = 768,000 B`` (+ a null page of 256,000 B).
    """
    for name, value, least in (("page_size", page_size, 1), ("buffer_bytes", buffer_bytes, 1),
                               ("state_slots_per_request", state_slots_per_request, 1)):
        if not is_whole(value) or value < least:
            raise LayoutError(f"{name} must be a whole number >= {least}, got {value!r} "
                              f"({type(value).__name__})")
    if type(null_pages) is not bool:
        raise LayoutError(f"null_pages must be True or False, got {null_pages!r}")
    if not classes:
        raise LayoutError("no cache classes to lay out")
    page_size, buffer_bytes = int(page_size), int(buffer_bytes)
    state_slots_per_request = int(state_slots_per_request)
    keys = [c.key for c in classes]
    if len(set(keys)) != len(keys):
        raise LayoutError(f"two cache classes of one lifetime and size of one owner: "
                          f"{[owner_label(o, f'{lt}/{w}') for o, lt, w in keys]}")
    ordered = chain_order(classes)
    labels = [c.label for c in ordered]
    if len(set(labels)) != len(labels):
        ordered = [c.labelled(owner_label(c.owner, f"{c.lifetime.value}{c.window}"))
                   if labels.count(c.label) > 1 else c for c in ordered]
    for c in ordered:
        _check_class_sizes(c)

    smallest_page = min(c.bytes_per_token * page_size if c.is_token_class else c.bytes_per_slot
                        for c in ordered)
    if buffer_bytes // smallest_page > MAX_PAGES_PER_BAND:
        raise LayoutError(
            f"{buffer_bytes:,} B in pages of {smallest_page:,} B is "
            f"{buffer_bytes // smallest_page:,} pages, more than a band's page table holds "
            f"({MAX_PAGES_PER_BAND:,}); use larger pages (page_size)")
    anchors = chain_anchors(len(ordered))
    bands = []
    for c, anchor in zip(ordered, anchors, strict=True):
        if c.is_token_class:
            page_tokens, page_bytes = page_size, page_size * c.bytes_per_token
        else:
            page_tokens, page_bytes = 1, c.bytes_per_slot
        grid_base = buffer_bytes % page_bytes if anchor is Anchor.HIGH else 0
        releases_early = c.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)
        reserved = 1 if null_pages and releases_early else 0
        bands.append(BandLayout(c, anchor, page_tokens, page_bytes, grid_base,
                                (buffer_bytes - grid_base) // page_bytes, reserved))
    layout = ChainLayout(buffer_bytes, page_size, tuple(bands), state_slots_per_request)
    check_smallest_request(layout, state_slots_per_request)
    return layout


def _check_class_sizes(c: CacheClass) -> None:
    """That class ``c``'s sizes are whole numbers in range: ``bytes_per_token >= 1`` for a
    token class (and a window or chunk ``>= 1`` token unless it is full attention),
    ``bytes_per_slot >= 1`` for a state class. A float, a ``bool`` or NaN is refused: NaN
    passes every comparison's ``False`` branch and would lay out a band of NaN-byte
    pages.

    Raises:
        LayoutError: the first size that is not, naming the class and the value.
    """
    if c.is_token_class:
        if not is_whole(c.bytes_per_token) or c.bytes_per_token < 1:
            raise LayoutError(f"{c.lifetime} class needs bytes_per_token a whole number "
                              f"> 0, got {c.bytes_per_token!r}")
        if c.lifetime is not LifetimeClass.FULL and (
                not is_whole(c.window) or c.window < 1):
            raise LayoutError(f"{c.lifetime} class needs a window >= 1 token (a whole "
                              f"number), got {c.window!r}")
    elif not is_whole(c.bytes_per_slot) or c.bytes_per_slot < 1:
        raise LayoutError(f"state class needs bytes_per_slot a whole number > 0, got "
                          f"{c.bytes_per_slot!r}")


def check_smallest_request(layout: ChainLayout, state_slots: int) -> None:
    """Refuse a layout whose buffer cannot hold one smallest request claiming
    ``state_slots`` slots in every state band (:func:`plan_layout`'s own check; a caller
    whose requests claim more slots than the layout's ``state_slots_per_request``, e.g.
    ``1 + k`` under speculative decoding with ``k`` checkpoint slots, checks again with
    its count).

    Raises:
        BufferTooSmallError: as :func:`plan_layout` (bytes, then the page grids).
    """
    buffer_bytes = layout.buffer_bytes
    needed = smallest_request_bytes(layout.bands, state_slots)
    needed += layout.reserved_bytes
    if needed > buffer_bytes:
        pages = smallest_request_pages(layout.bands, state_slots)
        parts = ", ".join(
            f"{b.label} {n} x {b.page_bytes:,} B"
            + (f" (a {b.cache_class.window:,}-token window spans up to {n} pages)"
               if b.lifetime is LifetimeClass.WINDOW and n > 1 else "")
            for n, b in zip(pages, layout.bands, strict=True))
        raise BufferTooSmallError(
            f"buffer of {buffer_bytes:,} B cannot hold one smallest request: it needs "
            f"{needed:,} B ({parts}, plus {layout.reserved_bytes:,} B of null pages)",
            needed_bytes=needed,
            available_bytes=buffer_bytes,
        )
    reach = smallest_request_reach(layout.bands, state_slots)
    if reach > buffer_bytes:
        raise BufferTooSmallError(
            f"buffer of {buffer_bytes:,} B cannot hold one smallest request: its "
            f"{needed:,} B of pages (with null pages) fit, but no placement of whole pages "
            f"fits the bands' page grids: packed on them ({layout.shape_name}, each "
            f"floating band from the first page of its grid above the band below) they "
            f"need {reach:,} B",
            needed_bytes=reach,
            available_bytes=buffer_bytes,
        )
