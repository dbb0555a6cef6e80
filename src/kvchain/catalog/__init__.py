"""Bundled real model configs (JSON, with sources) and the lookup by name.

``list_models()`` lists them; ``load_model("gpt-oss-120b", tp=2)`` builds a
:class:`~kvchain.model.spec.ModelSpec`. Data files and their licenses: ``data/SOURCES.md``.
"""

from kvchain.catalog.loader import (
    CatalogEntry,
    ClassSummary,
    list_models,
    load_model,
    load_models_json_entry,
    read_bundled_config,
    read_models_json,
    resolve_name,
)

__all__ = [
    "CatalogEntry",
    "ClassSummary",
    "list_models",
    "load_model",
    "load_models_json_entry",
    "read_bundled_config",
    "read_models_json",
    "resolve_name",
]
