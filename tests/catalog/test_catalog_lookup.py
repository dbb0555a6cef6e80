"""Catalog listing, names, aliases, unknown names, and the bundled files."""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

from kvchain.catalog import list_models, load_model, resolve_name
from kvchain.errors import ConfigError, UnknownModelError
from kvchain.model import LifetimeClass

DATA = resources.files("kvchain.catalog").joinpath("data")
# The project's shared data folder lies beside the repository (CI keeps a copy there).


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("GPT-OSS-120B", "gpt-oss-120b"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B"),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen3-Next-80B-A3B"),
        ("gemma-3-27b", "gemma-3-27b"),
        ("jamba-v0.1", "Jamba-v0.1"),
        ("llama-4-scout", "Llama-4-Scout-17B-16E"),
        ("jet-nemotron-2b", "Jet-Nemotron-2B"),
        ("nemotron-3-super", "Nemotron-3-Super-120B-A12B-FP8"),
        ("mimo-v2-flash", "MiMo-V2-Flash"),
        ("smallthinker", "SmallThinker-21BA3B"),
        ("minimax-m1", "MiniMax-M1"),
        ("MiniMax-M1 / MiniMax-Text-01", "MiniMax-M1"),
        ("minimax_text_01", "MiniMax-M1"),
        ("meta-llama--Meta-Llama-3.1-8B", "Llama-3.1-8B"),
    ],
)
def test_aliases(alias, name):
    assert resolve_name(alias) == name
    assert load_model(alias).name == name


def test_unknown_model_lists_close_names():
    with pytest.raises(UnknownModelError, match="gpt-oss-120b") as info:
        load_model("gpt-oss-12")
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(UnknownModelError, match=r"close names: .*gemma"):
        load_model("gemma-3-28b")
    with pytest.raises(UnknownModelError, match="no bundled model named 'zzz'"):
        load_model("zzz")


def test_list_models():
    entries = list_models()
    assert len(entries) == 25  # 24 + Qwen3-0.6B (a draft for the Qwen3 family, round 6)
    names = [e.name for e in entries]
    assert len(set(names)) == 25
    owner: dict[str, str] = {}
    for e in entries:
        for key in (e.name.lower(), *e.aliases):
            assert owner.setdefault(key, e.name) == e.name  # no alias names two models
        assert e.source and e.license and e.hf_repo
    assert sum(e.has_config for e in entries) == 14
    jet = next(e for e in entries if e.name == "Jet-Nemotron-2B")
    assert jet.lifetimes == "state+window+full"
    assert [(c.lifetime, c.layers, c.bytes_per_token, c.bytes_per_slot, c.window) for c in
            jet.classes] == [
        (LifetimeClass.STATE, 24, 0, 14_745_600, None),
        (LifetimeClass.WINDOW, 2, 2_048, 0, 1_152),
        (LifetimeClass.FULL, 2, 2_048, 0, None),
    ]
    oss = next(e for e in entries if e.name == "gpt-oss-120b")
    assert oss.source.startswith("ai-dynamo/aiconfigurator")
    assert oss.license == "Apache-2.0 (repo)"


def test_sources_md_names_every_bundled_file():
    sources = DATA.joinpath("SOURCES.md").read_text()
    configs = [p.name for p in DATA.joinpath("model_configs").iterdir()]
    assert len(configs) == 14
    for name in [*configs, "models.json", "catalog.json"]:
        assert f"`{name}`" in sources or f"`model_configs/{name}`" in sources


def _recorded_sums(sources: str) -> dict[str, str]:
    block = sources.split("## SHA-256", 1)[1].split("```")[1]
    return {name: digest for digest, name in (line.split() for line in block.split("\n")
                                              if line.strip())}


def test_bundled_copies_are_byte_exact():
    """Every packaged data file hashes to the SHA-256 that SOURCES.md records (taken when
    the copies were checked against their sources), and every file is recorded."""
    recorded = _recorded_sums(DATA.joinpath("SOURCES.md").read_text())
    files = ["models.json", *(f"model_configs/{p.name}"
                              for p in DATA.joinpath("model_configs").iterdir())]
    assert sorted(recorded) == sorted(files)
    for name in files:
        path = DATA.joinpath(*name.split("/"))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded[name], name


def test_a_changed_copy_is_caught():
    """The check above can fail: one flipped byte changes the digest."""
    data = bytearray(DATA.joinpath("models.json").read_bytes())
    data[0] ^= 1
    recorded = _recorded_sums(DATA.joinpath("SOURCES.md").read_text())
    assert hashlib.sha256(bytes(data)).hexdigest() != recorded["models.json"]
