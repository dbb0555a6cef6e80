"""Proof of retraction by host copy on the request layer: a replayable stream of request
operations (admit, decode step, suspend to host, resume, finish) on a byte-backed chain with
a host buffer, audited after every operation.

Stream format (one JSON object per operation; :func:`host_stream` generates one from a
seed, :func:`replay_host_stream` runs one)::

    {"op": "admit", "rid": 3, "tokens": 11}   # a new request's whole prompt, committed
    {"op": "step"}                            # one decode token for every running request
    {"op": "suspend", "pick": 5}              # running request 5 mod n to host (refused
                                              # when the host is full)
    {"op": "resume", "pick": 2}               # suspended request 2 mod n, oldest first:
                                              # its load-back priced, refused if it misfits
    {"op": "finish", "pick": 0}               # running request 0 mod n ends

A pick is an index into the running requests (admission order) or the suspended ones
(suspension order), taken modulo their number (a no-op when there are none), so a stream
replays on any manager, a defective one included.

The chain (:func:`host_chain`): ``P = 4``; a full band (1 B a token), a sliding window of 6
tokens, a chunked-local band of 8-token chunks and a state band of 16 B slots, in 512 B,
so memory binds and resumes are refused now and then. Every live page of a request holds a
byte pattern of its own (:func:`_pattern`), written after every operation that gives it
pages, so a page lost or swapped by a suspension and resume shows in its bytes.

What each operation checks, counted in :class:`HostStreamCounts` (every "must be 0" figure
has a planted sibling in tests/proof/test_host_retract.py that makes it non-zero):

* after every operation: the chain's and the request layer's audits (every bound device page
  held once, or the cache's, or a null page: ``device_audit_failures``) and the host audit
  (every held host slot belongs to one suspended request, none leaked:
  ``host_audit_failures``) - together: every page and slot of a request is in exactly one
  place, on the device, on host, or free;
* a resume that fits: the chain's snapshot equals the quote's prediction
  (``price_mismatches``), and the request holds exactly its demand with the bytes it had
  when suspended (``lost_pages``);
* a refused suspension or resume: the snapshot, the host pools and the request's place are
  unchanged (``refusals_that_changed``);
* no operation raises anything but the refusals above (``operations_failed``: e.g. a commit
  that finds its pages gone after a resume that lost one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvchain.alloc.chain import Chain
from kvchain.buffer.host import HostBuffer
from kvchain.buffer.numpy_buffer import NumpyBuffer
from kvchain.errors import (
    AuditError,
    CapacityError,
    ConfigError,
    HostPoolFullError,
    KVChainError,
)
from kvchain.layout import ChainLayout, plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass
from kvchain.requests.manager import KVManager
from kvchain.requests.suspend import HostSide

#: Host slots per band label of the stream's host buffer: room for a few suspended requests
#: (a request of the stream holds 1-10 full pages at admission, more as it decodes), so
#: suspensions are refused too.
DEFAULT_HOST_SLOTS = {"full": 60, "window": 20, "local": 20, "state": 6}


def host_chain(buffer_bytes: int = 512) -> ChainLayout:
    """The stream's four-band layout (module docstring), ``P = 4``."""
    return plan_layout([declared_class(LifetimeClass.FULL, 1),
                        declared_class(LifetimeClass.WINDOW, 1, 6),
                        declared_class(LifetimeClass.LOCAL, 1, 8),
                        declared_class(LifetimeClass.STATE, 16)], buffer_bytes, 4)


@dataclass(slots=True)
class HostStreamCounts:
    """What a replay saw (module docstring): operations, the outcomes, and the "must be 0"
    figures."""

    operations: int = 0
    admitted: int = 0
    suspended: int = 0
    resumed: int = 0
    resumes_refused: int = 0
    suspensions_refused: int = 0
    device_audit_failures: int = 0
    host_audit_failures: int = 0
    price_mismatches: int = 0
    lost_pages: int = 0
    refusals_that_changed: int = 0
    operations_failed: int = 0

    @property
    def violations(self) -> int:
        """The sum of the "must be 0" figures."""
        return (self.device_audit_failures + self.host_audit_failures + self.price_mismatches
                + self.lost_pages + self.refusals_that_changed + self.operations_failed)

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict."""
        return asdict(self)


def _pattern(rid: int, band: int, entry: int) -> int:
    """The byte of page ``entry`` of ``rid`` in ``band`` (never 0, the null page's)."""
    return (31 * rid + 7 * band + entry) % 255 + 1


@dataclass
class HostRetractDriver:
    """One request layer on a numpy chain with a host buffer, driven op by op.

    Args:
        manager: the :class:`KVManager` class (a planted-defect subclass in the tests).
        buffer_bytes: the device buffer.
        host_slots: slots per band label of the host buffer.
        strict: raise :class:`AuditError` at the first violation (the hypothesis machine)
            instead of counting it.
    """

    manager: type[KVManager] = KVManager
    buffer_bytes: int = 512
    host_slots: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_HOST_SLOTS))
    strict: bool = False
    counts: HostStreamCounts = field(default_factory=HostStreamCounts)
    running: list[int] = field(default_factory=list)
    away: dict[int, list[np.ndarray]] = field(default_factory=dict)  # suspended -> bytes

    def __post_init__(self) -> None:
        layout = host_chain(self.buffer_bytes)
        self.device = NumpyBuffer(layout.buffer_bytes)
        self.chain = Chain(layout, self.device)
        self.kv = self.manager(self.chain)
        self.host = HostSide.of_buffer(HostBuffer(layout, self.host_slots), self.device)

    # --- bytes ---------------------------------------------------------------------------

    def _live(self, rid: int, band: int) -> list[tuple[int, int]]:
        """``(entry, physical page)`` of every live page of ``rid`` in ``band``."""
        table = self.kv.page_table(rid, band)
        null = -1
        if self.chain.layout.bands[band].reserved_pages:
            null = self.chain.null_page(band)
        live = [(e, v) for e, v in enumerate(table.tolist()) if v != null]
        if not live:
            return []
        phys = self.chain.translate(band, np.asarray([v for _, v in live], dtype=np.int64))
        return [(e, int(p)) for (e, _), p in zip(live, phys.tolist(), strict=True)]

    def _fill(self, rid: int) -> None:
        for band, layout in enumerate(self.chain.layout.bands):
            for entry, page in self._live(rid, band):
                self.device.write_page(layout, page, np.full(
                    layout.page_bytes, _pattern(rid, band, entry), dtype=np.uint8))

    def _bytes(self, rid: int) -> list[np.ndarray]:
        out = []
        for band, layout in enumerate(self.chain.layout.bands):
            pages = [self.device.read_page(layout, p) for _, p in self._live(rid, band)]
            out.append(np.concatenate(pages) if pages else np.zeros(0, dtype=np.uint8))
        return out

    def _state(self) -> tuple[Any, ...]:
        """What a refusal must leave as it was."""
        return (self.chain.snapshot(), tuple(sorted(self.host.held.items())),
                tuple(self.running), tuple(self.away))

    # --- operations -------------------------------------------------------------------

    def apply(self, op: dict[str, Any]) -> None:
        """Run one stream operation, then the audits (module docstring).

        Raises:
            ConfigError: an unknown operation.
            AuditError: a violation, with ``strict``.
        """
        self.counts.operations += 1
        try:
            self._apply(op)
        except (KVChainError, AssertionError) as exc:
            if isinstance(exc, ConfigError) or self.strict:
                raise
            self.counts.operations_failed += 1
        self.audit()

    def _apply(self, op: dict[str, Any]) -> None:
        kind = op.get("op")
        if kind == "admit":
            self.admit(int(op["rid"]), int(op["tokens"]))
        elif kind == "step":
            self.step()
        elif kind in ("suspend", "finish") and self.running:
            rid = self.running[int(op["pick"]) % len(self.running)]
            (self.suspend if kind == "suspend" else self.finish)(rid)
        elif kind == "resume" and self.away:
            self.resume(list(self.away)[int(op["pick"]) % len(self.away)])
        elif kind not in ("suspend", "finish", "resume"):
            raise ConfigError(f"unknown host-stream operation {op!r}")

    def _violation(self, what: str, message: str) -> None:
        setattr(self.counts, what, getattr(self.counts, what) + 1)
        if self.strict:
            raise AuditError(message)

    def admit(self, rid: int, tokens: int) -> None:
        """A new request's whole prompt of ``tokens`` tokens, committed (skipped when it
        does not fit: nothing changes)."""
        if rid in self.kv or rid in self.away:
            return
        try:
            self.kv.allocate([(rid, tokens)])
        except CapacityError:
            return
        self.kv.commit(rid, tokens)
        self.running.append(rid)
        self.counts.admitted += 1
        self._fill(rid)

    def step(self) -> None:
        """One decode token for every running request (skipped when it does not fit)."""
        if not self.running:
            return
        try:
            self.kv.allocate([(rid, 1) for rid in self.running],
                             self.kv.decode_demands(self.running))
        except CapacityError:
            return
        self.kv.commit_decodes(self.running)
        for rid in self.running:
            self._fill(rid)

    def suspend(self, rid: int) -> None:
        """Suspend running ``rid`` to host (a full host refuses: nothing changes)."""
        if rid not in self.running:
            return
        before, data = self._state(), self._bytes(rid)
        try:
            self.kv.suspend(rid, self.host)
        except HostPoolFullError:
            self.counts.suspensions_refused += 1
            if self._state() != before or rid not in self.kv:
                self._violation("refusals_that_changed", f"a refused suspension of {rid} "
                                f"changed the chain, the host or the request")
            return
        self.running.remove(rid)
        self.away[rid] = data
        self.counts.suspended += 1

    def resume(self, rid: int) -> None:
        """Price ``rid``'s load-back, then resume it (price == outcome, its pages and bytes
        back) or see the refusal change nothing."""
        if rid not in self.away:
            return
        demand = self.kv.resume_demand(rid)
        quote = self.chain.price(demand)
        before = self._state()
        if not quote.fits:
            with contextlib.suppress(CapacityError):
                self.kv.suspensions.resume(rid)
            self.counts.resumes_refused += 1
            if self._state() != before or not self.kv.suspensions.is_suspended(rid):
                self._violation("refusals_that_changed", f"a refused resume of {rid} changed "
                                f"the chain, the host or the request")
            return
        self.kv.suspensions.resume(rid, quote)
        data = self.away.pop(rid)
        self.running.append(rid)
        self.counts.resumed += 1
        if self.chain.snapshot() != quote.after:
            self._violation("price_mismatches", f"the resume of {rid} did not realize its "
                            f"quote")
        got = self._bytes(rid)
        if (self.kv.reads.held_per_band([rid]) != demand.pages
                or any(not np.array_equal(a, b) for a, b in zip(got, data, strict=True))):
            self._violation("lost_pages", f"request {rid} came back without the pages or "
                            f"bytes it held")

    def finish(self, rid: int) -> None:
        """Running ``rid`` ends and frees its pages."""
        if rid in self.running:
            self.kv.free(rid)
            self.running.remove(rid)

    def audit(self) -> None:
        """The device and host audits (module docstring)."""
        try:
            self.chain.audit()
            self.kv.audit()
        except AuditError as exc:
            self._violation("device_audit_failures", str(exc))
        try:
            self.kv.audit_host(self.host)
        except AuditError as exc:
            self._violation("host_audit_failures", str(exc))


def host_stream(seed: int, ops: int = 300) -> list[dict[str, Any]]:
    """A seeded stream of ``ops`` operations (module docstring): about 20 % admissions of
    1-40 tokens, 40 % decode steps, 15 % suspensions, 15 % resumes and 10 % finishes, each
    pick drawn from 0-15."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    rid = 0
    for _ in range(ops):
        u = rng.random()
        pick = int(rng.integers(0, 16))
        if u < 0.2 or rid == 0:
            out.append({"op": "admit", "rid": rid, "tokens": int(rng.integers(1, 41))})
            rid += 1
        elif u < 0.6:
            out.append({"op": "step"})
        elif u < 0.75:
            out.append({"op": "suspend", "pick": pick})
        elif u < 0.9:
            out.append({"op": "resume", "pick": pick})
        else:
            out.append({"op": "finish", "pick": pick})
    return out


def replay_host_stream(ops: Iterable[dict[str, Any]],
                       manager: type[KVManager] = KVManager) -> HostStreamCounts:
    """Replay a stream on a fresh :class:`HostRetractDriver` of ``manager``; then resume
    what is still suspended where it fits (a last audit of every load-back). Returns the
    counts."""
    driver = HostRetractDriver(manager)
    for op in ops:
        driver.apply(op)
    for _ in range(len(driver.away)):
        driver.apply({"op": "resume", "pick": 0})
    return driver.counts


def dump_stream(ops: Iterable[dict[str, Any]]) -> str:
    """The stream as JSON lines."""
    return "".join(json.dumps(op) + "\n" for op in ops)


def load_stream(text: str) -> Iterator[dict[str, Any]]:
    """Operations from JSON lines (blank lines skipped)."""
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)
