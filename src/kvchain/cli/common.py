"""Helpers shared by the CLI commands: model loading and band tables."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.report.tables import band_table
from kvchain.spec.declared import declare_model
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import CacheDtype
from kvchain.spec.model import ModelSpec

SPEC_FILE_KEYS = frozenset({"name", "full", "window", "window_tokens", "local", "chunk_tokens",
                            "state", "source", "windows", "locals", "hidden_size",
                            "num_attention_heads", "total_params", "active_params",
                            "weight_bytes"})


def load_declared(path: Path) -> ModelSpec:
    """Read a spec file that declares classes by their bytes.

    Format (JSON, every key optional except one class)::

        {"name": "my-model", "full": 32000, "window": 0, "window_tokens": null,
         "local": 0, "chunk_tokens": null, "state": 50000000}

    ``full``/``window``/``local``: bytes per token of the class (all layers, K and V);
    ``window_tokens``: ``W``; ``chunk_tokens``: ``C``; ``state``: bytes per request of all
    state layers; ``hidden_size``, ``num_attention_heads``, ``total_params``,
    ``active_params``, ``weight_bytes``: what ``simulate``'s cost model reads (0 or absent:
    a model without weights, for ``plan``). Several window sizes (or chunk sizes): list
    the classes, each its own band, e.g. ``"windows": [{"bytes": 4096, "tokens": 128},
    {"bytes": 2048, "tokens": 11}]`` (``"locals"`` likewise), alone or next to
    ``window``/``local``.

    Raises:
        ConfigError: unreadable JSON, an unknown key, or invalid bytes (names the key).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"spec file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"spec file {path}: expected a JSON object")
    unknown = set(data) - SPEC_FILE_KEYS
    if unknown:
        raise ConfigError(f"spec file {path}: unknown keys {sorted(unknown)}; "
                          f"known: {sorted(SPEC_FILE_KEYS)}")
    def count(key: str) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if type(value) is not int or value < 0:
            raise ConfigError(f"spec file {path}: {key} must be a non-negative integer, "
                              f"got {value!r}")
        return value

    def classes(key: str) -> list[tuple[int, int]]:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise ConfigError(f"spec file {path}: {key} must be a list of "
                              f'{{"bytes": int, "tokens": int}}, got {value!r}')
        out = []
        for entry in value:
            if not isinstance(entry, dict) or set(entry) != {"bytes", "tokens"} or any(
                    type(entry[k]) is not int or entry[k] <= 0 for k in ("bytes", "tokens")):
                raise ConfigError(f"spec file {path}: each {key} entry needs positive int "
                                  f'"bytes" and "tokens" (and nothing else), got {entry!r}')
            out.append((entry["bytes"], entry["tokens"]))
        return out

    return declare_model(str(data.get("name", Path(path).stem)),
                         windows=classes("windows"), locals_=classes("locals"),
                         full=count("full") or 0, window=count("window") or 0,
                         window_tokens=count("window_tokens"), local=count("local") or 0,
                         chunk_tokens=count("chunk_tokens"), state=count("state") or 0,
                         hidden_size=count("hidden_size") or 0,
                         num_attention_heads=count("num_attention_heads") or 0,
                         total_params=count("total_params") or 0,
                         active_params=count("active_params") or 0,
                         weight_bytes=count("weight_bytes") or 0,
                         source=str(data.get("source", f"declared in {path}")))


def prepare_out_dir(out: Path | None) -> None:
    """Create the output folder before a long run, so a bad path fails at once.

    Raises:
        ConfigError: the path exists and is not a folder, or cannot be created or written.
    """
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".kvchain-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write outputs to {out}: {exc.strerror or exc}") from None


def load_spec(model: str, config: Path | None, *, spec_file: Path | None = None,
              kv_dtype: CacheDtype = CacheDtype.BF16, tp: int = 1) -> ModelSpec:
    """The model of a command: a spec file, a Hugging Face config.json, or a catalog name
    (in that order of precedence).

    Raises:
        ConfigError and subclasses: unknown model, bad config, bad spec file.
    """
    if spec_file is not None:
        return load_declared(spec_file)
    if config is not None:
        return load_hf_config(config, kv_dtype=kv_dtype, tp=tp)
    return load_model(model, kv_dtype=kv_dtype, tp=tp)


def render_bands(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer
    (:func:`kvchain.report.tables.band_table`)."""
    return band_table(layout)
