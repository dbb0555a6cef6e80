"""The request geometry: the page size and one band policy per band, read off a layout
once; the request layer, admission, capacity and the prefix cache share it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvchain.bands.policies import (
    BandPolicy,
    FullPolicy,
    LocalPolicy,
    StatePolicy,
    WindowPolicy,
    _WindowedPolicy,
)
from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass


class StateRollback(enum.StrEnum):
    """How a state band rolls back a speculative step's rejected drafts (docs/design.md,
    speculative decoding).

    ``CHECKPOINTS``: ``k`` more slots per request (the state after each of the step's
    ``1 + k`` tokens is kept; the one after the last accepted token becomes the working
    state): ``k x slot_bytes`` per request, no recompute (vLLM's ``num_spec + 1`` slots).
    ``REPLAY``: one more slot (the state before the step); after a step with a rejected
    draft the state is copied back from it and the ``1 + a`` accepted tokens are
    recomputed (TensorRT-LLM's Mamba-2 rollback): ``1 x slot_bytes`` per request, paid in
    that recompute.
    """

    CHECKPOINTS = "checkpoints"
    REPLAY = "replay"


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
        spec_tokens: draft tokens ``k`` of a speculative decode step (0: no speculation).
            A request then claims ``k`` more state slots (one per draft: the states after
            each of the step's ``1 + k`` tokens are all kept, and the verify keeps the one
            after the last accepted token as the working state: rollback by checkpoint,
            no recompute), its window bands' later peak holds ``W + k`` tokens, and its
            lifetime ``k`` more tokens of every band (docs/design.md, speculative
            decoding). With ``rollback = REPLAY`` one more state slot instead of ``k``.
        rollback: how the state band rolls back (:class:`StateRollback`).
        windows: the window and chunked-local policies, low -> high (derived).
        fulls: indices of every full-attention band, low -> high (derived; a target's
            and its draft's are two).
        states: indices of every state band, low -> high (derived).
        full: index of the lowest full-attention band, or ``None`` (derived; the prefix
            cache's keyed band: the cache refuses a chain with several, ``fulls``).
        window: index of the lowest window or chunked-local band, or ``None`` (derived;
            a shorthand for one-window callers: the prefix cache and the request layer
            use every band of ``windows``).
        state: index of the lowest state band, or ``None`` (derived; the request layer
            treats every band of ``states`` alike).

    Raises:
        ConfigError: a policy whose band or page size does not match its place.
    """

    page_size: int
    policies: tuple[BandPolicy, ...]
    state_slots: int = 1
    slot_bytes: int = 0
    buffer_bytes: int = 0
    page_bytes: int = 0
    spec_tokens: int = 0
    rollback: StateRollback = StateRollback.CHECKPOINTS
    windows: tuple[_WindowedPolicy, ...] = field(init=False)
    fulls: tuple[int, ...] = field(init=False)
    states: tuple[int, ...] = field(init=False)
    full: int | None = field(init=False)
    window: int | None = field(init=False)
    state: int | None = field(init=False)

    def __post_init__(self) -> None:
        if type(self.spec_tokens) is not int or self.spec_tokens < 0:
            raise ConfigError(f"spec_tokens must be an int >= 0, got {self.spec_tokens!r}")
        for b, pol in enumerate(self.policies):
            if pol.band != b or pol.page_size != self.page_size:
                raise ConfigError(f"band {b}: policy {pol!r} does not match its place "
                                  f"(page size {self.page_size})")
        windows = tuple(p for p in self.policies if isinstance(p, _WindowedPolicy))
        fulls, states = self._all_of(FullPolicy), self._all_of(StatePolicy)
        object.__setattr__(self, "windows", windows)
        object.__setattr__(self, "fulls", fulls)
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "full", fulls[0] if fulls else None)
        object.__setattr__(self, "window", windows[0].band if windows else None)
        object.__setattr__(self, "state", states[0] if states else None)

    def _all_of(self, kind: type[BandPolicy]) -> tuple[int, ...]:
        return tuple(p.band for p in self.policies if isinstance(p, kind))

    @property
    def num_bands(self) -> int:
        """Bands of the chain."""
        return len(self.policies)

    @staticmethod
    def of(layout: ChainLayout, spec_tokens: int = 0,
           rollback: StateRollback = StateRollback.CHECKPOINTS) -> RequestGeometry:
        """Read the geometry off a layout: a policy per band by its lifetime class, for
        speculative steps of ``spec_tokens`` drafts (0: none) rolled back by ``rollback``:
        every state band's slots are the layout's ``state_slots_per_request`` plus
        ``spec_tokens`` (``CHECKPOINTS``) or plus 1 (``REPLAY``, when ``spec_tokens > 0``):
        a draft model's state follows the request's tokens like the target's, so it keeps
        the same checkpoints. ``slot_bytes`` and ``page_bytes`` are the lowest state and
        full bands' (the prefix cache's budget; it refuses chains with several).

        Raises:
            ConfigError: ``spec_tokens`` not an int >= 0, or an unknown ``rollback``.
        """
        if type(spec_tokens) is not int or spec_tokens < 0:
            raise ConfigError(f"spec_tokens must be an int >= 0, got {spec_tokens!r}")
        if not isinstance(rollback, StateRollback):
            raise ConfigError(f"rollback must be a StateRollback, got {rollback!r}")
        p = layout.page_size
        extra = spec_tokens if rollback is StateRollback.CHECKPOINTS else min(spec_tokens, 1)
        slots = layout.state_slots_per_request + extra
        policies: list[BandPolicy] = []
        for i, b in enumerate(layout.bands):
            lt = b.lifetime
            if lt is LifetimeClass.WINDOW:
                policies.append(WindowPolicy(i, p, b.cache_class.window or 0, spec_tokens))
            elif lt is LifetimeClass.LOCAL:
                policies.append(LocalPolicy(i, p, b.cache_class.window or 0, spec_tokens))
            elif lt is LifetimeClass.STATE:
                policies.append(StatePolicy(i, p, slots))
            else:
                policies.append(FullPolicy(i, p))
        fulls = layout.indices_of(LifetimeClass.FULL)
        states = layout.indices_of(LifetimeClass.STATE)
        full = fulls[0] if fulls else None
        state = states[0] if states else None
        return RequestGeometry(
            p, tuple(policies), slots,
            slot_bytes=layout.bands[state].page_bytes if state is not None else 0,
            buffer_bytes=layout.buffer_bytes,
            page_bytes=layout.bands[full].page_bytes if full is not None else 0,
            spec_tokens=spec_tokens, rollback=rollback)
