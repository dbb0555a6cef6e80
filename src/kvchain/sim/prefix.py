"""Prefix-cache figures of a simulation: hit rate, evictions per band, copy-on-write state
copies, and the hit rate over time (what ``metrics.json["prefix_cache"]`` and the plot
show)."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.keys import page_keys_from_blocks
from kvchain.cache.radix import CacheGeometry, ResumePolicy, cache_refusal, resume_points
from kvchain.errors import TraceError
from kvchain.layout import ChainLayout
from kvchain.model.layers import LifetimeClass
from kvchain.sim.prefix_bounds import HitBound, lru_capacity_pages, walk_bound
from kvchain.sim.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceRequest


@dataclass(slots=True)
class PrefixCacheStats:
    """The prefix cache's figures over one run.

    Attributes:
        prompt_tokens: prompt tokens of the requests admitted (first admission each).
        hit_tokens: of which served by the cache (no prefill compute).
        evicted_pages: pages (state slots for a state band) evicted, per band label.
        cow_state_copies: checkpoint copies into a request's own state slot on a hit.
        cow_bytes: bytes those copies moved (slot bytes each).
        checkpoints_saved: state checkpoint slots written by prefills for the cache.
        interval_tokens: tokens between resume points.
        junctions_saved: prefills that saved a junction checkpoint (and window tail) where
            their prompt left a cached path (``CacheGlue.junctions_saved``).
        partial_hits: admissions whose hit was partial (``--partial-hits``): they shared
            the cache's pages past the deepest checkpoint and recomputed the gap.
        partial_tokens: those gaps' tokens: pages reused, compute not saved (not in
            ``hit_tokens``).
        infinite_bound: the infinite-cache hit rate of the same requests at the same page
            size (:func:`kvchain.sim.prefix_bounds.hit_bound`), or ``None`` if not computed.
        lru_bound: the LRU bound's hit rate with the run's whole buffer as full-attention
            pages (``lru_capacity_pages``), or ``None`` (not computed, or no full band).
        lru_capacity_pages: that LRU's capacity in pages, or ``None``.
        timeline: ``(t_s, prompt_tokens, hit_tokens)`` cumulative, after each step that
            admitted a request.
        host_timeline: with a host tier, ``(t_s, slots held per band)`` after each step
            that changed them (the host occupancy chart,
            :func:`kvchain.report.plots.host_chart`); empty without one.
        host_slot_bytes: with a host tier, bytes of one host slot per band (its page
            bytes) and ``host_slots`` the slots per band; empty without one.
    """

    prompt_tokens: int = 0
    hit_tokens: int = 0
    evicted_pages: dict[str, int] = field(default_factory=dict)
    cow_state_copies: int = 0
    cow_bytes: int = 0
    checkpoints_saved: int = 0
    interval_tokens: int = 0
    junctions_saved: int = 0
    partial_hits: int = 0
    partial_tokens: int = 0
    infinite_bound: float | None = None
    lru_bound: float | None = None
    lru_capacity_pages: int | None = None
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    host_timeline: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    host_slot_bytes: tuple[int, ...] = ()
    host_slots: tuple[int, ...] = ()

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0.0 before any admission)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        """The ``prefix_cache`` section of ``metrics.json`` (without the timeline)."""
        return {"prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
                "hit_rate": round(self.hit_rate, 6), "evicted_pages": dict(self.evicted_pages),
                "cow_state_copies": self.cow_state_copies, "cow_bytes": self.cow_bytes,
                "checkpoints_saved": self.checkpoints_saved,
                "junctions_saved": self.junctions_saved,
                "partial_hits": self.partial_hits, "partial_tokens": self.partial_tokens,
                "interval_tokens": self.interval_tokens,
                "infinite_cache_bound": _rounded(self.infinite_bound),
                "lru_bound": _rounded(self.lru_bound),
                "lru_capacity_pages": self.lru_capacity_pages}

    def bounds(self) -> dict[str, float]:
        """The bounds computed, as hit rates by name (``infinite cache``, ``LRU``): what
        :func:`kvchain.report.plots.hit_rate_chart` draws against the run's rate."""
        out: dict[str, float] = {}
        if self.infinite_bound is not None:
            out["infinite cache"] = self.infinite_bound
        if self.lru_bound is not None:
            out[f"LRU of the buffer ({self.lru_capacity_pages:,} pages)"] = self.lru_bound
        return out

    def add_bounds(self, trace: Trace, layout: ChainLayout,
                   admitted: Collection[int] | None = None,
                   page_keys: Mapping[int, tuple[int, ...] | None] | None = None
                   ) -> dict[str, float]:
        """Compute the infinite-cache and LRU bounds of ``trace``'s prompts at the run's
        page size (the LRU holding ``layout.buffer_bytes`` of full-attention pages) into
        this record; return them as ``extra`` counters in percent
        (``prefix_infinite_bound_pct``, ``prefix_lru_bound_pct``).

        ``admitted``: the request ids the run admitted (the requests whose prompts
        :attr:`prompt_tokens` counts); the bounds are then over those requests alone, so
        a request rejected (it never fits, or passes the context) or never reached by the
        run's end weighs in neither rate. ``None``: every request of the trace. A prompt
        without content keys counts as a miss in both, as in the run's rate.

        ``page_keys``: request id -> the page keys the run gave the request
        (:func:`request_page_keys` at the run's page size; ``None`` or absent: computed
        here from its block ids): the keys are computed once per request for the run and
        both bounds.

        Raises:
            InvalidRequestError: block ids that do not match a prompt's length."""
        page, block = layout.page_size, trace_block_tokens(trace)
        requests = (trace.requests if admitted is None else
                    [r for r in trace.requests if r.request_id in admitted])
        # A prompt without content keys can never hit, but the run's hit rate counts its
        # tokens: so do the bounds (hit_bound skips it), as misses.
        unkeyed = sum(r.prompt_tokens for r in requests if not r.prefix_block_ids)

        def rate(bound: HitBound) -> float:
            total = bound.prompt_tokens + unkeyed
            return bound.hit_tokens / total if total else 0.0

        known = page_keys or {}
        keyed = [(r.prompt_tokens, keys) for r in requests
                 if (keys := _bound_keys(r, known, block, page)) is not None]
        self.infinite_bound = rate(walk_bound(keyed, page))
        extra = {"prefix_infinite_bound_pct": round(100 * self.infinite_bound, 2)}
        full = layout.index_of(LifetimeClass.FULL)
        if full is not None:
            per_token = layout.bands[full].page_bytes // page
            self.lru_capacity_pages = lru_capacity_pages(layout.buffer_bytes, per_token, page)
            self.lru_bound = rate(walk_bound(keyed, page, self.lru_capacity_pages))
            extra["prefix_lru_bound_pct"] = round(100 * self.lru_bound, 2)
        return extra


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 6)


def default_cache_off_reason(trace: Trace, layout: ChainLayout) -> str | None:
    """Why the prefix cache is off by default (not asked for either way) for ``trace`` on
    ``layout``, in words, or ``None`` when it is on: it is on whenever the trace carries
    content keys, on every chain (any number of window and chunked-local bands, each
    keeping its own tails: docs/prefix-cache.md) but one the cache cannot key (several
    state bands, :func:`kvchain.cache.radix.cache_refusal`). ``layout`` is
    the chain the run uses."""
    if not has_content_keys(trace):
        return "the trace has no content keys"
    return cache_refusal(RequestGeometry.of(layout))


def trace_block_tokens(trace: Trace) -> int:
    """Tokens per content block of a trace's ``prefix_block_ids``: ``trace.block_tokens``
    where the trace format gives it, else 512 (the Mooncake traces' block)."""
    value = getattr(trace, "block_tokens", None)
    return int(value) if value else MOONCAKE_BLOCK_TOKENS


def has_content_keys(trace: Trace) -> bool:
    """Whether any request of the trace carries content block ids."""
    return any(r.prefix_block_ids for r in trace.requests)


def host_interval_tokens(trace: Trace, geom: CacheGeometry, interval_tokens: int,
                         policy: ResumePolicy) -> int:
    """The resume interval a host tier is split by (:func:`kvchain.cache.host_tier.host_tier_plan`)
    for this trace: the device cache's interval times the mean spacing of the resume
    points its prompts keep, in intervals (whole pages over points, summed over the
    trace's prompts with content keys; at least 1, rounded to the nearest whole
    interval).

    Why: a host tier buys one state slot and one window tail per interval. Where a prompt
    keeps a checkpoint only every ``K`` intervals (``SPACED`` on a state chain: the
    checkpoint budget of :func:`kvchain.cache.radix.spaced_budget`), a split by the plain
    interval leaves ``K - 1`` of every ``K`` state slots empty while the full pages run out
    (qwen3-next-80b-a3b at 16 GiB: a checkpoint slot is 39.5 MB, three intervals' full
    pages). ``BLOCKS`` (every interval) gives the plain interval. A block-aligned
    prompt's resend point (:func:`~kvchain.cache.radix.resend_point`, one page below its
    last) is left out of the count on purpose: it adds one slot a page from another, no
    spacing, and counting it would shorten the interval of a trace by how many of its
    prompts happen to end on a page boundary.

    Raises:
        InvalidRequestError: as :func:`~kvchain.cache.radix.resume_points`.
    """
    page = geom.page_size
    ipages = interval_tokens // page
    pages = points = 0
    for r in trace.requests:
        if not r.prefix_block_ids:
            continue
        n = r.prompt_tokens // page
        pts = resume_points(geom, n, ipages, policy)
        pages += n
        points += len(pts)
    if not points:
        return interval_tokens
    return interval_tokens * max(1, round(pages / points / ipages))


def _bound_keys(request: TraceRequest, known: Mapping[int, tuple[int, ...] | None],
                block_tokens: int, page_tokens: int) -> tuple[int, ...] | None:
    """The page keys a bound counts ``request`` with: the run's (``known``), else those of
    its block ids, else ``None`` (no content ids: skipped, as
    :func:`~kvchain.sim.prefix_bounds.keyed_prompts` skips it)."""
    keys = known.get(request.request_id)
    if keys is None and request.prefix_block_ids is not None:
        keys = page_keys_from_blocks(request.prefix_block_ids, block_tokens,
                                     request.prompt_tokens, page_tokens)
    return keys


def truncated_request(request: TraceRequest, prompt_tokens: int,
                      block_tokens: int) -> TraceRequest:
    """``request`` with its prompt cut to its first ``prompt_tokens`` tokens (``--truncate``
    keeps the head: the model reads the start of a prompt past its context), and its
    content blocks to those the head covers (``ceil(prompt_tokens / block_tokens)``), so
    the prefix cache keys it as the prompt it serves and its bounds count that prompt.

    Raises:
        TraceError: ``prompt_tokens`` not in ``[1, request.prompt_tokens]``.
    """
    if not 1 <= prompt_tokens <= request.prompt_tokens:
        raise TraceError(f"request {request.request_id}: cannot truncate a prompt of "
                         f"{request.prompt_tokens:,} tokens to {prompt_tokens:,}")
    ids = request.prefix_block_ids
    kept = None if ids is None else ids[:-(-prompt_tokens // block_tokens)]
    return replace(request, prompt_tokens=prompt_tokens, prefix_block_ids=kept)


def request_page_keys(request: TraceRequest, block_tokens: int,
                      page_tokens: int) -> tuple[int, ...] | None:
    """Page keys of a trace request (``None`` without block ids).

    Raises:
        TraceError: block ids that do not cover the prompt (wrong count).
    """
    ids: Sequence[int] | None = request.prefix_block_ids
    if not ids:
        return None
    try:
        return page_keys_from_blocks(ids, block_tokens, request.prompt_tokens, page_tokens)
    except ValueError as exc:
        raise TraceError(f"request {request.request_id}: {exc}") from None


def warm_cold_trace(requests: int = 400, *, documents: int = 8, document_tokens: int = 8192,
                    query_tokens: int = 256, cold_tokens: int = 8192, output_tokens: int = 64,
                    rate_per_s: float = 4.0, seed: int = 0,
                    block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """A warm/cold interleaved trace: even requests are *warm* (one of ``documents``
    shared documents, round robin, plus a query of their own), odd ones *cold* (a prompt
    of their own, sharing nothing). Arrivals are Poisson at ``rate_per_s`` (seeded).
    What a cache-aware admission order is measured on: a cold request admitted ahead of
    warm ones may evict the documents they would hit.

    Args:
        requests: requests (>= 1).
        documents: shared documents (>= 1).
        document_tokens, query_tokens, cold_tokens: prompt parts in tokens (document and
            query: warm prompt ``document_tokens + query_tokens``; cold: ``cold_tokens``);
            ``document_tokens`` a multiple of ``block_tokens`` so documents end on a
            content-block boundary.
        output_tokens: output tokens of every request.
        rate_per_s: mean arrival rate (requests per second, > 0).
        seed: seeds the arrival times.
        block_tokens: tokens per content block id (512, as the Mooncake traces).

    Raises:
        TraceError: a size below 1, a non-positive rate, or a document length that is not
            a multiple of ``block_tokens``.
    """
    sizes = {"requests": requests, "documents": documents, "document_tokens": document_tokens,
             "query_tokens": query_tokens, "cold_tokens": cold_tokens,
             "output_tokens": output_tokens, "block_tokens": block_tokens}
    for name, value in sizes.items():
        if type(value) is not int or value < 1:
            raise TraceError(f"{name} must be an int >= 1, got {value!r}")
    if not rate_per_s > 0:
        raise TraceError(f"rate_per_s must be > 0, got {rate_per_s!r}")
    if document_tokens % block_tokens:
        raise TraceError(f"document_tokens ({document_tokens}) must be a multiple of "
                         f"block_tokens ({block_tokens})")
    rng = random.Random(seed)
    doc_blocks = document_tokens // block_tokens
    next_id = documents * doc_blocks + 1  # ids 1.. are the documents' blocks
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rate_per_s)
        if i % 2 == 0:
            d = (i // 2) % documents
            own = -(-query_tokens // block_tokens)
            ids = tuple(range(1 + d * doc_blocks, 1 + (d + 1) * doc_blocks))
            prompt = document_tokens + query_tokens
        else:
            own = -(-cold_tokens // block_tokens)
            ids = ()
            prompt = cold_tokens
        ids = ids + tuple(range(next_id, next_id + own))
        next_id += own
        out.append(TraceRequest(i, t, prompt, output_tokens, prefix_block_ids=ids))
    return Trace(f"warm-cold-{requests}", tuple(out), "generated: kvchain.sim.prefix."
                 "warm_cold_trace", "-", block_tokens=block_tokens)
