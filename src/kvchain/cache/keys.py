"""Content keys of pages: the hash chain a prefix cache matches on.

A page of ``P`` tokens at position ``j`` covers tokens ``[jP, (j + 1)P)``. Its key
depends on its own content and on its parent's key, so equal keys mean equal prefixes up
to and including that page (the block-hash chain of vLLM's automatic prefix caching
design; SGLang's radix tree matches the same prefixes token by token). Only whole pages
are keyed: a partial last page is never shared.

Two sources of content:

* **token ids** (a real engine, the library): :func:`page_keys_from_tokens`;
* **block ids** of a trace (Mooncake's ``hash_ids``: one id per block of
  ``block_tokens`` = 512 prompt tokens, the last block partial; equal ids mean equal
  block content): :func:`page_keys_from_blocks`. A page's key covers every block it
  overlaps and its end position, so a page inside a block that differs between two
  prompts never matches, and pages straddling two blocks need both.

Keys are Python ints (``hash`` of int tuples: deterministic across processes, unlike
``str`` hashing). A collision needs two different prefixes with equal 64-bit hashes.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvchain.errors import InvalidRequestError

ROOT_KEY = 0
"""The parent key of a prompt's first page."""


def _check_positive(name: str, value: int) -> None:
    if type(value) is not int or value < 1:
        raise InvalidRequestError(f"{name} must be an int >= 1, got {value!r}")


def page_keys_from_tokens(token_ids: Sequence[int], page_tokens: int) -> tuple[int, ...]:
    """Keys of the whole pages of a token sequence.

    Args:
        token_ids: the prompt's token ids (length ``L``).
        page_tokens: ``P``, tokens per page.

    Returns:
        ``floor(L / P)`` keys; key ``j`` = hash(key ``j - 1``, tokens of page ``j``).

    Raises:
        InvalidRequestError: ``page_tokens`` not an int >= 1, or a token id that is not a
            non-negative int.
    """
    _check_positive("page_tokens", page_tokens)
    tokens = tuple(token_ids)
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequestError(f"token ids must be non-negative ints, got {t!r}")
    keys: list[int] = []
    parent = ROOT_KEY
    for j in range(len(tokens) // page_tokens):
        parent = hash((parent, *tokens[j * page_tokens:(j + 1) * page_tokens]))
        keys.append(parent)
    return tuple(keys)


def page_keys_from_blocks(block_ids: Sequence[int], block_tokens: int, prompt_tokens: int,
                          page_tokens: int) -> tuple[int, ...]:
    """Keys of the whole pages of a prompt described by content block ids.

    Args:
        block_ids: one id per block of ``block_tokens`` prompt tokens (the last block may
            be partial): ``ceil(prompt_tokens / block_tokens)`` ids.
        block_tokens: tokens per content block (512 in the Mooncake traces).
        prompt_tokens: ``L``, the prompt length in tokens.
        page_tokens: ``P``, tokens per page.

    Returns:
        ``floor(L / P)`` keys; key ``j`` = hash(key ``j - 1``, ids of the blocks page ``j``
        overlaps, its end token ``(j + 1)P``).

    Raises:
        InvalidRequestError: a size not an int >= 1, an id that is not a non-negative int,
            or a block count other than ``ceil(L / block_tokens)``.
    """
    _check_positive("block_tokens", block_tokens)
    _check_positive("prompt_tokens", prompt_tokens)
    _check_positive("page_tokens", page_tokens)
    ids = tuple(block_ids)
    if not set(map(type, ids)) <= {int} or (ids and min(ids) < 0):  # one C-level scan
        for b in ids:  # name the first bad id (a bool, an int subclass, a negative)
            if type(b) is not int or b < 0:
                raise InvalidRequestError(f"block ids must be non-negative ints, got {b!r}")
    expected = -(-prompt_tokens // block_tokens)
    if len(ids) != expected:
        raise InvalidRequestError(f"{len(ids)} block ids for {prompt_tokens} tokens in blocks "
                                  f"of {block_tokens}: expected {expected}")
    keys: list[int] = []
    parent = ROOT_KEY
    span, blocks = (-1, -1), ids[:0]
    for end in range(page_tokens, prompt_tokens + 1, page_tokens):  # page j ends at (j + 1)P
        covered = ((end - page_tokens) // block_tokens, (end - 1) // block_tokens)
        if covered != span:  # the blocks page j overlaps (the same for a block's pages)
            span, blocks = covered, ids[covered[0]:covered[1] + 1]
        parent = hash((parent, end, *blocks))
        keys.append(parent)
    return tuple(keys)
