"""Corner states of a chain, built through a :class:`ChainRecorder` (so each is also a
replayable stream).

Base states (any shape; window-only corners fall back to the nearest sensible state on
shapes without a window band):

=================  ====================================================================
``empty``          a fresh chain (null pages only)
``full``           one page per band round-robin until nothing more fits
``edge_holes``     full, then the two pages at every band's frontier(s) released
``interior_holes`` full, then every third live page in each band's interior released
``retired_window`` window pages taken with full pages between, the oldest window pages
                   released (window-tail release leaves holes at the float's low side);
                   on chains of several window/local bands, in every one of them
``parked_float``   window pages taken and all released, then the idle flush: the floats
                   hold no live page (or only their null page), ENDs half full
``state_off_grid`` an odd number of state slots (frontier off the token grid), a few
                   token pages, one slot released inside the state band
=================  ====================================================================

:func:`corner_states` returns each base state three ways: gate open; gate closed; fence
pending (an in-flight forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvchain.alloc import Chain, Demand
from kvchain.alloc.pricing import fits
from kvchain.layout import Anchor
from kvchain.model.layers import LifetimeClass
from kvchain.testing.geometry import ChainGeometry
from kvchain.testing.streams import ChainRecorder, FenceHoldOp, FlushOp, GateOp


@dataclass(frozen=True, slots=True)
class CornerState:
    """One corner: its name and the recorder holding the chain (``recorder.chain``),
    the ids it holds (``recorder.held``) and the ops that built it (``recorder.ops``)."""

    name: str
    recorder: ChainRecorder

    @property
    def chain(self) -> Chain:
        """The chain in this corner state."""
        return self.recorder.chain


def _one(nb: int, i: int, k: int = 1) -> tuple[int, ...]:
    return tuple(k if j == i else 0 for j in range(nb))


def fill(rec: ChainRecorder, bands: list[int] | None = None) -> None:
    """Take one page per band round-robin (``bands``, default all) until none fits."""
    chain = rec.chain
    nb = chain.num_bands
    active = list(range(nb)) if bands is None else list(bands)
    while active:
        for i in list(active):
            if fits(chain.snapshot(), Demand(_one(nb, i))):
                rec.take(_one(nb, i))
            else:
                active.remove(i)


def _release_positions(rec: ChainRecorder, i: int, positions: list[int]) -> None:
    band = rec.chain.band(i)
    held = set(rec.held[i])
    vids = [int(band.p2v[j]) for j in positions
            if band.lo_idx <= j < band.hi_idx and int(band.p2v[j]) in held]
    if vids:
        rec.release(i, sorted(set(vids)))


def _edge_holes(rec: ChainRecorder) -> None:
    fill(rec)
    for i in range(rec.chain.num_bands):
        b = rec.chain.band(i)
        lo, hi = b.lo_idx, b.hi_idx
        if b.anchor is Anchor.LOW:
            pos = [hi - 1, hi - 2]
        elif b.anchor is Anchor.HIGH:
            pos = [lo, lo + 1]
        else:
            pos = [lo, hi - 1]
        _release_positions(rec, i, pos)


def _interior_holes(rec: ChainRecorder) -> None:
    fill(rec)
    for i in range(rec.chain.num_bands):
        b = rec.chain.band(i)
        _release_positions(rec, i, list(range(b.lo_idx + 1, b.hi_idx - 1, 3)))


def _window_bands(chain: Chain) -> list[int]:
    """Every window and chunked-local band (one on most chains, several on chains of
    several window sizes)."""
    return [i for i, b in enumerate(chain.layout.bands)
            if b.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]


def _retired_window(rec: ChainRecorder) -> None:
    chain = rec.chain
    nb = chain.num_bands
    ws = _window_bands(chain)
    if not ws:
        _interior_holes(rec)
        return
    others = [i for i in range(nb) if i not in ws]
    for _ in range(6):
        for w in ws:
            rec.take(_one(nb, w))
        for i in others:
            rec.take(_one(nb, i))
    for w in ws:
        old = rec.held[w][: max(1, len(rec.held[w]) * 2 // 3)]
        if old:
            rec.release(w, old)


def _parked_float(rec: ChainRecorder) -> None:
    chain = rec.chain
    nb = chain.num_bands
    ws = _window_bands(chain)
    for _ in range(3):
        for i in range(nb):
            rec.take(_one(nb, i))
    for w in ws:
        if rec.held[w]:
            rec.release(w, list(rec.held[w]))
    rec.run(FlushOp())
    if ws:
        ends = [i for i in range(nb) if i not in ws]
        fill(rec, ends)
        for i in ends:  # half full ENDs
            if rec.held[i]:
                rec.release(i, rec.held[i][len(rec.held[i]) // 2:])


def _state_off_grid(rec: ChainRecorder) -> None:
    chain = rec.chain
    nb = chain.num_bands
    s = next((i for i, b in enumerate(chain.layout.bands) if b.label == "state"), 0)
    rec.take(_one(nb, s, 3))
    for i in range(nb):
        if i != s:
            rec.take(_one(nb, i, 2))
    rec.take(_one(nb, s, 2))
    if len(rec.held[s]) > 1:
        rec.release(s, [rec.held[s][1]])


BASE_CORNERS: dict[str, Callable[[ChainRecorder], None]] = {
    "empty": lambda rec: None,
    "full": fill,
    "edge_holes": _edge_holes,
    "interior_holes": _interior_holes,
    "retired_window": _retired_window,
    "parked_float": _parked_float,
    "state_off_grid": _state_off_grid,
}

#: How each base state is finished: gate open, gate closed, a fence pending.
VARIANTS: tuple[str, ...] = ("open", "gate_closed", "fence_pending")


def build_corner(geometry: ChainGeometry, base: str, variant: str = "open") -> CornerState:
    """One corner state on a fresh chain of ``geometry``.

    Raises:
        KeyError: an unknown ``base`` or ``variant``.
    """
    if variant not in VARIANTS:
        raise KeyError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    rec = ChainRecorder(geometry.chain())
    BASE_CORNERS[base](rec)
    if variant == "gate_closed":
        rec.run(GateOp(False, realize_moves=False))  # keep the holes behind a closed gate
    elif variant == "fence_pending":
        rec.run(FenceHoldOp())
    return CornerState(f"{geometry.shape}/P{geometry.page_size}/{base}/{variant}", rec)


def corner_states(geometry: ChainGeometry,
                  variants: tuple[str, ...] = VARIANTS) -> tuple[CornerState, ...]:
    """Every base corner x ``variants`` on fresh chains of ``geometry``."""
    return tuple(build_corner(geometry, base, v) for base in BASE_CORNERS for v in variants)
