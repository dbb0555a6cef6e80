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
from kvchain.testing.streams import ChainRecorder, Op, generate_stream, op_from_json, op_to_json

STREAM_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamSection:
    """One chain's stream: its geometry, the seed it was generated with, its ops."""

    geometry: ChainGeometry
    ops: tuple[Op, ...]
    seed: int | None = None


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


def header_json(geometry: ChainGeometry, seed: int | None = None) -> dict[str, object]:
    """The header line of a section."""
    return {"kind": "header", "version": STREAM_VERSION, "shape": geometry.shape,
            **geometry.to_json(), "seed": seed}


def write_stream(path: Path, sections: Iterable[StreamSection]) -> int:
    """Write sections as JSON lines; returns the operations written.

    Raises:
        ConfigError: the file cannot be written.
    """
    n = 0
    try:
        with path.open("w", encoding="utf-8") as out:
            for section in sections:
                out.write(json.dumps(header_json(section.geometry, section.seed)) + "\n")
                for op in section.ops:
                    out.write(json.dumps(op_to_json(op), separators=(",", ":")) + "\n")
                    n += 1
    except OSError as exc:
        raise ConfigError(f"cannot write stream {path}: {exc.strerror or exc}") from None
    return n


def read_stream(path: Path) -> tuple[StreamSection, ...]:
    """Parse a stream file.

    Raises:
        ConfigError: unreadable file, bad JSON, an operation before any header, an
            unknown version, or a bad header/operation.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read stream {path}: {exc}") from exc
    sections: list[StreamSection] = []
    geometry: ChainGeometry | None = None
    seed: int | None = None
    ops: list[Op] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object")
        if data.get("kind") == "header":
            if data.get("version") != STREAM_VERSION:
                raise ConfigError(f"{path}:{number}: unknown stream version "
                                  f"{data.get('version')!r}")
            if geometry is not None:
                sections.append(StreamSection(geometry, tuple(ops), seed))
            geometry, ops = ChainGeometry.from_json(data), []
            seed = data.get("seed") if isinstance(data.get("seed"), int) else None
        elif geometry is None:
            raise ConfigError(f"{path}:{number}: an operation before the header")
        else:
            ops.append(op_from_json(data))
    if geometry is not None:
        sections.append(StreamSection(geometry, tuple(ops), seed))
    if not sections:
        raise ConfigError(f"{path}: no header line")
    return tuple(sections)


def replay_section(section: StreamSection, *, fail_fast: bool = False,
                   cache_defect: str | None = None,
                   planner: Planner = GENERAL_PLANNER) -> SectionReport:
    """Replay one section on a fresh chain (``NullBuffer``), auditing after every op.

    Args:
        section: geometry and operations.
        fail_fast: stop at the first divergence or violation.
        cache_defect: plant a defect in the prefix cache the cache ops build (tests of
            the replay's own counters; see :class:`~kvchain.testing.evictor.ReferenceEvictor`).
        planner: the chain's pricing strategy (tests of the divergence count plant a
            mispredicting one; :class:`~kvchain.alloc.pricing.Planner`).

    Raises:
        ConfigError: the geometry is invalid.
    """
    import time

    rec = ChainRecorder(section.geometry.chain(audit=True, planner=planner))  # every audit
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
                     pages: int = 256, cache: bool = False) -> StreamSection:
    """A seeded stream of ``n_ops`` operations on a ``shape`` chain
    (:func:`~kvchain.testing.geometry.shape_geometry` with mixed page bytes,
    :func:`~kvchain.testing.streams.generate_stream`; ``cache`` adds prefix-cache ops).

    Raises:
        ConfigError: an unknown shape or ``n_ops < 0``.
    """
    geometry = shape_geometry(shape, page_size, pages=pages)
    rec = generate_stream(geometry.chain(), n_ops, seed, audit=False, cache=cache)
    return StreamSection(geometry, tuple(rec.ops), seed)
