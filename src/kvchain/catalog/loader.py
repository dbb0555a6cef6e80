"""The bundled model catalog: names and aliases -> :class:`~kvchain.model.spec.ModelSpec`.

Package data under ``kvchain/catalog/data/`` (sources and licenses in ``SOURCES.md``):
``models.json`` (19 models), ``model_configs/*.json`` (14 verbatim Hugging Face configs)
and ``catalog.json`` (the index: names, aliases, which file describes each model).

A model with a verbatim config is built from it (:func:`~kvchain.model.hf.load_hf_config`);
a model only in ``models.json`` is built from its entry
(:func:`~kvchain.catalog.models_json.entry_config`). Lookups ignore case and treat ``_``
and spaces like ``-``; aliases include the Hugging Face repository id, its last part and
the config file's stem.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kvchain.catalog.models_json import entry_config
from kvchain.catalog.views import bundled_fields
from kvchain.errors import ConfigError, UnknownModelError
from kvchain.model.draft import with_draft
from kvchain.model.hf import load_hf_config
from kvchain.model.hf_layers import read_config
from kvchain.model.hf_transformers import ReadThrough
from kvchain.model.layers import CacheDtype, LifetimeClass
from kvchain.model.params import WeightFormat
from kvchain.model.spec import DraftKind, ModelSpec
from kvchain.model.spec_file import load_spec_file


@dataclass(frozen=True, slots=True)
class ClassSummary:
    """One lifetime class of a catalog model (bf16, tp=1).

    Attributes:
        lifetime: the class.
        layers: cache-keeping layers in it.
        bytes_per_token: ``E`` in bytes per token (0 for state).
        bytes_per_slot: ``S`` in bytes per request (0 for token classes).
        window: ``W`` or ``C`` tokens, ``None`` for full and state.
    """

    lifetime: LifetimeClass
    layers: int
    bytes_per_token: int
    bytes_per_slot: int
    window: int | None


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A bundled model, as listed by :func:`list_models`.

    Attributes:
        name: canonical name (what :func:`load_model` takes, any case).
        aliases: other accepted names (lower case).
        hf_repo: Hugging Face repository id.
        source: where its data came from (repository, path, commit).
        license: license of that data.
        has_config: a verbatim ``config.json`` is bundled (else: built from models.json).
        classes: its lifetime classes at bf16, tp=1, ordered state, window, local, full.
        total_params: all parameters (count).
        active_params: parameters read per token (count).
        weight_bytes: weight bytes on one rank at tp=1.
    """

    name: str
    aliases: tuple[str, ...]
    hf_repo: str
    source: str
    license: str
    has_config: bool
    classes: tuple[ClassSummary, ...]
    total_params: int
    active_params: int
    weight_bytes: int

    @property
    def lifetimes(self) -> str:
        """The classes joined, e.g. ``"state+window+full"``."""
        return "+".join(c.lifetime.value for c in self.classes)


@dataclass(frozen=True, slots=True)
class _Record:
    name: str
    aliases: tuple[str, ...]
    hf_repo: str
    source: str
    license: str
    config_file: str | None
    entry: Mapping[str, object] | None
    params_fields: Mapping[str, object]
    weight_format: WeightFormat | None


def _data() -> Traversable:
    return resources.files("kvchain.catalog").joinpath("data")


def _read_json(relative: str) -> object:
    node = _data()
    for part in relative.split("/"):
        node = node.joinpath(part)
    return json.loads(node.read_text(encoding="utf-8"))


def read_models_json() -> list[dict[str, object]]:
    """The bundled ``models.json``: 19 entries with layer kinds, shapes and derived bytes."""
    data = _read_json("models.json")
    assert isinstance(data, list)
    return data


def read_bundled_config(relative: str) -> dict[str, object]:
    """A bundled file by its path under ``catalog/data`` (e.g. ``"model_configs/x.json"``).

    Raises:
        ConfigError: no such bundled file.
    """
    try:
        data = _read_json(relative)
    except FileNotFoundError as exc:
        raise ConfigError(f"no bundled file {relative!r}") from exc
    assert isinstance(data, dict)
    return data


def _normalize(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", " ").split())


def _source_text(entry: Mapping[str, object] | None, spec: Mapping[str, object]) -> tuple[str, str]:
    if "source" in spec:
        return str(spec["source"]), str(spec.get("license", ""))
    src = entry.get("source") if entry else None
    if not isinstance(src, Mapping):
        return "", ""
    commit = src.get("commit")
    where = f"{src.get('repo', '')} {src.get('path', '')}".strip()
    if commit:
        where += f" @{str(commit)[:12]}"
    return where, str(src.get("license", ""))


def _records() -> list[_Record]:
    index = _read_json("catalog.json")
    assert isinstance(index, dict)
    entries = {str(e["name"]): e for e in read_models_json()}
    out = []
    for spec in index["models"]:
        entry = entries[spec["models_json"]] if spec.get("models_json") else None
        config_file = spec.get("config")
        aliases = {_normalize(spec["name"]), _normalize(spec["hf_repo"])}
        aliases.add(_normalize(spec["hf_repo"].split("/")[-1]))
        aliases.update(_normalize(a) for a in spec.get("aliases", []))
        if entry is not None:
            aliases.add(_normalize(str(entry["name"])))
        if config_file:
            aliases.add(_normalize(config_file.split("/")[-1].removesuffix(".json")))
        aliases.discard(_normalize(spec["name"]))
        source, license_ = _source_text(entry, spec)
        fmt = spec.get("weight_format")
        out.append(
            _Record(
                name=spec["name"],
                aliases=tuple(sorted(aliases)),
                hf_repo=spec["hf_repo"],
                source=source,
                license=license_,
                config_file=config_file,
                entry=entry,
                params_fields=spec.get("param_fields", {}),
                weight_format=None if fmt is None else WeightFormat(fmt),
            )
        )
    return out


def _find(name: str, records: list[_Record]) -> _Record:
    key = _normalize(name)
    for record in records:
        if key == _normalize(record.name) or key in record.aliases:
            return record
    names = {_normalize(r.name): r.name for r in records}
    for record in records:
        names.update({a: record.name for a in record.aliases})
    close = [names[k] for k in difflib.get_close_matches(key, list(names), n=8, cutoff=0.5)]
    close += [r.name for r in records if key and key in _normalize(r.name)]
    suggestions = list(dict.fromkeys(close))[:5]
    hint = f"; close names: {', '.join(suggestions)}" if suggestions else ""
    raise UnknownModelError(
        f"no bundled model named {name!r}{hint} (see `kvchain models` for all)"
    )


def resolve_name(name: str) -> str:
    """The canonical catalog name of ``name`` (any case, alias or repository id).

    Raises:
        UnknownModelError: no bundled model has that name; the message lists close names.
    """
    return _find(name, _records()).name


def vocab_size(name: str) -> int | None:
    """Tokens of the vocabulary of the bundled model ``name``: its bundled config's
    ``vocab_size`` (a multimodal config's text config), else the catalog's parameter
    fields or its ``models.json`` entry's; ``None`` where none of them gives one. What a
    speculative draft must share with its target (it proposes the target's token ids).

    Raises:
        UnknownModelError: no bundled model has that name.
    """
    record = _find(name, _records())
    found: object = None
    if record.config_file:
        cfg = read_bundled_config(record.config_file)
        text = cfg.get("text_config")
        found = cfg.get("vocab_size") or (text.get("vocab_size") if isinstance(text, dict)
                                          else None)
    if found is None:
        found = record.params_fields.get("vocab_size")
    if found is None and record.entry is not None:
        extra = record.entry.get("extra")
        found = extra.get("vocab_size") if isinstance(extra, dict) else None
    return found if type(found) is int and found > 0 else None


def _build(
    record: _Record,
    *,
    kv_dtype: CacheDtype | None,
    tp: int,
    state_dtype: CacheDtype | None,
    from_entry: bool,
) -> ModelSpec:
    def load(config: Mapping[str, object], read: ReadThrough | None = None) -> ModelSpec:
        # Bundled configs are read from their frozen transformers view (catalog/views.py):
        # the same bytes with or without transformers installed, and no import of it.
        return load_hf_config(config, name=record.name, kv_dtype=kv_dtype, tp=tp,
                              state_dtype=state_dtype, weight_format=record.weight_format,
                              source=record.source, use_transformers=False, read_as=read)

    if record.config_file and not from_entry:
        raw = read_bundled_config(record.config_file)
        return load(raw, bundled_fields(record.config_file, raw))
    if record.entry is None:
        raise UnknownModelError(f"{record.name!r} has no models.json entry")
    params: Mapping[str, object] = record.params_fields
    if record.config_file:
        raw = read_bundled_config(record.config_file)
        read = bundled_fields(record.config_file, raw)
        params = dict(read_config(raw, use_transformers=False, read_as=read).fields)
    return load(entry_config(record.entry, params))


def load_model(
    name: str,
    *,
    kv_dtype: CacheDtype | None = None,
    tp: int = 1,
    state_dtype: CacheDtype | None = None,
) -> ModelSpec:
    """The :class:`ModelSpec` of a bundled model, per tensor-parallel rank.

    Built from the verbatim ``config.json`` when one is bundled, else from the
    ``models.json`` entry. Arguments as :func:`~kvchain.model.hf.load_hf_config`.

    Example: ``load_model("gpt-oss-120b").bytes_per_token(LifetimeClass.FULL) == 36_864``.

    Raises:
        UnknownModelError: no bundled model has that name (lists close names).
        ConfigError: ``tp`` does not divide the model's heads or channels.
    """
    record = _find(name, _records())
    return _build(record, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype, from_entry=False)


def load_model_source(
    model: str,
    config: str | Path | None = None,
    *,
    spec_file: str | Path | None = None,
    kv_dtype: CacheDtype | None = None,
    tp: int = 1,
    state_dtype: CacheDtype | None = None,
    weight_format: WeightFormat | None = None,
    draft_model: str | None = None,
) -> ModelSpec:
    """The model of a run, per tensor-parallel rank: a spec file, a Hugging Face
    ``config.json``, or a bundled name, in that order of precedence (``kvchain plan``,
    ``simulate``, ``compare`` and ``sweep`` all load their model here); with
    ``draft_model``, joined with that bundled draft (:func:`load_draft`).

    ``kv_dtype`` / ``state_dtype`` override what a config declares (``None``: the config's
    dtype fields, else bf16; :mod:`kvchain.model.hf_dtypes`). ``weight_format`` says how a
    ``config``'s checkpoint stores its weights (:class:`~kvchain.model.params.WeightFormat`;
    ``None``: its ``quantization_config``): a spec file declares its weight bytes and a
    bundled model's format is its checkpoint's, so neither takes one.

    Raises:
        UnknownModelError: no bundled model (or draft) has that name (checked before a
            misplaced ``weight_format`` is reported).
        ConfigError and subclasses: a bad config or spec file; ``tp`` other than 1 with a
            spec file (it declares one rank's bytes, which nothing here splits: returning
            them as one rank's of ``tp`` would be wrong); a dtype override with a spec file
            (it declares bytes, not tensors); ``weight_format`` with a spec file
            or a bundled model; a config whose quantization needs ``weight_format``; and as
            :func:`load_draft`.
    """
    target = _load_target(model, config, spec_file, kv_dtype, tp, state_dtype, weight_format)
    if draft_model is None:
        return target
    return load_draft(target, draft_model, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)


def load_draft(target: ModelSpec, name: str, *, kv_dtype: CacheDtype | None = None,
               tp: int = 1, state_dtype: CacheDtype | None = None) -> ModelSpec:
    """``target`` joined with the bundled model ``name`` as its speculative-decoding draft
    (:func:`kvchain.model.with_draft`, kind ``MODEL``: a separate small model with KV of
    its own, e.g. ``Qwen3-0.6B`` for the Qwen3 family, ``gemma-3-1b`` for Gemma 3), loaded
    at the target's ``tp`` (a draft runs on the target's ranks, its bytes per rank) and
    the same dtype overrides. The draft must share the target's tokenizer; kvchain holds
    no tokenizers: the CLI compares the two vocabulary sizes (:func:`vocab_size`).

    Raises:
        UnknownModelError: no bundled model has that name.
        ConfigError: as :func:`load_model` (e.g. a ``tp`` the draft's heads do not
            divide by; the message then starts ``--draft-model <name>:``, as it is the
            draft's, not the target's) and :func:`~kvchain.model.with_draft`.
    """
    try:
        draft = load_model(name, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    except UnknownModelError as exc:  # say which of the two names it was
        raise UnknownModelError(f"--draft-model: {exc.args[0] if exc.args else exc}") from None
    except ConfigError as exc:  # e.g. a tp the target's heads divide by and the draft's not
        raise ConfigError(f"--draft-model {name}: {exc}") from None
    return with_draft(target, draft, DraftKind.MODEL)


def _load_target(model: str, config: str | Path | None, spec_file: str | Path | None,
                 kv_dtype: CacheDtype | None, tp: int, state_dtype: CacheDtype | None,
                 weight_format: WeightFormat | None) -> ModelSpec:
    """The target model of :func:`load_model_source` (no draft; its rules and errors)."""
    if spec_file is not None:
        if tp != 1:  # the one place: the CLI's --tp with --spec is refused here too
            raise ConfigError(f"--tp {tp} does not apply to --spec: a spec file declares one "
                              f"rank's bytes (per-token KV, state, weights) and nothing splits "
                              f"them; declare them per rank and leave --tp at 1")
        if kv_dtype is not None or state_dtype is not None:
            raise ConfigError("--kv-dtype/--state-dtype do not apply to --spec (a spec file "
                              "declares bytes, not tensors)")
        if weight_format is not None:
            raise ConfigError("--weight-format does not apply to --spec (a spec file "
                              "declares weight_bytes)")
        return load_spec_file(spec_file)
    if config is not None:
        return load_hf_config(config, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype,
                              weight_format=weight_format)
    spec = load_model(model, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype)
    if weight_format is not None:
        raise ConfigError("--weight-format applies to --config files; a bundled model's "
                          "format is its checkpoint's (see `kvchain models`)")
    return spec


def load_models_json_entry(
    name: str,
    *,
    kv_dtype: CacheDtype | None = None,
    tp: int = 1,
    state_dtype: CacheDtype | None = None,
) -> ModelSpec:
    """Like :func:`load_model` but always built from the ``models.json`` entry (the cache
    layers come from the entry; parameter-count fields from the bundled config if any).

    Raises:
        UnknownModelError: no such model, or it has no ``models.json`` entry.
    """
    record = _find(name, _records())
    return _build(record, kv_dtype=kv_dtype, tp=tp, state_dtype=state_dtype, from_entry=True)


def list_models() -> list[CatalogEntry]:
    """Every bundled model with its classes (bf16, tp=1), in catalog order."""
    out = []
    for record in _records():
        spec = _build(
            record, kv_dtype=CacheDtype.BF16, tp=1, state_dtype=None, from_entry=False
        )
        classes = tuple(
            ClassSummary(c.lifetime, len(c.layers), c.bytes_per_token, c.bytes_per_slot, c.window)
            for c in spec.classes
        )
        out.append(
            CatalogEntry(
                name=record.name,
                aliases=record.aliases,
                hf_repo=record.hf_repo,
                source=record.source,
                license=record.license,
                has_config=record.config_file is not None,
                classes=classes,
                total_params=spec.total_params,
                active_params=spec.active_params,
                weight_bytes=spec.weight_bytes,
            )
        )
    return out
