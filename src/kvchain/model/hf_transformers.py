"""Read a config through transformers' own configuration class, when it knows the family.

transformers is an optional extra (``pip install kvchain[hf]``). It is imported here,
lazily, on the first config that is read, never on ``import kvchain``. Its configuration
classes carry what every engine relies on: per-family defaults (e.g.
``Qwen3_5TextConfig.max_position_embeddings = 32768``), derived per-layer lists (e.g.
``KimiLinearConfig`` turns ``linear_attn_config.kda_layers`` into ``layer_types``;
``DeepseekV4Config`` turns legacy ``compress_ratios`` into ``layer_types``) and attribute
maps (aliases such as ``num_local_experts`` -> ``n_routed_experts``). kvchain keeps only
the geometry rules (:mod:`~kvchain.model.hf_layers`, :mod:`~kvchain.model.hf_geometry`).

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

**Flat configs of composite classes.** A multimodal class (``Step3p7Config``,
``Qwen3_5Config``, ``Qwen3_5MoeConfig``, ``Gemma4Config``, ``Llama4Config``... any class
whose ``sub_configs`` has a ``text_config``) builds its language model only from a nested
``text_config``: given the text fields flat at the top level it keeps them as loose
attributes and builds the text model from its own defaults (a flat 4-layer ``step3p7``
config became ``Step3p7TextConfig``'s 45 layers, without its window). A config of such a
family without a ``text_config`` mapping is therefore read as if its fields (all but
``model_type`` and the other sub-configs) were its ``text_config``: flat and nested
spellings of one model read the same.

**What the class supplied.** :attr:`ReadThrough.defaulted` names the fields of the
(text-over-top) view that the file did not write - neither under that name nor under an
``attribute_map`` alias - and whose value is the class's own default (the value the class
gives a config that sets nothing; cached per ``model_type``). A field the class derived
from other fields of the file (``layer_types`` from Kimi's ``linear_attn_config``) differs
from that default and is not listed. :mod:`~kvchain.model.hf_layers` reports those that a
model's bytes were computed from (``ModelSpec.defaulted``).

Import cost (transformers 5.24, torch 2.13 CPU installed; ``benchmarks/
bench_config_reader.py`` and ``python -X importtime``): ``import transformers`` alone is
about 0.8 s cumulative, but the first ``AutoConfig.for_model`` also imports torch
(``transformers.configuration_utils`` -> ``modeling_rope_utils`` -> ``torch``, 5.7 s of
the 5.8 s cumulative on the shared development machine under load): the first config
read of a process costs seconds, once. Later reads take 2-22 ms (1x-8x the raw-dict read
of the same config). Telling derived fields from defaulted ones reads the config a
second time (scaled) and, once per ``model_type``, the class's bare defaults: a live read
costs 1.5x-1.9x what it did without (median of 15, Llama-3.1-8B 0.75 -> 1.14 ms,
Qwen3-Next 1.03 -> 1.76 ms, Nemotron-H-56B 1.22 -> 1.97 ms). ``import kvchain`` never
pays it; ``use_transformers=False`` skips it, and bundled models never pay it: they are
read from a frozen view (:mod:`kvchain.catalog.views`).
"""

from __future__ import annotations

import logging
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
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
        defaulted: names of the merged (``text_config`` over top-level) fields whose value
            the configuration class supplied because the file did not set them (see the
            module doc); empty for the raw dict.
    """

    fields: dict[str, object]
    reader: str
    defaulted: frozenset[str] = field(default_factory=frozenset)


def _config_class_view(model_type: str, raw: Mapping[str, object]) -> tuple[Any, str] | None:
    try:
        import transformers
        from transformers import CONFIG_MAPPING, AutoConfig
    except ImportError:
        return None
    if model_type not in CONFIG_MAPPING:
        return None
    kwargs = {k: v for k, v in _nested(CONFIG_MAPPING[model_type], raw).items()
              if k != "model_type"}
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


def _text_class(cls: Any) -> Any | None:
    subs = getattr(cls, "sub_configs", None)
    return subs.get("text_config") if isinstance(subs, Mapping) else None


def _nested(cls: Any, raw: Mapping[str, object]) -> Mapping[str, object]:
    """``raw`` with its fields moved under ``text_config`` when ``cls`` is a composite
    class and ``raw`` is flat (no ``text_config`` mapping); else ``raw`` itself."""
    if _text_class(cls) is None or isinstance(raw.get("text_config"), Mapping):
        return raw
    subs = getattr(cls, "sub_configs", {})
    text = {k: v for k, v in raw.items() if k not in subs and k != "model_type"}
    kept = {k: v for k, v in raw.items() if k in subs and k != "text_config"}
    return {**kept, "model_type": raw.get("model_type"), "text_config": text}


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
    nested = _nested(type(obj), raw)
    try:
        fields = _fields(obj, nested)
    except Exception:
        return ReadThrough(dict(raw), "raw dict")
    defaults = _default_fields(model_type)
    merged = _merged(fields)
    written = _written(obj, nested)
    candidates = {
        k for k, v in merged.items()
        if k not in written and v is not None and k in defaults and defaults[k] == v
    }
    return ReadThrough(fields, reader, _not_derived(model_type, nested, merged, candidates))


_DEPTH_FIELDS = frozenset({"num_hidden_layers", "num_layers", "n_layer"})


def _not_derived(model_type: str, raw: Mapping[str, object], merged: Mapping[str, object],
                 candidates: set[str]) -> frozenset[str]:
    """The candidates the class did not derive from the file's own fields.

    A field the class computes from written fields can equal its default by chance
    (``LlamaConfig.head_dim`` = 4096 / 32 = 128, its default too). Every written integer
    field but the depth is scaled by a power of two fixed by its name (2, 4 or 8, from
    ``zlib.crc32``: sizes and head counts stay divisible but their ratios change) and the
    config read again: a candidate that moves with them was derived from the file, not
    defaulted. When the class refuses the moved config, every candidate is kept (reported
    rather than hidden).
    """
    if not candidates:
        return frozenset()

    def moved(part: Mapping[str, object]) -> dict[str, object]:
        return {k: v * 2 ** (1 + zlib.crc32(k.encode()) % 3)
                if isinstance(v, int) and not isinstance(v, bool) and k not in _DEPTH_FIELDS
                else v for k, v in part.items()}

    shifted = moved(raw)
    text = raw.get("text_config")
    if isinstance(text, Mapping):
        shifted["text_config"] = moved(text)
    view = _config_class_view(model_type, shifted)
    if view is None:
        return frozenset(candidates)
    try:
        again = _merged(_fields(view[0], shifted))
    except Exception:
        return frozenset(candidates)
    return frozenset(k for k in candidates if again.get(k) == merged[k])


def _fields(obj: Any, raw: Mapping[str, object]) -> dict[str, object]:
    """The overlaid view of ``obj`` (built from ``raw``), its ``text_config`` too."""
    fields = _overlay(obj, obj.to_dict(), raw)
    text_raw = raw.get("text_config")
    text_obj = getattr(obj, "text_config", None)
    text_ser = fields.get("text_config")
    if isinstance(text_ser, Mapping) and text_obj is not None and not isinstance(text_obj, dict):
        fields["text_config"] = _overlay(
            text_obj, text_ser, text_raw if isinstance(text_raw, Mapping) else {}
        )
    return fields


def _merged(fields: Mapping[str, object]) -> dict[str, object]:
    """Top-level fields with a nested ``text_config`` laid over them (as
    :func:`~kvchain.model.hf_layers.read_config` merges them)."""
    out = dict(fields)
    text = fields.get("text_config")
    if isinstance(text, Mapping):
        out.update(text)
    return out


def _written(obj: Any, raw: Mapping[str, object]) -> frozenset[str]:
    """Names the file set (top level and ``text_config``), with their ``attribute_map``
    aliases both ways (a file writing ``num_local_experts`` sets ``n_routed_experts``)."""
    names = {k for k, v in _merged(raw).items() if v is not None}
    aliases: dict[str, str] = {}
    for part in (obj, getattr(obj, "text_config", None)):
        amap = getattr(type(part), "attribute_map", None)
        if isinstance(amap, Mapping):
            aliases.update({str(a): str(c) for a, c in amap.items()})
    names |= {aliases[n] for n in names if n in aliases}
    names |= {a for a, c in aliases.items() if c in names}
    return frozenset(names)


@cache
def _default_fields(model_type: str) -> Mapping[str, object]:
    """The merged view of the class of ``model_type`` built from no fields at all: its
    defaults (empty when the class cannot be built without arguments)."""
    view = _config_class_view(model_type, {"model_type": model_type})
    if view is None:
        return {}
    try:
        return _merged(_fields(view[0], {}))
    except Exception:
        return {}
