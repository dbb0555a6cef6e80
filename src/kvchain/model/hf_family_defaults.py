"""Defaults of custom-code families that transformers does not ship, for the raw-dict reader.

A published ``config.json`` may leave out fields its own configuration class fills in
(the model runs with ``trust_remote_code``): Phi-4-mini-flash-reasoning's ``config.json``
has no ``mamba_d_state``, ``mamba_d_conv`` or ``mamba_expand``. transformers 5.24 has no
class for ``phi4flash``, so the raw-dict reader applies the class's defaults itself, and
each value applied is reported as a default the file did not set
(``ModelSpec.defaulted``).

Table (field -> default), with its source:

``phi4flash`` (and ``sambay``): ``Phi4FlashConfig.__init__`` in
``configuration_phi4flash.py`` of the Hugging Face repository
microsoft/Phi-4-mini-flash-reasoning (the copy read: franciskamande-ai/cloned_models
``Phi-4-mini-flash-reasoning/configuration_phi4flash.py`` @711ebe7): ``vocab_size``
51200, ``hidden_size`` 2560, ``intermediate_size`` 9216, ``num_hidden_layers`` 32,
``num_attention_heads`` 40, ``num_key_value_heads`` ``None`` (= the attention heads),
``max_position_embeddings`` 4096, ``tie_word_embeddings`` true, ``sliding_window`` 2047,
``mb_per_layer`` 2, ``mamba_d_state`` 16, ``mamba_d_conv`` 4, ``mamba_expand`` 2,
``mamba_dt_rank`` ``"auto"`` (= ``ceil(hidden_size / 16)``). ``None`` defaults are left
out: kvchain's own rule gives the same (KV heads default to the query heads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FamilyDefaults:
    """The defaults a family's configuration class applies.

    Attributes:
        source: where they were read (class, file, repository).
        values: field -> default value.
    """

    source: str
    values: Mapping[str, object]


_PHI4FLASH = FamilyDefaults(
    source="Phi4FlashConfig default (microsoft/Phi-4-mini-flash-reasoning "
           "configuration_phi4flash.py)",
    values={
        "vocab_size": 51200,
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "num_hidden_layers": 32,
        "num_attention_heads": 40,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "sliding_window": 2047,
        "mb_per_layer": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
    },
)

_TABLE: dict[str, FamilyDefaults] = {"phi4flash": _PHI4FLASH, "sambay": _PHI4FLASH}


def family_defaults(model_types: tuple[str, ...]) -> FamilyDefaults | None:
    """The defaults table of the first of ``model_types`` that has one, else ``None``.

    Raises:
        Nothing.
    """
    for model_type in model_types:
        if model_type in _TABLE:
            return _TABLE[model_type]
    return None
