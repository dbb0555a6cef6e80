"""A ``models.json`` entry -> a config mapping that :func:`~kvchain.model.hf.load_hf_config` reads.

A ``models.json`` entry carries what the cache needs: ``num_hidden_layers``,
``hidden_size``, an explicit ``layer_types`` list, an ``attention`` block (heads, head
dim, window or chunk) and a ``recurrent_state`` block whose scalar fields use the Hugging
Face names of the family (``mamba_num_heads``, ``linear_num_value_heads``...). They are laid
into one flat mapping::

    params fields (verbatim config, or catalog.json's param_fields)   lowest priority
    extra block numbers (experts, periods)
    recurrent_state scalars (not its derived counts and bytes)
    attention block, num_hidden_layers, hidden_size, layer_types      highest priority

``layer_types`` words are the loader's own vocabulary, except ``hybrid_attn+mamba2``
(Falcon-H1), which becomes ``full_attention+mamba2``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvchain.errors import ConfigError

# Derived counts of the recurrent_state block; the loader recomputes them.
_DERIVED_STATE_KEYS = frozenset({"num_layers", "conv_dim", "d_inner", "elements_per_layer"})

_KIND_WORDS = {"hybrid_attn+mamba2": "full_attention+mamba2"}


def _numbers(block: object) -> dict[str, object]:
    if not isinstance(block, Mapping):
        return {}
    return {
        k: v
        for k, v in block.items()
        if isinstance(v, int | float)
        and not k.startswith("bytes_")
        and k not in _DERIVED_STATE_KEYS
    }


def entry_config(
    entry: Mapping[str, object], params_fields: Mapping[str, object]
) -> dict[str, object]:
    """The flat config mapping of one ``models.json`` entry (see the module docstring).

    Args:
        entry: one element of ``models.json``.
        params_fields: fields for parameter counting the entry lacks (``vocab_size``,
            ``intermediate_size``, ``model_type``...): the verbatim config's fields when the
            catalog bundles one, else ``catalog.json``'s ``param_fields``.

    Raises:
        ConfigError: the entry lacks ``layer_types``, ``num_hidden_layers`` or
            ``attention``.
    """
    name = entry.get("name", "?")
    for key in ("layer_types", "num_hidden_layers", "hidden_size", "attention"):
        if key not in entry:
            raise ConfigError(f"models.json entry {name!r} lacks {key!r}")
    attention = entry["attention"]
    if not isinstance(attention, Mapping):
        raise ConfigError(f"models.json entry {name!r}: 'attention' must be an object")
    layer_types = entry["layer_types"]
    if not isinstance(layer_types, list):
        raise ConfigError(f"models.json entry {name!r}: 'layer_types' must be a list")
    config: dict[str, object] = {k: v for k, v in params_fields.items() if k != "text_config"}
    config.update(_numbers(entry.get("extra")))
    config.update(_numbers(entry.get("recurrent_state")))
    config.update(attention)
    config["num_hidden_layers"] = entry["num_hidden_layers"]
    config["hidden_size"] = entry["hidden_size"]
    config["layer_types"] = [_KIND_WORDS.get(str(w), str(w)) for w in layer_types]
    if entry.get("max_position_embeddings") is not None:  # the model's context length
        config["max_position_embeddings"] = entry["max_position_embeddings"]
    return config
