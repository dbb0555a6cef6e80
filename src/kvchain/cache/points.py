"""Resume-point arithmetic of the prefix cache: where a cached prompt keeps window tails and
state checkpoints, in pages (pure functions of the chain's geometry; nothing here holds
state).

Owns :class:`ResumePolicy` and its ``SPACED`` budget (:func:`spaced_budget`), a prompt's
resume points (:func:`resume_points`, with its :func:`resend_point`), the junction a
request saves past its hit (:func:`junction_point`), the window pages a resume reads
(:func:`tail_pages`), and which chains the cache refuses (:func:`cache_refusal`). The tree
(:mod:`kvchain.cache.tree`) and the facade (:class:`kvchain.cache.radix.PrefixCache`) read
them; see the overview in :mod:`kvchain.cache.radix` and ``docs/prefix-cache.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from kvchain.bands.geometry import RequestGeometry
from kvchain.errors import InvalidRequestError
from kvchain.field_types import is_whole


class ResumePolicy(StrEnum):
    """Where a cached prompt keeps window tails and state checkpoints.

    ``BLOCKS``: every ``interval`` tokens and the prompt's last whole page (reaches the
    infinite-cache hit rate on the Mooncake trace when memory is unbounded; a running
    request keeps a window tail per block until it finishes). ``ENDS``: only the last
    interval boundary and the last whole page (where a conversation's next turn resumes;
    two tails per request, so little memory is held back when memory binds). ``SPACED``:
    every ``K`` interval boundaries counted back from the last one, ``K`` the least spacing
    that keeps a prompt within its checkpoint budget (:func:`spaced_budget`: the bytes a
    checkpoint costs against the buffer and against the prompt's own full pages);
    ``BLOCKS`` where the budget holds every boundary.
    ``AUTO`` (the default): ``SPACED`` on a chain with a state band, ``BLOCKS`` otherwise
    (:meth:`resolve`; why: docs/prefix-cache.md, "Where checkpoints go").
    """

    BLOCKS = "blocks"
    ENDS = "ends"
    SPACED = "spaced"
    AUTO = "auto"

    def resolve(self, geom: CacheGeometry) -> ResumePolicy:
        """The policy a cache on ``geom`` uses: ``AUTO`` -> ``SPACED`` with a state band
        (a checkpoint is a whole state slot, megabytes, so a prompt keeps as many as the
        budget allows), else ``BLOCKS``; others as they are."""
        if self is not ResumePolicy.AUTO:
            return self
        return ResumePolicy.SPACED if geom.state is not None else ResumePolicy.BLOCKS


# A prompt's checkpoints may cost at most 1/64 of the buffer (``spaced_budget``): tens of
# requests prefill at once in a buffer and each holds its checkpoints until its prompt is
# inserted, so one prompt's share stays a small part of the bytes (docs/prefix-cache.md).
SPACED_BUFFER_SHARE = 64


def spaced_budget(geom: CacheGeometry, whole_pages: int | None = None) -> int | None:
    """Resume points (state checkpoints) a prompt of ``whole_pages`` pages may keep under
    ``SPACED``: ``max(2, min(B // (64 * S), n * E // S))`` for a buffer of ``B`` bytes,
    state slots of ``S`` bytes and full-attention pages of ``E`` bytes: a prompt's
    checkpoints cost at most 1/64 of the buffer and at most what the ``n`` full pages they
    make resumable cost (no more memory to resume a prompt than to hold the KV a hit
    reuses), and never fewer than the two of ``ENDS``. A bound whose bytes the geometry
    does not know (``buffer_bytes`` or ``page_bytes`` 0; ``whole_pages`` ``None``) is
    left out; ``None``
    (no bound) without a state band, without ``slot_bytes``, or when both are left out.

    Raises:
        InvalidRequestError: a negative ``whole_pages``.
    """
    if whole_pages is not None and whole_pages < 0:
        raise InvalidRequestError(f"whole_pages must be >= 0, got {whole_pages}")
    if geom.state is None or geom.slot_bytes <= 0:
        return None
    bounds = []
    if geom.buffer_bytes > 0:
        bounds.append(geom.buffer_bytes // (SPACED_BUFFER_SHARE * geom.slot_bytes))
    if geom.page_bytes > 0 and whole_pages is not None:
        bounds.append(whole_pages * geom.page_bytes // geom.slot_bytes)
    return max(2, min(bounds)) if bounds else None


#: The geometry the cache reads (band roles, page size, the bytes of the ``SPACED``
#: budget): the request layer's one geometry object, not a copy of its fields.
CacheGeometry = RequestGeometry

def resend_point(page_size: int, whole_pages: int, prompt_tokens: int) -> int:
    """The deepest page count a resend of the same prompt can hit, in pages:
    ``min(n, (L - 1) // P)`` for a prompt of ``L`` tokens whose keys cover ``n`` whole
    pages (``nP <= L``). A hit always leaves at least one token to compute (the logits of
    the next token; :meth:`PrefixCache.match` caps it at ``(L - 1) // P`` pages, as vLLM
    and SGLang cap a full-prompt hit at ``L - 1`` tokens), so this is ``n`` except for a
    block-aligned prompt (``L = nP``), where it is ``n - 1``.

    Example: ``P = 16``, ``L = 1,008`` (63 pages): 62 (992 tokens); ``L = 1,009``: 63.

    Raises:
        InvalidRequestError: ``prompt_tokens`` below ``whole_pages * page_size`` (keys for
            more pages than the prompt has), a count that is not an int (Python or NumPy,
            never a bool) or is negative, or ``page_size < 1``.
    """
    for name, v, low in (("page_size", page_size, 1), ("whole_pages", whole_pages, 0),
                         ("prompt_tokens", prompt_tokens, 0)):
        if not is_whole(v) or v < low:
            raise InvalidRequestError(f"resend_point: {name} must be an int >= {low}, "
                                      f"got {v!r}")
    # Python ints from here: NumPy's fixed-width product would wrap (2**60 pages of 16).
    page_size, whole_pages, prompt_tokens = int(page_size), int(whole_pages), int(prompt_tokens)
    if prompt_tokens < whole_pages * page_size:
        raise InvalidRequestError(f"resend_point: {whole_pages} whole pages of {page_size} "
                                  f"tokens for a prompt of {prompt_tokens} tokens")
    return min(whole_pages, max(0, (prompt_tokens - 1) // page_size))


def resume_points(geom: CacheGeometry, whole_pages: int, interval_pages: int,
                  policy: ResumePolicy = ResumePolicy.BLOCKS,
                  prompt_tokens: int | None = None) -> tuple[int, ...]:
    """Page counts where a cached prompt of ``whole_pages`` pages keeps window tails and
    state checkpoints, sorted: every ``interval_pages`` pages (``BLOCKS``; ``ENDS``: only
    the last of them; ``SPACED``: see below; ``AUTO``: as :meth:`ResumePolicy.resolve`),
    ``whole_pages`` itself and, given the prompt's length ``prompt_tokens``, its
    :func:`resend_point` (``whole_pages - 1`` for a block-aligned prompt, else
    ``whole_pages`` again: nothing added).

    Why the resend point as well as the last page, not instead of it (docs/prefix-cache.md,
    "A block-aligned prompt and its resend"): the point ``n`` serves every prompt that
    extends this one (a conversation's next turn, whose hit may reach past ``n``), the
    point ``n - 1`` the prompt's own resend, which can never resume at ``n``. Keeping
    ``n`` also keeps a cached prompt's last point at its node's end, which the dead-page
    rule (:meth:`PrefixCache.dead_full_page_ids`, the ``LEAF`` order) reads: every full
    page below a checkpoint can hit. The cost is one more checkpoint slot and one more
    window page per windowed band (the tails at ``n - 1`` and ``n`` overlap) per aligned
    prompt (no chunk cut: the forward writes the state at ``(n - 1) P`` inside the chunk
    that passes it, as at every other point). ``SPACED``'s budget places the interval
    points; the resend point is one slot beyond it.

    ``SPACED`` with a budget of ``C`` points (:func:`spaced_budget` of the prompt) with ``L``
    interval boundaries: all of them when ``L <= C - 1``; otherwise every ``K``-th counted
    back from the last, ``L, L - K, L - 2K, ... > 0`` with ``K = ceil(L / (C - 1))`` (at
    most ``C - 1`` boundaries, so at most ``C`` points with the last whole page). E.g. 500
    pages, interval 32 (``L = 15``), ``C = 6``: ``K = 3``, points 96, 192, 288, 384, 480,
    500.

    Empty on a chain without a window/local or state band (every page boundary resumes).

    Raises:
        InvalidRequestError: as :func:`resend_point`.
    """
    resend = (whole_pages if prompt_tokens is None
              else resend_point(geom.page_size, whole_pages, prompt_tokens))
    if not geom.windows and geom.state is None:
        return ()
    resolved = ResumePolicy(policy).resolve(geom)
    last = whole_pages // interval_pages
    if resolved is ResumePolicy.ENDS:
        pts = [last * interval_pages] if last else []
    elif resolved is ResumePolicy.SPACED:
        budget = spaced_budget(geom, whole_pages)
        step = 1 if budget is None or last <= budget - 1 else -(-last // (budget - 1))
        pts = [b * interval_pages for b in range(last, 0, -step)][::-1]
    else:
        pts = list(range(interval_pages, whole_pages + 1, interval_pages))
    if whole_pages and (not pts or pts[-1] != whole_pages):
        pts.append(whole_pages)
    if 0 < resend < whole_pages and resend not in pts:
        pts.insert(len(pts) - 1, resend)  # just below the last page: still sorted
    return tuple(pts)


# A junction adding more than 1/20 of its prefix is worth a checkpoint (junction_point).
JUNCTION_SHARE = 20


def junction_point(geom: CacheGeometry, hit: int, matched: int, whole_pages: int,
                   points: Sequence[int], min_gain_pages: int) -> int:
    """The junction checkpoint a request saves for the cache, in pages (0: none).

    A prompt whose full-attention keys share ``matched`` pages with a cached path but can
    resume only after ``hit`` pages (no checkpoint or window tail deeper on that path)
    recomputes pages ``[hit, matched)``; so would every later prompt sharing that prefix.
    The request therefore keeps a resume point (state checkpoint and window tail) at
    ``matched``, where its prompt leaves the cached path (or where the cached path ends),
    and later prompts that share the prefix resume there. (Marconi-style admission in vLLM
    PRs #37898 and #47782 saves the state at the shared-prefix junction the same way;
    SGLang's unified radix tree records a branch-checkpoint target, sglang #22935.)

    Not worth it, so 0, when the point adds fewer than ``min(min_gain_pages,
    ceil(matched / 20))`` pages of resumable prefix beyond the deepest point at or below it
    (the hit, or one of the request's own ``points``): a gain of a whole interval is always
    worth a checkpoint, and so is one of more than 1/20 of the shared prefix (without it a
    later hit would miss more than 5 % of that prefix, the 95 % of issue 22's target: a
    6,000-token prefix with a checkpoint at 5,632 gets its junction at 6,000); also 0 when
    it is the prompt's own last whole page (already a point), or when nothing matched past
    the hit.

    Args:
        geom: the chain's geometry (a chain without window or state band resumes at every
            page: no junction needed).
        hit: pages the request resumes from (its hit).
        matched: pages its keys share with a cached path (``Hit.matched``).
        whole_pages: ``n``, the prompt's whole pages.
        points: the request's own resume points (page counts, any order).
        min_gain_pages: least pages of extra resumable prefix worth a checkpoint (>= 1).
    """
    if not geom.windows and geom.state is None:
        return 0
    q = min(matched, whole_pages)
    if q >= whole_pages or q <= hit:
        return 0
    below = max((p for p in points if p <= q), default=0)
    if q - max(below, hit) < max(1, min(min_gain_pages, -(-q // JUNCTION_SHARE))):
        return 0
    return q


def tail_pages(geom: CacheGeometry, point: int) -> dict[int, range]:
    """Per window or chunked-local band (by band index), the page indices a request needs
    to resume after ``point`` pages: ``[policy.resume_start(point), point)`` (each band by
    its own policy; empty without such bands)."""
    return {pol.band: range(pol.resume_start(point), point) for pol in geom.windows}


def cache_refusal(geom: CacheGeometry) -> str | None:
    """Why the prefix cache cannot serve a chain of ``geom``, in words, or ``None`` when it
    can: a radix node keeps one state checkpoint per resume point, and a request saves one
    checkpoint slot per point, so a chain with several state bands (a target's and a
    speculative-decoding draft model's, :func:`kvchain.model.with_draft`) is refused rather
    than cached in part (docs/design.md, "Draft model bands"). Any number of full-attention
    bands (each keeps its own page list per node) and of window and chunked-local bands
    (each keeps its own tails) is served."""
    if len(geom.states) <= 1:
        return None
    return (f"the chain has {len(geom.states)} state bands (e.g. a draft model's), and the "
            f"prefix cache keeps one state checkpoint per resume point")

