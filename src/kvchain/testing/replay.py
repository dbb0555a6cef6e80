"""Replay of recorded operation streams (JSON lines) against a fresh chain.

Stream format (UTF-8, one JSON object per line)::

    {"kind": "header", "version": 1, "shape": "state|window|full",
     "classes": [{"lifetime": "state", "nbytes": 14, "window": null}, ...],
     "buffer_bytes": 1025, "page_size": 4, "null_pages": true, "seed": 7}
    {"op": "take", "pages": [1, 3, 2], "expect": "fit"}
    {"op": "release", "band": 1, "vids": [4, 5]}
    {"op": "gate", "open": false}
    {"op": "fence_hold"}
    {"op": "fence_complete"}
    {"op": "flush_idle"}
    {"op": "cache_insert", "pages": [[], [7, 8], [3]]}
    {"op": "cache_lock", "unit": 0}
    {"op": "cache_unlock", "unit": 0}
    {"op": "host_offload", "pages": [[2], [7, 8], [3]]}
    {"op": "host_load", "entry": 0, "expect": "fit"}
    {"op": "host_evict"}

A header may carry ``"host_slots": [4, 16, 8]`` (host slots per band, low -> high): the
replay then gives the recorder a host store of that size for the host operations (a stream
without it - every stream written before host operations existed - replays as before).
The header's geometry builds the chain (``NullBuffer``); each later line is one operation
(:mod:`kvchain.testing.streams`). Several headers may follow each other in one file: each
starts a fresh chain (one section per shape). :func:`replay_stream` runs every operation
through a :class:`ChainRecorder` (price == outcome on every take, an audit after every
operation) and reports counts per section.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kvchain.alloc.pricing import GENERAL_PLANNER, Planner
from kvchain.errors import ConfigError
from kvchain.testing.geometry import ChainGeometry, shape_geometry
from kvchain.testing.streams import (
    CacheInsertOp,
    ChainRecorder,
    HostEvictOp,
    HostLoadOp,
    HostOffloadOp,
    Op,
    ReleaseOp,
    TakeOp,
    generate_stream,
    op_from_json,
    op_to_json,
)
from kvchain.unique_fields import user_json

STREAM_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamSection:
    """One chain's stream: its geometry, the seed it was generated with, its ops."""

    geometry: ChainGeometry
    ops: tuple[Op, ...]
    seed: int | None = None
    host_slots: tuple[int, ...] | None = None
    """Host slots per band of the host store (``None``: no host operations)."""


@dataclass(frozen=True, slots=True)
class SectionReport:
    """Replay result of one section.

    Attributes:
        shape: the chain shape, e.g. ``"state|window|full"``.
        operations: operations replayed.
        decisions: takes priced.
        fits: takes that fit.
        divergences: price != outcome (or != the recorded outcome).
        violations: audit failures and operations that raised.
        seconds: wall time of the replay.
        messages: the first divergence/violation descriptions.
    """

    shape: str
    operations: int
    decisions: int
    fits: int
    divergences: int
    violations: int
    seconds: float
    messages: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """No divergence and no violation."""
        return self.divergences == 0 and self.violations == 0


def header_json(geometry: ChainGeometry, seed: int | None = None,
                host_slots: tuple[int, ...] | None = None) -> dict[str, object]:
    """The header line of a section (``host_slots`` only when given)."""
    out: dict[str, object] = {"kind": "header", "version": STREAM_VERSION,
                              "shape": geometry.shape, **geometry.to_json(), "seed": seed}
    if host_slots is not None:
        out["host_slots"] = list(host_slots)
    return out


def _host_slots(data: dict[str, object], nb: int) -> tuple[int, ...] | None:
    value = data.get("host_slots")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != nb or not all(
            type(x) is int and x >= 0 for x in value):
        raise ConfigError(f"host_slots must be {nb} whole numbers >= 0, got {value!r}")
    return tuple(value)


def write_stream(path: Path, sections: Iterable[StreamSection]) -> int:
    """Write sections as JSON lines; returns the operations written.

    Raises:
        ConfigError: the file cannot be written.
    """
    n = 0
    try:
        with path.open("w", encoding="utf-8") as out:
            for section in sections:
                out.write(json.dumps(header_json(section.geometry, section.seed,
                                                 section.host_slots)) + "\n")
                for op in section.ops:
                    out.write(json.dumps(op_to_json(op), separators=(",", ":")) + "\n")
                    n += 1
    except OSError as exc:
        raise ConfigError(f"cannot write stream {path}: {exc.strerror or exc}") from None
    return n


HEADER_KEYS = frozenset(("kind", "version", "shape", "classes", "buffer_bytes", "page_size",
                         "null_pages", "seed", "host_slots"))
"""The keys a section's header may carry (:func:`header_json`'s); any other is refused."""


def check_op(op: Op, bands: int, host: bool) -> None:
    """Refuse an operation its section's header makes impossible before it runs: a take,
    cache insert or host offload whose per-band lists are not one per band, a release of
    a band the chain does not have, a host operation without the header's
    ``host_slots``. (What depends on the chain's state - a release of ids not held, a
    lock of an unknown unit - is the replay's to count: a violation.)

    Args:
        op: the operation.
        bands: bands of the section's chain (one per class of its header).
        host: whether the header gives host slots.

    Raises:
        ConfigError: as above (names the operation).
    """
    if isinstance(op, TakeOp) and len(op.pages) != bands:
        raise ConfigError(f"{op}: {len(op.pages)} page counts for a chain of {bands} bands")
    if isinstance(op, CacheInsertOp | HostOffloadOp) and len(op.pages) != bands:
        raise ConfigError(f"{op}: {len(op.pages)} id lists for a chain of {bands} bands")
    if isinstance(op, ReleaseOp) and op.band >= bands:
        raise ConfigError(f"{op}: band {op.band} of a chain of {bands} bands")
    if isinstance(op, HostOffloadOp | HostLoadOp | HostEvictOp) and not host:
        raise ConfigError(f"{op}: a host operation in a section whose header gives no "
                          f"host_slots")


def read_stream(path: Path) -> tuple[StreamSection, ...]:
    """Parse a stream file.

    Raises:
        ConfigError: unreadable file, bad JSON, an operation before any header, an
            unknown version, a bad header/operation (an unknown key included), or an
            operation inconsistent with its header (:func:`check_op`).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read stream {path}: {exc}") from exc
    sections: list[StreamSection] = []
    geometry: ChainGeometry | None = None
    seed: int | None = None
    host_slots: tuple[int, ...] | None = None
    ops: list[Op] = []
    bands = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = user_json(line, unique=False)
        except ConfigError as exc:  # invalid or unusable JSON
            raise ConfigError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object")
        if data.get("kind") == "header":
            if data.get("version") != STREAM_VERSION:
                raise ConfigError(f"{path}:{number}: unknown stream version "
                                  f"{data.get('version')!r}")
            if geometry is not None:
                sections.append(StreamSection(geometry, tuple(ops), seed, host_slots))
            unknown = sorted(set(data) - HEADER_KEYS)
            if unknown:
                raise ConfigError(f"{path}:{number}: unknown header key(s) {unknown} (a "
                                  f"header carries {sorted(HEADER_KEYS)})")
            geometry, ops = ChainGeometry.from_json(data), []
            bands = len(geometry.layout().bands)  # the ops' per-band lists (check_op)
            if "shape" in data and data["shape"] != geometry.shape:
                raise ConfigError(f"{path}:{number}: the header's shape {data['shape']!r} "
                                  f"is not its classes' ({geometry.shape!r})")
            seed = data.get("seed") if isinstance(data.get("seed"), int) else None
            try:
                host_slots = _host_slots(data, len(geometry.classes))
            except ConfigError as exc:
                raise ConfigError(f"{path}:{number}: {exc}") from None
        elif geometry is None:
            raise ConfigError(f"{path}:{number}: an operation before the header")
        else:
            try:
                op = op_from_json(data)
                check_op(op, bands, host_slots is not None)
            except ConfigError as exc:
                raise ConfigError(f"{path}:{number}: {exc}") from None
            ops.append(op)
    if geometry is not None:
        sections.append(StreamSection(geometry, tuple(ops), seed, host_slots))
    if not sections:
        raise ConfigError(f"{path}: no header line")
    return tuple(sections)


def replay_section(section: StreamSection, *, fail_fast: bool = False,
                   cache_defect: str | None = None,
                   planner: Planner = GENERAL_PLANNER,
                   host_defect: str | None = None) -> SectionReport:
    """Replay one section on a fresh chain (``NullBuffer``), auditing after every op.

    Args:
        section: geometry and operations.
        fail_fast: stop at the first divergence or violation.
        cache_defect: plant a defect in the prefix cache the cache ops build (tests of
            the replay's own counters; see :class:`~kvchain.testing.evictor.ReferenceEvictor`).
        planner: the chain's pricing strategy (tests of the divergence count plant a
            mispredicting one; :class:`~kvchain.alloc.pricing.Planner`).
        host_defect: plant a host defect (:class:`~kvchain.testing.streams.ChainRecorder`).

    Raises:
        ConfigError: the geometry or the host slots are invalid.
    """
    import time

    rec = ChainRecorder(section.geometry.chain(audit=True, planner=planner),  # every audit
                        host_slots=section.host_slots, host_defect=host_defect)
    rec.cache_defect = cache_defect
    t0 = time.perf_counter()
    for op in section.ops:
        rec.run(op)
        if fail_fast and (rec.counts.divergences or rec.counts.violations):
            break
    seconds = time.perf_counter() - t0
    c = rec.counts
    return SectionReport(section.geometry.shape, c.operations, c.decisions, c.fits,
                         c.divergences, c.violations, seconds, tuple(c.messages))


def replay_stream(path: Path, *, fail_fast: bool = False,
                  planner: Planner = GENERAL_PLANNER) -> tuple[SectionReport, ...]:
    """Replay every section of a stream file (stops after a failing one with
    ``fail_fast``) on chains priced by ``planner`` (see :func:`replay_section`).

    Raises:
        ConfigError: as :func:`read_stream`.
    """
    reports = []
    for section in read_stream(path):
        report = replay_section(section, fail_fast=fail_fast, planner=planner)
        reports.append(report)
        if fail_fast and not report.ok:
            break
    return tuple(reports)


def generate_section(shape: str, n_ops: int, seed: int, *, page_size: int = 4,
                     pages: int = 256, cache: bool = False,
                     host: bool = False) -> StreamSection:
    """A seeded stream of ``n_ops`` operations on a ``shape`` chain
    (:func:`~kvchain.testing.geometry.shape_geometry` with mixed page bytes,
    :func:`~kvchain.testing.streams.generate_stream`; ``cache`` adds prefix-cache ops,
    ``host`` host offload / load-back / eviction with the default host slots).

    Raises:
        ConfigError: an unknown shape or ``n_ops < 0``.
    """
    geometry = shape_geometry(shape, page_size, pages=pages)
    rec = generate_stream(geometry.chain(), n_ops, seed, audit=False, cache=cache, host=host)
    slots = tuple(p.slots for p in rec.host.pools) if rec.host is not None else None
    return StreamSection(geometry, tuple(rec.ops), seed, slots)
