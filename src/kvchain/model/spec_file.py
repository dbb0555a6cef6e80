"""Spec files: a model declared by its class bytes in a JSON object (``--spec FILE``).

Format (every field optional but one class; ``null`` is the same as leaving a field out)::

    {"name": "my-model", "full": 32000, "window": 0, "window_tokens": null,
     "local": 0, "chunk_tokens": null, "state": 50000000}

Fields are the keyword arguments of :func:`~kvchain.model.declared.declare_model`
(``locals`` for its ``locals_``), read from its signature so the two never differ:
``full``/``window``/``local`` bytes per token of the class (all layers, K and V);
``window_tokens`` ``W``; ``chunk_tokens`` ``C``; ``state`` bytes per request of all state
layers; ``windows``/``locals`` more classes, each ``{"bytes": int, "tokens": int}``;
``weight_bytes``, ``hidden_size``, ``num_attention_heads``, ``total_params``,
``active_params`` for the GPU memory and cost models; ``name`` (default: the file's stem)
and ``source`` (default: ``"declared in <path>"``), strings.

Every number is checked once, by :func:`~kvchain.model.declared.declared_count` inside
``declare_model`` (ints only, bools refused, non-negative; token counts positive), so the
API and the CLI refuse the same values with the same :class:`~kvchain.errors.ConfigError`.
This module adds what only a file can get wrong: an unknown field, a missing partner
field, a class entry of the wrong shape, a name or source that is not a string, a field
given twice in one object (JSON readers keep the last silently; a file that sets ``full``
twice says two things, so it is refused).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvchain.errors import ConfigError
from kvchain.model.declared import declare_model
from kvchain.model.spec import ModelSpec
from kvchain.unique_fields import user_json

_PARAM_OF_FIELD = {"locals": "locals_"}
_CLASS_LISTS = ("windows", "locals")
_STRINGS = ("name", "source")

SPEC_FILE_FIELDS: tuple[str, ...] = tuple(
    next((f for f, p in _PARAM_OF_FIELD.items() if p == name), name)
    for name in inspect.signature(declare_model).parameters
)
"""Every field a spec file may have: :func:`declare_model`'s parameters."""


def _class_list(field: str, value: object) -> list[tuple[object, object]]:
    if not isinstance(value, list):
        raise ConfigError(f"{field!r} must be a list of "
                          f'{{"bytes": int, "tokens": int}}, got {value!r}')
    out = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"bytes", "tokens"}:
            raise ConfigError(f'each {field!r} entry needs "bytes" and "tokens" (and '
                              f"nothing else), got {entry!r}")
        out.append((entry["bytes"], entry["tokens"]))
    return out


def _unknown_fields(unknown: Sequence[str]) -> str:
    """The refusal text for unknown spec-file fields: each named, with the closest known
    field when one is close (``'fulll' (did you mean 'full'?)``), then the known ones."""
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, SPEC_FILE_FIELDS, n=1)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    word = "field" if len(unknown) == 1 else "fields"
    return f"unknown {word} {', '.join(named)}; known: {', '.join(sorted(SPEC_FILE_FIELDS))}"


def spec_from_mapping(data: object, *, default_name: str, default_source: str) -> ModelSpec:
    """The declared model of a parsed spec file.

    Args:
        data: the parsed JSON.
        default_name: the name when ``name`` is absent (the CLI gives the file's stem).
        default_source: the source text when ``source`` is absent.

    Raises:
        ConfigError: not a JSON object; an unknown field (names it and lists the known
            ones); a ``name``/``source`` that is not a string; a ``windows``/``locals``
            entry that is not ``{"bytes", "tokens"}``; and every refusal of
            :func:`declare_model` (a non-int or negative count, ``window`` without
            ``window_tokens``, no class...), each naming the field.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(SPEC_FILE_FIELDS))
    if unknown:
        raise ConfigError(_unknown_fields(unknown))
    given = {k: v for k, v in data.items() if v is not None}
    for key in _STRINGS:
        if key in given and not isinstance(given[key], str):
            raise ConfigError(f"{key!r} must be a string, got {given[key]!r}")
    kwargs: dict[str, object] = {}
    for key, value in given.items():
        kwargs[_PARAM_OF_FIELD.get(key, key)] = (
            _class_list(key, value) if key in _CLASS_LISTS else value)
    kwargs.setdefault("name", default_name)
    kwargs.setdefault("source", default_source)
    name = kwargs.pop("name")
    return declare_model(name, **kwargs)  # type: ignore[arg-type]


def load_spec_file(path: str | Path) -> ModelSpec:
    """Read a spec file (see the module doc) as a declared :class:`ModelSpec`.

    Raises:
        ConfigError: the file cannot be read or is not JSON, a field given twice in one
            object, or any refusal of :func:`spec_from_mapping`; the message starts with
            ``spec file <path>:``.
    """
    path = Path(path)
    try:
        data = user_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ConfigError and UnicodeDecodeError included
        raise ConfigError(f"spec file {path}: {exc}") from None
    try:
        return spec_from_mapping(data, default_name=path.stem,
                                 default_source=f"declared in {path}")
    except ConfigError as exc:
        raise ConfigError(f"spec file {path}: {exc}") from None
