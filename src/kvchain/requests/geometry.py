"""The request geometry: the page size and one band policy per band, read off a layout
once; the request layer, admission, capacity and the prefix cache share it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass
from kvchain.requests.policies import (
    BandPolicy,
    FullPolicy,
    LocalPolicy,
    StatePolicy,
    WindowPolicy,
    _WindowedPolicy,
)


@dataclass(frozen=True, slots=True)
class RequestGeometry:
    """What the request layer (and the prefix cache) needs of a layout.

    Attributes:
        page_size: ``P`` tokens per page.
        policies: one policy per band, low -> high (``policies[b].band == b``).
        state_slots: state slots a request claims (1 working + checkpoints).
        slot_bytes: bytes of one state slot (a checkpoint; 0: unknown or no state band).
        buffer_bytes: bytes of the whole buffer (0: unknown); with ``slot_bytes`` it sets
            the prefix cache's ``SPACED`` budget
            (:func:`kvchain.cache.radix.spaced_budget`).
        page_bytes: bytes of one full-attention page (0: unknown or no full band): the
            other bound of that budget.
        windows: the window and chunked-local policies, low -> high (derived).
        full: index of the full-attention band, or ``None`` (derived; the prefix cache's
            keyed band).
        window: index of the lowest window or chunked-local band, or ``None`` (derived;
            a shorthand for one-window callers: the prefix cache and the request layer
            use every band of ``windows``).
        state: index of the state band, or ``None`` (derived).

    Raises:
        ConfigError: a policy whose band or page size does not match its place.
    """

    page_size: int
    policies: tuple[BandPolicy, ...]
    state_slots: int = 1
    slot_bytes: int = 0
    buffer_bytes: int = 0
    page_bytes: int = 0
    windows: tuple[_WindowedPolicy, ...] = field(init=False)
    full: int | None = field(init=False)
    window: int | None = field(init=False)
    state: int | None = field(init=False)

    def __post_init__(self) -> None:
        for b, pol in enumerate(self.policies):
            if pol.band != b or pol.page_size != self.page_size:
                raise ConfigError(f"band {b}: policy {pol!r} does not match its place "
                                  f"(page size {self.page_size})")
        windows = tuple(p for p in self.policies if isinstance(p, _WindowedPolicy))
        object.__setattr__(self, "windows", windows)
        object.__setattr__(self, "full", self._first_of(FullPolicy))
        object.__setattr__(self, "window", windows[0].band if windows else None)
        object.__setattr__(self, "state", self._first_of(StatePolicy))

    def _first_of(self, kind: type[BandPolicy]) -> int | None:
        return next((p.band for p in self.policies if isinstance(p, kind)), None)

    @property
    def num_bands(self) -> int:
        """Bands of the chain."""
        return len(self.policies)

    @staticmethod
    def of(layout: ChainLayout) -> RequestGeometry:
        """Read the geometry off a layout: a policy per band by its lifetime class."""
        p = layout.page_size
        slots = layout.state_slots_per_request
        policies: list[BandPolicy] = []
        for i, b in enumerate(layout.bands):
            lt = b.lifetime
            if lt is LifetimeClass.WINDOW:
                policies.append(WindowPolicy(i, p, b.cache_class.window or 0))
            elif lt is LifetimeClass.LOCAL:
                policies.append(LocalPolicy(i, p, b.cache_class.window or 0))
            elif lt is LifetimeClass.STATE:
                policies.append(StatePolicy(i, p, slots))
            else:
                policies.append(FullPolicy(i, p))
        full = layout.index_of(LifetimeClass.FULL)
        state = layout.index_of(LifetimeClass.STATE)
        return RequestGeometry(
            p, tuple(policies), slots,
            slot_bytes=layout.bands[state].page_bytes if state is not None else 0,
            buffer_bytes=layout.buffer_bytes,
            page_bytes=layout.bands[full].page_bytes if full is not None else 0)
