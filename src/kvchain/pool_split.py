"""How fixed per-class pools split one buffer (the rule SGLang ships), written once.

The baselines' fixed-pool manager (:mod:`kvchain.baselines.managers`) and ``kvchain plan``'s
fixed-pool column (:func:`kvchain.capacity.fixed_pool_layouts`) both split a buffer by
:func:`fixed_pool_shares`.

Defaults (SGLang ``server_args.py``): ``--swa-full-tokens-ratio`` 0.8 (window-pool tokens per
full-pool token) and ``--mamba-full-memory-ratio`` 0.9 (state-pool bytes per byte of the
rest).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvchain.errors import ConfigError
from kvchain.field_types import is_whole
from kvchain.layout import chain_order
from kvchain.model.layers import CacheClass, LifetimeClass

#: Window (or chunked-local) pool tokens per full-pool token (SGLang ``--swa-full-tokens-ratio``).
SWA_FULL_TOKENS_RATIO = 0.8
#: State-pool bytes per byte of the other pools (SGLang ``--mamba-full-memory-ratio``).
MAMBA_FULL_MEMORY_RATIO = 0.9


def ordered_classes(classes: Sequence[CacheClass]) -> list[CacheClass]:
    """Classes in the chain's band order (as :func:`~kvchain.layout.plan_layout`)."""
    return chain_order(classes)


def fixed_pool_shares(classes: Sequence[CacheClass]) -> tuple[float, ...]:
    """Fractions of the buffer each class's own pool gets (band order, sum 1).

    Rules (SGLang defaults): a state pool gets ``0.9 / 1.9`` of the buffer (state bytes =
    0.9 x the rest); of the rest, a window (or chunked-local) pool holds ``0.8`` tokens per
    full-pool token, so full gets ``E_full / (E_full + 0.8 x sum(E_win))`` of it and each
    window ``0.8 E_win / (E_full + 0.8 x sum(E_win))`` (SGLang has one window pool; the ratio
    is applied to each of several); without a full class the pools split the rest by bytes
    per token.

    Example: gpt-oss-120b (``E_full = E_win``): window 0.8 / 1.8 = 0.444, full 0.556.

    Several full or state classes (a target's and a draft model's): the full pools share the
    full part by bytes per token (``E_full`` is their sum), the state pools the state part
    by slot bytes, so each pool holds the same count of tokens (slots). Only state classes
    (a pure recurrent target with a pure recurrent draft): the state pools split the whole
    buffer by slot bytes.

    Args:
        classes: the model's lifetime classes, any order.
    """
    ordered = ordered_classes(classes)
    shares = [0.0] * len(ordered)
    rest = 1.0
    state = [i for i, c in enumerate(ordered) if c.lifetime is LifetimeClass.STATE]
    if state:
        # Several state classes (a target's and a draft model's) split the state share by
        # slot bytes: each holds one slot per request. Without a token class (a pure
        # recurrent target and draft) the state share is the whole buffer.
        share = (MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
                 if len(state) < len(ordered) else 1.0)
        slots = sum(ordered[i].bytes_per_slot for i in state)
        for i in state:
            shares[i] = share * ordered[i].bytes_per_slot / slots
        rest -= share
        if len(state) == len(ordered):
            return tuple(shares)
    wins = [i for i, c in enumerate(ordered)
            if c.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]
    full = [i for i, c in enumerate(ordered) if c.lifetime is LifetimeClass.FULL]
    if wins and full:
        # Several full classes hold one token each per request token: E_full is their sum.
        e_f = sum(ordered[i].bytes_per_token for i in full)
        e_w = [SWA_FULL_TOKENS_RATIO * ordered[i].bytes_per_token for i in wins]
        for i in full:
            shares[i] = rest * ordered[i].bytes_per_token / (e_f + sum(e_w))
        for i, e in zip(wins, e_w, strict=True):
            shares[i] = rest * e / (e_f + sum(e_w))
    else:
        others = [i for i in range(len(ordered)) if i not in state]
        total_e = sum(max(ordered[i].bytes_per_token, 1) for i in others)
        for i in others:
            shares[i] = rest * max(ordered[i].bytes_per_token, 1) / total_e
    return tuple(shares)


def fixed_pool_bytes(classes: Sequence[CacheClass], buffer_bytes: int) -> tuple[int, ...]:
    """Whole bytes of each class's pool (band order): ``floor(share x B)`` each, the last
    pool taking what rounding leaves, so they sum to ``B`` exactly.

    Args:
        classes: the model's lifetime classes (at least one).
        buffer_bytes: ``B`` in bytes, a whole number >= 0.

    Raises:
        ConfigError: no classes, or ``buffer_bytes`` not a whole number >= 0 (a
            negative ``B`` gave a negative last pool, a float fractional bytes).
    """
    if not classes:
        raise ConfigError("fixed pools need at least one cache class")
    if not is_whole(buffer_bytes) or buffer_bytes < 0:
        raise ConfigError(f"buffer_bytes must be a whole number >= 0, got {buffer_bytes!r}")
    buffer_bytes = int(buffer_bytes)
    shares = fixed_pool_shares(classes)
    out = [int(s * buffer_bytes) for s in shares[:-1]]
    return (*out, buffer_bytes - sum(out))
