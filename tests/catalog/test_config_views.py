"""The frozen transformers view of each bundled config (kvchain.catalog.views)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from kvchain.catalog import views
from kvchain.catalog.loader import _records, load_model, read_bundled_config
from kvchain.errors import ConfigError
from kvchain.model.hf import load_hf_config
from kvchain.model.layers import LifetimeClass


def _bundled() -> list[tuple[str, str]]:
    return [(r.name, r.config_file) for r in _records() if r.config_file]


def _frozen_release() -> str:
    """The transformers release the bundled views were frozen with (e.g. ``"5.24.0"``)."""
    return str(json.loads((views._data_dir() / views.VIEWS_FILE).read_text())["transformers"])


def _restamp(text: str, live: str, frozen: str) -> str:
    """``text`` with the live release's stamp ``"transformers <live> "`` put back to the
    frozen one: a release that reads a config the same way differs only in this stamp."""
    head = f"transformers {live} "
    return f"transformers {frozen} " + text[len(head):] if text.startswith(head) else text


def _defaulted_as_frozen(defaulted, live: str, frozen: str):
    return tuple(dataclasses.replace(d, by=_restamp(d.by, live, frozen)) for d in defaulted)


def _views_as_frozen(fresh: dict, live: str, frozen: str) -> dict:
    """A fresh freeze's views with the live release's stamps (each view's ``reader`` and
    the ``transformers_version`` that ``to_dict`` adds) put back to the frozen release."""
    out = copy.deepcopy(fresh)
    for view in out.values():
        view["reader"] = _restamp(view["reader"], live, frozen)
        if view["fields"].get("transformers_version") == live:
            view["fields"]["transformers_version"] = frozen
    return out


def test_bundled_bytes_come_from_transformers_view_without_importing_it():
    """Nemotron-H-56B: transformers' NemotronHConfig keeps the SSM state in float32
    (``mamba_ssm_cache_dtype``). Per mamba2 layer: ssm 256 heads x 64 x 256 state x 4 B =
    16,777,216 B, conv 3 x 20,480 x 2 B = 122,880 B; 54 mamba layers -> 54 x 16,900,096 =
    912,605,184 B per request (the raw dict's bf16 would give 459,620,352 B).
    MiMo-V2-Flash: MiMoV2FlashConfig stores the window as 128 + 1 = 129 tokens."""
    nemo = load_model("Nemotron-H-56B-Base-8K")
    assert nemo.classes[0].lifetime is LifetimeClass.STATE
    assert nemo.classes[0].bytes_per_slot == 54 * (256 * 64 * 256 * 4 + 3 * 20_480 * 2)
    mimo = load_model("MiMo-V2-Flash")
    assert mimo.cache_classes(LifetimeClass.WINDOW)[0].window == 129


def test_a_bundled_model_reports_the_class_defaults_its_bytes_rest_on():
    """Nemotron-H-56B's config.json sets no mamba_ssm_cache_dtype: the fp32 state above is
    NemotronHConfig's default, and the model says so (from the frozen view, without
    transformers); Qwen3-8B's file sets every field read and its report is empty."""
    noted = {d.field: d for d in load_model("Nemotron-H-56B-Base-8K").defaulted}
    assert noted["mamba_ssm_cache_dtype"].value == "float32"
    assert noted["mamba_ssm_cache_dtype"].by == "transformers 5.24.0 NemotronHConfig"
    assert load_model("Qwen3-8B").defaulted == ()


def test_reading_a_bundled_model_imports_neither_transformers_nor_torch():
    """A fresh process: loading every bundled model leaves transformers and torch
    unimported (with the hf extra installed they cost seconds on the first config read)."""
    code = ("import sys; from kvchain.catalog.loader import list_models; list_models(); "
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("name", "relative"), _bundled())
def test_frozen_view_reads_like_transformers_today(name, relative):
    """Each bundled model built from its frozen view equals the model read through the
    installed transformers, at every tensor-parallel degree (a transformers release that
    reads a config otherwise fails here: regenerate with `python -m kvchain.catalog.views`).
    A newer release that reads it the same way differs only in the reader's stamp on the
    defaulted fields (5.25.0 against the views frozen with 5.24.0), which is put back."""
    transformers = pytest.importorskip("transformers", reason="the live reader needs it")
    raw = read_bundled_config(relative)
    live_release, frozen_release = transformers.__version__, _frozen_release()
    def outcome(read, tp):
        try:
            spec = read(tp)
        except ConfigError as exc:
            return str(exc)
        return (spec.classes, spec.layers, spec.total_params, spec.max_context_tokens,
                _defaulted_as_frozen(spec.defaulted, live_release, frozen_release))

    for tp in (1, 2, 4, 8):
        live = outcome(lambda tp: load_hf_config(raw, name=name, tp=tp), tp)
        assert outcome(lambda tp: load_model(name, tp=tp), tp) == live, (name, tp)


def test_views_file_matches_a_fresh_freeze():
    """The bundled views equal a fresh freeze with the installed transformers, its
    release stamps put back to the frozen release (see the test above)."""
    pytest.importorskip("transformers", reason="freezing needs transformers")
    recorded = json.loads((views._data_dir() / views.VIEWS_FILE).read_text())
    fresh = views.freeze_views([relative for _, relative in _bundled()])
    assert _views_as_frozen(fresh["views"], fresh["transformers"],
                            recorded["transformers"]) == recorded["views"]


def test_only_the_release_stamp_is_put_back():
    """The check above can fail: restamping forgives a view that differs only in its
    release (stamped "9.9.9" here), never one whose fields differ."""
    recorded = views._views()
    relative = "model_configs/nvidia--Nemotron-H-56B-Base-8K.json"
    frozen = _frozen_release()
    stamped = copy.deepcopy(dict(recorded))
    stamped[relative]["reader"] = stamped[relative]["reader"].replace(frozen, "9.9.9")
    stamped[relative]["fields"]["transformers_version"] = "9.9.9"
    assert stamped != recorded
    assert _views_as_frozen(stamped, "9.9.9", frozen) == recorded
    stamped[relative]["fields"]["mamba_ssm_cache_dtype"] = "bfloat16"
    assert _views_as_frozen(stamped, "9.9.9", frozen) != recorded
    noted = load_model("Nemotron-H-56B-Base-8K").defaulted
    moved = tuple(dataclasses.replace(d, by=d.by.replace(frozen, "9.9.9")) for d in noted)
    assert moved != noted and _defaulted_as_frozen(moved, "9.9.9", frozen) == noted
    other = tuple(dataclasses.replace(d, by="kvchain default: bf16") for d in noted)
    assert _defaulted_as_frozen(other, "9.9.9", frozen) == other != noted


def test_a_view_of_another_file_is_refused(monkeypatch):
    """The check can fail: a view recorded for another version of the config is an error,
    never silently served."""
    relative = next(rel for name, rel in _bundled() if name == "gpt-oss-120b")
    stale = {relative: {**views._views()[relative], "sha256": "0" * 64}}
    monkeypatch.setattr(views, "_views", lambda: stale)
    with pytest.raises(ConfigError, match="another file"):
        views.bundled_fields(relative, read_bundled_config(relative))


def test_an_edited_view_does_not_change_later_reads():
    # bundled_fields serves the views from a per-process cache; before it returned a copy,
    # a caller editing the returned mapping (or a nested one) changed every later read.
    relative = "model_configs/nvidia--Nemotron-H-56B-Base-8K.json"
    fields = views.bundled_fields(relative, read_bundled_config(relative)).fields
    want = json.dumps(fields, sort_keys=True)
    fields["mamba_ssm_cache_dtype"] = "bfloat16"  # type: ignore[index]
    fields.clear()  # type: ignore[attr-defined]
    again = views.bundled_fields(relative, read_bundled_config(relative)).fields
    assert json.dumps(again, sort_keys=True) == want
    assert again["mamba_ssm_cache_dtype"] == "float32"  # transformers' default, frozen
