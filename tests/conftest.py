"""Suite-wide settings: the heavy extras are optional (their tests skip without them) unless
CI asks for them."""

from __future__ import annotations

import importlib.util
import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """``KVCHAIN_REQUIRE=torch,transformers,ray`` (set by ``.ci/run``) makes a missing module
    an error, not a silent skip of the tests that need it; ``KVCHAIN_REQUIRE_TORCH=1`` is the
    same for torch alone.

    The suite runs with the audit flag's default on (``KVCHAIN_AUDIT=1``, see
    ``kvchain.audit``): every chain and prefix cache a test builds without an explicit
    ``audit=`` runs the rebuild-and-compare checks. ``KVCHAIN_AUDIT=0 pytest`` runs the
    suite on the cheap checks alone."""
    os.environ.setdefault("KVCHAIN_AUDIT", "1")
    wanted = {m.strip() for m in os.environ.get("KVCHAIN_REQUIRE", "").split(",") if m.strip()}
    if os.environ.get("KVCHAIN_REQUIRE_TORCH") == "1":
        wanted.add("torch")
    missing = sorted(m for m in wanted if importlib.util.find_spec(m) is None)
    if missing:
        raise pytest.UsageError(f"KVCHAIN_REQUIRE names modules that are not installed: "
                                f"{', '.join(missing)}")
