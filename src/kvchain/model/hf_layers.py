"""Hugging Face ``config.json`` -> what each decoder layer runs (its mixers and its MLP).

This module only reads a config; it knows no bytes. :mod:`kvchain.model.hf` turns the plan
into cache tensors and :mod:`kvchain.model.params` into parameter counts.

Per-layer kinds are read, in this order, from the first field the config has:

1. a list naming each layer's kind: ``layer_types`` (gpt-oss, Gemma 3 in newer
   transformers, Qwen3.5, Jet-Nemotron's ``attn``/``swa``/``jet``) or ``layers_block_type``;
   a ``"+"`` joins two mixers of one layer (``"full_attention+mamba2"``);
2. ``hybrid_override_pattern`` (Nemotron-H, Nemotron 3): one character per layer,
   ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE;
3. ``attn_type_list`` (MiniMax-01/M1): ``1`` softmax attention, ``0`` linear (lightning);
4. ``hybrid_layer_pattern`` (MiMo-V2-Flash): ``0`` full, ``1`` sliding window;
5. ``sliding_window_layout`` (SmallThinker): ``1`` sliding window, ``0`` full;
6. the rule of the family's transformers configuration class (``model_type``):

   ============== ============================================================
   gemma3         full if ``(i+1) % sliding_window_pattern == 0`` (default 6)
   gemma4         as gemma3, and the last layer is always full
   mamba2         every layer Mamba-2 (state only)
   mamba          every layer Mamba-1 (also ``falcon_mamba``)
   phi4flash      SambaY: see :func:`_sambay_kinds`
   kimi_linear    ``linear_attn_config`` layer lists: see :func:`_kimi_kinds`
   deepseek_v4    ``compress_ratios`` (0 window, 4 window + CSA, 128 window + HCA)
   gemma2         window if ``(i+1) % 2`` else full
   qwen3_next     full if ``(i+1) % full_attention_interval == 0`` else Gated DeltaNet
   jamba          attention if ``i % attn_layer_period == attn_layer_offset`` else Mamba-1
   llama4         full (NoPE) if ``no_rope_layers[i] == 0`` or, without that list,
                  ``(i+1) % no_rope_layer_interval == 0`` (default 4); else chunked local
   falcon_h1      attention AND Mamba-2 in parallel in every layer
   dense families all full; all window when ``sliding_window`` is set (Mistral); Qwen2/3
                  with ``use_sliding_window``: window from ``max_window_layers`` on
   ============== ============================================================

Configs are read through transformers' configuration class when transformers knows the
family (:mod:`~kvchain.model.hf_transformers`), so ``layer_types`` usually arrives
derived by the class; the rules below serve the raw dict. Gemma 4, Mamba, Mamba-2,
Kimi-Linear, DeepSeek-V4 and the ``per_layer_config`` reading follow transformers 5.24;
SambaY follows microsoft/Phi-4-mini-flash-reasoning ``modeling_phi4flash.py``.
Sources of the older rules: the configuration classes of huggingface/transformers 4.57
(``configuration_gemma3.py``, ``configuration_gemma2.py``, ``configuration_qwen3_next.py``,
``configuration_jamba.py``, ``configuration_llama4.py``, ``configuration_qwen2.py``), the
Falcon-H1 README (tiiuae/Falcon-H1: attention and SSM run in parallel in every block) and
the sources listed in ``catalog/data/SOURCES.md`` for the custom-code families (e.g.
Jet-Nemotron: NVlabs/Jet-Nemotron ``jetai/modeling/configs/jetlm_2B.json``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType

from kvchain.errors import ConfigError, MissingFieldError, UnknownFamilyError
from kvchain.model.hf_family_defaults import family_defaults
from kvchain.model.hf_transformers import ReadThrough, read_through_transformers
from kvchain.model.spec import DefaultedField
from kvchain.unique_fields import user_json


class Mixer(StrEnum):
    """A token mixer that keeps a cache: attention (by lifetime) or a recurrent kind."""

    FULL = "full"
    WINDOW = "window"
    LOCAL = "local"
    MAMBA1 = "mamba1"
    MAMBA2 = "mamba2"
    GATED_DELTA_NET = "gated_delta_net"
    LIGHTNING = "lightning"
    JET = "jet"
    KDA = "kda"
    CSA = "csa"
    HCA = "hca"

    @property
    def is_attention(self) -> bool:
        """True for full, sliding-window and chunked-local attention."""
        return self in (Mixer.FULL, Mixer.WINDOW, Mixer.LOCAL)

    @property
    def is_compressed(self) -> bool:
        """True for compressed-KV attention (DeepSeek-V4 CSA and HCA): one KV entry per
        group of tokens, kept for the whole request."""
        return self in (Mixer.CSA, Mixer.HCA)


class Ffn(StrEnum):
    """The feed-forward part of a layer."""

    NONE = "none"
    DENSE = "dense"
    MOE = "moe"


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """What one decoder layer runs.

    Attributes:
        index: layer index (0-based).
        mixers: cache-keeping mixers of the layer (empty for an MLP-only layer; two for a
            Falcon-H1 layer: attention and Mamba-2 in parallel).
        ffn: the layer's feed-forward block.
    """

    index: int
    mixers: tuple[Mixer, ...]
    ffn: Ffn


MAX_FIELD_VALUE = 2**31 - 1
"""Largest magnitude kvchain accepts for an integer config field: engines hold sizes and
counts in int32 (no real model is near it), and it keeps products of sizes far from any
float or memory trouble."""

MAX_LAYERS = 10_000
"""Largest ``num_hidden_layers`` accepted (the largest real decoder has a few hundred):
layer plans are built per layer, so an absurd count would exhaust memory."""


def whole_number(value: object, field: str) -> int:
    """``value`` as an int when it is a finite whole number within :data:`MAX_FIELD_VALUE`.

    Python's ``json`` accepts ``NaN`` and ``Infinity``, so floats are checked before
    ``int()``; bools are refused (``true`` is not a count).

    Raises:
        ConfigError: not a number, a bool, not finite, not whole, or too large (names the
            field and the value).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config field {field!r} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config field {field!r} must be a finite number, got {value!r}")
    if abs(value) > MAX_FIELD_VALUE:
        raise ConfigError(
            f"config field {field!r} = {value!r} is out of range (|value| <= {MAX_FIELD_VALUE})"
        )
    if value != int(value):
        raise ConfigError(f"config field {field!r} must be a whole number, got {value!r}")
    return int(value)


def _shown(value: object) -> str:
    """A short text of a field's value for :class:`DefaultedField` (lists by length)."""
    if isinstance(value, list | tuple):
        kinds = sorted({str(v) for v in value})
        if len(kinds) == 1:
            return f"[{kinds[0]}] x {len(value)}"
        return f"{len(value)} entries"
    if isinstance(value, Mapping):
        return f"{{{len(value)} keys}}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True, slots=True)
class HFConfig:
    """A read-only view of a ``config.json``: the text model's fields plus family names.

    Multimodal configs (Llama 4, Gemma 3) keep the language model under ``text_config``;
    its fields are laid over the top-level ones, so ``fields`` is the text model.

    Every field the loader reads is checked against ``supplied``: a field present only
    because a configuration class (or kvchain's table of a custom-code family's defaults,
    :mod:`~kvchain.model.hf_family_defaults`) supplied it is recorded, as is every kvchain
    rule default a reader applies (:meth:`note_default`); :meth:`noted` lists them. They
    become ``ModelSpec.defaulted``: the values the model's bytes rest on that the file did
    not set.

    Attributes:
        fields: the merged fields (read-only mapping).
        model_types: ``model_type`` of the top level and of ``text_config`` (lower case).
        architectures: the ``architectures`` list.
        origin: where the config came from (a path, ``_name_or_path``, or ``""``).
        reader: who read the fields: ``"transformers <version> <ConfigClass>"`` or
            ``"raw dict"`` (see :mod:`~kvchain.model.hf_transformers`).
        supplied: field name -> who supplied its value (the reader's class, or the
            source of a family's defaults) for fields the file did not set.
    """

    fields: Mapping[str, object]
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    origin: str
    reader: str = "raw dict"
    supplied: Mapping[str, str] = dc_field(default_factory=dict)
    _noted: dict[str, DefaultedField] = dc_field(default_factory=dict, compare=False,
                                                  repr=False)

    @property
    def family(self) -> str:
        """Names for error messages: ``model_type=... architectures=[...]``."""
        types = "/".join(self.model_types) or "?"
        return f"model_type={types} architectures={list(self.architectures)}"

    def _value(self, key: str) -> object:
        value = self.fields.get(key)
        if value is not None and key in self.supplied and key not in self._noted:
            self._noted[key] = DefaultedField(key, _shown(value), self.supplied[key])
        return value

    def note_default(self, key: str, value: object, by: str) -> None:
        """Record that ``value`` stands for the absent field ``key`` (first note wins)."""
        self._noted.setdefault(key, DefaultedField(key, _shown(value), by))

    def noted(self) -> tuple[DefaultedField, ...]:
        """Every supplied or defaulted field read so far, by field name."""
        return tuple(sorted(self._noted.values(), key=lambda d: d.field))

    def has(self, key: str) -> bool:
        """True when the field is present and not ``null``."""
        return self._value(key) is not None

    def get(self, key: str, default: object = None) -> object:
        """The raw field value (``default`` when absent or ``null``)."""
        value = self._value(key)
        return default if value is None else value

    def int_or_none(self, *keys: str) -> int | None:
        """The first present field of ``keys`` as an int, or ``None`` if none is present.

        Raises:
            ConfigError: the field is present but not a finite whole number, or its
                magnitude exceeds :data:`MAX_FIELD_VALUE` (names the field and the value).
        """
        for key in keys:
            value = self._value(key)
            if value is None:
                continue
            return whole_number(value, key)
        return None

    def optional_int(self, *keys: str, default: int, minimum: int = 1,
                     default_by: str | None = None) -> int:
        """The first present field of ``keys`` as an int >= ``minimum``, else ``default``.

        Replaces ``int_or_none(...) or default``, which silently turned a 0 into the default.
        ``default_by``: when given and the default is used, it is recorded as a defaulted
        field (``keys[0]``) with that source (for defaults that decide bytes).

        Raises:
            ConfigError: the field is present but not a whole number, or below ``minimum``
                (names the field and the value).
        """
        for key in keys:
            if self.fields.get(key) is not None:
                value = self.require_int(key)
                if value < minimum:
                    raise ConfigError(f"config field {key!r} must be >= {minimum}, got {value}")
                return value
        if default_by is not None:
            self.note_default(keys[0], default, default_by)
        return default

    def require_int(self, *keys: str) -> int:
        """The first present field of ``keys`` as an int.

        Raises:
            MissingFieldError: none of ``keys`` is present (names them).
            ConfigError: the field is not a whole number.
        """
        value = self.int_or_none(*keys)
        if value is None:
            names = " or ".join(repr(k) for k in keys)
            raise MissingFieldError(f"config ({self.family}) lacks {names}")
        return value

    def positive_int(self, *keys: str) -> int:
        """Like :meth:`require_int` but the value must be > 0.

        Raises:
            MissingFieldError: none of ``keys`` is present.
            ConfigError: the value is zero or negative (names field and value).
        """
        value = self.require_int(*keys)
        if value <= 0:
            key = next(k for k in keys if self.fields.get(k) is not None)
            raise ConfigError(f"config field {key!r} must be positive, got {value}")
        return value

    def is_family(self, *names: str) -> bool:
        """True when the top-level or text ``model_type`` is one of ``names``."""
        return any(t in names for t in self.model_types)


_MAX_CONFIG_BYTES = 64 * 1024 * 1024
"""Largest ``config.json`` read (real ones are a few KiB; guards memory)."""


def _load_json_file(path: Path) -> object:
    try:
        if path.is_file() and path.stat().st_size > _MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {path} is larger than {_MAX_CONFIG_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except OSError as exc:  # a directory, no permission, an I/O error
        raise ConfigError(f"config file {path} cannot be read: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc}") from exc
    try:
        return user_json(text, unique=False)  # a Hugging Face config keeps json's rule
    except ConfigError as exc:  # invalid or unusable JSON
        raise ConfigError(f"config file {path}: {exc}") from None


def _architectures(raw: Mapping[str, object]) -> tuple[str, ...]:
    archs = raw.get("architectures")
    if archs is None:
        return ()
    if isinstance(archs, str):
        return (archs,)
    if isinstance(archs, list | tuple) and all(isinstance(a, str) for a in archs):
        return tuple(archs)
    raise ConfigError(f"config field 'architectures' must be a list of strings, got {archs!r}")


def read_config(
    config: str | Path | Mapping[str, object], *, use_transformers: bool = True,
    read_as: ReadThrough | None = None,
) -> HFConfig:
    """Read a config from a path (``config.json``) or an already parsed mapping.

    With ``use_transformers`` (the default) the fields are those of transformers'
    configuration class for the ``model_type`` when transformers is installed and knows it
    (defaults, derived per-layer lists, aliases), else the raw dict
    (:func:`~kvchain.model.hf_transformers.read_through_transformers`). ``read_as``: a
    reading of ``config`` made before (a bundled model's frozen transformers view,
    :mod:`kvchain.catalog.views`), used instead of reading it now.

    A raw-dict reading of a custom-code family that transformers lacks gets the defaults
    of that family's configuration class (:mod:`~kvchain.model.hf_family_defaults`) for the
    fields the file does not set. Fields supplied by a class or that table are named in
    ``HFConfig.supplied``.

    Raises:
        ConfigError: the file is missing, unreadable (a directory, no permission), not
            UTF-8, larger than 64 MiB, not JSON (or JSON Python cannot hold: nesting too
            deep, an integer over 4,300 digits), not a JSON object, or its
            ``architectures`` is not a string or a list of strings.
    """
    origin = ""
    if isinstance(config, str | Path):
        path = Path(config)
        raw = _load_json_file(path)
        origin = str(path)
    else:
        raw = config
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config must be a JSON object, got {type(raw).__name__}")
    archs = _architectures(raw)
    read = read_as
    if read is None:
        read = read_through_transformers(raw) if use_transformers else ReadThrough(
            dict(raw), "raw dict")
    view: Mapping[str, object] = read.fields
    merged: dict[str, object] = dict(view)
    text = view.get("text_config")
    for key in ("text_config", "quantization_config"):  # read as objects further down
        value = view.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"config field {key!r} must be a JSON object, got "
                              f"{type(value).__name__} {value!r}"[:200])
    types = [str(raw.get("model_type", "")).lower()]
    if isinstance(text, Mapping):
        merged.update(text)
        types.append(str(text.get("model_type", "")).lower())
    model_types = tuple(t for t in types if t)
    supplied = {k: read.reader for k in read.defaulted}
    table = family_defaults(model_types) if read.reader == "raw dict" else None
    if table is not None:
        for key, value in table.values.items():
            if merged.get(key) is None:
                merged[key] = value
                supplied[key] = table.source
    origin = origin or str(raw.get("_name_or_path", "") or "")
    return HFConfig(
        fields=MappingProxyType(merged),
        model_types=model_types,
        architectures=archs,
        origin=origin,
        reader=read.reader,
        supplied=MappingProxyType(supplied),
    )


# --- per-layer kinds ----------------------------------------------------------------------

# Words of per-layer kind lists; "mamba" and "linear_attention" are resolved from the
# config's fields (see _resolve_word). None: an MLP-only layer.
_WORDS: dict[str, tuple[str, ...]] = {
    "full_attention": ("full",),
    "attention": ("full",),
    "attn": ("full",),
    "full": ("full",),
    "global": ("full",),
    "global_attention": ("full",),
    "sliding_attention": ("window",),
    "sliding_window": ("window",),
    "sliding": ("window",),
    "swa": ("window",),
    "local_sliding": ("window",),
    "chunked_attention": ("local",),
    "chunked": ("local",),
    "mamba": ("mamba",),
    "mamba1": ("mamba1",),
    "mamba2": ("mamba2",),
    "linear_attention": ("linear",),
    "gated_delta_net": ("gated_delta_net",),
    "lightning_attention": ("lightning",),
    "lightning": ("lightning",),
    "jet": ("jet",),
    "kda": ("kda",),
    "kimi_delta_attention": ("kda",),
    "compressed_sparse_attention": ("window", "csa"),
    "heavily_compressed_attention": ("window", "hca"),
    "shared_attention": (),
    "hybrid": ("full", "mamba"),
    "mlp": (),
    "moe": (),
    "ffn": (),
}
_FFN_ONLY_WORDS = {"mlp": Ffn.DENSE, "moe": Ffn.MOE, "ffn": Ffn.DENSE}

_PATTERN_CHARS: dict[str, tuple[tuple[str, ...], Ffn]] = {
    "M": (("mamba2",), Ffn.NONE),
    "*": (("full",), Ffn.NONE),
    "-": ((), Ffn.DENSE),
    "E": ((), Ffn.MOE),
}

_MAMBA2_FIELDS = (
    "mamba_num_heads",
    "mamba_n_heads",
    "n_mamba_heads",
    "mamba_head_dim",
    "mamba_d_head",
    "mamba_headdim",
    "mamba_n_groups",
    "mamba_ngroups",
    "mamba_d_ssm",
)
_GDN_FIELDS = ("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")

# Families whose every layer is plain attention (full, or window when sliding_window is on).
_DENSE_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "phi3",
        "olmo",
        "olmo2",
        "granite",
        "starcoder2",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "gpt_oss",
    }
)


def _resolve_word(cfg: HFConfig, word: str) -> Mixer:
    """``mamba`` and ``linear_attention`` name different mixers in different families.

    ``linear_attention``: Gated DeltaNet when the ``linear_*`` head fields are there
    (Qwen3-Next, Qwen3.5); Kimi Delta Attention for ``kimi_linear`` (transformers'
    ``KimiLinearConfig`` writes ``linear_attention`` for the ``kda_layers``); Mamba-2 for
    ``nemotron_h`` (transformers 5's ``NemotronHConfig`` writes ``linear_attention`` for
    ``M`` layers); else lightning attention (MiniMax).
    """
    if word == "mamba":
        return Mixer.MAMBA2 if any(cfg.has(f) for f in _MAMBA2_FIELDS) else Mixer.MAMBA1
    if word == "linear":
        if any(cfg.has(f) for f in _GDN_FIELDS):
            return Mixer.GATED_DELTA_NET
        if cfg.is_family("kimi_linear") or cfg.has("linear_attn_config"):
            return Mixer.KDA
        if cfg.is_family("nemotron_h") or any(cfg.has(f) for f in _MAMBA2_FIELDS):
            return Mixer.MAMBA2
        return Mixer.LIGHTNING
    return Mixer(word)


def _mixers_of_word(cfg: HFConfig, raw: object, index: int, field: str) -> tuple[Mixer, ...]:
    out: list[Mixer] = []
    for part in str(raw).strip().lower().split("+"):
        words = _WORDS.get(part)
        if words is None:
            raise UnknownFamilyError(
                f"{field}[{index}] = {raw!r} names a layer kind kvchain cannot map "
                f"({cfg.family}); known kinds: {sorted(_WORDS)}"
            )
        out.extend(_resolve_word(cfg, w) for w in words)
    return tuple(out)


def _check_length(cfg: HFConfig, field: str, values: Sequence[object], n: int) -> None:
    if len(values) != n:
        raise ConfigError(
            f"config field {field!r} has {len(values)} entries but num_hidden_layers is {n}"
        )


def _list_field(cfg: HFConfig, field: str, n: int) -> Sequence[object]:
    """Config field ``field``, a list of ``n`` entries (ConfigError if not)."""
    values = cfg.get(field)
    if not isinstance(values, list | tuple):
        raise ConfigError(f"config field {field!r} must be a list, got {values!r}")
    _check_length(cfg, field, values, n)
    return values


def _from_word_list(cfg: HFConfig, field: str, n: int) -> list[tuple[tuple[Mixer, ...], Ffn]]:
    words = [str(v).strip().lower() for v in _list_field(cfg, field, n)]
    single_block = any(w in _FFN_ONLY_WORDS for w in words)
    rows = []
    for i, word in enumerate(words):
        mixers = _mixers_of_word(cfg, word, i, field)
        if word in _FFN_ONLY_WORDS:
            ffn = _FFN_ONLY_WORDS[word]
        else:
            ffn = Ffn.NONE if single_block else _default_ffn(cfg, i)
        rows.append((mixers, ffn))
    return rows


def _from_pattern(cfg: HFConfig, n: int) -> list[tuple[tuple[Mixer, ...], Ffn]]:
    pattern = str(cfg.get("hybrid_override_pattern"))
    _check_length(cfg, "hybrid_override_pattern", pattern, n)
    rows = []
    for i, char in enumerate(pattern):
        if char not in _PATTERN_CHARS:
            raise UnknownFamilyError(
                f"hybrid_override_pattern[{i}] = {char!r} is not one of M * - E ({cfg.family})"
            )
        words, ffn = _PATTERN_CHARS[char]
        rows.append((tuple(_resolve_word(cfg, w) for w in words), ffn))
    return rows


def _from_int_list(
    cfg: HFConfig, field: str, n: int, meaning: Mapping[int, Mixer]
) -> list[tuple[tuple[Mixer, ...], Ffn]]:
    rows: list[tuple[tuple[Mixer, ...], Ffn]] = []
    for i, value in enumerate(_list_field(cfg, field, n)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value not in meaning:
            raise ConfigError(
                f"{field}[{i}] = {value!r}; expected one of {sorted(meaning)} ({cfg.family})"
            )
        rows.append(((meaning[int(value)],), _default_ffn(cfg, i)))
    return rows


def _family_kinds(cfg: HFConfig, n: int) -> list[tuple[Mixer, ...]]:
    fam = cfg.is_family
    if fam("gemma3", "gemma3_text"):
        period = cfg.optional_int("sliding_window_pattern", default=6,
                                  default_by="kvchain rule (Gemma3TextConfig default)")
        return [(Mixer.FULL,) if (i + 1) % period == 0 else (Mixer.WINDOW,) for i in range(n)]
    if fam("gemma4", "gemma4_text"):
        # transformers' Gemma4TextConfig: 5 window layers then 1 full, last layer full
        period = cfg.optional_int("sliding_window_pattern", default=6,
                                  default_by="kvchain rule (Gemma4TextConfig default)")
        return [
            (Mixer.FULL,) if (i + 1) % period == 0 or i == n - 1 else (Mixer.WINDOW,)
            for i in range(n)
        ]
    if fam("gemma2"):
        return [(Mixer.WINDOW,) if (i + 1) % 2 else (Mixer.FULL,) for i in range(n)]
    if fam("qwen3_next"):
        interval = cfg.positive_int("full_attention_interval")
        return [
            (Mixer.FULL,) if (i + 1) % interval == 0 else (Mixer.GATED_DELTA_NET,) for i in range(n)
        ]
    if fam("jamba"):
        period = cfg.positive_int("attn_layer_period")
        offset = cfg.require_int("attn_layer_offset")
        if not 0 <= offset < period:
            raise ConfigError(
                f"config field 'attn_layer_offset' must be in [0, attn_layer_period={period}), "
                f"got {offset}"
            )
        return [(Mixer.FULL,) if i % period == offset else (Mixer.MAMBA1,) for i in range(n)]
    if fam("llama4", "llama4_text"):
        return _llama4_kinds(cfg, n)
    if fam("falcon_h1"):
        return [(Mixer.FULL, Mixer.MAMBA2)] * n
    if fam("mamba2"):
        return [(Mixer.MAMBA2,)] * n
    if fam("mamba", "falcon_mamba"):
        return [(Mixer.MAMBA1,)] * n
    if fam("phi4flash", "sambay"):
        return _sambay_kinds(cfg, n)
    if fam("kimi_linear"):
        return _kimi_kinds(cfg, n)
    if any(t in _DENSE_FAMILIES for t in cfg.model_types):
        return _dense_kinds(cfg, n)
    raise UnknownFamilyError(
        f"cannot tell the layer kinds of {cfg.family}: no per-layer kind list "
        "(layer_types, layers_block_type, hybrid_override_pattern, attn_type_list, "
        "hybrid_layer_pattern, sliding_window_layout) and no known family rule"
    )


def _sambay_kinds(cfg: HFConfig, n: int) -> list[tuple[Mixer, ...]]:
    """SambaY (Phi-4-mini-flash), from microsoft/Phi-4-mini-flash-reasoning
    ``modeling_phi4flash.py`` (``Phi4FlashDecoderLayer``) and ``configuration_phi4flash.py``.

    Layer ``i`` of ``n``: Mamba-1 when ``i % mb_per_layer == 0`` (default 2), attention
    otherwise. The self-decoder (``i < n/2``) has window attention. From ``i = n/2 + 2``
    on (the cross-decoder, ``yoco_cross``) Mamba layers become gated memory units and
    attention layers cross-attend to layer ``n/2 + 1``'s KV: neither keeps a cache. Layer
    ``n/2 + 1`` is the one full-attention layer (its KV is what the cross-decoder reads);
    layer ``n/2`` is a last Mamba layer (when ``n/2`` is a Mamba index).
    """
    period = cfg.positive_int("mb_per_layer")  # default 2: kvchain.model.hf_family_defaults
    cross_from = sambay_cross_from(n)
    out: list[tuple[Mixer, ...]] = []
    for i in range(n):
        if i >= cross_from:
            out.append(())
        elif i % period == 0:
            out.append((Mixer.MAMBA1,))
        else:
            out.append((Mixer.WINDOW,) if i < n // 2 else (Mixer.FULL,))
    return out


def sambay_cross_from(n: int) -> int:
    """First layer of SambaY's cross-decoder (``yoco_cross``) in a model of ``n`` layers:
    ``n // 2 + 2`` (microsoft/Phi-4-mini-flash-reasoning ``modeling_phi4flash.py``). Its
    layers keep no cache: gated memory units at ``i % mb_per_layer == 0``, attention that
    reads layer ``n // 2 + 1``'s KV otherwise."""
    return n // 2 + 2


def _kimi_kinds(cfg: HFConfig, n: int) -> list[tuple[Mixer, ...]]:
    """Kimi-Linear without transformers, as ``KimiLinearConfig.__post_init__`` does it:
    ``linear_attn_config.full_attn_layers`` (1-based) are MLA, ``kda_layers`` KDA; without
    those lists, full when ``i > 0 and i % 4 == 0``, else KDA."""
    block = cfg.get("linear_attn_config")
    sub = block if isinstance(block, Mapping) else {}
    full, kda = sub.get("full_attn_layers"), sub.get("kda_layers")
    if not (isinstance(full, list | tuple) and isinstance(kda, list | tuple)):
        return [(Mixer.FULL,) if i and i % 4 == 0 else (Mixer.KDA,) for i in range(n)]
    kinds: list[tuple[Mixer, ...]] = [() for _ in range(n)]
    for field, values, mixer in (("full_attn_layers", full, Mixer.FULL),
                                 ("kda_layers", kda, Mixer.KDA)):
        for value in values:
            index = whole_number(value, f"linear_attn_config.{field}")
            if not 1 <= index <= n:
                raise ConfigError(
                    f"linear_attn_config.{field} names layer {index}; layers are 1..{n}"
                )
            kinds[index - 1] = (mixer,)
    return kinds


def _llama4_kinds(cfg: HFConfig, n: int) -> list[tuple[Mixer, ...]]:
    chunked = Mixer.LOCAL if cfg.has("attention_chunk_size") else Mixer.FULL
    no_rope = cfg.get("no_rope_layers")
    if isinstance(no_rope, list | tuple) and no_rope:
        _check_length(cfg, "no_rope_layers", no_rope, n)
        if any(v not in (0, 1) for v in no_rope):
            raise ConfigError(f"no_rope_layers must hold 0 or 1, got {list(no_rope)}")
        return [(chunked,) if v else (Mixer.FULL,) for v in no_rope]
    interval = cfg.optional_int("no_rope_layer_interval", default=4,
                                default_by="kvchain rule (Llama4TextConfig default)")
    return [(Mixer.FULL,) if (i + 1) % interval == 0 else (chunked,) for i in range(n)]


def _dense_kinds(cfg: HFConfig, n: int) -> list[tuple[Mixer, ...]]:
    if not cfg.has("sliding_window") or cfg.get("use_sliding_window", True) is False:
        return [(Mixer.FULL,)] * n
    if not cfg.has("use_sliding_window"):
        cfg.note_default("use_sliding_window", True,
                         "kvchain rule: a sliding_window turns window layers on")
    first_window = 0
    if cfg.is_family("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        first_window = cfg.optional_int("max_window_layers", default=0, minimum=0,
                                        default_by="kvchain rule: windows from layer 0")
    return [(Mixer.WINDOW,) if i >= first_window else (Mixer.FULL,) for i in range(n)]


# --- feed-forward kind per layer -----------------------------------------------------------


EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_primary_experts")
"""Fields naming the routed experts per MoE layer, in the order they are tried."""


def num_experts(cfg: HFConfig) -> int:
    """Routed experts per MoE layer (0 for a dense model).

    Raises:
        ConfigError: a negative or non-whole expert count (names the field).
    """
    return cfg.optional_int(
        *EXPERT_FIELDS,
        default=0,
        minimum=0,
    )


def _default_ffn(cfg: HFConfig, i: int) -> Ffn:
    """Feed-forward kind of layer ``i`` of a model whose every layer has one.

    MoE placement rules: ``moe_layer_freq`` list (MiMo: 1 = MoE); ``expert_layer_period``
    / ``expert_layer_offset`` (Jamba); ``interleave_moe_layer_step`` (Llama 4: MoE if
    ``(i+1) % step == 0``); ``first_k_dense_replace`` (DeepSeek: dense below k, then every
    ``moe_layer_freq``-th); ``decoder_sparse_step`` / ``mlp_only_layers`` (Qwen MoE).
    Otherwise every layer of an MoE model is MoE.
    """
    if num_experts(cfg) <= 0:
        return Ffn.DENSE
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list | tuple):
        n = cfg.require_int("num_hidden_layers", "num_layers", "n_layer")
        _check_length(cfg, "moe_layer_freq", freq, n)
        if freq[i] not in (0, 1):
            raise ConfigError(f"moe_layer_freq[{i}] = {freq[i]!r}; expected 0 or 1")
        return Ffn.MOE if freq[i] else Ffn.DENSE
    if cfg.has("expert_layer_period"):
        period = cfg.positive_int("expert_layer_period")
        offset = cfg.optional_int("expert_layer_offset", default=0, minimum=0)
        if offset >= period:
            raise ConfigError(
                f"config field 'expert_layer_offset' = {offset} must be below "
                f"expert_layer_period = {period}"
            )
        return Ffn.MOE if i % period == offset else Ffn.DENSE
    if cfg.has("interleave_moe_layer_step"):
        step = cfg.positive_int("interleave_moe_layer_step")
        return Ffn.MOE if (i + 1) % step == 0 else Ffn.DENSE
    if cfg.has("first_k_dense_replace"):
        k = cfg.optional_int("first_k_dense_replace", default=0, minimum=0)
        every = cfg.optional_int("moe_layer_freq", default=1)
        return Ffn.MOE if i >= k and i % every == 0 else Ffn.DENSE
    if cfg.has("decoder_sparse_step") or cfg.has("mlp_only_layers"):
        step = cfg.optional_int("decoder_sparse_step", default=1)
        dense_layers = cfg.get("mlp_only_layers", [])
        if isinstance(dense_layers, list | tuple) and i in dense_layers:
            return Ffn.DENSE
        return Ffn.MOE if step > 0 and (i + 1) % step == 0 else Ffn.DENSE
    return Ffn.MOE


def layer_plans(cfg: HFConfig) -> tuple[LayerPlan, ...]:
    """The plan of every decoder layer, in model order (see the module docstring).

    Raises:
        MissingFieldError: no ``num_hidden_layers``, or a field a family rule needs.
        UnknownFamilyError: no per-layer list and no known family rule, or a per-layer
            kind that kvchain cannot map (names the field, index and value).
        ConfigError: a per-layer list whose length differs from ``num_hidden_layers``, more
            than :data:`MAX_LAYERS` layers, or a bad value of a layer-rule field.
    """
    n = _depth(cfg)
    if n > MAX_LAYERS:
        raise ConfigError(f"num_hidden_layers = {n} is more than kvchain accepts ({MAX_LAYERS})")
    if cfg.has("layer_types"):
        rows = _from_word_list(cfg, "layer_types", n)
    elif cfg.has("layers_block_type"):
        rows = _from_word_list(cfg, "layers_block_type", n)
    elif cfg.has("hybrid_override_pattern"):
        rows = _from_pattern(cfg, n)
    elif cfg.has("attn_type_list"):
        linear = _resolve_word(cfg, "linear")
        rows = _from_int_list(cfg, "attn_type_list", n, {1: Mixer.FULL, 0: linear})
    elif cfg.has("hybrid_layer_pattern"):
        rows = _from_int_list(cfg, "hybrid_layer_pattern", n, {0: Mixer.FULL, 1: Mixer.WINDOW})
    elif cfg.has("sliding_window_layout"):
        rows = _from_int_list(cfg, "sliding_window_layout", n, {0: Mixer.FULL, 1: Mixer.WINDOW})
    elif cfg.has("compress_ratios"):
        rows = _from_compress_ratios(cfg, n)
    elif cfg.is_family("mamba", "mamba2", "falcon_mamba"):
        # a pure Mamba block has no MLP (transformers' MambaBlock / Mamba2Block)
        rows = [(kinds, Ffn.NONE) for kinds in _family_kinds(cfg, n)]
    else:
        rows = [(kinds, _default_ffn(cfg, i)) for i, kinds in enumerate(_family_kinds(cfg, n))]
    shared = kv_shared_layers(cfg, n)
    return tuple(
        LayerPlan(i, tuple(m for m in mixers if not (i in shared and m.is_attention)), ffn)
        for i, (mixers, ffn) in enumerate(rows)
    )


_LAYER_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern")


def _depth(cfg: HFConfig) -> int:
    """``num_hidden_layers``; without it, the length of the per-layer kind list (a
    ``nemotron_h`` config may give only ``layers_block_type``: transformers 5's
    ``NemotronHConfig.num_hidden_layers`` is that list's length).

    Raises:
        MissingFieldError: neither is present.
    """
    if any(cfg.has(k) for k in ("num_hidden_layers", "num_layers", "n_layer")):
        return cfg.positive_int("num_hidden_layers", "num_layers", "n_layer")
    for key in _LAYER_LISTS:
        value = cfg.get(key)
        if isinstance(value, list | tuple | str) and len(value) > 0:
            return len(value)
    return cfg.positive_int("num_hidden_layers", "num_layers", "n_layer")


def kv_shared_layers(cfg: HFConfig, n: int) -> frozenset[int]:
    """Layers whose attention reuses an earlier layer's KV and keeps none of its own.

    Gemma 4 (transformers' ``Gemma4TextConfig.num_kv_shared_layers`` and
    ``kv_sharing_modes``): the last ``num_kv_shared_layers`` layers read the KV of the
    last earlier layer of the same type.

    Raises:
        ConfigError: ``num_kv_shared_layers`` negative or above the layer count.
    """
    if not cfg.is_family("gemma4", "gemma4_text"):
        return frozenset()
    count = cfg.optional_int("num_kv_shared_layers", default=0, minimum=0)
    if count >= n and count:
        raise ConfigError(
            f"num_kv_shared_layers = {count} leaves no layer of the {n} to produce a KV cache"
        )
    return frozenset(range(n - count, n))


# DeepSeek-V4 (transformers' DeepseekV4Config): legacy per-layer compress_ratios,
# 0 = sliding window only, 4 = CSA, 128 = HCA.
_COMPRESS_RATIO_MIXERS: dict[int, tuple[Mixer, ...]] = {
    0: (Mixer.WINDOW,),
    4: (Mixer.WINDOW, Mixer.CSA),
    128: (Mixer.WINDOW, Mixer.HCA),
}


def _from_compress_ratios(cfg: HFConfig, n: int) -> list[tuple[tuple[Mixer, ...], Ffn]]:
    values = cfg.get("compress_ratios")
    if not isinstance(values, list | tuple):
        raise ConfigError(f"config field 'compress_ratios' must be a list, got {values!r}")
    values = list(values)[:n]
    _check_length(cfg, "compress_ratios", values, n)
    rows = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or value not in _COMPRESS_RATIO_MIXERS:
            raise ConfigError(
                f"compress_ratios[{i}] = {value!r}; expected one of "
                f"{sorted(_COMPRESS_RATIO_MIXERS)} ({cfg.family})"
            )
        rows.append((_COMPRESS_RATIO_MIXERS[int(value)], _default_ffn(cfg, i)))
    return rows
