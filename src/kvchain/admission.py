"""Admission: one prefill budget on the chain's own pricing (DESIGN section 5).

Each scheduling step builds one :class:`ChainPrefillBudget`: a reservation ledger that
starts from the chain's snapshot, reserves this step's decode tokens and the future of
every running request (rest of its prompt; its remaining output x ``new_token_ratio``),
then admits waiting work while the planner fits ``ledger + candidate``. The scheduler
never does capacity arithmetic; pricing never allocates.

Why admitted => allocatable: the step allocates, in one take, a demand that is at most
the ledger's total, and the planner is monotone (contract 5). With moves allowed, whether
a demand fits depends only on live pages + demand (ENDs compacted, float packed), so the
future reservations stay realizable as they are taken piece by piece.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from kvchain.alloc.pricing import fits, largest_fitting
from kvchain.alloc.snapshot import ChainSnapshot, Demand
from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.spec.layers import LifetimeClass


class WindowAdmission(StrEnum):
    """How window (or chunked-local) tokens are admitted.

    ``NONE``: the chain has no window band. ``JOINT``: window and full demand priced
    together against the shared bytes (default; exact on every shape). ``SPLIT``: each
    band admitted against its own remainder - its holes plus half of each gap it touches,
    no moves - the conservative per-pool behaviour of older engines, kept for comparison.
    """

    NONE = "none"
    JOINT = "joint"
    SPLIT = "split"


@dataclass(frozen=True, slots=True)
class AdmissionRules:
    """How a chain admits work.

    Attributes:
        window: window admission mode.
        state_slots_per_request: slots a new request claims (1 + checkpoint slots).
    """

    window: WindowAdmission
    state_slots_per_request: int = 1

    @staticmethod
    def for_layout(layout: ChainLayout, window: WindowAdmission | None = None) -> AdmissionRules:
        """Rules derived from a layout: ``NONE`` without a window/local band, else ``JOINT``
        (or the given mode).

        Raises:
            ConfigError: a window mode other than ``NONE`` on a chain without a window band,
                or ``NONE`` on a chain that has one.
        """
        has_window = any(b.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)
                         for b in layout.bands)
        if window is None:
            window = WindowAdmission.JOINT if has_window else WindowAdmission.NONE
        if has_window == (window is WindowAdmission.NONE):
            raise ConfigError(f"window admission {window} does not match the chain "
                              f"{layout.shape_name}")
        return AdmissionRules(window, layout.state_slots_per_request)


@dataclass(slots=True)
class NewTokenRatio:
    """Fraction of a running request's remaining output that admission reserves.

    Starts at ``init``, decays by ``decay`` per step toward ``floor`` while decodes fit,
    resets to ``init`` after a retraction. Defaults follow SGLang
    (``python/sglang/srt/environ.py``: ``SGLANG_INIT_NEW_TOKEN_RATIO = 0.7``,
    ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14`` -> floor 0.098,
    ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600``): outputs usually end well before their
    limit, so reserving all of it would under-fill the batch; a retraction shows the
    estimate was too low.

    Raises:
        ConfigError: values outside ``0 <= floor <= init <= 1`` or a negative decay.
    """

    init: float = 0.7
    floor: float = 0.7 * 0.14
    decay: float = (0.7 - 0.7 * 0.14) / 600
    value: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if not 0.0 <= self.floor <= self.init <= 1.0 or self.decay < 0:
            raise ConfigError(f"new_token_ratio needs 0 <= floor <= init <= 1 and decay >= 0, "
                              f"got init={self.init} floor={self.floor} decay={self.decay}")
        if self.value < 0:
            self.value = self.init

    def step(self) -> None:
        """One decode step without retraction: decay toward the floor."""
        self.value = max(self.floor, self.value - self.decay)

    def reset(self) -> None:
        """After a retraction: back to ``init``."""
        self.value = self.init

    def tokens(self, remaining: int) -> int:
        """Tokens to reserve for ``remaining`` output tokens: ``ceil(remaining x ratio)``,
        at least 1 while any remain (the next decode is always covered)."""
        if remaining <= 0:
            return 0
        return max(1, math.ceil(remaining * self.value - 1e-9))


class ChainPrefillBudget:
    """The reservation ledger of one scheduling step.

    Args:
        snapshot: the chain's snapshot at the start of the step.
        rules: the chain's admission rules.

    The ledger holds one summed :class:`Demand`; ``admit`` adds a candidate iff the
    planner fits ``ledger + candidate`` on the snapshot (``SPLIT`` also requires each band
    to stay within its own remainder). Evictable supply (a prefix cache's unlocked pages)
    is part of the snapshot and priced by the planner; a hit that locks pages changes the
    supply, so the scheduler :meth:`rebase` s the ledger on the new snapshot.
    """

    def __init__(self, snapshot: ChainSnapshot, rules: AdmissionRules) -> None:
        self.snapshot = snapshot
        self.rules = rules
        self._reserved = Demand.zeros(len(snapshot.bands))
        self._remainders = (_split_remainders(snapshot)
                            if rules.window is WindowAdmission.SPLIT else None)
        self.decisions = 0

    @property
    def reserved(self) -> Demand:
        """Pages reserved so far (summed over everything reserved and admitted)."""
        return self._reserved

    def fits(self, demand: Demand) -> bool:
        """Whether ``ledger + demand`` fits (one pricing decision; nothing is reserved)."""
        self.decisions += 1
        total = self._reserved.plus(demand)
        if self._remainders is not None and any(
            t > r for t, r in zip(total.pages, self._remainders, strict=True)
        ):
            return False
        return fits(self.snapshot, total)

    def rebase(self, snapshot: ChainSnapshot) -> bool:
        """Price from now on against ``snapshot`` (the chain after a prefix-cache lock or
        unlock) and return whether what is reserved still fits there."""
        self.snapshot = snapshot
        if self._remainders is not None:
            self._remainders = _split_remainders(snapshot)
        return self._reserved.is_empty or self.fits(Demand.zeros(len(snapshot.bands)))

    def reserve(self, demand: Demand) -> None:
        """Add a demand to the ledger unconditionally (this step's decodes and the future of
        running requests, which were admitted earlier)."""
        self._reserved = self._reserved.plus(demand)

    def admit(self, demand: Demand) -> bool:
        """Reserve ``demand`` if ``ledger + demand`` fits; return whether it was admitted."""
        if not self.fits(demand):
            return False
        self.reserve(demand)
        return True

    def largest(self, demand_of: Callable[[int], Demand], upper: int, step: int = 1) -> int:
        """Largest multiple of ``step`` tokens ``t <= upper`` whose ``demand_of(t)`` fits
        (0 if none), or ``upper`` itself if it fits: a monotone search over the same
        predicate (chunk caps). A request's demand is not strictly monotone in its chunk (a
        bigger chunk leaves less to reserve later), so ``upper`` and one page are always
        tried as well."""
        if upper <= 0:
            return 0
        if self.fits(demand_of(upper)):
            return upper  # the common case, and exact where the demand is not monotone
        units = upper // step
        best = largest_fitting(lambda n: self.fits(demand_of(n * step)), units) * step
        if best == 0 and units and self.fits(demand_of(step)):
            return step  # the search assumes monotone demands; one page always gets a try
        return best


def _split_remainders(snapshot: ChainSnapshot) -> tuple[int, ...]:
    """Per-band remainders for ``SPLIT``: holes, plus half of each gap shared with a
    neighbour, plus all of a gap at a buffer end, in whole pages of the band's grid (a
    band's edge lies on its own grid, so flooring from it is exact)."""
    out = []
    last = len(snapshot.bands) - 1
    for i, band in enumerate(snapshot.bands):
        below = snapshot.gap_below(i) // (2 if i > 0 else 1)
        above = snapshot.gap_above(i) // (2 if i < last else 1)
        out.append(band.holes + below // band.page_bytes + above // band.page_bytes)
    return tuple(out)
