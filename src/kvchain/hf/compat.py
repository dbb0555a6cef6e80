"""Whether torch and transformers can be imported (the ``kvchain[hf]`` extra)."""

from __future__ import annotations

import importlib.util

from kvchain.errors import KVChainError


class HFUnavailableError(KVChainError, ImportError):
    """torch or transformers is not installed (``pip install kvchain[hf]``)."""


def require_hf() -> None:
    """Check that torch and transformers are importable.

    Raises:
        HFUnavailableError: naming the missing package.
    """
    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            raise HFUnavailableError(f"kvchain.hf needs {name}; install it with "
                                     f"`pip install kvchain[hf]` (CPU torch first)")
