"""Chain geometries for proofs: classes by bytes, buffer bytes, page size, null pages.

A :class:`ChainGeometry` is the serializable description of one chain (it is the header
of a replay stream, :mod:`kvchain.testing.replay`). :func:`tiny_geometries` lists the
small chains the exhaustive oracle can search (at most a few dozen pages per band) for
every chain shape, page sizes 1, 4 and 16 tokens, with equal and mixed page bytes.

Mixed page bytes (bytes per page, page size ``P`` tokens)::

    state slot  S = max(3, 7P // 2)   off the window grid, so the state frontier is too
    window      2P                    (E_win = 2 B/token)
    full        3P                    (E_full = 3 B/token)
    B           48P + 1               odd: the HIGH END's grid base is off 0
"""

from __future__ import annotations

from dataclasses import dataclass

from kvchain.alloc import Chain
from kvchain.alloc.pricing import GENERAL_PLANNER, Planner
from kvchain.buffer import BufferBackend
from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass

#: Every chain shape of at most one float, low -> high (docs/design.md §2).
SHAPES: tuple[str, ...] = ("full", "window|full", "state|full", "state|window",
                           "state|window|full")

#: Chains of several floats (``docs/pricing.md``, "Chains of N bands"): ``wide`` is a
#: second sliding-window class of ``3P`` tokens, ``local`` a chunked-local class of ``2P``
#: tokens. Their layouts name the windows by size and order the floats by bytes per request,
#: largest first (``state|window12|window8|full`` at ``P = 4`` with equal page bytes).
N_BAND_SHAPES: tuple[str, ...] = ("window|local|full", "state|window|wide|full",
                                  "state|window|local|full", "state|window|wide|local|full")


@dataclass(frozen=True, slots=True)
class ClassBytes:
    """One lifetime class declared by bytes.

    Attributes:
        lifetime: ``"state"``, ``"window"``, ``"local"`` or ``"full"``.
        nbytes: bytes per token (token classes) or per state slot (state).
        window: window (or chunk) in tokens for window/local; ``None`` otherwise.
    """

    lifetime: str
    nbytes: int
    window: int | None = None


@dataclass(frozen=True, slots=True)
class ChainGeometry:
    """Everything needed to build a fresh chain.

    Attributes:
        classes: the lifetime classes by bytes (any order).
        buffer_bytes: ``B``.
        page_size: tokens per page of every token band.
        null_pages: reserve one null page per window/local band.
    """

    classes: tuple[ClassBytes, ...]
    buffer_bytes: int
    page_size: int
    null_pages: bool = True

    def layout(self) -> ChainLayout:
        """The validated layout.

        Raises:
            ConfigError: an unknown lifetime or bad bytes (``LayoutError`` and
                ``BufferTooSmallError`` are ``ConfigError`` subclasses).
        """
        classes = []
        for c in self.classes:
            try:
                lifetime = LifetimeClass(c.lifetime)
            except ValueError as exc:
                raise ConfigError(f"unknown lifetime {c.lifetime!r}") from exc
            classes.append(declared_class(lifetime, c.nbytes, c.window))
        return plan_layout(classes, self.buffer_bytes, self.page_size,
                           null_pages=self.null_pages)

    def chain(self, buffer: BufferBackend | None = None, *, audit: bool | None = None,
              planner: Planner = GENERAL_PLANNER) -> Chain:
        """A fresh chain of this geometry (default a ``NullBuffer``); ``audit`` is the
        chain's audit flag (``None``: :func:`kvchain.audit.resolve_audit`'s default);
        ``planner`` its pricing strategy (tests plant planner defects here).

        Raises:
            ConfigError: as :meth:`layout`, a bad ``audit`` flag or ``planner``.
        """
        return Chain(self.layout(), buffer, audit=audit, planner=planner)

    @property
    def shape(self) -> str:
        """The shape name, e.g. ``"state|window|full"``."""
        return self.layout().shape_name

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the replay header's geometry fields)."""
        return {
            "classes": [{"lifetime": c.lifetime, "nbytes": c.nbytes, "window": c.window}
                        for c in self.classes],
            "buffer_bytes": self.buffer_bytes,
            "page_size": self.page_size,
            "null_pages": self.null_pages,
        }

    @staticmethod
    def from_json(data: dict[str, object]) -> ChainGeometry:
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: a missing or mistyped field.
        """
        try:
            classes = tuple(ClassBytes(str(c["lifetime"]), _count(c["nbytes"]),
                                       None if c.get("window") is None else _count(c["window"]))
                            for c in _dicts(data["classes"]))
            null_pages = data.get("null_pages", True)
            if type(null_pages) is not bool:
                raise ValueError(f"null_pages must be true or false, got {null_pages!r}")
            return ChainGeometry(classes, _count(data["buffer_bytes"]),
                                 _count(data["page_size"]), null_pages)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad chain geometry {data!r}: {exc}") from exc


def _count(value: object) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return value


def shape_geometry(shape: str, page_size: int = 4, *, mixed: bool = True,
                   pages: int = 48, null_pages: bool = True) -> ChainGeometry:
    """A geometry of ``shape`` with about ``pages`` window-sized pages of bytes.

    Equal page bytes: every token band ``2P`` bytes, a state slot ``2P``; mixed: see the
    module docstring, plus ``wide`` ``P`` bytes and ``local`` ``4P`` bytes per page. The
    window is ``2P`` tokens (``wide``: ``3P``; ``local``: a chunk of ``2P``).

    Raises:
        ConfigError: an unknown shape.
    """
    if shape not in SHAPES + N_BAND_SHAPES:
        raise ConfigError(f"unknown chain shape {shape!r}; expected one of "
                          f"{SHAPES + N_BAND_SHAPES}")
    p = page_size
    e_full, e_win, slot = (3, 2, max(3, 7 * p // 2)) if mixed else (2, 2, 2 * p)
    e_wide, e_local = (1, 4) if mixed else (2, 2)
    by_name = {"state": ClassBytes("state", slot), "window": ClassBytes("window", e_win, 2 * p),
               "wide": ClassBytes("window", e_wide, 3 * p),
               "local": ClassBytes("local", e_local, 2 * p),
               "full": ClassBytes("full", e_full)}
    classes = tuple(by_name[name] for name in shape.split("|"))
    buffer_bytes = pages * p + (1 if mixed else 0)
    return ChainGeometry(classes, buffer_bytes, p, null_pages)


def tiny_geometries() -> tuple[ChainGeometry, ...]:
    """The oracle's chains: every shape x page size 1/4/16 x equal/mixed page bytes.

    About 24 bytes-per-page-unit: up to ~12 pages per band of 2P..3P bytes.
    """
    out = []
    for shape in SHAPES:
        for p in (1, 4, 16):
            for mixed in (False, True):
                out.append(shape_geometry(shape, p, mixed=mixed, pages=24,
                                          null_pages=not mixed or shape == "state|window"))
    return tuple(out)


def tiny_n_band_geometries(*, mixed_five_bands: bool = False) -> tuple[ChainGeometry, ...]:
    """The oracle's chains of two and three floats (and window + local on one float), no
    null pages: every shape of :data:`N_BAND_SHAPES` x page size 1/4 with equal page bytes
    (20 page units at ``P = 1``, 24 at ``P = 4``), and with mixed page bytes in one page
    unit more than the smallest buffer the layout accepts (the search grows fast with
    bands and bytes). Mixed five-band chains take about a minute each to search, so they
    come only with ``mixed_five_bands`` (the slow proof profile)."""
    out = []
    for shape in N_BAND_SHAPES:
        five = shape.count("|") == 4
        for p in (1, 4):
            out.append(shape_geometry(shape, p, mixed=False, pages=20 if p == 1 else 24,
                                      null_pages=False))
            if five and not mixed_five_bands:
                continue
            pages = next(n for n in range(4, 64) if _accepts(shape, p, n)) + 1
            out.append(shape_geometry(shape, p, mixed=True, pages=pages, null_pages=False))
    return tuple(out)


def _accepts(shape: str, page_size: int, pages: int) -> bool:
    try:
        shape_geometry(shape, page_size, mixed=True, pages=pages, null_pages=False).layout()
    except ConfigError:
        return False
    return True


def _dicts(value: object) -> list[dict[str, object]]:
    """``value`` as a list of JSON objects (raises ValueError otherwise)."""
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise ValueError(f"expected a list of objects, got {value!r}")
    return value
