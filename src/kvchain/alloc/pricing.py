"""The planner: capacity as a pure function of a chain snapshot.

``price(snapshot, demand) -> Quote`` decides whether a demand (pages per band) fits and,
if it does, the cheapest plan of primitive actions with the snapshot predicted after each
(see :mod:`kvchain.alloc.snapshot` for the actions). It reads counts and frontiers only,
never hole positions, so the allocator can realize exactly what the price said.

Candidates (DESIGN section 3, PRICING-NOTES sections 1-2), cheapest first by bytes copied
(an upper bound: ``pages x page_bytes`` of every Compact and Relocate):

* **in place**: holes first, then each band extends into its adjacent gap; the float
  extends on its low side first (the full END grows every decode step, so the float
  leaves the high gap to it), then on its high side;
* **compaction**: ENDs with spare holes (more holes than their own demand) compact just
  enough to open the bytes a neighbour must extend into; a float with spare holes
  compacts toward whichever side needs the bytes;
* **relocation**: the float is packed (zero holes) against its low or high neighbour,
  after the ENDs compacted just enough; on an empty float this copies nothing.

Refusal comes only with a proof: the byte bound (``demand bytes + live bytes > B``), the
index-space cap, or the maximal candidate (ENDs fully compacted, float packed) failing to
place whole pages on the float's grid. A closed move gate removes every candidate that
copies; the refusal then says ``moves_blocked``.

Two ENDs, worked example (PRICING-NOTES section 1): ``P_A = P_Z = 32 B``,
``B = 6,400 B``, each END 100 live pages; after releasing 40 pages of A and 80 of Z (all
interior holes), the demand ``(50, 50)`` is planned as::

    Compact(Z, LOW, 10)      # Z's frontier rises 320 B; at most 10 copies
    UseHoles(A, 40); UseHoles(Z, 50)
    Extend(A, HIGH, 10)      # into the 320 B opened by Z

and ``(61, 61)`` is refused with a shortfall of 64 B.

Three bands, worked example (section 2): ``P_S = 48 B``, ``P_W = P_F = 32 B``,
``B = 6,784 B``, 41 state slots held (frontier 1,968 B, off the 32-byte grid), empty
window float and full END: ``n`` window + ``n`` full pages fit for ``n <= 75``; ``n = 76``
is refused by the byte bound (shortfall 48 B).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvchain.alloc.snapshot import (
    Action,
    BandSnapshot,
    ChainSnapshot,
    Compact,
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
from kvchain.errors import InvalidDemandError, PlanMismatchError
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
    elif isinstance(action, Compact):
        k = action.pages
        _check_side(band, action.side)
        if not 0 < k <= band.holes:
            raise PlanMismatchError(f"Compact({k}) on a band with {band.holes} holes")
        if not band.movable:
            raise PlanMismatchError(f"Compact on {band.label} while its move gate is closed")
        if action.side is Side.HIGH:
            new = _band(band, band.lo, band.hi - k * band.page_bytes, band.live, band.holes - k)
        else:
            new = _band(band, band.lo + k * band.page_bytes, band.hi, band.live, band.holes - k)
    elif isinstance(action, Relocate):
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
    else:  # pragma: no cover - exhaustive over Action
        raise PlanMismatchError(f"unknown action {action!r}")
    bands = list(snapshot.bands)
    bands[i] = new
    return ChainSnapshot(snapshot.buffer_bytes, tuple(bands), snapshot.epoch,
                         snapshot.evictable)


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


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: RefusalReason
    shortfall_bytes: int


def validate_demand(snapshot: ChainSnapshot, demand: Demand) -> None:
    """Check a demand's shape against a snapshot.

    Raises:
        InvalidDemandError: pages not a tuple, the wrong number of bands, or a page count
            that is not a non-negative int.
    """
    pages = demand.pages
    if type(pages) is not tuple:
        raise InvalidDemandError(f"demand pages must be a tuple of ints, got {pages!r}")
    if len(pages) != len(snapshot.bands):
        raise InvalidDemandError(
            f"demand has {len(pages)} entries, the chain has {len(snapshot.bands)} bands"
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
    return _solve_three_bands(snapshot, pages)


def _solve_two_ends(snapshot: ChainSnapshot, pages: tuple[int, ...]) -> _Plan | _Refusal:
    """Two ENDs facing one gap: byte-additive (PRICING-NOTES section 1)."""
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
    """State END | FLOAT | full END (PRICING-NOTES section 2)."""
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
    ``floor(hi / P_W) - ceil(lo / P_W)`` pages (PRICING-NOTES section 2). The ENDs compact
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
    if len(bands) == 3:
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
    if plan.relocate_lo is not None:
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
            if plan.float_ext_low:
                exts.append(Extend(i, Side.LOW, plan.float_ext_low))
            if plan.float_ext_high:
                exts.append(Extend(i, Side.HIGH, plan.float_ext_high))
    actions.extend(exts)
    return actions


# --- public API ---------------------------------------------------------------------------


def price(snapshot: ChainSnapshot, demand: Demand) -> Quote:
    """Price a demand on a snapshot: the cheapest plan, or a refusal with its proof.

    Args:
        snapshot: the chain's snapshot (counts and frontiers).
        demand: pages per band (state slots for a state band), aligned with
            ``snapshot.bands``.

    Returns:
        A :class:`Quote`: ``fits`` with ordered steps (each with its predicted snapshot)
        and ``copied_bytes``, or a refusal with ``reason`` and a positive
        ``shortfall_bytes``.

    Raises:
        InvalidDemandError: the demand's length differs from the band count, or an entry
            is not a non-negative int.
    """
    validate_demand(snapshot, demand)
    if demand.is_empty:
        return Quote(demand, snapshot, (), True)
    k, base, solved = _solve_with_eviction(snapshot, demand)
    if isinstance(solved, _Refusal):
        return Quote(demand, snapshot, (), False, solved.shortfall_bytes, solved.reason)
    actions = _actions(base, demand, solved)
    if k:
        actions.insert(0, Evict(k))
    plan = LazyPlan(snapshot, tuple(actions), apply_action)
    return Quote(demand, snapshot, plan, True, 0, None, solved.copied_bytes)


def fits(snapshot: ChainSnapshot, demand: Demand) -> bool:
    """Whether :func:`price` would fit the demand (same decision, no plan is built).

    Raises:
        InvalidDemandError: as :func:`price`.
    """
    validate_demand(snapshot, demand)
    return demand.is_empty or isinstance(_solve_with_eviction(snapshot, demand)[2], _Plan)


def least_eviction(snapshot: ChainSnapshot, demand: Demand) -> int | None:
    """The fewest eviction units after which ``demand`` fits (0: fits as is), or ``None``
    when even evicting every unit of ``snapshot.evictable`` would not fit.

    Raises:
        InvalidDemandError: as :func:`price`.
    """
    validate_demand(snapshot, demand)
    if demand.is_empty:
        return 0
    k, _, solved = _solve_with_eviction(snapshot, demand)
    return k if isinstance(solved, _Plan) else None


def _solve_with_eviction(snapshot: ChainSnapshot, demand: Demand,
                         ) -> tuple[int, ChainSnapshot, _Plan | _Refusal]:
    """The least eviction prefix after which the demand fits, and the plan there.

    Eviction is the last resort: a demand that fits as it is (in place or with moves)
    evicts nothing - cached pages save prefill compute, copies cost only HBM traffic.
    Otherwise the least ``k`` is found by binary search over the units: ``fits`` after
    ``k`` units is monotone in ``k``, because each unit only turns live pages into holes,
    and with moves allowed whether a demand fits depends on live pages alone (contract 3),
    while with the gate closed a band's extra holes can only help that band. A refusal is
    the refusal after evicting every unit (the smallest shortfall there is).

    Returns:
        ``(k, snapshot after evicting k units, plan or refusal)``.
    """
    units = snapshot.evictable.units
    excess = _excess_bytes(snapshot, demand)
    if units == 0 or excess <= 0:  # else nothing fits before evicting: skip that solve
        solved = _solve(snapshot, demand)
        if isinstance(solved, _Plan) or units == 0:
            return 0, snapshot, solved
    # The byte bound is necessary, so no prefix below lo fits; with the gate open it is
    # usually sufficient too: one solve at lo then settles the search.
    lo = _byte_bound_prefix(snapshot, excess)
    if lo < units:
        candidate = _evicted(snapshot, lo)
        attempt = _solve(candidate, demand)
        if isinstance(attempt, _Plan):
            return lo, candidate, attempt
        lo += 1
    full = _evicted(snapshot, units)
    solved_full = _solve(full, demand)
    if isinstance(solved_full, _Refusal):
        return units, full, solved_full
    hi = units  # fits after hi units, not after lo - 1
    best: tuple[ChainSnapshot, _Plan] = (full, solved_full)
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = _evicted(snapshot, mid)
        attempt = _solve(candidate, demand)
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


def max_units(snapshot: ChainSnapshot, unit: Demand, base: Demand | None = None) -> int:
    """Largest ``n`` such that ``base + n x unit`` fits: the capacity query.

    E.g. ``unit = (0, 1, 1)`` on a state|window|full chain asks how many full + window
    pages fit together (PRICING-NOTES section 2: 75 in its worked example).

    Raises:
        InvalidDemandError: invalid ``unit``/``base`` or an empty ``unit``.
    """
    base = base or Demand.zeros(len(snapshot.bands))
    validate_demand(snapshot, unit)
    validate_demand(snapshot, base)
    if unit.is_empty:
        raise InvalidDemandError("max_units needs a non-empty unit demand")
    if not fits(snapshot, base):
        return 0
    unit_bytes = sum(d * b.page_bytes for d, b in zip(unit.pages, snapshot.bands, strict=True))
    base_bytes = sum(d * b.page_bytes for d, b in zip(base.pages, snapshot.bands, strict=True))
    order = snapshot.evictable
    evictable_bytes = sum(n * b.page_bytes for n, b in
                          zip(order.freed(order.units), snapshot.bands, strict=False))
    upper = (snapshot.free_bytes + evictable_bytes - base_bytes) // unit_bytes
    return largest_fitting(lambda n: fits(snapshot, base.plus(unit.scaled(n))), upper)
