"""The audit switch: whether the rebuild-and-compare checks run.

The hot path checks what it can in O(bands) (counters kept as things change); the full
checks - rebuild a chain's snapshot after every plan action and compare it with the
prediction, walk a prefix cache's whole tree to rebuild its eviction order and compare it
with the incrementally kept one - cost O(pages) or O(nodes log nodes) and run only under
an audit flag. Each object takes it as a constructor argument (``Chain(..., audit=...)``,
``PrefixCache(..., audit=...)``); ``None`` there means this module's default: on when the
environment variable ``KVCHAIN_AUDIT`` is ``1``/``true``/``yes``/``on`` (the test suite sets
it), off when it is unset, empty or ``0``/``false``/``no``/``off``.
"""

from __future__ import annotations

import os

from kvchain.errors import ConfigError

AUDIT_ENV = "KVCHAIN_AUDIT"
"""Environment variable of the default audit flag."""

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def resolve_audit(flag: bool | None) -> bool:
    """The audit flag an object runs with: ``flag`` itself when given, else the default
    read from ``KVCHAIN_AUDIT`` now (case-insensitive).

    Raises:
        ConfigError: ``flag`` not a bool or ``None``, or ``KVCHAIN_AUDIT`` set to another
            value than the ones above.
    """
    if flag is not None:
        if type(flag) is not bool:
            raise ConfigError(f"audit must be True, False or None, got {flag!r}")
        return flag
    raw = os.environ.get(AUDIT_ENV, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ConfigError(f"{AUDIT_ENV}={raw!r}: expected one of 1, true, yes, on, 0, false, no, "
                      f"off (or unset)")
