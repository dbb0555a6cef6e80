"""Transformers' view of each bundled config, frozen into the package.

A config read through transformers' configuration class (:mod:`kvchain.model.hf_transformers`)
can differ from the raw ``config.json``: the class fills defaults and derives fields. For
two bundled models the difference changes bytes (transformers 5.24):

* ``NemotronHConfig`` defaults ``mamba_ssm_cache_dtype`` to ``float32``: the SSM state of
  Nemotron-H-56B is 4 B per element, not the bf16 of the weights (912,605,184 B of state
  per request instead of 459,620,352);
* ``MiMoV2FlashConfig`` stores ``sliding_window`` as the raw value plus one (129 for a
  ``config.json`` that says 128).

Reading bundled models raw when transformers is absent would give other bytes than with
it, and reading them through transformers costs seconds on the first read of a process
(transformers imports torch). So the view of every bundled config whose ``model_type``
transformers knows is frozen in ``catalog/data/config_views.json`` together with the
SHA-256 of the config it was taken from, the reader (``"transformers 5.24.0
NemotronHConfig"``) and the fields the class supplied because the file did not set them
(``defaulted``, reported on the model as ``ModelSpec.defaulted``); :func:`bundled_fields`
serves it, and a bundled model reads the same bytes in every environment without importing
transformers. ``tests/catalog/test_config_views.py`` (run in CI, where transformers is
installed) re-reads every bundled config through transformers and checks the frozen view
gives the same :class:`ModelSpec` at every tensor-parallel degree, so a transformers
release that reads a config otherwise is caught; ``python -m kvchain.catalog.views``
writes the file anew.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path

from kvchain.errors import ConfigError
from kvchain.model.hf_transformers import ReadThrough

VIEWS_FILE = "config_views.json"


def _data_dir() -> Path:
    return Path(str(resources.files("kvchain.catalog").joinpath("data")))


@cache
def _views() -> Mapping[str, Mapping[str, object]]:
    path = _data_dir() / VIEWS_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    views = data.get("views") if isinstance(data, dict) else None
    if not isinstance(views, dict):
        raise ConfigError(f"{path}: no 'views' mapping")
    return views


def config_sha256(relative: str) -> str:
    """SHA-256 (hex) of the bundled file ``relative`` (e.g. ``"model_configs/x.json"``).

    Raises:
        ConfigError: no such bundled file.
    """
    path = _data_dir().joinpath(*relative.split("/"))
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"no bundled file {relative!r}") from exc


def bundled_fields(relative: str, raw: Mapping[str, object]) -> ReadThrough:
    """The reading of a bundled config: its fields, who produced them, and which fields
    the configuration class supplied (the file did not set them).

    Args:
        relative: the config's path under ``catalog/data``.
        raw: its parsed ``config.json``.

    Returns:
        The frozen transformers view (its fields a fresh copy on every call, so a caller
        that edits them cannot change what later reads get), its reader name and its
        ``defaulted`` fields when a view is recorded for this config, else the raw dict
        read as ``"raw dict"`` (transformers does not know the ``model_type``).

    Raises:
        ConfigError: a view is recorded for another version of the file (its SHA-256
            differs: regenerate with ``python -m kvchain.catalog.views``).
    """
    view = _views().get(relative)
    if view is None:
        return ReadThrough(dict(raw), "raw dict")
    digest = config_sha256(relative)
    if view.get("sha256") != digest:
        raise ConfigError(f"the frozen transformers view of {relative} was taken from "
                          f"another file (sha256 {view.get('sha256')}, file {digest}); "
                          "run `python -m kvchain.catalog.views`")
    fields = view.get("fields")
    reader = view.get("reader")
    defaulted = view.get("defaulted", [])
    if (not isinstance(fields, dict) or not isinstance(reader, str)
            or not isinstance(defaulted, list)):
        raise ConfigError(f"the frozen view of {relative} is malformed")
    # the views are cached per process: never shared
    return ReadThrough(copy.deepcopy(fields), reader, frozenset(map(str, defaulted)))


def freeze_views(configs: list[str]) -> dict[str, object]:
    """Read each bundled config through transformers now and return the views file's
    content (needs transformers: ``pip install kvchain[hf]``).

    Args:
        configs: paths under ``catalog/data``.

    Raises:
        ConfigError: transformers is not installed.
    """
    from kvchain.model.hf_transformers import read_through_transformers

    try:
        import transformers
    except ImportError as exc:
        raise ConfigError("freezing the views needs transformers (pip install "
                          "'kvchain[hf]')") from exc
    views: dict[str, object] = {}
    for relative in sorted(configs):
        raw = json.loads(_data_dir().joinpath(*relative.split("/")).read_text("utf-8"))
        read = read_through_transformers(raw)
        if read.reader == "raw dict":
            continue
        views[relative] = {"sha256": config_sha256(relative), "reader": read.reader,
                           "fields": json.loads(json.dumps(read.fields, sort_keys=True)),
                           "defaulted": sorted(read.defaulted)}
    return {"transformers": transformers.__version__, "views": views}


def main() -> None:
    """Write ``catalog/data/config_views.json`` from the installed transformers."""
    configs = sorted(f"model_configs/{p.name}"
                     for p in (_data_dir() / "model_configs").iterdir() if p.suffix == ".json")
    out = _data_dir() / VIEWS_FILE
    out.write_text(json.dumps(freeze_views(configs), indent=1, sort_keys=True) + "\n",
                   encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
