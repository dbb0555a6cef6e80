"""Admission: one prefill budget on the chain's own pricing (docs/design.md §5).

Each scheduling step builds one :class:`ChainPrefillBudget`: a reservation ledger that
starts from the chain's snapshot, reserves this step's decode tokens and the future of
every running request (rest of its prompt; the output a reservation policy expects it
still to generate: :class:`ReservePolicy`), then admits waiting work while the planner fits
``ledger + candidate``. The scheduler
never does capacity arithmetic; pricing never allocates.

Why admitted => allocatable: the step allocates, in one take, a demand that is at most
the ledger's total, and the planner is monotone (contract 5). With moves allowed, whether
a demand fits depends only on live pages + demand (ENDs compacted, float packed), so the
future reservations stay realizable as they are taken piece by piece.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from kvchain.alloc.pricing import GENERAL_PLANNER, Planner, largest_fitting
from kvchain.alloc.snapshot import ChainSnapshot, Demand, RefusalReason
from kvchain.errors import ConfigError
from kvchain.field_types import check_field_types
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass

_V = TypeVar("_V")  # what a chunk search computes per candidate (largest_fit)


class WindowAdmission(StrEnum):
    """How window (or chunked-local) tokens are admitted.

    ``NONE``: the chain has no window band. ``JOINT``: window and full demand priced
    together against the shared bytes (default; exact on every shape, also with several
    window or chunked-local bands). ``SPLIT``: each band (every window band separately)
    admitted against its own remainder - its holes plus half of each gap it touches, no
    moves - the conservative per-pool behaviour of older engines, kept for comparison.
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
        (or the given mode); one rule covers every window and chunked-local band.

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
        ConfigError: a value that is not a finite number (NaN, infinity, a ``bool``, a
            string: NaN passed ``decay < 0`` and then dropped the ratio to its floor in
            one step), values outside ``0 <= floor <= init <= 1`` or a negative decay.
    """

    init: float = 0.7
    floor: float = 0.7 * 0.14
    decay: float = (0.7 - 0.7 * 0.14) / 600
    value: float = field(default=-1.0)

    def __post_init__(self) -> None:
        numbers = (self.init, self.floor, self.decay, self.value)
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
               for v in numbers):
            raise ConfigError(f"new_token_ratio needs finite numbers, got init={self.init!r} "
                              f"floor={self.floor!r} decay={self.decay!r} "
                              f"value={self.value!r}")
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


#: What binds when a refusal's bytes fit the free bytes, per planner reason (refusal texts).
_NOT_BYTES: dict[RefusalReason | None, str] = {
    RefusalReason.GRID: "no placement of whole pages fits the bands' page grids",
    RefusalReason.INDEX_CAP: "a band's span would pass its index-space cap",
    RefusalReason.MOVES_BLOCKED: "only a plan that moves pages fits and the move gate is "
                                 "closed",
}


class ChainPrefillBudget:
    """The reservation ledger of one scheduling step.

    Args:
        snapshot: the chain's snapshot at the start of the step.
        rules: the chain's admission rules.
        planner: the pricing strategy (the allocator's own, ``Allocator.planner``, so that
            what admission fits the allocator's quote fits); default
            :data:`~kvchain.alloc.pricing.GENERAL_PLANNER`.

    The ledger holds one summed :class:`Demand`; ``admit`` adds a candidate iff the
    planner fits ``ledger + candidate`` on the snapshot (``SPLIT`` also requires each band
    to stay within its own remainder). Evictable supply (a prefix cache's unlocked pages)
    is part of the snapshot and priced by the planner; a hit that locks pages changes the
    supply, so the scheduler :meth:`rebase` s the ledger on the new snapshot.
    """

    def __init__(self, snapshot: ChainSnapshot, rules: AdmissionRules,
                 planner: Planner = GENERAL_PLANNER) -> None:
        self.snapshot = snapshot
        self.rules = rules
        self.planner = planner
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
        return self.planner.fits(self.snapshot, total)

    def refusal(self, demand: Demand) -> str:
        """Why ``ledger + demand`` does not fit, naming the constraint that binds (for
        refusal messages; pricing only, nothing is reserved): the split share of
        :meth:`share_refusal` when one binds; the planner's own reason when the bytes of
        pages the ledger and ``demand`` need fit the free bytes (page grids, an index-space
        cap, a closed move gate); otherwise those bytes against the snapshot's free bytes
        (the planner's own refusal: compaction and moves included).
        """
        share = self.share_refusal(demand)
        if share is not None:
            return share
        total = self._reserved.plus(demand)
        need_bytes = sum(n * b.page_bytes
                         for n, b in zip(total.pages, self.snapshot.bands, strict=True))
        free = self.snapshot.free_bytes
        reason = (self.planner.price(self.snapshot, total).reason if need_bytes <= free
                  else None)  # the bytes suffice: say what the planner found binding
        if reason in _NOT_BYTES:
            return (f"its {need_bytes:,} B of pages fit the {free:,} B free, but "
                    f"{_NOT_BYTES[reason]} ({reason})")
        how = ("" if self.rules.window is WindowAdmission.NONE  # no window band: no rule
               else f"{self.rules.window.value} ")
        return (f"it needs {need_bytes:,} B of pages and {how}admission fits at most the "
                f"{free:,} B free")

    def share_refusal(self, demand: Demand) -> str | None:
        """Under ``SPLIT``, the first band whose pages of ``ledger + demand`` exceed its
        share, e.g. ``"split admission gives the window band a share of 2 pages (3,200 B:
        its holes, half of each gap it touches, all of a gap at a buffer end) and it needs 4
        pages (6,400 B); joint admission (the default) fits it"`` - the refusal is the
        share, not the chain's bytes, so the bytes needed may be fewer than the chain's.
        ``None`` under ``JOINT``, or when no share binds."""
        if self._remainders is None:
            return None
        total = self._reserved.plus(demand)
        for band, need, share in zip(self.snapshot.bands, total.pages, self._remainders,
                                     strict=True):
            if need > share:
                joint = ("; joint admission (the default) fits it"
                         if self.planner.fits(self.snapshot, total) else "")
                return (f"split admission gives the {band.label} band a share of "
                        f"{share:,} pages ({share * band.page_bytes:,} B: its holes, half "
                        f"of each gap it touches, all of a gap at a buffer end) and it "
                        f"needs {need:,} pages ({need * band.page_bytes:,} B){joint}")
        return None

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
        tried as well (:meth:`largest_fit`, whose value it drops)."""
        return self.largest_fit(demand_of, upper, step, _itself)[0]

    def largest_fit(self, value_of: Callable[[int], _V], upper: int, step: int,
                    demand: Callable[[Any], Demand]) -> tuple[int, _V | None]:
        """:meth:`largest` over ``demand(value_of(t))``, with the value computed for the
        chunk it returns (``None`` with 0): each candidate's value is computed once, and
        the caller reuses the fitted one (the step plan's demand: issue 20, item 4)."""
        if upper <= 0:
            return 0, None
        seen: dict[int, _V] = {}

        def fits(t: int) -> bool:
            got = seen[t] = value_of(t)
            return self.fits(demand(got))

        if fits(upper):
            return upper, seen[upper]  # the common case, exact where not monotone
        units = upper // step
        best = largest_fitting(lambda n: fits(n * step), units) * step
        if best == 0 and units and fits(step):
            return step, seen[step]  # the search assumes monotone demands: one page tried
        if not best:
            return 0, None
        return best, seen[best] if best in seen else value_of(best)



def _itself(d: Demand) -> Demand:
    """The identity (a search whose values are the demands themselves)."""
    return d


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


# --- reservations for future output ---------------------------------------------------------


class ReservePolicy(StrEnum):
    """How admission reserves the output a running request has still to generate.

    ``SGLANG``: :class:`NewTokenRatio` x the tokens left to the request's limit (SGLang's
    rule). ``FULL``: every token left to the limit (never retracts while lengths stay
    within their limits; under-fills the batch when outputs end early). ``ADAPTIVE``
    (default): :class:`AdaptiveReserve` - the batch's own future peak, from output lengths
    learned on finished requests. Why the default: it never retracts while outputs
    end by their expected length (a batch that runs to its limits is covered at its page
    peak), and it fills the batch far better than ``FULL`` when outputs end early. Its
    cost against SGLang's ratio on the benchmark slices: 0 to 6% more steps, 0 to 4% less
    throughput, and no retraction where SGLang retracts 1 to 4 times
    (``docs/benchmarks.md``, "Reservations for future output (round 4)").
    """

    SGLANG = "sglang"
    ADAPTIVE = "adaptive"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class ReserveConfig:
    """Which reservation policy a scheduler builds, with its knobs.

    Attributes:
        policy: the policy.
        ratio: ``(init, floor, decay)`` of SGLang's :class:`NewTokenRatio` (``SGLANG``
            only; ``None`` = SGLang's defaults).
        quantile: ``ADAPTIVE``: quantile of ``output / limit`` over finished requests taken
            as a running request's expected output (0.9: a high quantile, so that most
            requests end below their estimate).
        warmup: ``ADAPTIVE``: finished requests needed before the quantile is trusted;
            until then every request is expected to run to its limit (20: a p90 of fewer
            samples is essentially their maximum anyway).

    Raises:
        ConfigError: ``ratio`` given with another policy or out of range, ``quantile``
            outside ``(0, 1]``, ``warmup`` below 1.
    """

    policy: ReservePolicy = ReservePolicy.ADAPTIVE
    ratio: tuple[float, float, float] | None = None
    quantile: float = 0.9
    warmup: int = 20

    def __post_init__(self) -> None:
        check_field_types(self)  # e.g. policy="full" (a string, not the member)
        if self.ratio is not None:
            if self.policy is not ReservePolicy.SGLANG:
                raise ConfigError(f"a new-token ratio only applies to the sglang reservation "
                                  f"policy, not {self.policy.value}")
            if len(self.ratio) != 3:
                raise ConfigError(f"new-token ratio needs INIT,FLOOR,DECAY, got {self.ratio}")
            NewTokenRatio(*self.ratio)  # validates the range
        if not 0.0 < self.quantile <= 1.0:
            raise ConfigError(f"quantile must be in (0, 1], got {self.quantile}")
        if self.warmup < 1:
            raise ConfigError(f"warmup must be >= 1 finished request, got {self.warmup}")

    def build(self) -> OutputReserve:
        """A fresh policy instance (stateful: one per scheduler)."""
        if self.policy is ReservePolicy.SGLANG:
            ratio = NewTokenRatio(*self.ratio) if self.ratio is not None else NewTokenRatio()
            return SGLangReserve(ratio)
        if self.policy is ReservePolicy.FULL:
            return FullReserve()
        return AdaptiveReserve(self.quantile, self.warmup)


def parse_new_token_ratio(text: str) -> tuple[float, float, float]:
    """``"INIT,FLOOR,DECAY"`` -> three floats, checked like :class:`NewTokenRatio`.

    Raises:
        ConfigError: not three comma-separated numbers, or out of range.
    """
    parts = [p.strip() for p in text.split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"new-token ratio must be INIT,FLOOR,DECAY numbers, got "
                          f"{text!r}") from None
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ConfigError(f"new-token ratio must be three finite numbers INIT,FLOOR,DECAY, "
                          f"got {text!r}")
    NewTokenRatio(*values)
    return values[0], values[1], values[2]


class OutputReserve:
    """A reservation policy for future output (base: reserve everything, ``FULL``).

    The scheduler owns the instance and calls, per step: :meth:`begin_step` with the
    numbers of the requests that decode in this step, :meth:`tokens` and :meth:`horizon`
    for each running or candidate request's future, :meth:`on_step` after the forward; and
    :meth:`on_finish` / :meth:`on_retract` as requests end or are retracted. Token counts
    are KV tokens; ``left`` is ``limit - output_done - 1`` (the last sampled token is never
    fed back). Pure: no scheduler import.
    """

    def begin_step(self, held: Sequence[int], left: Sequence[int],
                   done: Sequence[int], limits: Sequence[int], page_size: int = 1) -> None:
        """Called once per scheduling step that reserves futures, with one entry per
        request that decodes in this step (running requests still in prefill, and
        candidates for admission, are not in it): tokens in its cache after this step
        (``held``), output tokens left to its limit (``left``), output tokens done and its
        output limit; ``page_size``: tokens per page of the chain."""

    def tokens(self, left: int, done: int, limit: int, held: int | None = None) -> int:
        """KV tokens to reserve for a request with ``left`` output tokens left to its
        ``limit`` after ``done`` (0 if none left, else at least 1: the next decode is
        always covered). ``held``: its tokens after this step when it is one of the batch
        :meth:`begin_step` was given; ``None`` when it is not (in prefill, or a candidate
        for admission)."""
        return max(0, left)

    def horizon(self, left: int, done: int, limit: int) -> int:
        """KV tokens the request is expected still to compute (``left`` to its limit
        here; at least :meth:`tokens`): the window bands' later peak is reserved over them
        (:func:`kvchain.requests.demand.request_demand`'s ``horizon``), since a window's pages
        do not shrink with a smaller share of the batch's growth."""
        return max(0, left)

    def on_step(self) -> None:
        """One forward done without retraction."""

    def on_finish(self, output_tokens: int, limit: int) -> None:
        """A request finished after ``output_tokens`` tokens with output limit ``limit``."""

    def on_retract(self) -> None:
        """A running request was retracted."""


class FullReserve(OutputReserve):
    """``FULL``: reserve every token up to the request's limit."""


@dataclass(slots=True, eq=False)
class SGLangReserve(OutputReserve):
    """``SGLANG``: ``ceil(left x ratio)`` with SGLang's decaying :class:`NewTokenRatio`."""

    ratio: NewTokenRatio

    def tokens(self, left: int, done: int, limit: int, held: int | None = None) -> int:
        """``ratio.tokens(left)``."""
        return self.ratio.tokens(left)

    def horizon(self, left: int, done: int, limit: int) -> int:
        """``ratio.tokens(left)``: SGLang's ratio is its estimate of the output itself."""
        return self.ratio.tokens(left)

    def on_step(self) -> None:
        """Decay the ratio."""
        self.ratio.step()

    def on_retract(self) -> None:
        """Reset the ratio to its initial value."""
        self.ratio.reset()


def linear_quantile(ascending: Sequence[float], q: float) -> float:
    """The ``q`` quantile of an ascending, non-empty sequence by linear interpolation
    between order statistics (Hyndman & Fan's method 7, numpy's default ``"linear"``),
    with numpy's own float arithmetic, so it equals ``float(np.quantile(values, q))``
    bit for bit (numpy 2.x ``_quantile``: virtual index ``(n - 1) x q``, weight ``g`` its
    fractional part, ``a + (b - a) x g``, or ``b - (b - a) x (1 - g)`` when ``g >= 0.5``).
    O(1) on a list kept sorted, instead of numpy's O(n) partition of a fresh array.

    Args:
        ascending: values, sorted ascending (not checked: O(1) is the point).
        q: quantile in ``[0, 1]``.

    Raises:
        ConfigError: no values, or ``q`` outside ``[0, 1]``.
    """
    n = len(ascending)
    if not n or not 0.0 <= q <= 1.0:
        raise ConfigError(f"a quantile needs values and 0 <= q <= 1, got {n} values, q={q}")
    h = (n - 1) * q
    if h >= n - 1:
        return float(ascending[-1])
    lo = math.floor(h)
    a, b = ascending[lo], ascending[lo + 1]
    g = h - lo
    diff = b - a
    return float(b - diff * (1 - g) if g >= 0.5 else a + diff * g)


class AdaptiveReserve(OutputReserve):
    """``ADAPTIVE``: reserve the decoding batch's future peak in pages, with output lengths
    learned from finished requests.

    1. Expected output of a request with limit ``m``: ``ceil(q x m)`` where ``q`` is the
       ``quantile`` of ``output / limit`` over finished requests (1 during the
       ``warmup``); a request already past it is expected to run to ``m``. So
       ``expected_left = min(left, ceil(q x m) - 1 - done)``, or ``left`` once that is
       below 1. (Without per-request
       ``max_tokens`` the limit is the trace's output length and ``q`` learns 1.)
    2. The decoding batch's future peak of full-attention pages, if it decodes in
       lockstep and each request frees everything when it ends: request ``i`` holds
       ``n_i`` tokens after this step (``b_i = ceil(n_i / P)`` pages, page size ``P``)
       and has ``r_i`` expected tokens left, ``R_i = ceil((n_i + r_i) / P) - b_i`` pages
       to its end. At ``t = r_k`` (just before the k-th shortest ends) the batch holds at
       most ``ceil(r_k / P) x #{i: r_i >= r_k} - sum_{r_i < r_k} b_i`` pages more than
       now (``ceil(x + y) <= ceil(x) + ceil(y)`` per request: at most one page per
       running request above the exact count, never below it); the peak ``E`` is their
       maximum, clipped to ``[0, sum R]``.
    3. Every decoding request reserves ``ceil(R_i x E / sum R)`` pages (integer
       arithmetic), i.e. the most tokens those pages hold, at most ``r_i``: the ledger's
       sum is at least ``E``. Identical requests give ``E = sum R`` (full reservation);
       requests that end at staggered times give ``E`` far below ``sum R`` (an
       SGLang-like fill).
    4. A request that does not decode in this step - still in prefill, or a candidate
       for admission - reserves its whole ``expected_left``: it is not in the lockstep
       batch (it starts decoding later and so ends later than the model would say), and
       a candidate added to a batch raises the batch's peak by at most its own output.
       It joins the shared peak from its first decode on.
    5. A window band's pages do not grow with tokens: every request's window later peak
       is reserved over its whole ``expected_left`` (:meth:`horizon`), not over its
       share of the growth.

    The bound it keeps: while requests run no longer than expected (a batch that runs to
    its limits; or ``q`` learned on outputs that keep ending by ``ceil(q x m)``), the
    ledger covers every later step of the batch, so decodes always fit and nothing is
    retracted (``tests/sched/test_reserve.py``, a W = 11, P = 64 chain with 200
    requests: 0 retractions, as ``full``). Outputs longer than the estimate can still
    retract. ``q`` is taken over the last :attr:`WINDOW` finished requests. A retraction
    changes nothing: the estimate comes from lengths, not from a decaying guess.

    Raises:
        ConfigError: ``quantile`` outside ``(0, 1]`` or ``warmup < 1``.
    """

    #: Finished requests the quantile is taken over (the most recent ones: bounded work per
    #: finish, and the estimate follows a workload that drifts).
    WINDOW = 1_000

    def __init__(self, quantile: float = 0.9, warmup: int = 20) -> None:
        if not 0.0 < quantile <= 1.0 or warmup < 1:
            raise ConfigError(f"adaptive reservation needs 0 < quantile <= 1 and warmup >= 1, "
                              f"got {quantile} and {warmup}")
        self.quantile = quantile
        self.warmup = warmup
        self._fractions: deque[float] = deque(maxlen=self.WINDOW)
        self._sorted: list[float] = []  # the same values, ascending (for the quantile)
        self._q = 1.0
        self._peak = 0  # E: this step's peak, pages (class docstring, step 2)
        self._pages = 0  # sum R: pages to every decoding request's expected end
        self._page_size = 1
        self.value = 1.0  # this step's fraction E / sum R

    @property
    def learned_fraction(self) -> float:
        """``q``: the expected fraction of its limit a request generates (1 in warm-up)."""
        return self._q

    def expected_left(self, left: int, done: int, limit: int) -> int:
        """Expected KV tokens left (step 1 of the class docstring)."""
        if left <= 0:
            return 0
        expected = math.ceil(self._q * limit - 1e-9) - 1 - done
        return left if expected < 1 else min(left, expected)  # past it: to the limit

    def begin_step(self, held: Sequence[int], left: Sequence[int],
                   done: Sequence[int], limits: Sequence[int], page_size: int = 1) -> None:
        """Compute this step's peak ``E`` and fraction ``E / sum R`` (class docstring,
        step 2): ``O(n log n)`` in the decoding requests.

        Raises:
            ConfigError: ``page_size < 1``.
        """
        if page_size < 1:
            raise ConfigError(f"page_size must be >= 1, got {page_size}")
        self._page_size = page = page_size
        r = np.array([self.expected_left(a, d, m) for a, d, m in
                      zip(left, done, limits, strict=True)], dtype=np.int64)
        n = np.asarray(held, dtype=np.int64).reshape(r.shape)
        base = -(-n // page)
        pages = -(-(n + r) // page) - base
        total = int(pages.sum()) if r.size else 0
        if total <= 0:
            self._peak = self._pages = 0
            self.value = 1.0
            return
        order = np.argsort(r, kind="stable")
        grown = -(-r[order] // page)  # ceil(r_k / P)
        still = r.size - np.arange(r.size)
        freed = np.concatenate(([0], np.cumsum(base[order])[:-1]))
        peak = min(total, max(0, int((grown * still - freed).max())))
        self._peak, self._pages = peak, total
        self.value = peak / total

    def tokens(self, left: int, done: int, limit: int, held: int | None = None) -> int:
        """For a request of the decoding batch (``held``: its tokens after this step): the
        most tokens ``ceil(R_i x E / sum R)`` more pages hold, at most ``expected_left``
        (step 3); otherwise ``expected_left`` itself (step 4). At least 1 while any are
        left."""
        expected = self.expected_left(left, done, limit)
        if expected <= 0:
            return 0
        if held is None:
            return expected
        page = self._page_size
        base = -(-held // page)
        pages = -(-(held + expected) // page) - base
        if self._pages <= 0:
            return expected
        share = -(-pages * self._peak // self._pages)
        return max(1, min(expected, (base + share) * page - held))

    def horizon(self, left: int, done: int, limit: int) -> int:
        """``expected_left``: the request is expected to compute all of it, so its
        window's later peak is reserved over it (class docstring, step 5)."""
        return self.expected_left(left, done, limit)

    def on_finish(self, output_tokens: int, limit: int) -> None:
        """Learn ``output / limit``; refresh ``q`` once past the warm-up."""
        if limit <= 0:
            return
        fraction = min(1.0, output_tokens / limit)
        if len(self._fractions) == self._fractions.maxlen:  # the oldest leaves the window
            del self._sorted[bisect.bisect_left(self._sorted, self._fractions[0])]
        self._fractions.append(fraction)
        bisect.insort(self._sorted, fraction)
        if len(self._fractions) >= self.warmup:
            self._q = linear_quantile(self._sorted, self.quantile)
