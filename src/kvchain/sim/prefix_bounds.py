"""Hit-rate bounds of a prefix cache on a trace: what any cache could reach.

Two bounds over the prompts of a trace with content block ids (Mooncake ``hash_ids``),
both counting whole pages (``P`` tokens) keyed by the hash chain of
:func:`kvchain.cache.keys.page_keys_from_blocks`, requests in arrival order:

* **infinite cache**: a prompt page hits when its key appeared in an earlier prompt. With
  hash-chain keys a seen key implies its whole prefix was seen, so the hit of a prompt is
  its longest prefix of seen pages.
* **LRU of C pages**: the same, with at most ``C`` pages kept; each prompt's pages are
  touched (hits) or inserted right after its lookup, deepest page least recent, so a
  chain is evicted leaf first (an evicted parent would orphan its children).

Simplifications (the bounds are upper bounds of what a real engine gets): every prompt's
pages are cached at arrival (no wait for its prefill), output tokens are never cached (the
trace has no content ids for them), nothing is locked, and the capacity holds nothing but
cached pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable
from dataclasses import dataclass

from kvchain.cache.keys import page_keys_from_blocks
from kvchain.errors import ConfigError
from kvchain.sim.traces import TraceRequest

DEFAULT_BLOCK_TOKENS = 512
"""Tokens per content block of the Mooncake traces (their ``hash_ids``)."""

MAX_KEYED_PAGES = 2**25
"""Most page keys :func:`keyed_prompts` computes (33,554,432): a key costs about 80 B in
memory between the keys and the infinite cache's set (a Python int and two references),
some 2.7 GB at the limit; the whole bundled Mooncake trace is 9,049,613 pages at ``P =
16``. One 2**31-token prompt at ``P = 1`` would have been 2.1e9 keys (about 170 GB)."""


@dataclass(frozen=True, slots=True)
class HitBound:
    """A bound's totals.

    Attributes:
        requests: prompts counted (those with content ids).
        prompt_tokens: their tokens.
        hit_tokens: tokens in pages that hit.
        capacity_pages: the cache size (``None``: infinite).
    """

    requests: int
    prompt_tokens: int
    hit_tokens: int
    capacity_pages: int | None

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0.0 when nothing was counted)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def lru_capacity_pages(capacity_bytes: int, full_bytes_per_token: int, page_tokens: int) -> int:
    """Pages of full-attention KV that ``capacity_bytes`` hold: the LRU bound's ``C``
    (``max(floor(bytes / (bytes per token x P)), 1)``; 29,127 pages for 16 GiB of
    gpt-oss-120b at 36,864 B per token and 16 tokens a page).

    Raises:
        ConfigError: a size below 1.
    """
    for name, value in (("capacity_bytes", capacity_bytes),
                        ("full_bytes_per_token", full_bytes_per_token),
                        ("page_tokens", page_tokens)):
        if type(value) is not int or value < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    return max(capacity_bytes // (full_bytes_per_token * page_tokens), 1)


def keyed_prompts(requests: Iterable[TraceRequest], page_tokens: int,
                  block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[tuple[int, tuple[int, ...]]]:
    """``(prompt tokens, page keys)`` of each request with content block ids, in order
    (:func:`~kvchain.cache.keys.page_keys_from_blocks`; those without ids are skipped):
    what :func:`walk_bound` reads, computed once for any number of cache sizes.

    Raises:
        InvalidRequestError: block ids that do not match a prompt's length, or a size
            not an int >= 1.
        ConfigError: the prompts hold more than :data:`MAX_KEYED_PAGES` whole pages
            (before any key is computed).
    """
    keyed = [(r.prompt_tokens, r.prefix_block_ids) for r in requests
             if r.prefix_block_ids is not None]
    if type(page_tokens) is int and page_tokens >= 1:  # else the keys' check refuses it
        pages = sum(tokens // page_tokens for tokens, _ in keyed)
        if pages > MAX_KEYED_PAGES:
            raise ConfigError(f"the prompts make {pages:,} pages of {page_tokens} tokens, "
                              f"past the {MAX_KEYED_PAGES:,} a bound keys (about 80 B each "
                              f"in memory): a larger page size or fewer requests")
    return [(tokens, page_keys_from_blocks(ids, block_tokens, tokens, page_tokens))
            for tokens, ids in keyed]


def hit_bound(requests: Iterable[TraceRequest], page_tokens: int, *,
              capacity_pages: int | None = None,
              block_tokens: int = DEFAULT_BLOCK_TOKENS) -> HitBound:
    """The infinite-cache (``capacity_pages=None``) or LRU bound of a trace's prompts
    (:func:`walk_bound` over :func:`keyed_prompts`).

    Args:
        requests: in arrival order; those without ``prefix_block_ids`` are skipped.
        page_tokens: ``P``, tokens per page (>= 1).
        capacity_pages: LRU capacity in pages (>= 1), or ``None`` for an infinite cache.
        block_tokens: tokens per content block (512 for Mooncake).

    Returns:
        A :class:`HitBound`. On the bundled Mooncake conversation trace at ``P = 16`` the
        infinite-cache bound is 17.16% of prompt tokens over the first 600 requests and
        29.41% over the first 2,000 (tests/sim/test_prefix_bounds.py).

    Raises:
        ConfigError: ``page_tokens`` or ``capacity_pages`` not an int >= 1.
        InvalidRequestError: block ids that do not match a prompt's length.
    """
    _check_sizes(page_tokens, capacity_pages)
    return walk_bound(keyed_prompts(requests, page_tokens, block_tokens), page_tokens,
                      capacity_pages)


def _check_sizes(page_tokens: int, capacity_pages: int | None) -> None:
    """Refuse a page size or capacity that is not an int >= 1 (ConfigError)."""
    for name, value in (("page_tokens", page_tokens), ("capacity_pages", capacity_pages)):
        if value is not None and (type(value) is not int or value < 1):
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")


def walk_bound(keyed: Iterable[tuple[int, tuple[int, ...]]], page_tokens: int,
               capacity_pages: int | None = None) -> HitBound:
    """The bound of prompts given as ``(prompt tokens, page keys)`` in arrival order
    (:func:`keyed_prompts`): each hits its longest run of leading pages whose keys the
    cache holds (``P`` tokens a page), then every page of it becomes most recent, its
    deepest page least recent of them; an LRU of ``capacity_pages`` pages then evicts
    the least recent keys (``None``: an infinite cache, nothing evicted).

    Raises:
        ConfigError: ``page_tokens`` or ``capacity_pages`` not an int >= 1.
    """
    _check_sizes(page_tokens, capacity_pages)
    if capacity_pages is None:
        return _walk_infinite(keyed, page_tokens)
    lru: OrderedDict[int, None] = OrderedDict()
    count = prompt = hit = 0
    for tokens, keys in keyed:
        count += 1
        prompt += tokens
        hit += _leading_hits(keys, lru) * page_tokens
        for key in reversed(keys):  # the deepest page least recent: evicted first
            lru[key] = None
            lru.move_to_end(key)
        for _ in range(len(lru) - capacity_pages):
            lru.popitem(last=False)
    return HitBound(count, prompt, hit, capacity_pages)


def _walk_infinite(keyed: Iterable[tuple[int, tuple[int, ...]]],
                   page_tokens: int) -> HitBound:
    """:func:`walk_bound` of an infinite cache: nothing is evicted, so recency does not
    matter and the cache is the set of keys seen."""
    seen: set[int] = set()
    count = prompt = hit = 0
    for tokens, keys in keyed:
        count += 1
        prompt += tokens
        hit += _leading_hits(keys, seen) * page_tokens
        seen.update(keys)
    return HitBound(count, prompt, hit, None)


def _leading_hits(keys: tuple[int, ...], cached: Container[int]) -> int:
    """How many leading ``keys`` ``cached`` holds (pages)."""
    n = 0
    for key in keys:
        if key not in cached:
            break
        n += 1
    return n
