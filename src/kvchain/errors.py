"""Typed errors of kvchain.

Every refused or invalid operation raises a subclass of :class:`KVChainError` and leaves
the object it was called on exactly as it was (snapshot, epoch, tables, bytes).
"""

from __future__ import annotations


class KVChainError(Exception):
    """Base class of every error kvchain raises on purpose."""

    def __str__(self) -> str:
        # KeyError subclasses would otherwise print their message in quotes.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


# --- configuration (spec, catalog, layout) -------------------------------------------


class ConfigError(KVChainError, ValueError):
    """A model configuration or option is invalid (names the field and the value)."""


class DuplicateFieldError(ConfigError):
    """A file that names one field twice: a key given twice in one JSON object, or a CSV
    header naming a column twice (``kvchain.unique_fields``). Readers of a trace re-raise
    it as a :class:`TraceError` naming the file and line.

    Attributes:
        field: the name given twice.
        first: its first value (a CSV column: the column number, from 1).
        second: its second value.
    """

    def __init__(self, message: str, *, field: str, first: object, second: object) -> None:
        super().__init__(message)
        self.field = field
        self.first = first
        self.second = second


class UnknownFamilyError(ConfigError):
    """A Hugging Face config whose architecture/model_type kvchain cannot map to layers."""


class MissingFieldError(ConfigError):
    """A config lacks a field the layer declarations need (names the field)."""


class UnknownModelError(ConfigError, KeyError):
    """A catalog lookup by a name that no bundled model has."""


class UnknownGPUError(ConfigError, KeyError):
    """A GPU name that the GPU table does not know."""


class LayoutError(ConfigError):
    """Classes that cannot be laid out as a chain (e.g. both window and chunked-local)."""


class BufferTooSmallError(LayoutError):
    """The buffer cannot hold one smallest request.

    Attributes:
        needed_bytes: bytes the smallest request needs (pages rounded, reserved pages
            included).
        available_bytes: bytes of the buffer.
    """

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


# --- allocation -----------------------------------------------------------------------


class AllocationError(KVChainError):
    """Base of the chain allocator's errors."""


class InvalidDemandError(AllocationError, ValueError):
    """A demand of the wrong length, negative pages or a band index out of range."""


class CapacityError(AllocationError):
    """A demand that does not fit the chain now.

    Attributes:
        shortfall_bytes: positive proof of the refusal: how many more free bytes (of the
            best candidate plan, grid rounding included) the demand needs.
        demand: the refused :class:`~kvchain.alloc.snapshot.Demand`.
        reason: short machine-readable reason (``"bytes"``, ``"grid"``, ``"index_cap"``,
            ``"moves_blocked"``).
    """

    def __init__(self, message: str, *, shortfall_bytes: int, demand: object, reason: str) -> None:
        super().__init__(message)
        self.shortfall_bytes = shortfall_bytes
        self.demand = demand
        self.reason = reason


class UnknownPageError(AllocationError, KeyError):
    """A virtual page id that is not bound in its band (never taken, or out of range)."""


class DoubleReleaseError(AllocationError):
    """A virtual page released twice (or twice within one release call)."""


class MovesBlockedError(AllocationError):
    """A move was asked for while the move gate is closed."""


class PlanMismatchError(AllocationError, AssertionError):
    """The executor's live snapshot differs from the planner's prediction: a bug."""


class AuditError(AllocationError, AssertionError):
    """The chain's integrity audit failed (overlap, span != live + holes, bad tables)."""


class QuoteError(AllocationError):
    """A quote handed to ``take`` that the allocator did not issue for its current snapshot
    and this demand; nothing changed."""


class ForgedQuoteError(QuoteError):
    """A quote built by the caller, issued by another allocator, altered after pricing, or
    priced for a different demand."""


class StaleQuoteError(QuoteError):
    """A quote priced on an earlier snapshot (the capacity epoch moved since): price again."""


# --- requests and scheduling ------------------------------------------------------------


class RequestError(KVChainError):
    """Base of the request layer's and scheduler's errors."""


class UnknownRequestError(RequestError, KeyError):
    """A request id the KV manager or scheduler does not hold."""


class TraceError(KVChainError, ValueError):
    """A malformed request trace (names the file, line and field)."""


# --- simulator metrics --------------------------------------------------------------------


class MetricsError(KVChainError, ValueError):
    """An event or sample the simulator's metrics recorder cannot accept: an unknown or
    repeated request id, an event out of order (a token before admission, a second finish),
    a time before the request's arrival, or a step sample with impossible values (names
    the field and the value). Raised before the recorder changes."""


class ReservedPageError(AllocationError):
    """A chain-held null page released by a holder, or the null page asked of a band that
    reserves none."""


# --- buffer backends ----------------------------------------------------------------------


class KVBufferError(KVChainError):
    """Base of the byte buffer backends' errors (``kvchain.buffer``)."""


class BufferArgumentError(KVBufferError, ValueError):
    """Bad input to a buffer backend: a page index outside the band's grid, source and
    destination lists of different lengths, a duplicate destination page, page data of the
    wrong length, or a layer that is not in the band. Raised before any byte changes."""


class BufferUnsupportedError(KVBufferError):
    """An operation the backend cannot do: bytes of a :class:`~kvchain.buffer.NullBuffer`,
    a torch backend without torch installed, or a dtype view at a misaligned byte offset."""


class HostPoolFullError(KVBufferError):
    """A host buffer's pool of one cache class has fewer free slots than asked for
    (``kvchain.buffer.HostBuffer``); nothing was allocated.

    Attributes:
        label: the class's band label (``"full"``, ``"window"``, ``"state"``...).
        wanted: slots asked for.
        free: slots free in that pool.
    """

    def __init__(self, message: str, *, label: str, wanted: int, free: int) -> None:
        super().__init__(message)
        self.label = label
        self.wanted = wanted
        self.free = free


# --- GPU cost model -------------------------------------------------------------------------


class CostModelError(KVChainError, ValueError):
    """Bad input to the GPU cost model (``kvchain.sim.cost``): negative work, a prefill chunk
    of no tokens, or fewer tokens than sequences. Names the field and the value."""


class InvalidRequestError(RequestError, ValueError):
    """A request with a non-positive prompt or output length, or a duplicate id."""


class StaleHostCopyError(RequestError, ValueError):
    """A request's host copy loaded back into a request whose page table no longer names
    the pages that were copied (it committed tokens, released window pages or was freed
    since the copy, or the copy is another request's); nothing was copied
    (``kvchain.cache.host_copy``)."""


class AdmissionDivergenceError(RequestError, AssertionError):
    """Admission accepted work that the allocator then refused: a bug, never expected."""



class StalePlanError(InvalidDemandError):
    """A step plan (``kvchain.requests.plan.StepPlan``) applied to a manager that did not
    build it, or after the requests it was built for changed (a token committed, a request
    bound or unbound, pages taken or released that change a row's demand); nothing was
    applied."""
