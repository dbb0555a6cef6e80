"""The planner: capacity as a pure function of a chain snapshot.

``price(snapshot, demand) -> Quote`` decides whether a demand (pages per band) fits and,
if it does, the cheapest plan of primitive actions with the snapshot predicted after each
(see :mod:`kvchain.alloc.snapshot` for the actions). It reads counts and frontiers only,
never hole positions, so the allocator can realize exactly what the price said.

Candidates (docs/design.md §3, docs/pricing.md §1-2), cheapest first by bytes copied
(an upper bound: ``pages x page_bytes`` of every Compact and Relocate):

* **in place**: holes first, then each band extends into its adjacent gap; the float
  extends on its low side first (the full END grows every decode step, so the float
  leaves the high gap to it), then on its high side;
* **compaction**: ENDs with spare holes (more holes than their own demand) compact just
  enough to open the bytes a neighbour must extend into; a float with spare holes
  compacts toward whichever side needs the bytes;
* **relocation**: the float is packed (zero holes) against its low or high neighbour,
  after the ENDs compacted just enough; on an empty float this copies nothing.

A demand that fits without a copy (after the least eviction prefix, if bytes must be
freed), or that the byte bound refuses even after evicting everything, is answered by a
one-pass shortcut over the counts (``_in_place_shortcut``; docs/pricing.md §6) with the
same quote the general solver gives.

Refusal comes only with a proof: the byte bound (``demand bytes + live bytes > B``), the
index-space cap, or the maximal candidate (ENDs fully compacted, float packed) failing to
place whole pages on the float's grid. A closed move gate removes every candidate that
copies; the refusal then says ``moves_blocked``.

Two ENDs, worked example (docs/pricing.md §1): ``P_A = P_Z = 32 B``,
``B = 6,400 B``, each END 100 live pages; after releasing 40 pages of A and 80 of Z (all
interior holes), the demand ``(50, 50)`` is planned as::

    Compact(Z, LOW, 10)      # Z's frontier rises 320 B; at most 10 copies
    UseHoles(A, 40); UseHoles(Z, 50)
    Extend(A, HIGH, 10)      # into the 320 B opened by Z

and ``(61, 61)`` is refused with a shortfall of 64 B.

More than one float (a model with several window sizes, or a window next to chunked-local
attention): ``_solve_chain`` - in place, then a low-side and a high-side sweep over each
float's options, refusal by the maximal candidate (ENDs compacted, floats packed leftmost
in order, each on its own grid), which is exact; see ``docs/pricing.md``, "Chains of N
bands". Worked examples: ``tests/alloc/test_pricing_n_bands.py``.

Three bands, worked example (section 2): ``P_S = 48 B``, ``P_W = P_F = 32 B``,
``B = 6,784 B``, 41 state slots held (frontier 1,968 B, off the 32-byte grid), empty
window float and full END: ``n`` window + ``n`` full pages fit for ``n <= 75``; ``n = 76``
is refused by the byte bound (shortfall 48 B).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvchain.alloc.snapshot import (
    Action,
    BandSnapshot,
    ChainSnapshot,
    Compact,
    CopyPages,
    Demand,
    Evict,
    Extend,
    LazyPlan,
    Quote,
    RefusalReason,
    Relocate,
    Side,
    UseHoles,
    WaitFence,
)
from kvchain.errors import ConfigError, InvalidDemandError, PlanMismatchError
from kvchain.layout import Anchor


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- applying one action to a snapshot (pure) ---------------------------------------------


def apply_action(snapshot: ChainSnapshot, action: Action) -> ChainSnapshot:
    """The snapshot after one plan action (pure; the executor must reach exactly this).

    Raises:
        PlanMismatchError: the action is impossible on this snapshot (too few holes, an
            extension onto a neighbour's bytes, a move on a band whose gate is closed, ...).
            The planner never emits such an action: this is a bug check.
    """
    if isinstance(action, WaitFence):
        return replace(
            snapshot,
            bands=tuple(replace(b, fence_pending=False) for b in snapshot.bands),
        )
    if isinstance(action, Evict):
        return _evicted(snapshot, action.units)
    if isinstance(action, CopyPages):
        if not 0 <= action.band < len(snapshot.bands) or not action.src \
                or len(action.src) != len(action.dst):
            raise PlanMismatchError(f"{action}: no such band, or sources and destinations "
                                    f"differ in number")
        return snapshot  # a copy changes no count or frontier
    i = action.band
    band = snapshot.bands[i]
    low_limit = snapshot.bands[i - 1].hi if i > 0 else 0
    high_limit = (
        snapshot.bands[i + 1].lo if i + 1 < len(snapshot.bands) else snapshot.buffer_bytes
    )
    if isinstance(action, UseHoles):
        if not 0 < action.pages <= band.holes:
            raise PlanMismatchError(f"UseHoles({action.pages}) on a band with {band.holes} holes")
        new = _band(band, band.lo, band.hi, band.live + action.pages, band.holes - action.pages)
    elif isinstance(action, Extend):
        new = _extended(band, action, low_limit, high_limit)
    elif isinstance(action, Compact):
        new = _compacted(band, action)
    elif isinstance(action, Relocate):
        new = _relocated(band, action, low_limit, high_limit)
    else:  # pragma: no cover - exhaustive over Action
        raise PlanMismatchError(f"unknown action {action!r}")
    bands = list(snapshot.bands)
    bands[i] = new
    return ChainSnapshot(snapshot.buffer_bytes, tuple(bands), snapshot.epoch,
                         snapshot.evictable)


def _extended(band: BandSnapshot, action: Extend, low_limit: int, high_limit: int
              ) -> BandSnapshot:
    """``band`` after ``action``: ``k`` new pages at its high or low end, within the index
    cap and the bytes ``[low_limit, high_limit)`` its neighbours leave.

    Raises:
        PlanMismatchError: a side the band cannot grow on, ``k <= 0``, past the cap, or
            onto a neighbour's bytes.
    """
    k = action.pages
    _check_side(band, action.side)
    if k <= 0 or band.span + k > band.cap:
        raise PlanMismatchError(f"Extend({k}) past the index cap {band.cap}")
    if action.side is Side.HIGH:
        new = _band(band, band.lo, band.hi + k * band.page_bytes, band.live + k, band.holes)
        if new.hi > high_limit:
            raise PlanMismatchError(f"Extend({k}) of {band.label} runs into byte {high_limit}")
    else:
        new = _band(band, band.lo - k * band.page_bytes, band.hi, band.live + k, band.holes)
        if new.lo < low_limit:
            raise PlanMismatchError(f"Extend({k}) of {band.label} runs into byte {low_limit}")
    return new


def _compacted(band: BandSnapshot, action: Compact) -> BandSnapshot:
    """``band`` after ``action``: ``k`` of its holes given back at one end (its pages moved).

    Raises:
        PlanMismatchError: a wrong side, ``k`` not in ``[1, holes]``, or its gate closed.
    """
    k = action.pages
    _check_side(band, action.side)
    if not 0 < k <= band.holes:
        raise PlanMismatchError(f"Compact({k}) on a band with {band.holes} holes")
    if not band.movable:
        raise PlanMismatchError(f"Compact on {band.label} while its move gate is closed")
    if action.side is Side.HIGH:
        return _band(band, band.lo, band.hi - k * band.page_bytes, band.live, band.holes - k)
    return _band(band, band.lo + k * band.page_bytes, band.hi, band.live, band.holes - k)


def _relocated(band: BandSnapshot, action: Relocate, low_limit: int, high_limit: int
               ) -> BandSnapshot:
    """A floating ``band`` after ``action``: its live pages packed at byte ``action.lo``,
    inside ``[low_limit, high_limit)``.

    Raises:
        PlanMismatchError: an anchored band, a start off the page grid, a closed gate with
            live pages, or a span outside the gaps.
    """
    p = band.page_bytes
    if band.anchor is not Anchor.FLOAT:
        raise PlanMismatchError(f"Relocate of the {band.anchor} band {band.label}")
    if action.lo % p:
        raise PlanMismatchError(f"Relocate to byte {action.lo}, off the {p}-byte grid")
    if band.live and not band.movable:
        raise PlanMismatchError(f"Relocate of {band.label} while its move gate is closed")
    new = _band(band, action.lo, action.lo + band.live * p, band.live, 0)
    if new.lo < low_limit or new.hi > high_limit:
        raise PlanMismatchError(f"Relocate to [{new.lo}, {new.hi}) outside its gaps")
    return new


def _evicted(snapshot: ChainSnapshot, k: int) -> ChainSnapshot:
    """The snapshot after evicting the first ``k`` units of its eviction order: freed
    pages become holes of their band (``live -= freed``, ``holes += freed``), frontiers
    stay (a release never shrinks a span), and the order left is the suffix.

    Raises:
        PlanMismatchError: ``k`` outside ``[1, units]``, or a unit frees more pages than
            a band holds live (the cache published an impossible order: a bug check).
    """
    order = snapshot.evictable
    if not 0 < k <= order.units:
        raise PlanMismatchError(f"Evict({k}) with {order.units} eviction units")
    freed = order.freed(k)
    bands = []
    for b, n in zip(snapshot.bands, freed, strict=True):
        if n > b.live:
            raise PlanMismatchError(f"Evict({k}) frees {n} pages of {b.label}, "
                                    f"{b.live} are live")
        bands.append(_band(b, b.lo, b.hi, b.live - n, b.holes + n) if n else b)
    return ChainSnapshot(snapshot.buffer_bytes, tuple(bands), snapshot.epoch, order.after(k))


def _band(b: BandSnapshot, lo: int, hi: int, live: int, holes: int) -> BandSnapshot:
    """``b`` with new frontiers and counts (a direct constructor call: this is the hot path
    of pricing, and ``dataclasses.replace`` costs several times more)."""
    return BandSnapshot(b.label, b.anchor, b.page_bytes, lo, hi, live, holes, b.cap, b.movable,
                        b.fence_pending)


def _check_side(band: BandSnapshot, side: Side) -> None:
    if band.anchor is Anchor.LOW and side is not Side.HIGH:
        raise PlanMismatchError(f"the LOW END {band.label} only moves its HIGH frontier")
    if band.anchor is Anchor.HIGH and side is not Side.LOW:
        raise PlanMismatchError(f"the HIGH END {band.label} only moves its LOW frontier")


# --- the decision: counts only --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """A feasible candidate, as decisions (turned into actions by :func:`_steps`).

    ``compact[i]``: pages band ``i`` compacts (for the float: ``float_compact_low`` /
    ``float_compact_high`` instead); ``float_ext_low``/``float_ext_high``: pages the float
    extends on each side; ``relocate_lo``: byte the float is packed to, or ``None``.
    """

    compact: tuple[int, ...]
    float_compact_low: int = 0
    float_compact_high: int = 0
    float_ext_low: int = 0
    float_ext_high: int = 0
    relocate_lo: int | None = None
    copied_bytes: int = 0
    floats: tuple[_FloatMove, ...] | None = None


@dataclass(frozen=True, slots=True)
class _FloatMove:
    """What one float of a chain with several floats does (``_Plan.floats``): pages it
    compacts at each side, pages it extends at each side, and the byte it is packed to
    (``None``: it stays). ``copied``: bytes its compaction or relocation copies."""

    band: int
    compact_low: int = 0
    compact_high: int = 0
    ext_low: int = 0
    ext_high: int = 0
    relocate_lo: int | None = None
    copied: int = 0


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: RefusalReason
    shortfall_bytes: int


def validate_demand(snapshot: ChainSnapshot, demand: Demand) -> None:
    """Check a demand against a snapshot (:func:`check_demand` with its band count).

    Raises:
        InvalidDemandError: as :func:`check_demand`.
    """
    check_demand(demand, len(snapshot.bands))


def check_demand(demand: object, num_bands: int) -> None:
    """Check that ``demand`` is a :class:`Demand` whose pages fit a chain of ``num_bands``
    bands (:func:`validate_pages`): the one check every allocator, the planner's methods
    and the module-level functions run before pricing or a memo lookup, so a tuple or
    ``None`` is refused typed, never read as ``.pages``.

    Raises:
        InvalidDemandError: not a ``Demand`` (``expected a Demand, got tuple``), or as
            :func:`validate_pages`.
    """
    if not isinstance(demand, Demand):
        raise InvalidDemandError(f"expected a Demand, got {type(demand).__name__}")
    validate_pages(demand.pages, num_bands)


def validate_pages(pages: object, num_bands: int) -> None:
    """Check a demand's pages against a chain of ``num_bands`` bands (the second half of
    :func:`check_demand`).

    Raises:
        InvalidDemandError: pages not a tuple, the wrong number of bands, or a page count
            that is not a non-negative int (bools and numpy ints are refused: ``True == 1``
            would otherwise hash and compare as a page count).
    """
    if type(pages) is not tuple:
        raise InvalidDemandError(f"demand pages must be a tuple of ints, got {pages!r}")
    if len(pages) != num_bands:
        raise InvalidDemandError(
            f"demand has {len(pages)} entries, the chain has {num_bands} bands"
        )
    for d in pages:
        if type(d) is not int or d < 0:  # bool and numpy ints are refused on purpose
            raise InvalidDemandError(f"demand pages must be non-negative ints, got {pages!r}")


def _solve(snapshot: ChainSnapshot, demand: Demand) -> _Plan | _Refusal:
    """The cheapest feasible candidate, or the proof of refusal (demand already valid)."""
    bands = snapshot.bands
    pages = demand.pages
    # Byte bound and index-space cap: nothing can help past these.
    need = 0
    for b, d in zip(bands, pages, strict=True):
        need += (b.live + d) * b.page_bytes
        if d > b.holes and b.live + d > b.cap:
            return _Refusal(RefusalReason.INDEX_CAP, (b.live + d - b.cap) * b.page_bytes)
    if need > snapshot.buffer_bytes:
        return _Refusal(RefusalReason.BYTES, need - snapshot.buffer_bytes)
    if len(bands) == 1:
        return _Plan((0,))  # a lone LOW END: holes, then the gap up to B (bound above)
    if len(bands) == 2:
        return _solve_two_ends(snapshot, pages)
    if len(bands) == 3:
        return _solve_three_bands(snapshot, pages)
    return _solve_chain(snapshot, pages)


#: A solver: the cheapest feasible candidate for a valid demand on a snapshot, or the proof
#: of refusal (``_solve`` is the general one; a :class:`Planner` carries the one it uses).
Solver = Callable[[ChainSnapshot, Demand], "_Plan | _Refusal"]


def _solve_two_ends(snapshot: ChainSnapshot, pages: tuple[int, ...]) -> _Plan | _Refusal:
    """Two ENDs facing one gap: byte-additive (docs/pricing.md §1)."""
    a, z = snapshot.bands
    da, dz = pages
    gap = z.lo - a.hi
    deficit = max(da - a.holes, 0) * a.page_bytes + max(dz - z.holes, 0) * z.page_bytes - gap
    if deficit <= 0:
        return _Plan((0, 0))
    # Exactly one END has spare holes (else the byte bound refused): it compacts just enough.
    donor = 0 if a.holes > da else 1
    band = (a, z)[donor]
    spare = band.holes - pages[donor]
    if not band.movable:
        return _Refusal(RefusalReason.MOVES_BLOCKED, deficit)
    k = _ceil_div(deficit, band.page_bytes)
    if k > spare:  # pragma: no cover - the byte bound already proves this case
        return _Refusal(RefusalReason.BYTES, deficit - spare * band.page_bytes)
    compact = (k, 0) if donor == 0 else (0, k)
    return _Plan(compact, copied_bytes=k * band.page_bytes)


def _solve_three_bands(snapshot: ChainSnapshot, pages: tuple[int, ...]) -> _Plan | _Refusal:
    """State END | FLOAT | full END (docs/pricing.md §2)."""
    s, w, f = snapshot.bands
    ds, dw, df = pages
    ps, pw, pf = s.page_bytes, w.page_bytes, f.page_bytes
    ext_s, spare_s = max(ds - s.holes, 0), max(s.holes - ds, 0)
    ext_w, spare_w = max(dw - w.holes, 0), max(w.holes - dw, 0)
    ext_f, spare_f = max(df - f.holes, 0), max(f.holes - df, 0)
    s_hi = s.hi + ext_s * ps  # the ENDs' frontiers after their own in-place growth
    f_lo = f.lo - ext_f * pf
    can_s = s.movable and spare_s > 0
    can_f = f.movable and spare_f > 0
    best: _Plan | None = None

    def consider(plan: _Plan) -> None:
        nonlocal best
        if best is None or plan.copied_bytes < best.copied_bytes:
            best = plan

    # In place and END compaction around a float that stays where it is.
    if ext_w > 0 or spare_w == 0:
        room_low = w.lo - s_hi  # bytes the float may extend into on each side
        room_high = f_lo - w.hi
        if room_low >= 0 and room_high >= 0:
            max_low = room_low // pw
            max_high = room_high // pw
            if ext_w <= max_low + max_high:
                low = min(ext_w, max_low)
                # In place copies nothing: no candidate can be cheaper, and ties go to it.
                return _Plan((0, 0, 0), float_ext_low=low, float_ext_high=ext_w - low)
            else:
                for low_first in (True, False):
                    plan = _float_stays_with_compaction(
                        s, w, f, ext_w, room_low, room_high,
                        spare_s if can_s else 0, spare_f if can_f else 0, low_first,
                    )
                    if plan is not None:
                        consider(plan)
    else:
        # The float has spare holes: it needs no new page and can compact toward the side
        # whose END must grow past its frontier.
        short_low = max(s_hi - w.lo, 0)
        short_high = max(w.hi - f_lo, 0)
        k_low = _ceil_div(short_low, pw)
        k_high = _ceil_div(short_high, pw)
        if k_low + k_high == 0:
            return _Plan((0, 0, 0))  # in place: nothing is cheaper
        elif w.movable and k_low + k_high <= spare_w:
            consider(_Plan((0, 0, 0), float_compact_low=k_low, float_compact_high=k_high,
                           copied_bytes=(k_low + k_high) * pw))

    # Relocation: the float packed (no holes) against one neighbour.
    if w.movable or w.live == 0:
        n = w.live + dw
        for low_first in (True, False):
            plan = _packed_float(s, w, f, n, s_hi, f_lo,
                                 spare_s if can_s else 0, spare_f if can_f else 0, low_first)
            if plan is not None:
                consider(plan)
    if best is not None:
        return best
    return _three_band_refusal(snapshot, pages, s_hi, f_lo)


def _float_stays_with_compaction(
    s: BandSnapshot, w: BandSnapshot, f: BandSnapshot, ext_w: int,
    room_low: int, room_high: int, spare_s: int, spare_f: int, low_first: bool,
) -> _Plan | None:
    """The float extends by ``ext_w`` where it is; ENDs compact to open its gaps."""
    ps, pw, pf = s.page_bytes, w.page_bytes, f.page_bytes
    max_low = (room_low + spare_s * ps) // pw
    max_high = (room_high + spare_f * pf) // pw
    if ext_w > max_low + max_high:
        return None
    low = min(ext_w, max_low) if low_first else ext_w - min(ext_w, max_high)
    high = ext_w - low
    c_s = _ceil_div(max(low * pw - room_low, 0), ps)
    c_f = _ceil_div(max(high * pw - room_high, 0), pf)
    return _Plan((c_s, 0, c_f), float_ext_low=low, float_ext_high=high,
                 copied_bytes=c_s * ps + c_f * pf)


def _packed_float(
    s: BandSnapshot, w: BandSnapshot, f: BandSnapshot, n: int, s_hi: int, f_lo: int,
    spare_s: int, spare_f: int, low_first: bool,
) -> _Plan | None:
    """The float packed into ``n`` whole grid pages between the (compacted) ENDs.

    Grid rounding: between bytes ``lo`` and ``hi`` the float places
    ``floor(hi / P_W) - ceil(lo / P_W)`` pages (docs/pricing.md §2). The ENDs compact
    just enough to open the missing grid pages, low side first or high side first.
    """
    ps, pw, pf = s.page_bytes, w.page_bytes, f.page_bytes
    lo_idx = _ceil_div(s_hi, pw)
    hi_idx = f_lo // pw
    short = max(n - (hi_idx - lo_idx), 0)
    gain_low_max = lo_idx - _ceil_div(s_hi - spare_s * ps, pw)
    gain_high_max = (f_lo + spare_f * pf) // pw - hi_idx
    if short > gain_low_max + gain_high_max:
        return None
    g_low = min(short, gain_low_max) if low_first else short - min(short, gain_high_max)
    g_high = short - g_low
    # Fewest END pages that open g_low / g_high whole float pages.
    c_s = _ceil_div(max(s_hi - (lo_idx - g_low) * pw, 0), ps) if g_low else 0
    c_f = _ceil_div(max((hi_idx + g_high) * pw - f_lo, 0), pf) if g_high else 0
    if low_first:
        first = _ceil_div(s_hi - c_s * ps, pw)  # packed live pages, then growth upward
        relocate_lo, ext_low, ext_high = first * pw, 0, n - w.live
    else:
        last = (f_lo + c_f * pf) // pw  # growth downward, then packed live pages
        relocate_lo, ext_low, ext_high = (last - w.live) * pw, n - w.live, 0
    moved = relocate_lo != w.lo or w.holes > 0
    return _Plan((c_s, 0, c_f), float_ext_low=ext_low, float_ext_high=ext_high,
                 relocate_lo=relocate_lo if moved else None,
                 copied_bytes=c_s * ps + c_f * pf + (w.live * pw if moved else 0))


def _three_band_refusal(snapshot: ChainSnapshot, pages: tuple[int, ...],
                        s_hi: int, f_lo: int) -> _Refusal:
    """Why nothing fits: moves blocked, or the float's grid (bytes suffice)."""
    s, w, f = snapshot.bands
    pw = w.page_bytes
    # The maximal candidate ignoring gates: ENDs fully compacted, float packed.
    lo_idx = _ceil_div(s_hi - max(s.holes - pages[0], 0) * s.page_bytes, pw)
    hi_idx = (f_lo + max(f.holes - pages[2], 0) * f.page_bytes) // pw
    grid_short = w.live + pages[1] - (hi_idx - lo_idx)
    if grid_short > 0:
        return _Refusal(RefusalReason.GRID, grid_short * pw)
    # It would fit with moves: the gate (or a band's movability) forbids them.
    room = max(w.lo - s_hi, 0) // pw + max(f_lo - w.hi, 0) // pw
    short = max(max(pages[1] - w.holes, 0) - room, 1)
    return _Refusal(RefusalReason.MOVES_BLOCKED, short * pw)


# --- N bands: two ENDs and several floats ---------------------------------------------------
#
# The bands as plain lists (index 0 = LOW END, n - 1 = HIGH END, floats between), so the
# same sweep runs on the chain and on its mirror image (bytes x -> B - x, order reversed):
# the mirror turns "high side first" into "low side first" without a second copy of the
# code. A float's grid starts at ``grid`` (0 on the real chain, ``B mod P`` in the mirror).


@dataclass(slots=True)
class _Bands:
    lo: list[int]
    hi: list[int]
    live: list[int]
    holes: list[int]
    page: list[int]
    grid: list[int]
    movable: list[bool]
    demand: list[int]


def _bands_of(snapshot: ChainSnapshot, pages: tuple[int, ...]) -> _Bands:
    bands = snapshot.bands
    return _Bands([b.lo for b in bands], [b.hi for b in bands], [b.live for b in bands],
                  [b.holes for b in bands], [b.page_bytes for b in bands],
                  [0] * len(bands), [b.movable for b in bands], list(pages))


def _mirror(c: _Bands, big: int) -> _Bands:
    return _Bands([big - h for h in reversed(c.hi)], [big - lo for lo in reversed(c.lo)],
                  c.live[::-1], c.holes[::-1], c.page[::-1],
                  [(big - g) % p for g, p in zip(reversed(c.grid), reversed(c.page),
                                                 strict=True)],
                  c.movable[::-1], c.demand[::-1])


def _thresholds(c: _Bands, z_lo_max: int, moves: bool) -> list[int]:
    """``t[j]``: the highest byte band ``j - 1`` may end at so that floats ``j ..`` and the
    HIGH END still fit, each float packed as far up as its grid allows (``moves``: movable
    or empty floats may pack; otherwise a float with live pages stays and extends, low side
    first). ``t[n - 1]`` is the HIGH END's fully compacted frontier. ``-1`` marks
    "nothing fits"."""
    n = len(c.lo)
    t = [0] * n
    t[n - 1] = z_lo_max
    for j in range(n - 2, 0, -1):
        nxt = t[j + 1]
        p, g = c.page[j], c.grid[j]
        if nxt < 0:
            t[j] = -1
        elif (moves and c.movable[j]) or c.live[j] == 0:
            top = (nxt - g) // p * p + g - (c.live[j] + c.demand[j]) * p
            t[j] = top if top >= 0 else -1
        else:
            ext = max(c.demand[j] - c.holes[j], 0)
            if c.hi[j] > nxt:
                t[j] = -1
            else:
                low = max(ext - (nxt - c.hi[j]) // p, 0)
                t[j] = c.lo[j] - low * p
    return t


def _end_frontiers(c: _Bands) -> tuple[int, int, int, int]:
    """The ENDs after their own in-place growth (``a_hi``, ``z_lo``) and their spare holes
    (pages each may compact away; 0 when its gate is closed)."""
    n = len(c.lo)
    a_hi = c.hi[0] + max(c.demand[0] - c.holes[0], 0) * c.page[0]
    z_lo = c.lo[n - 1] - max(c.demand[n - 1] - c.holes[n - 1], 0) * c.page[n - 1]
    spare_a = max(c.holes[0] - c.demand[0], 0) if c.movable[0] else 0
    spare_z = max(c.holes[n - 1] - c.demand[n - 1], 0) if c.movable[n - 1] else 0
    return a_hi, z_lo, spare_a, spare_z


def _float_options(c: _Bands, j: int, x: int, limit: int) -> list[tuple[int, _FloatMove]]:
    """Ways float ``j`` can hold its demand when the band below ends at byte ``x``:
    ``(byte it ends at, decisions)``, only those ending at or below ``limit``.

    Stay (own holes first, then extend low as far as the gap below allows, then high); stay
    after compacting its spare holes just enough at the low side (to clear ``x``) and at
    the high side none, just enough to end at ``limit``, or all; packed at the lowest grid
    byte at or above ``x`` (copies its live pages unless it is already packed there).
    """
    lo, hi, p = c.lo[j], c.hi[j], c.page[j]
    live, holes, d = c.live[j], c.holes[j], c.demand[j]
    ext, spare = max(d - holes, 0), max(holes - d, 0)
    out: list[tuple[int, _FloatMove]] = []
    if x <= lo:
        low = min(ext, (lo - x) // p)
        end = hi + (ext - low) * p
        if end <= limit:
            out.append((end, _FloatMove(j, ext_low=low, ext_high=ext - low)))
    if spare and c.movable[j]:
        k_low = _ceil_div(max(x - lo, 0), p)
        rest = spare - k_low
        if rest >= 0:
            highs = {0, rest, _ceil_div(max(hi - limit, 0), p)}
            for k_high in sorted(highs):
                if (k_low or k_high) and k_high <= rest and hi - k_high * p <= limit:
                    out.append((hi - k_high * p,
                                _FloatMove(j, compact_low=k_low, compact_high=k_high,
                                           copied=(k_low + k_high) * p)))
    if c.movable[j] or live == 0:
        g = c.grid[j]
        new_lo = _ceil_div(x - g, p) * p + g
        end = new_lo + (live + d) * p
        if end <= limit:
            moved = new_lo != lo or holes > 0
            out.append((end, _FloatMove(j, ext_high=d if moved else ext,
                                        relocate_lo=new_lo if moved else None,
                                        copied=live * p if moved else 0)))
    return out


_Path = tuple[int, int, int, tuple[_FloatMove, ...]]  # (end byte, copied, END-A pages, floats)


def _sweep(c: _Bands) -> tuple[int, int, int, tuple[_FloatMove, ...]] | None:
    """The cheapest candidate placed low side first: the LOW END compacts by one of a few
    amounts (none, all its spare holes, just enough for the first float to stay, to stay
    and extend low, or to fit at all), each float takes one of :func:`_float_options`,
    and the HIGH END compacts just enough for the last band. Returns ``(copied bytes,
    LOW END pages, HIGH END pages, float decisions)`` or ``None``.

    Dominance: a partial placement ending lower at no higher cost is never worse (every
    option of the next float ends no higher and copies no more from a lower start), so
    only the Pareto front of ``(end byte, copied)`` is kept after each float.
    """
    n = len(c.lo)
    a_hi, z_lo, spare_a, spare_z = _end_frontiers(c)
    t = _thresholds(c, z_lo + spare_z * c.page[n - 1], True)
    if t[1] < 0:
        return None
    pa = c.page[0]
    first_ext = max(c.demand[1] - c.holes[1], 0) * c.page[1]
    wanted = {0, spare_a, _ceil_div(max(a_hi - c.lo[1], 0), pa),
              _ceil_div(max(a_hi - c.lo[1] + first_ext, 0), pa),
              _ceil_div(max(a_hi - t[1], 0), pa)}
    paths: list[_Path] = [(a_hi - k * pa, k * pa, k, ()) for k in sorted(wanted)
                          if k <= spare_a and a_hi - k * pa <= t[1]]
    for j in range(1, n - 1):
        grown: list[_Path] = []
        for end, copied, k_a, moves in paths:
            for new_end, mv in _float_options(c, j, end, t[j + 1]):
                grown.append((new_end, copied + mv.copied, k_a, (*moves, mv)))
        grown.sort(key=lambda q: (q[0], q[1]))
        paths = []
        for q in grown:
            if not paths or q[1] < paths[-1][1]:
                paths.append(q)
        if not paths:
            return None
    best: tuple[int, int, int, tuple[_FloatMove, ...]] | None = None
    pz = c.page[n - 1]
    for end, copied, k_a, moves in paths:
        k_z = _ceil_div(max(end - z_lo, 0), pz)
        total = copied + k_z * pz
        if best is None or total < best[0]:
            best = (total, k_a, k_z, moves)
    return best


def _unmirror(move: _FloatMove, n: int, c: _Bands, big: int) -> _FloatMove:
    """A float decision of the mirrored chain, in the real chain's bytes and sides."""
    j = n - 1 - move.band
    lo = None
    if move.relocate_lo is not None:
        lo = big - move.relocate_lo - c.live[j] * c.page[j]
    return _FloatMove(j, move.compact_high, move.compact_low, move.ext_high, move.ext_low,
                      lo, move.copied)


def _solve_chain(snapshot: ChainSnapshot, pages: tuple[int, ...]) -> _Plan | _Refusal:
    """Two ENDs and two or more floats (fixed order, each on its own grid): see
    ``docs/pricing.md`` ("Chains of N bands").

    1. **In place** (copies nothing; returned at once): each float uses its holes, then
       extends into the gap below as far as it reaches, then above; the gaps are shared, so
       taking the low gap first leaves the most to the bands above, and this greedy fits
       exactly when any in-place split does.
    2. **With copies**: :func:`_sweep` on the chain (low side first) and on its mirror
       (high side first); fewest copied bytes wins, the low-side sweep on ties.
    3. **Refusal** when both sweeps find nothing. The maximal candidate (ENDs fully
       compacted, every float packed, leftmost in order on its own grid) is one of the
       sweep's candidates, and it fits whenever any arrangement does (greedy packing is
       optimal: by induction, its ``j``-th float ends no higher than in any arrangement),
       so the refusal is exact: ``GRID`` when it fails, ``MOVES_BLOCKED`` when it would
       fit but the gate is closed.
    """
    n = len(pages)
    bands = snapshot.bands
    a, z = bands[0], bands[n - 1]
    x = a.hi + max(pages[0] - a.holes, 0) * a.page_bytes
    z_lo = z.lo - max(pages[n - 1] - z.holes, 0) * z.page_bytes
    stay: list[_FloatMove] = []
    for j in range(1, n - 1):  # in place, straight off the snapshot (the common case)
        b = bands[j]
        lo, p = b.lo, b.page_bytes
        if x > lo:
            break
        ext = max(pages[j] - b.holes, 0)
        low = min(ext, (lo - x) // p)
        stay.append(_FloatMove(j, ext_low=low, ext_high=ext - low))
        x = b.hi + (ext - low) * p
    else:
        if x <= z_lo:
            return _Plan((0,) * n, floats=tuple(stay))
    c = _bands_of(snapshot, pages)
    big = snapshot.buffer_bytes
    best: _Plan | None = None
    for mirrored in (False, True):
        found = _sweep(_mirror(c, big) if mirrored else c)
        if found is None:
            continue
        copied, k_low_end, k_high_end, moves = found
        if best is not None and copied >= best.copied_bytes:
            continue
        compact = [0] * n
        if mirrored:
            compact[0], compact[n - 1] = k_high_end, k_low_end
            moves = tuple(_unmirror(m, n, c, big) for m in reversed(moves))
        else:
            compact[0], compact[n - 1] = k_low_end, k_high_end
        best = _Plan(tuple(compact), copied_bytes=copied, floats=moves)
    if best is not None:
        return best
    return _chain_refusal(c, z_lo)


def _chain_refusal(c: _Bands, z_lo: int) -> _Refusal:
    """Why nothing fits on a chain of several floats: the maximal candidate fails
    (``GRID``, short by the bytes its last float overruns) or needs moves while the gate
    is closed (``MOVES_BLOCKED``, short by the bytes the in-place greedy overruns)."""
    n = len(c.lo)
    ungated = _Bands(c.lo, c.hi, c.live, c.holes, c.page, c.grid, [True] * n, c.demand)
    a_hi, _, spare_a, spare_z = _end_frontiers(ungated)
    short = _greedy_overrun(ungated, a_hi - spare_a * c.page[0],
                            z_lo + spare_z * c.page[n - 1])
    if short > 0:
        return _Refusal(RefusalReason.GRID, short)
    return _Refusal(RefusalReason.MOVES_BLOCKED, max(_greedy_overrun(c, a_hi, z_lo), 1))


def _greedy_overrun(c: _Bands, start: int, ceiling: int) -> int:
    """Bytes by which the lowest placement (floats packed leftmost where they may move,
    else in place extending low first) overruns ``ceiling`` (<= 0: it fits)."""
    x = start
    for j in range(1, len(c.lo) - 1):
        p = c.page[j]
        if c.movable[j] or c.live[j] == 0:
            x = _ceil_div(x - c.grid[j], p) * p + c.grid[j] + (c.live[j] + c.demand[j]) * p
        elif x > c.lo[j]:
            return x - c.lo[j]
        else:
            ext = max(c.demand[j] - c.holes[j], 0)
            x = c.hi[j] + max(ext - (c.lo[j] - x) // p, 0) * p
    return x - ceiling


# --- from decisions to actions ------------------------------------------------------------


def _actions(snapshot: ChainSnapshot, demand: Demand, plan: _Plan) -> list[Action]:
    """Canonical order: fence; END compaction; float compaction/relocation; holes; extends."""
    bands = snapshot.bands
    actions: list[Action] = []
    moves: list[Action] = []
    for i, k in enumerate(plan.compact):
        if k:
            side = Side.HIGH if bands[i].anchor is Anchor.LOW else Side.LOW
            moves.append(Compact(i, side, k))
    if plan.floats is not None:
        moves.extend(_float_moves(bands, plan.floats))
    elif len(bands) == 3:
        if plan.float_compact_low:
            moves.append(Compact(1, Side.LOW, plan.float_compact_low))
        if plan.float_compact_high:
            moves.append(Compact(1, Side.HIGH, plan.float_compact_high))
        if plan.relocate_lo is not None:
            moves.append(Relocate(1, plan.relocate_lo))
    if plan.copied_bytes and any(b.fence_pending for b in bands):
        actions.append(WaitFence())
    actions.extend(moves)
    exts: list[Action] = []
    holes_after = [b.holes for b in bands]
    ext_sides: dict[int, tuple[int, int]] = {}
    if plan.floats is not None:
        for m in plan.floats:
            holes_after[m.band] -= m.compact_low + m.compact_high
            if m.relocate_lo is not None:
                holes_after[m.band] = 0
            ext_sides[m.band] = (m.ext_low, m.ext_high)
    elif plan.relocate_lo is not None:
        holes_after[1] = 0
    for i, d in enumerate(demand.pages):
        use = min(d, holes_after[i])
        if use:
            actions.append(UseHoles(i, use))
        ext = d - use
        if not ext:
            continue
        band = bands[i]
        if band.anchor is Anchor.LOW:
            exts.append(Extend(i, Side.HIGH, ext))
        elif band.anchor is Anchor.HIGH:
            exts.append(Extend(i, Side.LOW, ext))
        else:
            low, high = ext_sides.get(i, (plan.float_ext_low, plan.float_ext_high))
            if low:
                exts.append(Extend(i, Side.LOW, low))
            if high:
                exts.append(Extend(i, Side.HIGH, high))
    actions.extend(exts)
    return actions


def _float_moves(bands: tuple[BandSnapshot, ...],
                 floats: tuple[_FloatMove, ...]) -> list[Action]:
    """Compactions (they only shrink spans), then relocations in an order where each lands
    on free bytes: floats moving up from the highest down, then floats moving down (or
    packed where they are) from the lowest up. A float moving up never needs a lower
    float to move first, and the lowest float moving down finds everything below it
    already in place (``docs/pricing.md``)."""
    out: list[Action] = []
    for m in floats:
        if m.compact_low:
            out.append(Compact(m.band, Side.LOW, m.compact_low))
        if m.compact_high:
            out.append(Compact(m.band, Side.HIGH, m.compact_high))
    ups: list[_FloatMove] = []
    downs: list[_FloatMove] = []
    for m in floats:
        if m.relocate_lo is not None:
            (ups if m.relocate_lo > bands[m.band].lo else downs).append(m)
    out.extend(Relocate(m.band, m.relocate_lo) for m in reversed(ups))  # type: ignore[arg-type]
    out.extend(Relocate(m.band, m.relocate_lo) for m in downs)  # type: ignore[arg-type]
    return out


# --- copies appended to a plan ---------------------------------------------------------


def with_copies(quote: Quote, copies: Sequence[CopyPages]) -> Quote:
    """``quote`` with the copy actions ``copies`` appended to its plan (pure): the same
    demand, snapshot, moves and ``copied_bytes``; the copies run last, once their
    destinations are bound, and predict the snapshot before them (a copy changes no
    count), so price == outcome holds for the plan as for ``quote``'s. Their bytes are
    the new quote's :attr:`~kvchain.alloc.snapshot.Quote.copy_bytes`. No copies gives
    ``quote`` itself; a refusal is returned as it is (nothing is taken, nothing copied).

    Raises:
        InvalidDemandError: a copy that is not a :class:`CopyPages`, names no band of the
            chain, has no source, sources and destinations of different lengths, an id
            or position that is not an int >= 0, a destination position outside the
            pages the demand binds in that band or named twice (over all copies of the
            band), or ``quote`` already carries copies.
    """
    if not copies or not quote.fits:
        return quote
    steps = quote.steps
    actions = steps.actions if isinstance(steps, LazyPlan) else tuple(s.action for s in steps)
    if any(isinstance(a, CopyPages) for a in actions):
        raise InvalidDemandError("the quote already carries copies")
    pages = quote.demand.pages
    used: dict[int, set[int]] = {}
    for c in copies:
        if not isinstance(c, CopyPages):
            raise InvalidDemandError(f"a copy must be a CopyPages, got {type(c).__name__}")
        band = c.band
        if type(band) is not int or not 0 <= band < len(pages):
            raise InvalidDemandError(f"{c}: no band {band!r} on a chain of {len(pages)}")
        if not c.src or len(c.src) != len(c.dst):
            raise InvalidDemandError(f"{c}: {len(c.src)} sources for {len(c.dst)} "
                                     f"destinations (at least one each)")
        if any(type(v) is not int or v < 0 for v in (*c.src, *c.dst)):
            raise InvalidDemandError(f"{c}: ids and positions must be ints >= 0")
        taken = used.setdefault(band, set())
        for d in c.dst:
            if d >= pages[band] or d in taken:
                raise InvalidDemandError(f"{c}: destination position {d} of band {band} is "
                                         f"outside the {pages[band]} pages the demand binds "
                                         f"or named twice")
            taken.add(d)
    plan = LazyPlan(quote.before, (*actions, *copies), apply_action)
    return Quote(quote.demand, quote.before, plan, True, 0, None, quote.copied_bytes)


# --- public API ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planner:
    """A pricing strategy: the solver that decides a demand on a snapshot, and whether the
    in-place shortcut answers for it.

    :data:`GENERAL_PLANNER` (the general solver with the shortcut) is what every chain,
    pool allocator and module-level function here uses unless another planner is passed
    in; tests plant a defect by building ``Planner(a_wrong_solver)`` and handing it to the
    chain (``Chain(layout, planner=...)``), never by patching this module.

    Attributes:
        solve: the solver (a :data:`Solver`; default the general one, ``_solve``).
        shortcut: whether ``_in_place_shortcut`` gives ``solve``'s answers. It walks the
            counts once and emits the general solver's in-place plan or byte-bound
            refusal, so it is true only of the general solver; a planner built with
            another solver leaves it ``False`` (the default), so that its solver answers
            every demand. ``Planner()`` is the general solver without the shortcut
            (``tests/alloc/test_price_shortcut.py`` checks both give the same quotes).

    Raises:
        ConfigError: ``solve`` not callable, ``shortcut`` not a bool, or ``shortcut`` set
            for a solver other than the general one (its answers are not the shortcut's).
            Checked when the planner is built, so a bad one never reaches a chain.
    """

    solve: Solver = _solve
    shortcut: bool = False

    def __post_init__(self) -> None:
        if not callable(self.solve):
            raise ConfigError(f"Planner solve must be a callable solver, got "
                              f"{type(self.solve).__name__}")
        if type(self.shortcut) is not bool:
            raise ConfigError(f"Planner shortcut must be True or False, got {self.shortcut!r}")
        if self.shortcut and self.solve is not _solve:
            raise ConfigError("Planner shortcut=True gives the general solver's answers "
                              "only; a planner with another solver must leave it False")

    def price(self, snapshot: ChainSnapshot, demand: Demand) -> Quote:
        """Price a demand on a snapshot: the cheapest plan, or a refusal with its proof.

        Args:
            snapshot: the chain's snapshot (counts and frontiers).
            demand: pages per band (state slots for a state band), aligned with
                ``snapshot.bands``.

        Returns:
            A :class:`Quote`: ``fits`` with ordered steps (each with its predicted
            snapshot) and ``copied_bytes``, or a refusal with ``reason`` and a positive
            ``shortfall_bytes``. Nothing is memoized here: a chain keeps the quotes it
            issued for its current snapshot (:class:`~kvchain.alloc.quotes.QuoteRegistry`).

        Raises:
            InvalidDemandError: not a :class:`Demand`, its length differs from the band
                count, or an entry is not a non-negative int.
        """
        validate_demand(snapshot, demand)
        return self.quote(snapshot, demand)

    def quote(self, snapshot: ChainSnapshot, demand: Demand) -> Quote:
        """:meth:`price` of a demand already validated against ``snapshot`` (a chain
        checks its demands itself; an invalid one here is undefined).

        A demand that fits without a copy (in place, after the least eviction prefix if
        it needs one), or that the byte bound refuses even after evicting everything, is
        answered by ``_in_place_shortcut`` straight from the counts when :attr:`shortcut`
        is set; every other demand goes to the solver, after the least eviction prefix."""
        pages = demand.pages
        if not any(pages):
            return Quote(demand, snapshot, (), True)
        if self.shortcut:
            found = _in_place_shortcut(snapshot, pages)
            if isinstance(found, tuple):
                return Quote(demand, snapshot, LazyPlan(snapshot, found[1], apply_action), True)
            if found is not None:
                return Quote(demand, snapshot, (), False, found.shortfall_bytes, found.reason)
        k, base, solved = _solve_with_eviction(snapshot, demand, self.solve)
        if isinstance(solved, _Refusal):
            return Quote(demand, snapshot, (), False, solved.shortfall_bytes, solved.reason)
        actions = _actions(base, demand, solved)
        if k:
            actions.insert(0, Evict(k))
        plan = LazyPlan(snapshot, tuple(actions), apply_action)
        return Quote(demand, snapshot, plan, True, 0, None, solved.copied_bytes)

    def fits(self, snapshot: ChainSnapshot, demand: Demand) -> bool:
        """Whether :meth:`price` would fit the demand (same decision, no plan is built).

        Raises:
            InvalidDemandError: as :meth:`price`.
        """
        validate_demand(snapshot, demand)
        if demand.is_empty:
            return True
        if self.shortcut:
            found = _in_place_shortcut(snapshot, demand.pages)
            if found is not None:
                return isinstance(found, tuple)
        return isinstance(_solve_with_eviction(snapshot, demand, self.solve)[2], _Plan)

    def least_eviction(self, snapshot: ChainSnapshot, demand: Demand) -> int | None:
        """The fewest eviction units after which ``demand`` fits (0: fits as is), or
        ``None`` when even evicting every unit of ``snapshot.evictable`` would not fit.

        Raises:
            InvalidDemandError: as :meth:`price`.
        """
        validate_demand(snapshot, demand)
        if demand.is_empty:
            return 0
        if self.shortcut:
            found = _in_place_shortcut(snapshot, demand.pages)
            if isinstance(found, tuple):
                return found[0]
            if found is not None:
                return None
        k, _, solved = _solve_with_eviction(snapshot, demand, self.solve)
        return k if isinstance(solved, _Plan) else None

    def max_units(self, snapshot: ChainSnapshot, unit: Demand,
                  base: Demand | None = None) -> int:
        """Largest ``n`` such that ``base + n x unit`` fits: the capacity query.

        E.g. ``unit = (0, 1, 1)`` on a state|window|full chain asks how many full + window
        pages fit together (docs/pricing.md §2: 75 in its worked example). ``O(log n)``
        calls of :meth:`fits` (:func:`largest_fitting`).

        Raises:
            InvalidDemandError: invalid ``unit``/``base`` or an empty ``unit``.
        """
        base = Demand.zeros(len(snapshot.bands)) if base is None else base
        validate_demand(snapshot, unit)
        validate_demand(snapshot, base)
        if unit.is_empty:
            raise InvalidDemandError("max_units needs a non-empty unit demand")
        if not self.fits(snapshot, base):
            return 0
        bands = snapshot.bands
        unit_bytes = sum(d * b.page_bytes for d, b in zip(unit.pages, bands, strict=True))
        base_bytes = sum(d * b.page_bytes for d, b in zip(base.pages, bands, strict=True))
        order = snapshot.evictable
        evictable_bytes = sum(n * b.page_bytes for n, b in
                              zip(order.freed(order.units), bands, strict=False))
        upper = (snapshot.free_bytes + evictable_bytes - base_bytes) // unit_bytes
        return largest_fitting(lambda n: self.fits(snapshot, base.plus(unit.scaled(n))),
                               upper)


#: The general solver with the in-place shortcut: the planner of every chain and pool
#: allocator not given another, and of :func:`price`, :func:`fits`,
#: :func:`least_eviction` and :func:`max_units`.
GENERAL_PLANNER = Planner(_solve, shortcut=True)


def price(snapshot: ChainSnapshot, demand: Demand) -> Quote:
    """:meth:`Planner.price` of :data:`GENERAL_PLANNER` (pure; no memo).

    Raises:
        InvalidDemandError: not a :class:`Demand`, its length differs from the band count,
            or an entry is not a non-negative int.
    """
    validate_demand(snapshot, demand)
    return GENERAL_PLANNER.quote(snapshot, demand)


def _price_uncached(snapshot: ChainSnapshot, demand: Demand) -> Quote:
    """:func:`price` without the validation (the demand is already valid; benchmarks time
    the planner alone through it)."""
    return GENERAL_PLANNER.quote(snapshot, demand)


_NO_SHORTCUT = Planner(_solve)  # the general solver answering every demand itself


def _price_general(snapshot: ChainSnapshot, demand: Demand) -> Quote:
    """The general solver with no shortcut: every candidate (in place, compaction,
    relocation) after the least eviction prefix (demand valid); the shortcut's tests
    compare it with :func:`price`."""
    return _NO_SHORTCUT.quote(snapshot, demand)


def fits(snapshot: ChainSnapshot, demand: Demand) -> bool:
    """:meth:`Planner.fits` of :data:`GENERAL_PLANNER`.

    Raises:
        InvalidDemandError: as :func:`price`.
    """
    return GENERAL_PLANNER.fits(snapshot, demand)


def least_eviction(snapshot: ChainSnapshot, demand: Demand) -> int | None:
    """:meth:`Planner.least_eviction` of :data:`GENERAL_PLANNER`.

    Raises:
        InvalidDemandError: as :func:`price`.
    """
    return GENERAL_PLANNER.least_eviction(snapshot, demand)


def max_units(snapshot: ChainSnapshot, unit: Demand, base: Demand | None = None) -> int:
    """:meth:`Planner.max_units` of :data:`GENERAL_PLANNER`: largest ``n`` such that
    ``base + n x unit`` fits.

    Raises:
        InvalidDemandError: invalid ``unit``/``base`` or an empty ``unit``.
    """
    return GENERAL_PLANNER.max_units(snapshot, unit, base)


# --- the shortcut: demands that fit without a copy ------------------------------------------
#
# Most demands (a decode step, a prefill chunk on a chain with room) fit in place: holes
# first, then each band extends into its gap. The general solver finds that answer first
# too and returns it at once, but only after building its candidate records, the plan
# decisions and a snapshot per probed eviction prefix. The shortcut walks the counts once,
# low -> high, and emits the same actions. It stands for the general solver's in-place
# answer, so only a planner that says so (``Planner.shortcut``: the general solver's) uses
# it; a planner built with another solver (a planted defect) answers every demand itself.

_ACTIONS_MAX = 1 << 16  # interned actions kept (cleared when full; actions are immutable)
_ACTIONS: dict[tuple[int, int, int], Action] = {}


def _action(kind: int, band: int, pages: int) -> Action:
    """An interned action: ``kind`` 0 ``UseHoles``, 1 ``Extend`` LOW, 2 ``Extend`` HIGH,
    3 ``Evict`` (``band`` ignored). Equal to a fresh construction (actions are values)."""
    key = (kind, band, pages)
    action = _ACTIONS.get(key)
    if action is None:
        if len(_ACTIONS) >= _ACTIONS_MAX:
            _ACTIONS.clear()
        if kind == 0:
            action = UseHoles(band, pages)
        elif kind == 3:
            action = Evict(pages)
        else:
            action = Extend(band, Side.LOW if kind == 1 else Side.HIGH, pages)
        _ACTIONS[key] = action
    return action


def _in_place_shortcut(snapshot: ChainSnapshot, pages: tuple[int, ...],
                       ) -> tuple[int, tuple[Action, ...]] | _Refusal | None:
    """The plan of a demand that fits with no copy, or the byte-bound refusal, or ``None``
    (ask the general solver).

    Decides exactly as :func:`_solve_with_eviction` does when its answer is in place or a
    refusal by the byte bound:

    * live + demanded bytes within the buffer: no eviction; the demand must fit in place
      as it is (else the general solver's answer may be a plan with copies, which it
      prefers to evicting);
    * bytes must be freed and eviction can free them: eviction stops at the byte-bound
      prefix (:meth:`EvictionOrder.least_units_freeing`, a necessary condition) and the
      demand must fit in place there;
    * even evicting every unit leaves too few bytes: the refusal of :func:`_solve` after
      evicting everything (an index-cap refusal of the lowest band past its cap first,
      else ``BYTES`` short by the bytes still missing).

    ``None`` in every other case, including an order that frees more pages than a band
    holds (the general path raises its error there).

    Returns:
        ``(eviction units, actions)``: ``Evict`` first when units > 0, then ``UseHoles``
        per band low -> high, then ``Extend`` per band (a float low side before high); or a
        ``_Refusal``; or ``None``.
    """
    bands = snapshot.bands
    order = snapshot.evictable
    units = order.units
    if not units:  # fitting in place implies the byte bound: walk first, bound on failure
        actions = _walk_in_place(snapshot, pages, None)
        if actions is not None:
            return 0, tuple(actions)
    need = -snapshot.buffer_bytes  # live + demanded bytes past the buffer
    for b, d in zip(bands, pages, strict=True):
        need += (b.live + d) * b.page_bytes
    if need <= 0:
        if units:
            actions = _walk_in_place(snapshot, pages, None)
            if actions is not None:
                return 0, tuple(actions)
        return None
    if units:
        freed = order.freed(units)
        evictable = 0
        for b, f in zip(bands, freed, strict=True):
            evictable += f * b.page_bytes
        if need <= evictable:  # eviction can free the bytes: stop at the byte-bound prefix
            k = order.least_units_freeing(tuple([b.page_bytes for b in bands]), need)
            actions = _walk_in_place(snapshot, pages, order.freed(k))
            if actions is None:
                return None
            actions.insert(0, _action(3, 0, k))
            return k, tuple(actions)
    else:
        freed, evictable = None, 0
    capped: _Refusal | None = None  # _solve's prelude after evicting everything
    for i, b in enumerate(bands):
        d, live, holes = pages[i], b.live, b.holes
        if freed is not None:
            if freed[i] > live:
                return None
            live -= freed[i]
            holes += freed[i]
        if capped is None and d > holes and live + d > b.cap:
            capped = _Refusal(RefusalReason.INDEX_CAP, (live + d - b.cap) * b.page_bytes)
    if capped is not None:
        return capped
    return _Refusal(RefusalReason.BYTES, need - evictable)


def _walk_in_place(snapshot: ChainSnapshot, pages: tuple[int, ...],
                   freed: tuple[int, ...] | None) -> list[Action] | None:
    """One pass low -> high: each band takes its holes (plus ``freed[i]`` pages turned into
    holes by eviction), then extends: the LOW END up, each float into the gap below as far
    as it reaches and then up, the HIGH END down - the in-place candidate of
    :func:`_solve_two_ends`, :func:`_solve_three_bands` and :func:`_solve_chain` (the lone
    band: up to byte B). ``None`` when it does not fit, a band would pass its index cap, or
    eviction would free more pages than a band holds live."""
    bands = snapshot.bands
    top = len(bands) - 1
    uses: list[Action] = []
    exts: list[Action] = []
    x = 0  # the byte the band below ends at after its growth
    for i, b in enumerate(bands):
        d = pages[i]
        holes = b.holes
        live = b.live
        if freed is not None:
            f = freed[i]
            if f > live:
                return None
            holes += f
            live -= f
        if d > holes:
            ext = d - holes
            if live + d > b.cap:
                return None
            if holes:
                uses.append(_action(0, i, holes))
        else:
            ext = 0
            if d:
                uses.append(_action(0, i, d))
        p = b.page_bytes
        if i == 0:
            if top == 0 and (live + d) * p > snapshot.buffer_bytes:
                return None
            x = b.hi + ext * p
            if ext:
                exts.append(_action(2, 0, ext))
        elif i == top:
            if b.lo - ext * p < x:
                return None
            if ext:
                exts.append(_action(1, i, ext))
        else:
            lo = b.lo
            if x > lo:
                return None
            low = (lo - x) // p
            if low > ext:
                low = ext
            x = b.hi + (ext - low) * p
            if low:
                exts.append(_action(1, i, low))
            if ext > low:
                exts.append(_action(2, i, ext - low))
    uses.extend(exts)
    return uses


def _solve_with_eviction(snapshot: ChainSnapshot, demand: Demand, solve: Solver,
                         ) -> tuple[int, ChainSnapshot, _Plan | _Refusal]:
    """The least eviction prefix after which the demand fits, and the plan there.

    Eviction is the last resort: a demand that fits as it is (in place or with moves)
    evicts nothing - cached pages save prefill compute, copies cost only HBM traffic.
    Otherwise the least ``k`` is found by binary search over the units: ``fits`` after
    ``k`` units is monotone in ``k``, because each unit only turns live pages into holes,
    and with moves allowed whether a demand fits depends on live pages alone (contract 3),
    while with the gate closed a band's extra holes can only help that band. A refusal is
    the refusal after evicting every unit (the smallest shortfall there is).

    Args:
        solve: the solver asked on each probed prefix (a :class:`Planner`'s).

    Returns:
        ``(k, snapshot after evicting k units, plan or refusal)``.
    """
    units = snapshot.evictable.units
    excess = _excess_bytes(snapshot, demand)
    if units == 0 or excess <= 0:  # else nothing fits before evicting: skip that solve
        solved = solve(snapshot, demand)
        if isinstance(solved, _Plan) or units == 0:
            return 0, snapshot, solved
    # The byte bound is necessary, so no prefix below lo fits; with the gate open it is
    # usually sufficient too: one solve at lo then settles the search.
    lo = _byte_bound_prefix(snapshot, excess)
    if lo < units:
        candidate = _evicted(snapshot, lo)
        attempt = solve(candidate, demand)
        if isinstance(attempt, _Plan):
            return lo, candidate, attempt
        lo += 1
    full = _evicted(snapshot, units)
    solved_full = solve(full, demand)
    if isinstance(solved_full, _Refusal):
        return units, full, solved_full
    hi = units  # fits after hi units, not after lo - 1
    best: tuple[ChainSnapshot, _Plan] = (full, solved_full)
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = _evicted(snapshot, mid)
        attempt = solve(candidate, demand)
        if isinstance(attempt, _Plan):
            hi, best = mid, (candidate, attempt)
        else:
            lo = mid + 1
    return hi, best[0], best[1]


def _excess_bytes(snapshot: ChainSnapshot, demand: Demand) -> int:
    """Live + demanded bytes beyond the buffer: ``sum_i (live_i + demand_i) * P_i - B``."""
    return sum((b.live + d) * b.page_bytes for b, d in
               zip(snapshot.bands, demand.pages, strict=True)) - snapshot.buffer_bytes


def _byte_bound_prefix(snapshot: ChainSnapshot, excess: int) -> int:
    """The fewest eviction units (at least 1) whose freed bytes cover ``excess``
    (:func:`_excess_bytes`): a necessary condition of fitting; ``units`` if no prefix
    covers it (:meth:`EvictionOrder.least_units_freeing`)."""
    return snapshot.evictable.least_units_freeing(
        tuple(b.page_bytes for b in snapshot.bands), excess)


def largest_fitting(predicate: Callable[[int], bool], upper: int) -> int:
    """Largest ``n`` in ``[0, upper]`` with ``predicate(n)`` true, for a monotone predicate
    (true up to some ``n``, false after); 0 if even ``predicate(1)`` is false.

    ``predicate(0)`` is assumed true. ``O(log upper)`` calls. Chunk caps, output clipping
    and capacity queries are all answered this way over :func:`fits` (contract 5: more
    demand never fits where less did not).
    """
    lo, hi = 0, max(upper, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predicate(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
