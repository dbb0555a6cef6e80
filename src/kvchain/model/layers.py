"""Layer declarations and lifetime classes.

A model's cache is declared layer by layer; layers with the same lifetime are grouped into
one :class:`CacheClass`, which becomes one band of the chain.

Bytes per token of an attention layer (per tensor-parallel rank)::

    kv_heads_per_rank * (k_head_dim + v_head_dim) * dtype_bytes

e.g. gpt-oss-120b: 8 KV heads x (64 + 64) x 2 B = 2,048 B per layer; 18 full layers give
``E_full = 36,864 B`` (bundled ``catalog/data/models.json``). A recurrent layer holds a fixed set of
state tensors per request (shapes from vLLM's ``MambaStateShapeCalculator``,
``vllm/model_executor/layers/mamba/mamba_utils.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

TARGET = "target"
"""The owner tag of the served (target) model's layers: :attr:`LayerCache.owner`'s default."""

DRAFT = "draft"
"""The owner tag :func:`kvchain.model.draft.with_draft` gives a draft model's layers."""


class LifetimeClass(StrEnum):
    """How long a layer's cache lives; one band per class.

    ``STATE`` < ``WINDOW``/``LOCAL`` < ``FULL`` is also the chain's low-to-high band order
    (several window/local classes: by bytes per request, ``kvchain.layout.band_order_key``).
    """

    STATE = "state"
    WINDOW = "window"
    LOCAL = "local"
    FULL = "full"


class CacheDtype(StrEnum):
    """Element type of a cache tensor."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP32 = "fp32"

    @property
    def nbytes(self) -> int:
        """Bytes per element: 2 (bf16, fp16), 1 (fp8), 4 (fp32)."""
        return {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}[self.value]


@dataclass(frozen=True, slots=True)
class TensorDecl:
    """One cache tensor of a layer.

    Attributes:
        name: ``"k"``, ``"v"``, ``"latent"`` (MLA), ``"conv"``, ``"ssm"``...
        shape: per token for attention tensors (e.g. ``(kv_heads, head_dim)``), per
            request for state tensors (e.g. ``(heads, head_dim, d_state)``).
        dtype: element type.
    """

    name: str
    shape: tuple[int, ...]
    dtype: CacheDtype

    @property
    def nbytes(self) -> int:
        """Bytes of one instance (one token, or one request for state tensors)."""
        return math.prod(self.shape) * self.dtype.nbytes


@dataclass(frozen=True, slots=True)
class LayerCache:
    """The cache one layer keeps.

    Attributes:
        index: layer index in the model (0-based).
        lifetime: its lifetime class.
        kind: free-form kind, e.g. ``"gqa"``, ``"mla"``, ``"mamba1"``, ``"mamba2"``,
            ``"gated_delta_net"``, ``"lightning"``.
        tensors: for token classes, per-token tensors (K, V or a latent); for state,
            per-request tensors.
        window: tokens of the sliding window (``WINDOW``) or attention chunk (``LOCAL``);
            ``None`` otherwise.
        owner: which model of a served pair holds the layer: :data:`TARGET` (the served
            model, the default) or :data:`DRAFT` (a speculative-decoding draft model's own
            cache layer, :func:`kvchain.model.draft.with_draft`). ``(owner, index)``
            identifies a layer: a draft's layers keep the draft model's own 0-based
            indices.
    """

    index: int
    lifetime: LifetimeClass
    kind: str
    tensors: tuple[TensorDecl, ...]
    window: int | None = None
    owner: str = TARGET

    @property
    def nbytes(self) -> int:
        """Bytes per token (token classes) or per request (state), this layer only."""
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True, slots=True)
class CacheClass:
    """One lifetime class of a model: what one band holds.

    Attributes:
        lifetime: the class.
        bytes_per_token: ``E`` (bytes per token summed over the class's layers); 0 for state.
        bytes_per_slot: ``S`` (bytes per request summed over state layers); 0 otherwise.
        window: ``W`` tokens (window) or ``C`` tokens (chunked local); ``None`` otherwise.
        layers: the layers of the class, in model order (their tensors lie in this order
            inside a page).
        label: the class's unique name in its model: the lifetime (``"window"``) when the
            model has one class of that lifetime, else the lifetime and its window in
            tokens (``"window128"``, ``"window11"``); a draft's classes carry the prefix
            ``"draft."`` (``"draft.full"``, ``"draft.state"``); :func:`group_classes` sets
            it. Defaults to the lifetime (with that prefix for a draft class).
        owner: :data:`TARGET` or :data:`DRAFT`, the owner of every layer of the class.
    """

    lifetime: LifetimeClass
    bytes_per_token: int
    bytes_per_slot: int
    window: int | None
    layers: tuple[LayerCache, ...]
    label: str = ""
    owner: str = TARGET

    def __post_init__(self) -> None:
        """Check the counts and set the default label.

        Raises:
            ConfigError: ``bytes_per_token`` or ``bytes_per_slot`` not a whole number >= 0,
                or ``window`` neither ``None`` nor a whole number >= 1 (a NaN, float or
                bool size would lay out a chain of NaN or fractional bytes).
        """
        from kvchain.errors import ConfigError
        from kvchain.field_types import is_whole

        for name in ("bytes_per_token", "bytes_per_slot"):
            v = getattr(self, name)
            if not is_whole(v) or v < 0:
                raise ConfigError(f"{self.lifetime.value} class: {name} must be a whole "
                                  f"number >= 0, got {v!r}")
        if self.window is not None and (not is_whole(self.window) or self.window < 1):
            raise ConfigError(f"{self.lifetime.value} class: window must be None or a whole "
                              f"number of tokens >= 1, got {self.window!r}")
        if not self.label:
            object.__setattr__(self, "label", owner_label(self.owner, self.lifetime.value))

    def labelled(self, label: str) -> CacheClass:
        """The same class under another label."""
        return CacheClass(self.lifetime, self.bytes_per_token, self.bytes_per_slot,
                          self.window, self.layers, label, self.owner)

    @property
    def key(self) -> tuple[str, LifetimeClass, int | None]:
        """``(owner, lifetime, window)``: what tells two classes of one chain apart (two
        classes with one key would be one band)."""
        return (self.owner, self.lifetime, self.window)

    def holds(self, layer: LayerCache) -> bool:
        """True when ``layer`` belongs to this class (its key matches the class's)."""
        return (layer.owner, layer.lifetime, layer.window) == self.key

    @property
    def is_token_class(self) -> bool:
        """True for full, window and local classes (paged by tokens)."""
        return self.lifetime is not LifetimeClass.STATE

    @staticmethod
    def of(layers: tuple[LayerCache, ...]) -> CacheClass:
        """Group layers of one lifetime into a class.

        Raises:
            ConfigError: no layers, mixed lifetimes, mixed owners, or differing windows in
                one class.
        """
        from kvchain.errors import ConfigError

        if not layers:
            raise ConfigError("a cache class needs at least one layer")
        lifetime, owner = layers[0].lifetime, layers[0].owner
        if any(layer.lifetime is not lifetime for layer in layers):
            raise ConfigError(f"layers of different lifetimes in one {lifetime} class")
        if any(layer.owner != owner for layer in layers):
            raise ConfigError(f"layers of different owners in one {lifetime} class: "
                              f"{sorted({layer.owner for layer in layers})}")
        windows = {layer.window for layer in layers}
        if len(windows) != 1:
            # None (no window) sorts first: a plain sort of None and ints raises TypeError.
            shown = sorted(windows, key=lambda w: -1 if w is None else w)
            raise ConfigError(f"{lifetime} layers with different windows {shown}")
        total = sum(layer.nbytes for layer in layers)
        if lifetime is LifetimeClass.STATE:
            return CacheClass(lifetime, 0, total, None, layers, owner=owner)
        return CacheClass(lifetime, total, 0, layers[0].window, layers, owner=owner)


def owner_label(owner: str, label: str) -> str:
    """A class label as its chain shows it: ``label`` for the target's classes,
    ``"<owner>.<label>"`` for another owner's (``"draft.full"``)."""
    return label if owner == TARGET else f"{owner}.{label}"


def group_classes(layers: tuple[LayerCache, ...]) -> tuple[CacheClass, ...]:
    """Group layer caches into classes, one per distinct ``(owner, lifetime, window)``.

    Order: the target's classes first, then each other owner's (in order of first
    appearance); within one owner state, window classes by window size, smallest first,
    chunked-local classes by chunk size, full (the layout then orders the chain,
    :func:`kvchain.layout.band_order_key`). Within one owner a lifetime with one class
    labels it by the lifetime (``"window"``), a lifetime with several by lifetime and
    window tokens (``"window11"``, ``"window128"``); a draft's labels carry the prefix
    ``"draft."`` (:func:`owner_label`: ``"draft.full"``, ``"draft.state"``).

    Example: layers with sliding windows of 128 and 11 tokens and full layers give
    classes ``window11``, ``window128``, ``full``; with a draft's full layers added,
    ``window11``, ``window128``, ``full``, ``draft.full``.

    Raises:
        ConfigError: a layer whose window does not suit its lifetime (as
            :meth:`CacheClass.of`).
    """
    owners = sorted({layer.owner for layer in layers},
                    key=lambda o: (o != TARGET, [x.owner for x in layers].index(o)))
    out: list[CacheClass] = []
    for owner in owners:
        for lifetime in LifetimeClass:
            members = [x for x in layers if x.lifetime is lifetime and x.owner == owner]
            if not members:
                continue
            windows = sorted({layer.window for layer in members},
                             key=lambda w: -1 if w is None else w)
            classes = [CacheClass.of(tuple(x for x in members if x.window == w))
                       for w in windows]
            if len(classes) > 1:
                classes = [c.labelled(owner_label(owner, f"{lifetime.value}{c.window}"))
                           for c in classes]
            out.extend(classes)
    return tuple(out)
