"""Type checks of a configuration dataclass's fields against their annotations.

A configuration value of the wrong type (a float page size, an enum's string where the
code compares members, the string ``"no"`` for a flag, which is truthy) either runs on
silently or fails deep inside a run with a bare ``TypeError``. :func:`check_field_types`
refuses it where the value is built, naming the field.

Rules, by the annotation with ``None`` removed (``int | None`` -> ``int``; ``None`` passes
only for such optional fields): an enum takes its members (not their values); ``bool``
takes ``True``/``False`` only; ``int`` takes Python ints only (never a bool, a float or a
NumPy integer, which the planner's int-only demands refuse deep in a run, as ``Request``
refuses them); ``float`` takes ints and floats, never a bool; ``str`` takes strings; any other
class takes its instances. Annotations this does not understand (other unions, generics)
are not checked.
"""

from __future__ import annotations

import functools
import types
from dataclasses import fields
from enum import Enum
from typing import Any, TypeGuard, Union, get_type_hints

import numpy as np

from kvchain.errors import ConfigError


@functools.cache
def _field_kinds(cls: type) -> dict[str, tuple[Any, bool]]:
    """Field name -> (its type with ``None`` removed, whether ``None`` is allowed); the
    type is ``None`` where the annotation is not a single class."""
    out: dict[str, tuple[Any, bool]] = {}
    for name, hint in get_type_hints(cls).items():
        origin = getattr(hint, "__origin__", None)
        if isinstance(hint, types.UnionType) or origin is Union:
            args = [a for a in hint.__args__ if a is not type(None)]
            optional = len(args) < len(hint.__args__)
            out[name] = (args[0] if len(args) == 1 and isinstance(args[0], type) else None,
                         optional)
        else:
            out[name] = (hint if isinstance(hint, type) and origin is None else None, False)
    return out


def type_problem(value: Any, kind: type) -> str | None:
    """What ``value`` needs to be of field type ``kind`` (e.g. ``"of type int"``), or
    ``None`` when it is (the rules of the module doc)."""
    if issubclass(kind, Enum):
        return (None if isinstance(value, kind)
                else f"a {kind.__name__} (one of {[m.value for m in kind]})")
    if kind is bool:
        return None if type(value) is bool else "True or False"
    if isinstance(value, bool):
        return "a number" if kind is float else f"of type {kind.__name__}"
    if kind is int:  # a NumPy integer would reach the planner's int-only demands
        return None if type(value) is int else "of type int"
    if kind is float:
        return None if isinstance(value, int | float) else "a number"
    return None if isinstance(value, kind) else f"of type {kind.__name__}"


def is_whole(value: object) -> TypeGuard[int | np.integer]:
    """Whether ``value`` is a whole number of a count (tokens, pages, bytes, slots): a
    Python int or a NumPy integer, never a ``bool`` (``True`` would count as 1), a float
    (``16.0`` or ``1e10`` would run on as a float and ``nan`` compares False with every
    bound, so range checks alone let it through) or anything else. Range checks are the
    caller's; this is the one test of the kind every count argument shares."""
    return type(value) is int or (not isinstance(value, bool)
                                  and isinstance(value, int | np.integer))


def check_field_types(obj: Any) -> None:
    """Check every field of dataclass instance ``obj`` against its annotation.

    Raises:
        ConfigError: ``"<field> must be <what>, got <value> (<type>)"`` for the first field
            whose value is not of its type.
    """
    kinds = _field_kinds(type(obj))  # type: ignore[arg-type]
    for f in fields(obj):
        kind, optional = kinds[f.name]
        value = getattr(obj, f.name)
        if kind is None or (value is None and optional):
            continue
        problem = type_problem(value, kind)
        if problem is not None:
            raise ConfigError(f"{f.name} must be {problem}, got {value!r} "
                              f"({type(value).__name__})")
