"""Suite-wide settings: torch is optional (its tests skip without it) unless CI asks."""

from __future__ import annotations

import importlib.util
import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """With ``KVCHAIN_REQUIRE_TORCH=1`` (set by ``.ci/run``) a missing torch is an error,
    not a silent skip of the torch-backed tests."""
    if os.environ.get("KVCHAIN_REQUIRE_TORCH") == "1" and importlib.util.find_spec(
            "torch") is None:
        raise pytest.UsageError("KVCHAIN_REQUIRE_TORCH=1 but torch is not installed")
