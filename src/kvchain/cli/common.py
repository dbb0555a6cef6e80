"""Helpers shared by the CLI commands: model loading and band tables."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.layout import ChainLayout
from kvchain.spec.declared import declare_model
from kvchain.spec.hf import load_hf_config
from kvchain.spec.layers import CacheDtype
from kvchain.spec.model import ModelSpec

SPEC_FILE_KEYS = frozenset({"name", "full", "window", "window_tokens", "local", "chunk_tokens",
                            "state", "source"})


def load_declared(path: Path) -> ModelSpec:
    """Read a spec file that declares classes by their bytes.

    Format (JSON, every key optional except one class)::

        {"name": "my-model", "full": 32000, "window": 0, "window_tokens": null,
         "local": 0, "chunk_tokens": null, "state": 50000000}

    ``full``/``window``/``local``: bytes per token of the class (all layers, K and V);
    ``window_tokens``: ``W``; ``chunk_tokens``: ``C``; ``state``: bytes per request of all
    state layers.

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

    return declare_model(str(data.get("name", Path(path).stem)),
                         full=count("full") or 0, window=count("window") or 0,
                         window_tokens=count("window_tokens"), local=count("local") or 0,
                         chunk_tokens=count("chunk_tokens"), state=count("state") or 0,
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
              kv_dtype: CacheDtype | None = None, tp: int = 1,
              state_dtype: CacheDtype | None = None) -> ModelSpec:
    """The model of a command: a spec file, a Hugging Face config.json, or a catalog name
    (in that order of precedence).

    ``kv_dtype`` / ``state_dtype`` (``--kv-dtype`` / ``--state-dtype``) override what the
    config declares (``None``: the config's dtype fields, else bf16; see
    :mod:`kvchain.spec.hf_dtypes`).

    Raises:
        ConfigError and subclasses: unknown model, bad config, bad spec file, or a dtype
            override given with a spec file (its classes are declared in bytes).
    """
    if spec_file is not None:
        if kv_dtype is not None or state_dtype is not None:
            raise ConfigError("--kv-dtype/--state-dtype do not apply to --spec (a spec file "
                              "declares bytes, not tensors)")
        return load_declared(spec_file)
    if config is not None:
        return load_hf_config(config, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    return load_model(model, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)


KV_DTYPE_HELP = ("Element type of attention K/V (default: the config's kv_cache_dtype / "
                 "quantization_config, else bf16).")
STATE_DTYPE_HELP = ("Element type of the recurrent state (default: the config's "
                    "mamba_ssm_dtype / mamba_ssm_cache_dtype / mamba_cache_dtype, else bf16).")


def render_bands(layout: ChainLayout) -> Table:
    """A table of the chain's bands, low -> high in the buffer."""
    table = Table(title=f"chain {layout.shape_name} in {layout.buffer_bytes:,} B "
                        f"({layout.buffer_bytes / 1e9:,.2f} GB), {layout.page_size} tokens/page")
    for col in ("band", "anchor", "bytes/token", "page bytes", "window", "null pages",
                "max pages"):
        table.add_column(col, justify="right" if col not in ("band", "anchor") else "left")
    for b in layout.bands:
        c = b.cache_class
        per_token = f"{c.bytes_per_token:,}" if c.is_token_class else f"{c.bytes_per_slot:,}/slot"
        table.add_row(b.label, b.anchor.value, per_token, f"{b.page_bytes:,}",
                      f"{c.window:,}" if c.window else "-", str(b.reserved_pages), f"{b.cap:,}")
    return table
