"""One rule for files that name fields: a field named twice is refused.

JSON readers keep the last value of a key given twice in one object, and a CSV reader that
maps a header to columns keeps one of two columns of the same name, both silently; a file
that sets a field twice says two things, so every reader of a user's file refuses it
(spec files: :mod:`kvchain.model.spec_file`; request traces: :mod:`kvchain.sim.traces`,
JSON-lines objects and CSV headers alike). :func:`user_json` is the one parser of a user's
JSON text: every way the text can fail (invalid, a number past Python's 4,300-digit limit,
nesting deeper than the parser's recursion) is a :class:`~kvchain.errors.ConfigError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kvchain.errors import ConfigError, DuplicateFieldError


def unique_fields(pairs: Iterable[tuple[str, object]]) -> dict[str, object]:
    """``(name, value)`` pairs as a dict, each name once: a JSON object's pairs (use it as
    ``json.loads(text, object_pairs_hook=unique_fields)``) or a CSV header's
    ``(column name, column number)``.

    Raises:
        DuplicateFieldError: a name given twice (``field``, ``first`` and ``second``: the
            name and its two values), before the rest is read.
    """
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateFieldError(
                f"field {key!r} is given twice ({out[key]!r}, then {value!r})",
                field=key, first=out[key], second=value)
        out[key] = value
    return out


def user_json(text: str, unique: bool = True) -> object:
    """``json.loads(text)`` of a user's file, each object's fields named once
    (:func:`unique_fields`; ``unique=False``: the last value kept, as ``json`` does).

    Raises:
        DuplicateFieldError: a field named twice in one object (``unique``).
        ConfigError: ``"invalid JSON: <what and where>"`` for text that is not JSON, or
            ``"unusable JSON: <why>"`` for an integer past Python's digit limit (4,300
            digits) or nesting past the interpreter's recursion limit (a RecursionError
            inside ``json``), the message cut at 300 characters; the caller prefixes
            the file it read.
    """
    try:
        return json.loads(text, object_pairs_hook=unique_fields if unique else None)
    except ConfigError:
        raise
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc}"[:300]) from None
    except (ValueError, RecursionError) as exc:  # > 4,300-digit int, deep nesting
        raise ConfigError(f"unusable JSON: {exc}"[:300]) from None
