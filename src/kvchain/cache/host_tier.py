"""How much prefix a host tier of ``H`` bytes holds, and how its bytes split between classes.

A host tier keeps what the device prefix cache keeps (``docs/prefix-cache.md``), per resume
point: a cached prefix is only useful up to a point where every class can resume - full
pages for every page of the prefix, the window tail before the point (window and
chunked-local classes), and a state checkpoint at the point (state). On a state hybrid,
full pages without a checkpoint after them can never be used (the 0-of-8 host hits of sglang
#39436): the host tier therefore buys **resume intervals**, never bare KV.

Resume interval (the unit): a prefix keeps a resume point every ``K`` tokens (``K`` a whole
number of pages, ``I = K / P`` pages; the simulator puts them on the trace's content-block
boundaries, 512 tokens for the bundled Mooncake traces). One interval costs, per band:

* full attention: ``I`` pages;
* sliding window ``W``: ``min(I, t)`` pages, ``t`` the window tail at a resume point,
  ``ceil((W - 1) / P)`` pages away from the start of the prompt (consecutive tails overlap
  when ``t > I``, so an interval never adds more than its own ``I`` pages); chunked local
  ``C``: ``min(I, t)`` with ``t`` the longest tail over the points of one period
  (``(m K) mod C`` tokens back to the chunk's start: ``ceil((C - gcd(K, C)) / P)`` pages)
  - an upper bound;
* state: 1 slot (the checkpoint).

A model with neither window nor state resumes at every page: its interval is one page.
Tails are counted with each band policy's ``resume_start``, the device cache's own rule.

The split (:func:`host_tier_plan`): each class gets ``m`` intervals' worth of slots, ``m``
the most intervals whose slots fit ``H`` (with each region's 256-byte alignment,
:func:`kvchain.buffer.host_regions`): every class runs out together, so no byte sits in a
class whose partner is gone. It holds ``m x K`` tokens of resumable prefix; a short tail of
``H`` (less than one interval plus alignment) is left unused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvchain.buffer.host import HOST_ALIGN_BYTES, HostBuffer, host_regions
from kvchain.cache.radix import CacheGeometry
from kvchain.errors import ConfigError, InvalidRequestError
from kvchain.field_types import is_whole
from kvchain.layout import BandLayout, ChainLayout
from kvchain.model.layers import LifetimeClass


@dataclass(frozen=True, slots=True)
class HostClassShare:
    """One class's part of a host tier.

    Attributes:
        label: the band's label.
        page_bytes: bytes of one slot (the band's device page bytes).
        per_interval: slots one resume interval needs (module docstring).
        slots: slots the tier gives the class (``intervals x per_interval``).
        nbytes: ``slots x page_bytes``.
    """

    label: str
    page_bytes: int
    per_interval: int
    slots: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class HostTierPlan:
    """A host tier of ``host_bytes`` for one chain (:func:`host_tier_plan`).

    Attributes:
        host_bytes: the tier's byte budget (``H``).
        interval_tokens: tokens per resume interval (``K``, whole pages; one page when
            every page boundary resumes).
        interval_bytes: bytes of one interval over all classes.
        intervals: resume intervals the tier holds (``m``).
        resumable_tokens: tokens of prefix the tier holds that a hit can resume from:
            ``m x K``.
        used_bytes: bytes of the slots and the regions' alignment padding (<= ``H``).
        classes: per band, in the chain's band order.
        every_page_resumes: True when the chain has neither window nor state band.
    """

    host_bytes: int
    interval_tokens: int
    interval_bytes: int
    intervals: int
    resumable_tokens: int
    used_bytes: int
    classes: tuple[HostClassShare, ...]
    every_page_resumes: bool

    @property
    def slots(self) -> dict[str, int]:
        """Slots per band label (what :class:`kvchain.buffer.HostBuffer` takes)."""
        return {c.label: c.slots for c in self.classes}

    @property
    def resumes_without_bytes(self) -> bool:
        """True when a resume point needs no bytes of any class (``interval_bytes == 0``:
        no full or state band, and every window tail at a point is empty - chunked-local
        bands whose chunk divides the interval, or a 1-token window). A host tier then has
        nothing to hold: ``intervals == 0``."""
        return self.interval_bytes == 0

    @property
    def stranded_full_pages(self) -> int:
        """Full-attention slots no state checkpoint can make resumable: ``full slots -
        state slots x full pages per interval`` (at least 0; 0 without a state or a full
        class). The split gives every class the same number of intervals, so this is 0 for
        every plan :func:`host_tier_plan` returns; a split by any other rule (e.g. bytes in
        proportion to bytes per token) strands pages (tests/cache/test_host_tier.py)."""
        by = {c.label: c for c in self.classes}
        full, state = by.get(LifetimeClass.FULL.value), by.get(LifetimeClass.STATE.value)
        if full is None or state is None:
            return 0
        return max(0, full.slots - state.slots * full.per_interval)


def _tail(layout: ChainLayout, i: int, point: int) -> int:
    """Pages of window or chunked-local band ``i`` a hit that resumes after ``point`` pages
    holds: ``point - resume_start(point)``, the band policy's own rule (the device cache
    keeps the same tail)."""
    policy = CacheGeometry.of(layout).policies[i]
    return point - policy.resume_start(point)


def _tail_per_interval(layout: ChainLayout, i: int, interval_pages: int) -> int:
    """Window pages one interval adds for band ``i`` (module docstring)."""
    band = layout.bands[i]
    p = layout.page_size
    tokens = band.cache_class.window or 0
    if band.lifetime is LifetimeClass.LOCAL:
        # A point r tokens past its chunk's start needs ceil(r / P) pages of tail; over
        # m = 1 .. C / g (g = gcd(K, C)) the point m K lands r = (m K) mod C on every
        # multiple of g below C, so the longest tail is ceil((C - g) / P) - in closed form:
        # a walk over the period took C / g steps (minutes for a 10^8-token chunk).
        k, c = interval_pages * p, tokens
        tail = -(-(c - math.gcd(k, c)) // p)
    else:
        # A point far enough from the prompt's start that its tail is not clipped at 0.
        point = interval_pages * (-(-tokens // (interval_pages * p)) + 1)
        tail = _tail(layout, i, point)
    return min(interval_pages, tail)


def per_interval_slots(layout: ChainLayout, interval_tokens: int) -> tuple[int, ...]:
    """Slots per band (chain order) one resume interval of ``interval_tokens`` needs, the
    interval rounded up to whole pages (module docstring); a chain with neither window nor
    state band counts one page per interval.

    Example: ``P = 16``, ``K = 512`` (``I = 32``), bands ``state|window|full`` with
    ``W = 128``: ``(1, min(32, ceil(127 / 16)) = 8, 32)``.

    Raises:
        ConfigError: ``interval_tokens`` not a whole number (bools and floats refused) or
            ``< 1``.
    """
    if not is_whole(interval_tokens) or interval_tokens < 1:
        raise ConfigError(f"resume interval must be a whole number >= 1 token, got "
                          f"{interval_tokens!r}")
    interval_tokens = int(interval_tokens)
    if _every_page_resumes(layout):
        return tuple(1 for _ in layout.bands)
    pages = -(-interval_tokens // layout.page_size)
    out = []
    for i, band in enumerate(layout.bands):
        if band.lifetime is LifetimeClass.FULL:
            out.append(pages)
        elif band.lifetime is LifetimeClass.STATE:
            out.append(1)
        else:
            out.append(_tail_per_interval(layout, i, pages))
    return tuple(out)


def _every_page_resumes(layout: ChainLayout) -> bool:
    """True for a chain of full-attention pages only (no window, local or state band)."""
    return all(b.lifetime is LifetimeClass.FULL for b in layout.bands)


def _used_bytes(layout: ChainLayout, per: tuple[int, ...], m: int) -> int:
    regions = host_regions(layout, {b.label: m * n for b, n in zip(layout.bands, per,
                                                                   strict=True)})
    return max((r.base + r.nbytes for r in regions), default=0)


def host_tier_plan(layout: ChainLayout, host_bytes: int, interval_tokens: int
                   ) -> HostTierPlan:
    """Split ``host_bytes`` of host memory between the chain's classes by resume interval
    and say how many tokens of resumable prefix it holds (module docstring).

    Example (tests/cache/test_host_tier.py): ``P = 4``, bands ``state|window|full`` with
    ``S = 48 B``, window pages of 8 B (``W = 8``), full pages of 16 B; ``K = 16`` tokens
    (``I = 4``): an interval needs 1 state slot, ``min(4, ceil(7 / 4)) = 2`` window pages
    and 4 full pages: ``48 + 16 + 64 = 128 B``. ``H = 10,000 B`` holds ``m = 76`` intervals
    (state ``[0, 3,648)``, window ``[3,840, 5,056)``, full ``[5,120, 9,984)``; 77 would end
    at 10,048), ``76 x 16 = 1,216`` resumable tokens.

    Raises:
        ConfigError: ``host_bytes`` not a whole number ``>= 0`` or ``interval_tokens`` not
            one ``>= 1`` (bools and floats refused; numpy integers taken).
    """
    if not is_whole(host_bytes) or host_bytes < 0:
        raise ConfigError(f"host bytes must be a whole number >= 0, got {host_bytes!r}")
    host_bytes = int(host_bytes)
    per = per_interval_slots(layout, interval_tokens)
    interval_tokens = int(interval_tokens)
    every_page = _every_page_resumes(layout)
    k = layout.page_size if every_page else -(-interval_tokens // layout.page_size) * \
        layout.page_size
    interval_bytes = sum(n * b.page_bytes for n, b in zip(per, layout.bands, strict=True))
    # Alignment pads each region after the first by less than HOST_ALIGN_BYTES, so this m
    # fits; then grow it while one more interval still fits (a few steps).
    padding = HOST_ALIGN_BYTES * (len(layout.bands) - 1)
    if interval_bytes == 0:
        m = 0  # a resume needs no bytes (resumes_without_bytes): nothing to hold
    else:
        m = max(0, (host_bytes - padding) // interval_bytes)
        while _used_bytes(layout, per, m + 1) <= host_bytes:
            m += 1
    classes = tuple(HostClassShare(b.label, b.page_bytes, n, m * n, m * n * b.page_bytes)
                    for b, n in zip(layout.bands, per, strict=True))
    return HostTierPlan(host_bytes, k, interval_bytes, m, m * k,
                        _used_bytes(layout, per, m), classes, every_page)


def host_buffer(layout: ChainLayout, host_bytes: int, interval_tokens: int, *,
                backend: str = "numpy") -> HostBuffer:
    """A :class:`~kvchain.buffer.HostBuffer` of at most ``host_bytes`` for ``layout``, its
    slots split by :func:`host_tier_plan` (``nbytes == plan.used_bytes``).

    Raises:
        ConfigError: as :func:`host_tier_plan`.
        BufferArgumentError, BufferUnsupportedError: as :class:`~kvchain.buffer.HostBuffer`
            (an unknown backend; torch missing).
    """
    return HostBuffer(layout, host_tier_plan(layout, host_bytes, interval_tokens).slots,
                      backend=backend)


def hit_load_bytes(layout: ChainLayout, hit_tokens: int) -> int:
    """Bytes a host hit of ``hit_tokens`` loads back: every full page of the hit, the
    window tail before it in each window / chunked-local band
    (each band policy's ``resume_start``), and one state checkpoint.

    Example: ``P = 4``, full pages 16 B, window pages 8 B (``W = 8``), ``S = 48 B``, a hit
    of 16 tokens (4 pages): ``4 x 16 + 2 x 8 + 48 = 128 B``.

    Raises:
        InvalidRequestError: ``hit_tokens`` not a whole number (bools and floats refused),
            negative, or not a whole number of pages (a hit ends at a resume point, on a
            page boundary).
    """
    p = layout.page_size
    if not is_whole(hit_tokens):
        raise InvalidRequestError(f"a host hit's tokens must be a whole number, got "
                                  f"{hit_tokens!r}")
    hit_tokens = int(hit_tokens)
    if hit_tokens < 0 or hit_tokens % p:
        raise InvalidRequestError(f"a host hit covers whole pages of {p} tokens, got "
                                  f"{hit_tokens} tokens")
    pages = hit_tokens // p
    total = 0
    for i, band in enumerate(layout.bands):
        total += _hit_pages(layout, i, band, pages) * band.page_bytes
    return total


def _hit_pages(layout: ChainLayout, i: int, band: BandLayout, pages: int) -> int:
    if band.lifetime is LifetimeClass.FULL:
        return pages
    if band.lifetime is LifetimeClass.STATE:
        return 1 if pages else 0
    return _tail(layout, i, pages)
