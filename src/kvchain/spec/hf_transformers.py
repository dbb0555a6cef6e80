"""Read a config through transformers' own configuration class, when it knows the family.

transformers is an optional extra (``pip install kvchain[hf]``). It is imported here,
lazily, on the first config that is read, never on ``import kvchain``. Its configuration
classes carry what every engine relies on: per-family defaults (e.g.
``Qwen3_5TextConfig.max_position_embeddings = 32768``), derived per-layer lists (e.g.
``KimiLinearConfig`` turns ``linear_attn_config.kda_layers`` into ``layer_types``;
``DeepseekV4Config`` turns legacy ``compress_ratios`` into ``layer_types``) and attribute
maps (aliases such as ``num_local_experts`` -> ``n_routed_experts``). kvchain keeps only
the geometry rules (:mod:`~kvchain.spec.hf_layers`, :mod:`~kvchain.spec.hf_geometry`).

What comes back is the raw dict overlaid by the class's view of it:

1. ``AutoConfig.for_model(model_type, **raw).to_dict()`` (the class's defaults and
   derived fields win over the raw values they were derived from);
2. every alias of the class's ``attribute_map`` and the few properties that are not
   serialized (``num_hidden_layers`` of ``NemotronHConfig`` is a property over
   ``layers_block_type``) are added under their names;
3. raw keys the class consumed without serializing (``Gemma4TextConfig`` pops
   ``global_head_dim`` and ``num_global_key_value_heads`` into ``per_layer_config``)
   are kept as written;
4. a ``layer_types`` the class made up from its own default pattern is dropped when the
   raw dict states the layer kinds in a field the class ignores (``attn_type_list`` of
   MiniMax checkpoints: transformers' ``MiniMaxConfig`` defaults ``layer_types`` to
   alternating full/linear and never reads ``attn_type_list``).

The same is done for a nested ``text_config``. When transformers is not installed, does
not know the ``model_type``, or its class refuses the dict (it validates types), the raw
dict is used unchanged and kvchain's own checks name the bad field.

Import cost (transformers 5.24, torch 2.13 CPU installed; ``benchmarks/
bench_config_reader.py`` and ``python -X importtime``): ``import transformers`` alone is
about 0.8 s cumulative, but the first ``AutoConfig.for_model`` also imports torch
(``transformers.configuration_utils`` -> ``modeling_rope_utils`` -> ``torch``, 5.7 s of
the 5.8 s cumulative on the shared development machine under load): the first config
read of a process costs seconds, once. Later reads take 2-22 ms (1x-8x the raw-dict read
of the same config). ``import kvchain`` never pays it; ``use_transformers=False`` skips
it, and bundled models never pay it: they are read from a frozen view
(:mod:`kvchain.catalog.views`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Per-layer kind fields that configuration classes do not read (see rule 4).
_RAW_KIND_LISTS = ("attn_type_list", "hybrid_layer_pattern", "sliding_window_layout")

# Properties of configuration classes that to_dict() does not serialize but the geometry
# rules read.
_PROPERTIES = ("num_hidden_layers",)


@dataclass(frozen=True, slots=True)
class ReadThrough:
    """The fields of a config and which reader produced them.

    Attributes:
        fields: the config's fields (top level; a ``text_config`` stays nested).
        reader: ``"transformers <version> <ClassName>"`` or ``"raw dict"``.
    """

    fields: dict[str, object]
    reader: str


def _config_class_view(model_type: str, raw: Mapping[str, object]) -> tuple[Any, str] | None:
    try:
        import transformers
        from transformers import CONFIG_MAPPING, AutoConfig
    except ImportError:
        return None
    if model_type not in CONFIG_MAPPING:
        return None
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)  # a refused dict falls back silently
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = AutoConfig.for_model(model_type, **kwargs)
    except Exception:  # the class refused the dict: kvchain's own checks will name why
        return None
    finally:
        logger.setLevel(level)
    return obj, f"transformers {transformers.__version__} {type(obj).__name__}"


def _overlay(obj: Any, serialized: Mapping[str, object],
             raw: Mapping[str, object]) -> dict[str, object]:
    fields = dict(serialized)
    for alias in getattr(type(obj), "attribute_map", {}):
        if alias not in fields:
            value = getattr(obj, alias, None)
            if value is not None:
                fields[alias] = value
    for name in _PROPERTIES:
        if fields.get(name) is None:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                fields[name] = value
    for key, value in raw.items():
        fields.setdefault(key, value)
    if raw.get("layer_types") is None and any(raw.get(k) is not None for k in _RAW_KIND_LISTS):
        fields.pop("layer_types", None)
    return fields


def read_through_transformers(raw: Mapping[str, object]) -> ReadThrough:
    """The config's fields as transformers' configuration class sees them (see module doc).

    Args:
        raw: a parsed ``config.json`` (top level).

    Returns:
        The overlaid fields and the reader's name; the raw dict (copied) and
        ``"raw dict"`` when transformers is absent, does not know ``model_type``, or
        refuses the dict.

    Raises:
        Nothing: every failure of transformers falls back to the raw dict.
    """
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return ReadThrough(dict(raw), "raw dict")
    view = _config_class_view(model_type, raw)
    if view is None:
        return ReadThrough(dict(raw), "raw dict")
    obj, reader = view
    try:
        serialized = obj.to_dict()
    except Exception:
        return ReadThrough(dict(raw), "raw dict")
    fields = _overlay(obj, serialized, raw)
    text_raw = raw.get("text_config")
    text_obj = getattr(obj, "text_config", None)
    text_ser = fields.get("text_config")
    if isinstance(text_ser, Mapping) and text_obj is not None and not isinstance(text_obj, dict):
        fields["text_config"] = _overlay(
            text_obj, text_ser, text_raw if isinstance(text_raw, Mapping) else {}
        )
    return ReadThrough(fields, reader)
