"""One rule for files that name fields: a field named twice is refused.

JSON readers keep the last value of a key given twice in one object, and a CSV reader that
maps a header to columns keeps one of two columns of the same name, both silently; a file
that sets a field twice says two things, so every reader of a user's file refuses it
(spec files: :mod:`kvchain.model.spec_file`; request traces: :mod:`kvchain.sim.traces`,
JSON-lines objects and CSV headers alike).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvchain.errors import DuplicateFieldError


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
