"""Request traces for the simulator: arrival times, prompt and output lengths.

Four public traces are bundled (byte-exact copies, sources and licenses in
``kvchain/sim/data/SOURCES.md``); :func:`load_trace` loads one of them by name, or a file
of one of their three formats, or of the generic format a user writes by hand
(:data:`TRACE_FORMATS_HELP`), by path, and cuts it (first N requests, a time window, a rate
scale). :func:`write_trace` writes any trace in the generic format.

Conventions (the same for every format):

- ``arrival_s`` is seconds from the trace start: the earliest arrival of the file is 0.
  Wall-clock and millisecond timestamps are kept as integer nanoseconds until that last
  subtraction, so order is never lost to float rounding.
- Rows whose time goes backwards are allowed: requests are sorted *stably* by arrival (ties
  and equal times keep file order). None of the bundled traces has such a row.
- ``request_id`` is the 0-based data-row index in the file (header and blank lines not
  counted), so a request of a cut trace can be found in the file.
- A field given twice is refused (:class:`TraceError` naming the file, line and field): a
  key twice in one JSON-lines object, or a column named twice in a CSV header (readers
  would keep one of the two silently). The rule is :func:`kvchain.unique_fields.unique_fields`,
  the one spec files use.
- ``prompt_tokens`` must be >= 1 (a 0 is a malformed row: :class:`TraceError`).
  ``output_tokens`` of 0 is clamped to 1, because a serving engine always emits the token
  that ends the prefill; :attr:`Trace.zero_output_rows` counts such rows. The bundled traces
  have none (minimum outputs: azure-code 6, azure-conv 7, mooncake 1, sharegpt 2).

Example::

    >>> trace = load_trace("azure-conv", start_s=0, end_s=3600)
    >>> trace.requests[0].prompt_tokens, trace.requests[0].output_tokens
    (374, 44)
"""

from __future__ import annotations

import _csv
import csv
import datetime
import enum
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import numpy as np

from kvchain.errors import ConfigError, DuplicateFieldError, TraceError
from kvchain.field_types import type_problem
from kvchain.unique_fields import unique_fields, user_json

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` block (Mooncake FAST'25 trace README: 512-token blocks;
every row of the bundled trace has ``len(hash_ids) == ceil(input_length / 512)``)."""

DEFAULT_POISSON_RATE_RPS = 5.53
"""Default arrival rate (requests/s) for traces without arrival times (ShareGPT): the mean
arrival rate of the bundled Azure 2023 conversation trace (19,366 requests over 3,501.72 s,
``sim/data/azure2023_conv.csv``: 19,366 / 3,501.72 = 5.53), so ShareGPT lengths arrive at a
real chat service's rate."""

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000

MAX_TOKEN_COUNT = 2**31 - 1
"""Largest prompt or output length accepted (tokens): engines count tokens in int32, and a
larger value in a trace is a corrupt row, not a request."""

MAX_MOONCAKE_TIMESTAMP_MS = 2**53
"""Largest Mooncake ``timestamp`` accepted (ms, about 285,000 years): below it a float
timestamp is exact to the millisecond and every nanosecond arithmetic stays finite."""

_MAX_COUNT_DIGITS = len(str(MAX_TOKEN_COUNT))
_UTF8_BOM = b"\xef\xbb\xbf"


class TraceFormat(enum.StrEnum):
    """File formats :func:`load_trace` reads."""

    AZURE_2023 = "azure-2023"
    """CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference trace 2023)."""
    MOONCAKE = "mooncake"
    """JSON lines ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""
    SHAREGPT_LENGTHS = "sharegpt-lengths"
    """CSV ``num_prefill_tokens,num_decode_tokens,...`` (no arrival times: Poisson)."""
    GENERIC = "generic"
    """CSV or JSON lines written by hand: ``arrival_s, prompt_tokens, output_tokens`` and
    optional ``hash_ids``, ``max_tokens`` (see :data:`TRACE_FORMATS_HELP`)."""


TRACE_FORMATS_HELP = """\
Trace formats (a bundled name, or a file detected by its header / first line):
  generic CSV (header with arrival_s), one request per line:
    arrival_s,prompt_tokens,output_tokens[,hash_ids][,max_tokens]
    0.25,1200,128,7 8 9,256
  generic JSONL (objects with arrival_s):
    {"arrival_s": 0.25, "prompt_tokens": 1200, "output_tokens": 128,
     "hash_ids": [7, 8, 9], "max_tokens": 256}
  arrival_s: seconds, finite and >= 0 (the earliest is taken as 0: a trace
  may start at any time >= 0; a negative time is refused); in JSONL a number,
  not a string; prompt_tokens >= 1; output_tokens >= 0 (0 counts as 1);
  hash_ids: optional ids of the prompt's blocks of --block-tokens tokens
  (default 512), ceil(prompt / block) of them, equal leading ids = shared
  prefix; in CSV space- or semicolon-separated;
  max_tokens: optional output limit the client asked for (tokens, >=
  output_tokens; admission reserves up to it, the request stops at output_tokens).
  Other fields: refused.
  Azure 2023 CSV (azure-conv, azure-code):
    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44
  (wall clock, 100 ns; prompt and output tokens)
  Mooncake JSONL (mooncake): timestamp in ms, lengths in tokens, 512-token
  block ids:
    {"timestamp": 0, "input_length": 6758, "output_length": 500,
     "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}
  ShareGPT lengths CSV (sharegpt): no arrival times (Poisson, --seed):
    num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
    74,918,992,0.0806100217864923
  (num_total_tokens, if given, must be prefill + decode; pd_ratio is not read)
"""
"""The accepted trace formats, their columns, units and an example line each (printed by
``kvchain simulate --help`` and ``kvchain compare --help``; also in the README)."""


@dataclass(frozen=True, slots=True)
class BundledTrace:
    """One trace shipped inside the package.

    Attributes:
        name: the name :func:`load_trace` accepts.
        filename: file under ``kvchain/sim/data/``.
        format: its :class:`TraceFormat`.
        rows: data rows in the file.
        description: what the trace is, in one line.
        source: where the file comes from (repository and path).
        license: the license of the source.
    """

    name: str
    filename: str
    format: TraceFormat
    rows: int
    description: str
    source: str
    license: str


BUNDLED_TRACES: Mapping[str, BundledTrace] = MappingProxyType(
    {
        t.name: t
        for t in (
            BundledTrace(
                name="azure-conv",
                filename="azure2023_conv.csv",
                format=TraceFormat.AZURE_2023,
                rows=19_366,
                description="Azure LLM inference 2023, conversation service: 1 h, 5.5 req/s, "
                "prompts mean 1,155 tokens, outputs mean 211 tokens",
                source="Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv "
                "(Splitwise, ISCA 2024)",
                license="CC-BY 4.0",
            ),
            BundledTrace(
                name="azure-code",
                filename="azure2023_code.csv",
                format=TraceFormat.AZURE_2023,
                rows=8_819,
                description="Azure LLM inference 2023, code completion: 1 h, very bursty "
                "(inter-arrival CV 13, up to 67 req in 1 s), prompts mean 2,048, outputs "
                "mean 28 tokens",
                source="Azure/AzurePublicDataset data/AzureLLMInferenceTrace_code.csv "
                "(Splitwise, ISCA 2024)",
                license="CC-BY 4.0",
            ),
            BundledTrace(
                name="mooncake",
                filename="mooncake_fast25_conversation_trace.jsonl",
                format=TraceFormat.MOONCAKE,
                rows=12_031,
                description="Mooncake (Kimi) conversation: 1 h, 3.4 req/s, long prompts "
                "(mean 12,035, p99 85,400 tokens), 512-token prefix block ids",
                source="kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl "
                "(Mooncake, FAST 2025)",
                license="Apache-2.0 (repository)",
            ),
            BundledTrace(
                name="sharegpt",
                filename="sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                format=TraceFormat.SHAREGPT_LENGTHS,
                rows=30_731,
                description="ShareGPT conversations (Llama 2 tokenizer, <= 8k tokens): "
                "lengths only, Poisson arrivals; prompts mean 2,340, outputs mean 439 tokens",
                source="microsoft/sarathi-serve (branch niyama_asplos2026) "
                "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                license="Apache-2.0 (repository)",
            ),
        )
    }
)
"""The bundled traces by name (read-only)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        request_id: 0-based data-row index in the source file.
        arrival_s: arrival time, seconds from the trace start (>= 0).
        prompt_tokens: prompt length in tokens (>= 1).
        output_tokens: tokens to generate (>= 1; the first one ends the prefill).
        prefix_block_ids: ``hash_ids``: one id per prompt block of
            :attr:`Trace.block_tokens` tokens (Mooncake: 512,
            :data:`MOONCAKE_BLOCK_TOKENS`); equal leading ids between requests mean a
            shared prefix. ``None`` for traces without them.
        max_tokens: the request's own output cap in tokens (a generic trace's
            ``max_tokens`` column), ``None`` when the trace gives none.

    Raises:
        TraceError: a negative or non-finite arrival, a token count below 1, or
            ``max_tokens`` below ``output_tokens``.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_block_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise TraceError(f"request {self.request_id}: max_tokens must be >= 1, "
                             f"got {self.max_tokens}")
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise TraceError(
                f"request {self.request_id}: arrival_s must be finite and >= 0, "
                f"got {self.arrival_s!r}"
            )
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise TraceError(
                f"request {self.request_id}: prompt_tokens and output_tokens must be >= 1, "
                f"got {self.prompt_tokens} and {self.output_tokens}"
            )
        if self.max_tokens is not None and self.max_tokens < self.output_tokens:
            raise TraceError(
                f"request {self.request_id}: max_tokens ({self.max_tokens}) is below "
                f"output_tokens ({self.output_tokens})"
            )


@dataclass(frozen=True, slots=True)
class Trace:
    """A request trace, sorted by arrival time.

    Attributes:
        name: bundled name (``azure-conv``...) or the file's stem.
        requests: the requests in arrival order (stable: equal times keep file order).
        source: where the data comes from.
        license: the license of the data.
        zero_output_rows: rows of the source file whose output length 0 was clamped to 1
            (counted over the whole file, before any cut; see the module doc).
        block_tokens: tokens per ``prefix_block_ids`` block (Mooncake: 512).

    Raises:
        TraceError: requests not sorted by ``arrival_s``, or a repeated ``request_id``.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    source: str
    license: str
    zero_output_rows: int = 0
    block_tokens: int = 512

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise TraceError(f"trace {self.name!r}: block_tokens must be >= 1, "
                             f"got {self.block_tokens}")
        previous = -math.inf
        for request in self.requests:
            if request.arrival_s < previous:
                raise TraceError(
                    f"trace {self.name!r}: requests not sorted by arrival "
                    f"(request {request.request_id} at {request.arrival_s} s after {previous} s)"
                )
            previous = request.arrival_s
        if len({r.request_id for r in self.requests}) != len(self.requests):
            raise TraceError(f"trace {self.name!r}: request ids are not unique")

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        """The requests in arrival order."""
        return iter(self.requests)

    @property
    def duration_s(self) -> float:
        """Seconds from the trace start (t = 0) to the last arrival; 0.0 when empty."""
        return self.requests[-1].arrival_s if self.requests else 0.0


# --- parsing ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    """One parsed data row; ``arrival_ns`` is None for formats without times."""

    row_index: int
    arrival_ns: int | None
    prompt_tokens: int
    output_tokens: int
    prefix_block_ids: tuple[int, ...] | None
    max_tokens: int | None = None


_INT_RE = re.compile(r"[+-]?[0-9]+")
_WALL_CLOCK_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
)


def _error(path: Path, line: int, field: str, message: str) -> TraceError:
    return TraceError(f"{path}: line {line}, field {field!r}: {message}")


def _check_count(value: int, path: Path, line: int, field: str) -> int:
    if value < 0:
        raise _error(path, line, field, f"negative token count {value}")
    if value > MAX_TOKEN_COUNT:
        raise _error(path, line, field, f"token count {value} is above {MAX_TOKEN_COUNT}")
    return value


def _parse_count(text: str, path: Path, line: int, field: str) -> int:
    """A token count in ``[0, MAX_TOKEN_COUNT]`` from a text field."""
    stripped = text.strip()
    if not _INT_RE.fullmatch(stripped):
        raise _error(path, line, field, f"not an integer: {text[:40]!r}")
    if len(stripped) > _MAX_COUNT_DIGITS and len(stripped.lstrip("+-0")) > _MAX_COUNT_DIGITS:
        # int() of a > 4,300-digit string raises ValueError; no count is this long anyway.
        raise _error(
            path, line, field, f"token count of {len(stripped)} digits is above {MAX_TOKEN_COUNT}"
        )
    value = int(stripped)
    if 0 <= value <= MAX_TOKEN_COUNT:  # the common case, without a call
        return value
    return _check_count(value, path, line, field)


def _utf8_error(path: Path) -> TraceError:
    """The error for a file that is not UTF-8, naming the line of the first bad byte."""
    data = path.read_bytes()
    data = data.removeprefix(_UTF8_BOM)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return TraceError(f"{path}: line {line}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    return TraceError(f"{path}: not UTF-8 text")


def _check_lengths(
    prompt: int, output: int, path: Path, line: int, prompt_field: str
) -> tuple[int, bool]:
    """Validate lengths; returns the output (0 clamped to 1) and whether it was clamped."""
    if prompt < 1:
        raise _error(path, line, prompt_field, "prompt must be at least 1 token, got 0")
    if output == 0:
        return 1, True
    return output, False


def _parse_wall_clock_ns(
    text: str, path: Path, line: int, field: str, day_cache: dict[str, int]
) -> int:
    """``YYYY-MM-DD HH:MM:SS[.f{1,9}]`` to integer nanoseconds since 0001-01-01 (exact)."""
    match = _WALL_CLOCK_RE.fullmatch(text.strip())
    if match is None:
        raise _error(path, line, field, f"unparsable timestamp {text!r}")
    year, month, day, hour, minute, second, fraction = match.groups()
    date_key = f"{year}-{month}-{day}"
    days = day_cache.get(date_key)
    if days is None:
        try:
            days = datetime.date(int(year), int(month), int(day)).toordinal()
        except ValueError as exc:
            raise _error(path, line, field, f"invalid date in {text!r}: {exc}") from None
        day_cache[date_key] = days
    h, m, s = int(hour), int(minute), int(second)
    if h > 23 or m > 59 or s > 59:
        raise _error(path, line, field, f"invalid time of day in {text!r}")
    seconds = days * 86_400 + h * 3_600 + m * 60 + s
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    return seconds * _NS_PER_S + nanos


def _csv_rows(path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()
              ) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, {column: text}) for each data row; header checked first. The
    ``required`` columns are in every row's dict, the ``optional`` ones where the header
    names them.

    A UTF-8 byte-order mark is skipped (``utf-8-sig``: spreadsheet exports start with one).
    """
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        try:
            yield from _csv_data_rows(path, reader, required, optional)
        except UnicodeDecodeError:
            raise _utf8_error(path) from None
        except csv.Error as exc:  # e.g. a field over csv.field_size_limit() characters
            raise TraceError(f"{path}: line {reader.line_num}: malformed CSV: {exc}") from None


def _csv_data_rows(
    path: Path, reader: _csv.Reader, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    header = next(reader, None)
    if header is None:
        raise _error(path, 1, required[0], "empty file (no header)")
    columns = [c.strip() for c in header]
    try:  # "" is no field (a spreadsheet's trailing commas): it may repeat
        unique_fields((c, n) for n, c in enumerate(columns, start=1) if c)
    except DuplicateFieldError as exc:
        raise _error(path, 1, exc.field, f"column named twice in the header (columns "
                     f"{exc.first} and {exc.second})") from None
    for name in required:
        if name not in columns:
            raise _error(path, 1, name, f"missing column (header is {header!r})")
    positions = {name: columns.index(name) for name in required}
    positions.update((name, columns.index(name)) for name in optional if name in columns)
    for fields in reader:
        if not fields:
            continue
        line = reader.line_num
        if len(fields) != len(columns):
            # the first column the row lacks (a short row), or one past the header's last
            raise _error(
                path,
                line,
                columns[len(fields)] if len(fields) < len(columns)
                else f"#{len(columns) + 1} (past the header)",
                f"expected {len(columns)} fields, got {len(fields)}: {fields!r}"[:300],
            )
        yield line, {name: fields[pos] for name, pos in positions.items()}


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
_SHAREGPT_TOTAL = "num_total_tokens"


def _read_azure(path: Path) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    clamped = 0
    day_cache: dict[str, int] = {}
    for line, fields in _csv_rows(path, _AZURE_COLUMNS):
        arrival_ns = _parse_wall_clock_ns(fields["TIMESTAMP"], path, line, "TIMESTAMP", day_cache)
        prompt = _parse_count(fields["ContextTokens"], path, line, "ContextTokens")
        output = _parse_count(fields["GeneratedTokens"], path, line, "GeneratedTokens")
        output, was_clamped = _check_lengths(prompt, output, path, line, "ContextTokens")
        clamped += was_clamped
        rows.append(_Row(len(rows), arrival_ns, prompt, output, None))
    return rows, clamped


def _read_sharegpt(path: Path) -> tuple[list[_Row], int]:
    """The rows of a ShareGPT lengths CSV. ``num_total_tokens``, where the header has it,
    is checked against ``num_prefill_tokens + num_decode_tokens`` (a row that disagrees
    has lengths that cannot all be right, so none of them is trusted); ``pd_ratio`` is
    not read (a float the writers round differently).

    Raises:
        TraceError: a malformed count, a 0-token prompt, or a total that is not prefill +
            decode (names the file, line and field).
    """
    rows: list[_Row] = []
    clamped = 0
    for line, fields in _csv_rows(path, _SHAREGPT_COLUMNS, (_SHAREGPT_TOTAL,)):
        prompt = _parse_count(fields["num_prefill_tokens"], path, line, "num_prefill_tokens")
        output = _parse_count(fields["num_decode_tokens"], path, line, "num_decode_tokens")
        total_text = fields.get(_SHAREGPT_TOTAL)
        if total_text is not None:
            total = _parse_count(total_text, path, line, _SHAREGPT_TOTAL)
            if total != prompt + output:
                raise _error(path, line, _SHAREGPT_TOTAL,
                             f"{total:,} is not num_prefill_tokens + num_decode_tokens "
                             f"({prompt:,} + {output:,} = {prompt + output:,})")
        output, was_clamped = _check_lengths(prompt, output, path, line, "num_prefill_tokens")
        clamped += was_clamped
        rows.append(_Row(len(rows), None, prompt, output, None))
    return rows, clamped


def _json_count(value: object, path: Path, line: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(path, line, field, f"not an integer: {value!r}"[:200])
    return _check_count(value, path, line, field)


def _json_time_ns(value: object, path: Path, line: int) -> int:
    """A millisecond timestamp (int, or finite float) to integer nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(path, line, "timestamp", f"not a number: {value!r}")
    finite = isinstance(value, int) or math.isfinite(value)  # isfinite overflows on big ints
    if not (finite and 0 <= value <= MAX_MOONCAKE_TIMESTAMP_MS):
        raise _error(
            path,
            line,
            "timestamp",
            f"must be finite, >= 0 and <= 2**53 ms, got {value!r}"[:200],
        )
    if isinstance(value, int):
        return value * _NS_PER_MS
    return round(value * _NS_PER_MS)


def _parse_block_id(text: str, path: Path, line: int) -> int:
    """A block id of a CSV ``hash_ids`` field: a non-negative integer, the rule of a JSON
    list's ids (:func:`_json_block_ids`; ids are names, not token counts, so no cap)."""
    # int() of a > 4,300-digit string raises ValueError: 4,000 digits are ids enough.
    if not _INT_RE.fullmatch(text) or len(text) > 4_000 or text.startswith("-"):
        raise _error(path, line, "hash_ids", "must be a list of non-negative integers, got "
                     f"{text[:40]!r}")
    return int(text)


def _json_block_ids(value: object, prompt: int, path: Path, line: int,
                    block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[int, ...]:
    # type() is int refuses bool (an int subclass) as the per-item isinstance check did;
    # one C-level pass over the types and one min() instead of a generator per id
    if not isinstance(value, list) or not set(map(type, value)) <= {int} or (
            value and min(value) < 0):
        raise _error(path, line, "hash_ids", "must be a list of non-negative integers")
    expected = -(-prompt // block_tokens)
    if len(value) != expected:
        raise _error(
            path,
            line,
            "hash_ids",
            f"{len(value)} block ids for {prompt} prompt tokens; expected "
            f"ceil({prompt} / {block_tokens}) = {expected}",
        )
    return tuple(value)


def _read_mooncake(path: Path) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    clamped = 0
    for line, obj in _json_objects(path):
        for field in ("timestamp", "input_length", "output_length"):
            if field not in obj:
                raise _error(path, line, field, "missing field")
        arrival_ns = _json_time_ns(obj["timestamp"], path, line)
        prompt = _json_count(obj["input_length"], path, line, "input_length")
        output = _json_count(obj["output_length"], path, line, "output_length")
        output, was_clamped = _check_lengths(prompt, output, path, line, "input_length")
        clamped += was_clamped
        blocks = None
        if "hash_ids" in obj:
            blocks = _json_block_ids(obj["hash_ids"], prompt, path, line)
        rows.append(_Row(len(rows), arrival_ns, prompt, output, blocks))
    return rows, clamped


GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
"""Required columns (CSV) or keys (JSONL) of the generic format; optional: ``hash_ids``,
``max_tokens``."""


GENERIC_OPTIONAL = ("hash_ids", "max_tokens")
"""Optional columns (CSV) or keys (JSONL) of the generic format."""


def _refuse_unknown(names: Iterable[str], path: Path, line: int) -> None:
    """Refuse a generic trace's column or key that is not in the format (a misspelt
    ``max_tokens`` would otherwise be dropped and the requests run uncapped). An empty
    CSV header name (a spreadsheet's trailing comma) is not a field.

    Raises:
        TraceError: names the first unknown field and the known ones.
    """
    known = GENERIC_COLUMNS + GENERIC_OPTIONAL
    unknown = sorted(n for n in names if n and n not in known)  # "": a trailing comma
    if unknown:
        raise _error(path, line, unknown[0],
                     f"unknown field (the generic format has {', '.join(known)})")


def _arrival_ns(value: object, path: Path, line: int, text: bool) -> int:
    """``arrival_s`` (seconds: a number, or its text in a CSV file, ``text``) to integer
    nanoseconds. A JSON string (``"0"``) is refused like a JSON string count: JSON lines
    give numbers as numbers.

    Raises:
        TraceError: not a number (a bool, a JSON string, unparsable CSV text, or text
            with a ``_`` digit separator), or not finite, ``>= 0`` and at most
            :data:`MAX_MOONCAKE_TIMESTAMP_MS` / 1,000 seconds.
    """
    if isinstance(value, str) and not text:
        raise _error(path, line, "arrival_s", f"not a number: {value!r} (a JSON string; "
                     f"write the number itself)"[:200])
    if isinstance(value, str):
        raw = value
        try:
            if "_" in raw:  # float() reads "1_0" as 10; counts refuse the digit separator
                raise ValueError(raw)
            value = float(raw.strip())
        except ValueError:
            raise _error(path, line, "arrival_s", f"not a number: {raw[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(path, line, "arrival_s", f"not a number: {value!r}"[:200])
    finite = isinstance(value, int) or math.isfinite(value)
    if not (finite and 0 <= value <= MAX_MOONCAKE_TIMESTAMP_MS / 1000):
        raise _error(path, line, "arrival_s", f"must be finite, >= 0 and at most "
                     f"{MAX_MOONCAKE_TIMESTAMP_MS / 1000:,.0f} seconds, got {value!r}")
    return round(value * _NS_PER_S)


def _generic_row(index: int, fields: Mapping[str, object], path: Path, line: int,
                 block_tokens: int, text: bool) -> tuple[_Row, bool]:
    count = _parse_count if text else _json_count
    arrival = _arrival_ns(fields["arrival_s"], path, line, text)
    prompt = count(fields["prompt_tokens"], path, line, "prompt_tokens")  # type: ignore[arg-type]
    output = count(fields["output_tokens"], path, line, "output_tokens")  # type: ignore[arg-type]
    output, clamped = _check_lengths(prompt, output, path, line, "prompt_tokens")
    blocks = None
    raw_blocks = fields.get("hash_ids")
    if raw_blocks is not None and raw_blocks != "":
        if isinstance(raw_blocks, str):
            if not text:  # JSONL: a JSON list, as documented (a string is not parsed)
                raise _error(path, line, "hash_ids", "must be a list of non-negative integers")
            parts = raw_blocks.replace(";", " ").split()
            raw_blocks = [_parse_block_id(p, path, line) for p in parts]
        blocks = _json_block_ids(raw_blocks, prompt, path, line, block_tokens)
    cap = fields.get("max_tokens")
    max_tokens = None
    if cap is not None and cap != "":
        max_tokens = count(cap, path, line, "max_tokens")  # type: ignore[arg-type]
        if max_tokens < 1:
            raise _error(path, line, "max_tokens", "must be >= 1 token, got 0")
        if max_tokens < output:
            raise _error(path, line, "max_tokens",
                         f"{max_tokens} is below output_tokens ({output})")
    return _Row(index, arrival, prompt, output, blocks, max_tokens), clamped


def _read_generic(path: Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS
                  ) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    clamped = 0
    if path.suffix.lower() in (".jsonl", ".json"):
        for line, obj in _json_objects(path):
            for field in GENERIC_COLUMNS:
                if field not in obj:
                    raise _error(path, line, field, "missing field")
            _refuse_unknown(obj, path, line)
            row, was = _generic_row(len(rows), obj, path, line, block_tokens, text=False)
            rows.append(row)
            clamped += was
        return rows, clamped
    with path.open(encoding="utf-8-sig") as handle:
        try:
            header = {c.strip() for c in handle.readline().split(",")}
        except UnicodeDecodeError:
            raise _utf8_error(path) from None
    _refuse_unknown(header, path, 1)
    columns = GENERIC_COLUMNS + tuple(c for c in GENERIC_OPTIONAL if c in header)
    for line, fields in _csv_rows(path, columns):
        row, was = _generic_row(len(rows), fields, path, line, block_tokens, text=True)
        rows.append(row)
        clamped += was
    return rows, clamped


def _json_objects(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """(line number, object) for each non-blank line of a JSON-lines file.

    Raises:
        TraceError: a line that is not JSON or not an object, or an object that gives a
            field twice (JSON readers keep the last value silently; names the field and
            both values).
    """
    with path.open(encoding="utf-8-sig") as handle:
        try:
            lines = list(enumerate(handle, start=1))
        except UnicodeDecodeError:
            raise _utf8_error(path) from None
    for line, text in lines:
        if not text.strip():
            continue
        try:
            obj = user_json(text)
        except DuplicateFieldError as exc:
            raise _error(path, line, exc.field, f"given twice in one object ({exc.first!r}, "
                         f"then {exc.second!r})"[:300]) from None
        except ConfigError as exc:  # invalid or unusable JSON
            raise _error(path, line, "<json>", str(exc)) from None
        if not isinstance(obj, dict):
            raise _error(path, line, "<json>", "each line must be a JSON object")
        yield line, obj


def write_trace(trace: Trace, path: Path) -> Path:
    """Write ``trace`` in the generic format (CSV, or JSON lines for ``.jsonl``/``.json``):
    ``arrival_s`` (``repr`` of the float), ``prompt_tokens``, ``output_tokens``, and
    ``hash_ids`` / ``max_tokens`` when any request has them. :func:`load_trace` reads it
    back to the same requests (``block_tokens`` as written: pass it again).

    Raises:
        TraceError: the file cannot be written.
    """
    has_blocks = any(r.prefix_block_ids is not None for r in trace.requests)
    has_cap = any(r.max_tokens is not None for r in trace.requests)
    try:
        with path.open("w", encoding="utf-8", newline="") as handle:
            if path.suffix.lower() in (".jsonl", ".json"):
                for r in trace.requests:
                    obj: dict[str, object] = {"arrival_s": r.arrival_s,
                                              "prompt_tokens": r.prompt_tokens,
                                              "output_tokens": r.output_tokens}
                    if r.prefix_block_ids is not None:
                        obj["hash_ids"] = list(r.prefix_block_ids)
                    if r.max_tokens is not None:
                        obj["max_tokens"] = r.max_tokens
                    handle.write(json.dumps(obj) + "\n")
                return path
            writer = csv.writer(handle)
            writer.writerow([*GENERIC_COLUMNS, *(["hash_ids"] if has_blocks else []),
                             *(["max_tokens"] if has_cap else [])])
            for r in trace.requests:
                row: list[object] = [repr(r.arrival_s), r.prompt_tokens, r.output_tokens]
                if has_blocks:
                    row.append(" ".join(map(str, r.prefix_block_ids or ())))
                if has_cap:
                    row.append("" if r.max_tokens is None else r.max_tokens)
                writer.writerow(row)
    except OSError as exc:
        raise TraceError(f"{path}: cannot write trace: {exc.strerror or exc}") from None
    return path


_READERS = {
    TraceFormat.AZURE_2023: _read_azure,
    TraceFormat.MOONCAKE: _read_mooncake,
    TraceFormat.SHAREGPT_LENGTHS: _read_sharegpt,
}


def detect_format(path: Path) -> TraceFormat:
    """The format of a trace file, from its extension and first line.

    ``.jsonl`` / ``.json`` files are generic if the first object has ``arrival_s``, else
    Mooncake JSON lines; other files are CSV: generic if the header has ``arrival_s``, Azure
    2023 if it has ``TIMESTAMP``, ShareGPT lengths if it has ``num_prefill_tokens``.

    Raises:
        TraceError: the file cannot be read, or no known format matches (names the file).
    """
    suffix = path.suffix.lower()
    try:
        with path.open(encoding="utf-8-sig") as handle:
            header = handle.readline(65_536)
            while suffix in (".jsonl", ".json") and header and not header.strip():
                header = handle.readline(65_536)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace file: {exc}") from None
    except UnicodeDecodeError:
        raise _utf8_error(path) from None
    if suffix in (".jsonl", ".json"):
        return TraceFormat.GENERIC if '"arrival_s"' in header else TraceFormat.MOONCAKE
    columns = {c.strip() for c in header.strip().split(",")}
    if "arrival_s" in columns:
        return TraceFormat.GENERIC
    if "TIMESTAMP" in columns:
        return TraceFormat.AZURE_2023
    if "num_prefill_tokens" in columns:
        return TraceFormat.SHAREGPT_LENGTHS
    raise TraceError(
        f"{path}: line 1: unknown trace format (expected a .jsonl trace, or a CSV with an "
        f"arrival_s, TIMESTAMP or num_prefill_tokens column; header is {header.strip()!r})"
    )


def poisson_arrivals_s(count: int, *, rate: float, seed: int) -> np.ndarray:
    """Arrival times of a Poisson process, first arrival at 0.

    Gaps are exponential with mean ``1 / rate`` seconds drawn from
    ``numpy.random.default_rng(seed)``; ``count - 1`` gaps are drawn, so the same seed gives
    the same first k arrivals for every ``count >= k``.

    Args:
        count: number of arrivals (>= 0).
        rate: requests per second (> 0).
        seed: seed of the numpy Generator.

    Returns:
        float64 array of shape ``(count,)``, seconds, non-decreasing.

    Raises:
        ConfigError: ``count < 0`` or ``rate`` not finite and positive.
    """
    if count < 0:
        raise ConfigError(f"count must be >= 0, got {count}")
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate must be a finite positive number of requests/s, got {rate!r}")
    arrivals = np.zeros(count, dtype=np.float64)
    if count > 1:
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count - 1)
        arrivals[1:] = np.cumsum(gaps)
    return arrivals


def _resolve(name_or_path: str | Path) -> tuple[Path, BundledTrace | None]:
    if isinstance(name_or_path, str) and name_or_path in BUNDLED_TRACES:
        bundled = BUNDLED_TRACES[name_or_path]
        path = Path(str(resources.files("kvchain.sim").joinpath("data", bundled.filename)))
        return path, bundled
    if not str(name_or_path):  # Path("") is ".", the current folder
        raise TraceError(f"a trace is a file or a bundled name, got an empty name (bundled: "
                         f"{', '.join(BUNDLED_TRACES)})")
    path = Path(name_or_path)
    if path.is_dir():
        raise TraceError(f"{path}: is a folder, not a trace file")
    if not path.is_file():
        raise TraceError(
            f"{path}: no such trace file, and not a bundled trace name "
            f"(bundled: {', '.join(BUNDLED_TRACES)})"
        )
    return path, None


def _check_options(first: int | None, start_s: float, end_s: float | None,
                   rate_scale: float, rate: float | None, seed: int, block_tokens: int
                   ) -> None:
    """Refuse :func:`load_trace` options of the wrong type (counts are Python ints, times
    and rates ints or floats, never bools: :func:`~kvchain.field_types.type_problem`, as
    :class:`~kvchain.sim.run_options.RunOptions` reads the same fields) or out of range.

    Raises:
        ConfigError: the first option that is wrong, named.
    """
    for name, value, kind in (("first", first, int), ("start_s", start_s, float),
                              ("end_s", end_s, float), ("rate_scale", rate_scale, float),
                              ("rate", rate, float), ("seed", seed, int),
                              ("block_tokens", block_tokens, int)):
        optional = name in ("first", "end_s", "rate")
        problem = (None if value is None and optional else "given" if value is None
                   else type_problem(value, kind))
        if problem is not None:
            raise ConfigError(f"{name} must be {problem}, got {value!r}")
    if first is not None and first < 1:
        raise ConfigError(f"first must be a positive number of requests, got {first!r}")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ConfigError(f"start_s must be finite and >= 0 seconds, got {start_s!r}")
    if end_s is not None and not (end_s > start_s):
        raise ConfigError(f"end_s must be greater than start_s ({start_s} s), got {end_s!r}")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ConfigError(f"rate_scale must be finite and > 0, got {rate_scale!r}")
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed!r}")
    if block_tokens < 1:
        raise ConfigError(f"block_tokens must be >= 1, got {block_tokens!r}")


def load_trace(
    name_or_path: str | Path,
    *,
    first: int | None = None,
    start_s: float = 0,
    end_s: float | None = None,
    rate_scale: float = 1.0,
    rate: float | None = None,
    seed: int = 0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> Trace:
    """Load a bundled trace by name, or a trace file by path, and cut it.

    The cuts apply in this order, on trace seconds (t = 0 is the earliest arrival):

    1. arrival times: from the file, or for ShareGPT lengths a Poisson process
       (:func:`poisson_arrivals_s`) at ``rate`` requests/s (default
       :data:`DEFAULT_POISSON_RATE_RPS`) with ``seed``, assigned in file order;
    2. time window: keep ``start_s <= arrival_s < end_s``, then subtract ``start_s`` (the
       window starts at 0; a gap before its first request is kept);
    3. ``first``: keep the first N requests (in arrival order) of what is left;
    4. ``rate_scale``: divide every arrival time by it (2.0 = twice the arrival rate).

    Example: ``load_trace("azure-conv", end_s=3600)`` keeps the first hour (19,366 requests:
    the whole trace spans 3,501.7 s); ``load_trace("sharegpt", rate=2.0, first=100)`` gives
    100 ShareGPT requests arriving at 2 requests/s.

    Args:
        name_or_path: a name in :data:`BUNDLED_TRACES` or a path to a ``.csv`` / ``.jsonl``
            file of one of the :class:`TraceFormat` formats (detected by
            :func:`detect_format`).
        first: keep at most this many requests (>= 1); None keeps all.
        start_s: window start, seconds (>= 0).
        end_s: window end (exclusive), seconds (> start_s); None means no end.
        rate_scale: arrival-rate multiplier (> 0).
        rate: Poisson rate (requests/s) for traces without arrival times.
        seed: Poisson seed.
        block_tokens: tokens per ``hash_ids`` block of a generic trace (>= 1; Mooncake's
            are always 512, so another value with a Mooncake file is an error).

    Returns:
        the :class:`Trace`, requests sorted stably by arrival.

    Raises:
        TraceError: unknown name / missing file, or a malformed file (names the file, line
            and field: bad integer, negative or zero prompt tokens, a count above
            :data:`MAX_TOKEN_COUNT`, missing column, unparsable timestamp or one above
            :data:`MAX_MOONCAKE_TIMESTAMP_MS`, wrong hash_ids length, invalid JSON, JSON
            nested too deep or with a > 4,300-digit integer, a CSV field over
            ``csv.field_size_limit()``, bytes that are not UTF-8). A leading UTF-8
            byte-order mark is accepted.
        ConfigError: an option of the wrong type (a count not an int, a time or rate not
            a number, a bool for either) or out of range (:func:`_check_options`),
            ``rate`` given for a trace that has arrival times, or a cut that leaves no
            request.
    """
    _check_options(first, start_s, end_s, rate_scale, rate, seed, block_tokens)
    path, bundled = _resolve(name_or_path)
    fmt = bundled.format if bundled is not None else detect_format(path)
    if fmt is TraceFormat.MOONCAKE and block_tokens != MOONCAKE_BLOCK_TOKENS:
        raise ConfigError(f"Mooncake hash_ids blocks are {MOONCAKE_BLOCK_TOKENS} tokens; "
                          f"block_tokens {block_tokens} applies to generic traces only")
    rows, clamped = (_read_generic(path, block_tokens) if fmt is TraceFormat.GENERIC
                     else _READERS[fmt](path))
    name = bundled.name if bundled is not None else path.stem
    if not rows:
        raise TraceError(f"{path}: trace has no data rows")
    ordered, arrival_s = _arrivals(rows, fmt, rate, seed, name, path)
    requests = _cut(ordered, arrival_s, first, start_s, end_s, rate_scale)
    if not requests:
        raise ConfigError(
            f"trace {name!r}: the window [{start_s}, {end_s}) s holds no request "
            f"(the trace spans {arrival_s[-1]:.3f} s)"
        )
    if bundled is not None:
        source, license_ = bundled.source, bundled.license
    else:
        source, license_ = f"file {path}", "unknown (user file)"
    return Trace(
        name=name,
        requests=tuple(requests),
        source=source,
        license=license_,
        zero_output_rows=clamped,
        block_tokens=block_tokens,
    )


def _arrivals(rows: list[_Row], fmt: TraceFormat, rate: float | None, seed: int,
              name: str, path: Path) -> tuple[list[_Row], list[float]]:
    """The rows in arrival order and their arrival times (s, the first at 0): the file's
    times (sorted stably: ties keep file order), or for ShareGPT lengths a Poisson process
    at ``rate`` (default :data:`DEFAULT_POISSON_RATE_RPS`) with ``seed``, in file order.

    Raises:
        ConfigError: ``rate`` given for a trace with arrival times.
        TraceError: a row without an arrival time.
    """
    if fmt is TraceFormat.SHAREGPT_LENGTHS:
        arrivals = poisson_arrivals_s(
            len(rows), rate=DEFAULT_POISSON_RATE_RPS if rate is None else rate, seed=seed
        )
        return rows, arrivals.tolist()
    if rate is not None:
        raise ConfigError(
            f"trace {name!r} has arrival times; rate applies only to traces without "
            "them (use rate_scale to speed it up or slow it down)"
        )
    times = [r.arrival_ns for r in rows]
    if any(t is None for t in times):
        raise TraceError(f"{path}: a row without an arrival time")
    stamped = sorted(((t, r) for t, r in zip(times, rows, strict=True) if t is not None),
                     key=lambda tr: tr[0])  # stable: ties keep file order
    origin = stamped[0][0]
    return [r for _, r in stamped], [(t - origin) / _NS_PER_S for t, _ in stamped]


def _cut(ordered: list[_Row], arrival_s: list[float], first: int | None, start_s: float,
         end_s: float | None, rate_scale: float) -> list[TraceRequest]:
    """The requests of ``ordered`` (arrival times ``arrival_s``, s) in the window
    ``[start_s, end_s)`` moved to start at 0, at most ``first`` of them, their times divided
    by ``rate_scale``.

    Raises:
        ConfigError: a ``rate_scale`` so small that a scaled time passes the limit of a
            trace's times (:data:`MAX_MOONCAKE_TIMESTAMP_MS` / 1,000 s, as the loaders
            check them: past it float seconds lose the milliseconds a step takes, and the
            latencies came out wrong).
    """
    limit = MAX_MOONCAKE_TIMESTAMP_MS / 1000
    requests: list[TraceRequest] = []
    for row, t in zip(ordered, arrival_s, strict=True):
        if t < start_s or (end_s is not None and t >= end_s):
            continue
        if first is not None and len(requests) >= first:
            break
        scaled = (t - start_s) / rate_scale
        if not scaled <= limit:  # an infinite time included
            raise ConfigError(f"rate_scale {rate_scale!r} puts the arrival at {t - start_s:g} s "
                              f"at {scaled:g} s, past the {limit:,.0f} s limit of a trace's "
                              f"times (a larger --rate-scale)")
        requests.append(
            TraceRequest(
                request_id=row.row_index,
                arrival_s=scaled,
                prompt_tokens=row.prompt_tokens,
                output_tokens=row.output_tokens,
                prefix_block_ids=row.prefix_block_ids,
                max_tokens=row.max_tokens,
            )
        )
    return requests
