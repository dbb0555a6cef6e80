"""kvchain.hf is optional: never imported by ``import kvchain``; clear errors without it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from kvchain.errors import KVChainError


def test_import_kvchain_does_not_import_transformers() -> None:
    code = ("import sys, kvchain, kvchain.alloc, kvchain.sched.scheduler, kvchain.cli; "
            "print('transformers' in sys.modules, 'kvchain.hf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]


def test_missing_transformers_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Import kvchain.hf afresh as if transformers were not installed (also passes where
    # it really is not installed).
    real = importlib.util.find_spec
    # kvchain.hf checks torch first: where torch is absent too, the error names torch
    missing = "transformers" if real("torch") is not None else "torch"
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    for name in [m for m in sys.modules if m == "kvchain.hf" or m.startswith("kvchain.hf.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(KVChainError, match=missing) as info:
        importlib.import_module("kvchain.hf")
    assert isinstance(info.value, ImportError)
    assert type(info.value).__name__ == "HFUnavailableError"


def test_bad_engine_input_raises_and_changes_nothing() -> None:
    pytest.importorskip("torch", reason="kvchain.hf needs torch")
    pytest.importorskip("transformers", reason="kvchain.hf needs transformers")
    from kvchain.errors import ConfigError, InvalidRequestError
    from kvchain.hf import ChainEngine

    from .families import build_model

    model = build_model("gpt-oss")
    with pytest.raises(ConfigError):
        ChainEngine(model, 9_000, page_size=4, flush_every=0)
    engine = ChainEngine(model, 9_000, page_size=4, chunk_size=8)
    engine.add(0, [1, 2, 3], 2)
    for rid, prompt, new in ((1, [], 2), (2, [1], 0), (0, [1], 1)):
        with pytest.raises(InvalidRequestError):
            engine.add(rid, prompt, new)
    assert list(engine.results) == [0] and not engine.idle
    results = engine.run()
    assert len(results[0].tokens) == 2 and engine.idle
