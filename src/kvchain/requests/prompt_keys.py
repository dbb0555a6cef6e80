"""The one rule for a prompt's page keys and length as the request layer takes them
(:func:`check_page_keys`): the attach of a request (:mod:`kvchain.requests.attach`), the
prefix cache's pure queries (:meth:`~kvchain.requests.cache_glue.CacheGlue.points_for`,
:meth:`~kvchain.requests.cache_glue.CacheGlue.cached_tokens`) and the scheduler's
``add`` all check them here. A module of its own so that each of them can import it
(the attach imports the glue)."""

from __future__ import annotations

from collections.abc import Sequence

from kvchain.errors import InvalidRequestError


def check_prompt_tokens(rid: object, prompt_tokens: object, caller: str | None = None) -> int:
    """A prompt's length, checked: an int >= 1 (not a bool, a float or ``None``).

    Args:
        rid: the request (named in the error unless ``caller`` is given).
        prompt_tokens: ``L``, the prompt length in tokens.
        caller: the query named in the error instead of the request (a pure query has
            no request id).

    Returns:
        ``prompt_tokens``.

    Raises:
        InvalidRequestError: a length that is not an int >= 1.
    """
    if type(prompt_tokens) is not int or prompt_tokens < 1:
        raise InvalidRequestError(f"{caller or f'request {rid}'}: prompt_tokens must be an "
                                  f"int >= 1, got {prompt_tokens!r}")
    return prompt_tokens


def check_page_keys(rid: object, keys: object, prompt_tokens: object,
                    page_size: int, caller: str | None = None) -> tuple[int, ...]:
    """A prompt's page keys, checked: one int key per whole page of the prompt, i.e.
    ``prompt_tokens // page_size`` of them (a partial last page is never keyed:
    :mod:`kvchain.cache.keys`, whose ``page_keys_from_tokens`` and
    ``page_keys_from_blocks`` return exactly ``floor(L / P)`` keys).

    Cheap enough for the scheduler's every step: a tuple of keys is not copied, and the
    key check is one scan of their types (``set(map(type, keys))``).

    Args:
        rid: the request (named in the error unless ``caller`` is given).
        keys: the keys (a sequence of ints, not a string).
        prompt_tokens: ``L``, the prompt length in tokens (an int >= 1,
            :func:`check_prompt_tokens`).
        page_size: ``P``, tokens per page of the chain.
        caller: the query named in the error instead of the request.

    Returns:
        The keys as a tuple.

    Raises:
        InvalidRequestError: keys that are not a sequence of ints (a bool or a float key
            included), a prompt length that is not an int >= 1, or a count other than
            ``prompt_tokens // page_size`` (fewer would drop the prompt's last pages from
            the cache's insert, more would match pages the prompt does not have).
    """
    length = check_prompt_tokens(rid, prompt_tokens, caller)
    who = caller or f"request {rid}"
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise InvalidRequestError(f"{who}: page keys must be a sequence of ints, got "
                                  f"{type(keys).__name__} {keys!r}")
    out = tuple(keys)
    if not set(map(type, out)) <= {int}:
        raise InvalidRequestError(f"{who}: page keys must be ints, got "
                                  f"{sorted({type(k).__name__ for k in out})}")
    expected = length // page_size
    if len(out) != expected:
        raise InvalidRequestError(
            f"{who}: {len(out)} page keys for a prompt of {length:,} tokens: "
            f"expected one per whole page of {page_size} tokens, {expected:,}")
    return out
