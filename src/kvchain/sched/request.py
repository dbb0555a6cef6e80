"""Requests, their lifecycle events, and the batch of one engine step."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum

from kvchain.errors import InvalidRequestError


class RequestStatus(StrEnum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    Attributes:
        rid: unique id.
        prompt_tokens: prompt length (tokens, >= 1).
        output_tokens: output length at which it stops (tokens, >= 1).
        arrival_s: arrival time (seconds).
        status: lifecycle status.
        computed: tokens whose KV is in the cache.
        prefill_target: tokens to have in the cache before decoding: the prompt, plus the
            tokens generated before a retraction (recomputed).
        output_done: output tokens generated so far.
        retractions: times it was retracted.
        max_tokens: the output limit the client asked for (tokens), if known; the request
            may stop earlier (``output_tokens``, end of sequence). ``None``: the limit is
            ``output_tokens``. Admission reserves against the limit, never the true length.
        page_keys: content keys of the prompt's whole pages (a hash chain,
            :mod:`kvchain.cache.keys`), or ``None``: what the prefix cache matches on. One
            key per whole page of the chain's page size: ``prompt_tokens // P`` keys
            (checked by the scheduler's ``add``, which knows ``P``; here: at most
            ``prompt_tokens``, a page holding at least one token).
        hit_tokens: prompt tokens served by the prefix cache at its first admission.

    Raises:
        InvalidRequestError: an id, prompt or output length that is not an int, a length
            below 1, an arrival time that is not a finite number, ``max_tokens`` that is
            not an int ``>= output_tokens``, ``page_keys`` not a tuple of ints or more of
            them than prompt tokens, a progress count (``computed``, ``prefill_target``,
            ``output_done``, ``retractions``, ``hit_tokens``) that is not an int >= 0, or
            a ``status`` that is not a :class:`RequestStatus`.
    """

    rid: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    computed: int = 0
    prefill_target: int = 0
    output_done: int = 0
    retractions: int = 0
    max_tokens: int | None = None
    page_keys: tuple[int, ...] | None = None
    hit_tokens: int = 0
    # The scheduler that queued it (Scheduler.add sets it; not a constructor argument, so
    # dataclasses.replace makes a fresh copy): one request object lives in one scheduler.
    _holder: object | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.check()
        if self.prefill_target == 0:
            self.prefill_target = self.prompt_tokens

    def check(self) -> None:
        """Check the fields' types and ranges (the constructor's rules; a
        :class:`Request` is a mutable dataclass, so :meth:`Scheduler.add
        <kvchain.sched.scheduler.Scheduler.add>` runs them again on what it is handed).
        Changes nothing.

        Raises:
            InvalidRequestError: a field the class docstring's ``Raises`` refuses.
        """
        for name in ("rid", "prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if type(value) is not int:  # bools, floats, numpy ints refused: ids and counts
                raise InvalidRequestError(f"request {self.rid!r}: {name} must be an int, got "
                                          f"{type(value).__name__} {value!r}")
        if (isinstance(self.arrival_s, bool) or not isinstance(self.arrival_s, int | float)
                or not math.isfinite(self.arrival_s)):
            raise InvalidRequestError(f"request {self.rid}: arrival_s must be a finite number "
                                      f"of seconds, got {self.arrival_s!r}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InvalidRequestError(
                f"request {self.rid}: prompt_tokens and output_tokens must be >= 1, got "
                f"{self.prompt_tokens} and {self.output_tokens}")
        if self.max_tokens is not None and (type(self.max_tokens) is not int
                                            or self.max_tokens < self.output_tokens):
            raise InvalidRequestError(f"request {self.rid}: max_tokens must be an int >= "
                                      f"output_tokens ({self.output_tokens}), got "
                                      f"{self.max_tokens!r}")
        for name in ("computed", "prefill_target", "output_done", "retractions", "hit_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidRequestError(f"request {self.rid}: {name} must be an int >= 0, "
                                          f"got {value!r}")
        if not isinstance(self.status, RequestStatus):
            raise InvalidRequestError(f"request {self.rid}: status must be a RequestStatus, "
                                      f"got {self.status!r}")
        if self.page_keys is not None and (type(self.page_keys) is not tuple  # C-level scan:
                                           or not set(map(type, self.page_keys)) <= {int}):
            raise InvalidRequestError(f"request {self.rid}: page_keys must be a tuple of ints")
        if self.page_keys is not None and len(self.page_keys) > self.prompt_tokens:
            # a key per whole page: never more keys than tokens, whatever the page size
            raise InvalidRequestError(f"request {self.rid}: {len(self.page_keys):,} page keys "
                                      f"for a prompt of {self.prompt_tokens:,} tokens (one key "
                                      f"per whole page)")

    @property
    def in_prefill(self) -> bool:
        """True until its prefill target is in the cache."""
        return self.computed < self.prefill_target

    @property
    def remaining_prefill(self) -> int:
        """Prefill tokens still to compute (0 once decoding)."""
        return max(0, self.prefill_target - self.computed)

    @property
    def remaining_output(self) -> int:
        """Output tokens still to generate."""
        return self.output_tokens - self.output_done

    @property
    def output_limit(self) -> int:
        """Most output tokens it may generate: ``max_tokens``, else ``output_tokens``."""
        return self.output_tokens if self.max_tokens is None else self.max_tokens

    @property
    def output_left(self) -> int:
        """Output tokens left to its limit (what admission may reserve)."""
        return self.output_limit - self.output_done

    @property
    def final_tokens(self) -> int:
        """Tokens in its cache at its last decode: ``prompt + output - 1`` (the last
        output token is sampled, never fed back)."""
        return self.prompt_tokens + self.output_tokens - 1


class EventKind(StrEnum):
    """Lifecycle events, with timestamps, for metrics."""

    ARRIVED = "arrived"
    ADMITTED = "admitted"
    FIRST_TOKEN = "first_token"
    FINISHED = "finished"
    RETRACTED = "retracted"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event of one request at ``time_s`` seconds (``detail``: e.g. the
    reason of a rejection)."""

    kind: EventKind
    rid: int
    time_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A prefill chunk: ``tokens`` prompt tokens computed from position ``start``, after
    ``recompute`` tokens ``[start - recompute, start)`` run again (a partial prefix-cache
    hit's gap: their KV is the cache's, so the forward writes none there and the chunk
    allocates nothing for them; the recurrent state passes them; 0 for any other chunk).
    The forward computes ``recompute + tokens`` tokens from ``start - recompute``."""

    rid: int
    start: int
    tokens: int
    recompute: int = 0


@dataclass(frozen=True, slots=True)
class DecodeSeq:
    """One decode token for ``rid`` with ``context`` tokens already in its cache, and
    ``drafts`` draft tokens after it (a speculative step: ``1 + drafts`` tokens computed,
    the verify keeps the accepted ones)."""

    rid: int
    context: int
    drafts: int = 0


@dataclass(frozen=True, slots=True)
class LoadBack:
    """A load-back from the host tier realized in this step: ``rid``'s prompt resumed after
    ``start`` tokens on the device alone and after ``end`` once the load is done; ``pages``
    per band (state slots for a state band) were taken on the device for it and ``nbytes``
    copied host -> device (charged as transfer time, not prefill compute)."""

    rid: int
    start: int
    end: int
    pages: tuple[int, ...]
    nbytes: int

    @property
    def tokens(self) -> int:
        """Tokens of prefix the load made resumable (``end - start``)."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What one engine step computes.

    Attributes:
        prefills: prefill chunks (chunked prefill of long prompts across steps).
        decodes: one token for each decoding request.
        memory_blocked: admission stopped at a waiting request because the planner found no
            room for even its smallest chunk (memory), not because of the step's token
            budget or ``max_running`` (what memory-blocked U* averages over).
        loads: load-backs from the host tier realized while this step was scheduled
            (their bytes move before or during its forward).
        resumes: requests suspended to host whose pages this step's take loaded back
            (retraction by host copy; they compute nothing in this step).
        host_write_bytes: bytes copied device -> host by this step's suspensions.
        host_read_bytes: bytes copied host -> device by this step's resumes.
    """

    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[DecodeSeq, ...] = ()
    memory_blocked: bool = False
    resumes: tuple[int, ...] = ()
    host_write_bytes: int = 0
    host_read_bytes: int = 0
    loads: tuple[LoadBack, ...] = ()

    @property
    def load_bytes(self) -> int:
        """Bytes this step's load-backs copy host -> device."""
        return sum(ld.nbytes for ld in self.loads)

    @property
    def prefill_tokens(self) -> int:
        """Tokens of all prefill chunks."""
        return sum(p.tokens for p in self.prefills)

    @property
    def is_empty(self) -> bool:
        """True when the step computes nothing and loads nothing back from host."""
        return not self.prefills and not self.decodes and not self.resumes


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What the model driver reports after running a batch.

    Attributes:
        duration_s: seconds the step took (a finite number >= 0).
        stopped: requests that emitted end-of-sequence before their output length (a set
            of int ids).
        accepted: request id -> drafts the verify accepted in a speculative step
            (``0 <= a <= drafts``; a request absent: 0, every draft rejected).

    Which ids are known (requests of the batch: ``stopped`` any of them, ``accepted`` its
    decodes, at most their drafts) is the scheduler's check (``Scheduler.complete``); here
    the types and ranges.

    Raises:
        InvalidRequestError: ``duration_s`` not a finite number >= 0 (NaN, infinity, a
            negative time, a bool), ``stopped`` not a set of int ids, ``accepted`` not a
            mapping of int ids to ints >= 0.
    """

    duration_s: float
    stopped: frozenset[int] = frozenset()
    accepted: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = self.duration_s
        if (isinstance(d, bool) or not isinstance(d, numbers.Real) or not math.isfinite(d)
                or d < 0):
            raise InvalidRequestError(f"a step outcome's duration_s must be a finite number "
                                      f"of seconds >= 0, got {d!r}")
        if not isinstance(self.stopped, Set) or not all(
                type(rid) is int for rid in self.stopped):
            raise InvalidRequestError(f"a step outcome's stopped must be a set of int request "
                                      f"ids, got {self.stopped!r}")
        if not isinstance(self.accepted, Mapping) or not all(
                type(rid) is int and type(a) is int and a >= 0
                for rid, a in self.accepted.items()):
            raise InvalidRequestError(f"a step outcome's accepted must map int request ids to "
                                      f"ints >= 0 (drafts accepted), got {self.accepted!r}")
