"""Models declared directly by bytes: ``E_full``, ``E_win`` and ``W``, ``E_loc`` and ``C``, ``S``.

For experiments and tests that need a model's lifetime classes but not its layers: each
declared class is one opaque layer holding one tensor of one-byte elements (``fp8`` is
the only one-byte :class:`~kvchain.model.layers.CacheDtype`; the dtype carries no meaning
here, only the byte count does).

Example: a three-band model like Jet-Nemotron-2B::

    declare_model("jet-like", full=2048, window=2048, window_tokens=1152, state=14_745_600)

gives classes state (S = 14,745,600 B), window (E = 2,048 B, W = 1,152) and full
(E = 2,048 B).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvchain.errors import ConfigError
from kvchain.model.layers import CacheClass, CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.spec import ModelSpec


def declared_count(label: str, value: object, *, positive: bool = False) -> int:
    """``value`` as a byte or token count: an ``int`` (``bool`` and ``float`` refused, even
    ``1000.0``: a fractional byte count would build fractional page sizes), ``>= 0``, or
    ``> 0`` with ``positive``.

    The one check of every number a declared model takes, whether it comes from
    :func:`declare_model` or from a spec file (:mod:`kvchain.model.spec_file`).

    Raises:
        ConfigError: not an int, a bool, negative, or zero where ``positive`` (names
            ``label`` and the value).
    """
    if type(value) is not int:
        raise ConfigError(f"declared {label} must be an integer, got {value!r} "
                          f"({type(value).__name__})")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"declared {label} must be {'> 0' if positive else '>= 0'}, "
                          f"got {value}")
    return value


def declared_layer(
    index: int, lifetime: LifetimeClass, nbytes: int, window: int | None = None
) -> LayerCache:
    """One opaque layer of ``nbytes`` per token (token classes) or per request (state).

    Raises:
        ConfigError: ``nbytes`` not a positive int; a window given for full/state or
            missing (or not a positive int) for window/local.
    """
    declared_count(f"{lifetime} bytes", nbytes, positive=True)
    needs_window = lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)
    if needs_window and window is None:
        raise ConfigError(f"a declared {lifetime} class needs a positive window, got {window}")
    if needs_window:
        try:
            declared_count(f"{lifetime} window", window, positive=True)
        except ConfigError:
            raise ConfigError(f"a declared {lifetime} class needs a positive window, "
                              f"got {window!r}") from None
    if not needs_window and window is not None:
        raise ConfigError(f"a declared {lifetime} class takes no window, got {window}")
    tensor = TensorDecl("bytes", (nbytes,), CacheDtype.FP8)
    return LayerCache(index, lifetime, f"declared_{lifetime.value}", (tensor,), window)


def declared_class(
    lifetime: LifetimeClass, nbytes: int, window: int | None = None
) -> CacheClass:
    """A :class:`CacheClass` of one opaque layer (see :func:`declared_layer`).

    Raises:
        ConfigError: as :func:`declared_layer`.
    """
    return CacheClass.of((declared_layer(0, lifetime, nbytes, window),))


def declare_model(
    name: str,
    *,
    full: int = 0,
    window: int = 0,
    window_tokens: int | None = None,
    local: int = 0,
    chunk_tokens: int | None = None,
    state: int = 0,
    windows: Sequence[tuple[int, int]] = (),
    locals_: Sequence[tuple[int, int]] = (),
    hidden_size: int = 0,
    num_attention_heads: int = 0,
    total_params: int = 0,
    active_params: int = 0,
    weight_bytes: int = 0,
    source: str = "declared",
) -> ModelSpec:
    """A :class:`ModelSpec` with the given class bytes (a class with 0 bytes is absent).

    Args:
        name: display name.
        full: ``E_full`` bytes per token.
        window: ``E_win`` bytes per token; needs ``window_tokens`` (``W``).
        local: ``E_loc`` bytes per token of chunked-local attention; needs
            ``chunk_tokens`` (``C``).
        state: ``S`` bytes per request.
        windows: more sliding-window classes, ``(E_win bytes per token, W tokens)`` each
            (a model with several window sizes: one class, one band, per size).
        locals_: more chunked-local classes, ``(E_loc bytes per token, C tokens)`` each.
        hidden_size, num_attention_heads, total_params, active_params, weight_bytes:
            what a cost model reads; 0 (the default) declares a model without weights,
            for pure memory experiments.
        source: provenance text.

    Raises:
        ConfigError: a count that is not an int (a float such as ``1000.0``, a bool) or
            is negative (:func:`declared_count`, names the argument); a ``window_tokens``
            or ``chunk_tokens`` that is not a positive int; window bytes without
            ``window_tokens`` (or local bytes without ``chunk_tokens``) or the reverse;
            ``windows`` or ``locals_`` not a sequence (``None``, a number, a string); an
            entry of ``windows`` or ``locals_`` that is not a ``(bytes, tokens)`` tuple or
            list of positive ints (a dict or a set is refused: its order is not the
            pair's); two window (or two local) classes of one size; no class at all; a
            ``name`` or ``source`` that is not a string.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"declared model name must be a non-empty string, got {name!r}")
    if not isinstance(source, str):
        raise ConfigError(f"declared model source must be a string, got {source!r}")
    for label, value in (
        ("full", full),
        ("window", window),
        ("local", local),
        ("state", state),
        ("hidden_size", hidden_size),
        ("num_attention_heads", num_attention_heads),
        ("total_params", total_params),
        ("active_params", active_params),
        ("weight_bytes", weight_bytes),
    ):
        declared_count(label, value)
    for label, tokens in (("window_tokens", window_tokens), ("chunk_tokens", chunk_tokens)):
        if tokens is not None:
            declared_count(label, tokens, positive=True)
    specs = _declared_classes(name, state, (window, window_tokens), (local, chunk_tokens),
                              full, windows, locals_)
    layers = tuple(
        declared_layer(i, lifetime, nbytes, tokens)
        for i, (lifetime, nbytes, tokens) in enumerate(s for s in specs if s[1] > 0)
    )
    if not layers:
        raise ConfigError(f"declared model {name!r} has no class (all byte counts are 0)")
    return ModelSpec(
        name=name,
        layers=layers,
        num_layers=len(layers),
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        total_params=total_params,
        active_params=active_params,
        weight_bytes=weight_bytes,
        tp=1,
        source=source,
    )


def _declared_classes(name: str, state: int, window: tuple[int, int | None],
                      local: tuple[int, int | None], full: int,
                      windows: Sequence[tuple[int, int]], locals_: Sequence[tuple[int, int]]
                      ) -> list[tuple[LifetimeClass, int, int | None]]:
    """:func:`declare_model`'s classes in layer order, ``(lifetime, bytes, tokens)`` each
    (``tokens``: the window or chunk; ``None`` for state and full; a class of 0 bytes is
    left out by the caller): state, the first window class, the first local class (each
    ``(bytes, tokens)``, their counts already checked), full, then ``windows`` and
    ``locals_``.

    Raises:
        ConfigError: as :func:`declare_model`, for the window and local classes: bytes
            without tokens or the reverse, an extra class that is not a positive
            ``(bytes, tokens)`` pair, two classes of one lifetime and size.
    """
    window_bytes, window_tokens = window
    local_bytes, chunk_tokens = local
    for kind, nbytes, tokens, tokens_name in (
            ("window", window_bytes, window_tokens, "window_tokens"),
            ("local", local_bytes, chunk_tokens, "chunk_tokens")):
        if (nbytes > 0) != (tokens is not None):
            missing = tokens_name if nbytes > 0 else kind
            raise ConfigError(f"declared model {name!r} lacks {missing!r}: declare {kind} "
                              f"bytes and {tokens_name} together (or neither)")
    specs: list[tuple[LifetimeClass, int, int | None]] = [
        (LifetimeClass.STATE, state, None),
        (LifetimeClass.WINDOW, window_bytes, window_tokens),
        (LifetimeClass.LOCAL, local_bytes, chunk_tokens),
        (LifetimeClass.FULL, full, None),
    ]
    for lifetime, extra in ((LifetimeClass.WINDOW, windows), (LifetimeClass.LOCAL, locals_)):
        if isinstance(extra, str | bytes) or not isinstance(extra, Sequence):
            field_name = "windows" if lifetime is LifetimeClass.WINDOW else "locals_"
            raise ConfigError(f"declared {field_name} must be a sequence of (bytes, tokens) "
                              f"pairs, got {extra!r}"[:300])
        for entry in extra:
            try:
                if not isinstance(entry, tuple | list):  # a dict or set would unpack too
                    raise TypeError(entry)
                nbytes, tokens = entry
                declared_count(f"{lifetime} bytes", nbytes, positive=True)
                declared_count(f"{lifetime} tokens", tokens, positive=True)
            except (ConfigError, TypeError, ValueError):
                raise ConfigError(f"a declared {lifetime} class needs positive int bytes and "
                                  f"tokens, got {entry!r}") from None
            specs.append((lifetime, nbytes, tokens))
    sizes = [(lt, w) for lt, b, w in specs if b > 0 and w is not None]
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"declared model {name!r}: two classes of one lifetime and size "
                          f"{sorted(f'{lt}/{w}' for lt, w in sizes)}")
    return specs
