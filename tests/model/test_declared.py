"""Models declared by bytes."""

from __future__ import annotations

import json

import pytest

from kvchain.errors import ConfigError
from kvchain.model import LifetimeClass, declare_model, declared_class
from kvchain.model.layers import CacheClass, CacheDtype, LayerCache, TensorDecl
from kvchain.model.spec_file import SPEC_FILE_FIELDS, load_spec_file, spec_from_mapping


def test_three_band_declaration():
    spec = declare_model(
        "jet-like", full=2_048, window=2_048, window_tokens=1_152, state=14_745_600
    )
    assert [c.lifetime for c in spec.classes] == [
        LifetimeClass.STATE,
        LifetimeClass.WINDOW,
        LifetimeClass.FULL,
    ]
    assert spec.state_bytes == 14_745_600
    assert spec.bytes_per_token(LifetimeClass.WINDOW) == 2_048
    assert spec.cache_class(LifetimeClass.WINDOW).window == 1_152
    assert spec.bytes_per_token(LifetimeClass.FULL) == 2_048
    assert (spec.total_params, spec.weight_bytes, spec.source) == (0, 0, "declared")


def test_local_class_and_single_class():
    spec = declare_model("scout-like", full=49_152, local=147_456, chunk_tokens=8_192)
    assert spec.cache_class(LifetimeClass.LOCAL).window == 8_192
    assert spec.bytes_per_token(LifetimeClass.LOCAL) == 147_456
    cls = declared_class(LifetimeClass.STATE, 1_000)
    assert (cls.bytes_per_slot, cls.bytes_per_token, cls.window) == (1_000, 0, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"full": -1}, "full must be >= 0"),
        ({"window": 10}, "window bytes and window_tokens together"),
        ({"full": 10, "window_tokens": 5}, "window bytes and window_tokens together"),
        ({"local": 10}, "local bytes and chunk_tokens together"),
        ({}, "has no class"),
        ({"window": 10, "window_tokens": 0}, "window_tokens must be > 0, got 0"),
    ],
)
def test_bad_declarations(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        declare_model("bad", **kwargs)


def test_declared_class_errors():
    with pytest.raises(ConfigError, match="full bytes must be > 0, got 0"):
        declared_class(LifetimeClass.FULL, 0)
    with pytest.raises(ConfigError, match="takes no window"):
        declared_class(LifetimeClass.FULL, 10, window=4)



def test_a_class_mixing_a_window_and_none_is_a_config_error() -> None:
    """Found by mypy: the message sorted {None, 128}, which raised TypeError."""
    t = (TensorDecl("k", (8,), CacheDtype.BF16),)
    layers = (LayerCache(0, LifetimeClass.WINDOW, "gqa", t, 128),
              LayerCache(1, LifetimeClass.WINDOW, "gqa", t, None))
    with pytest.raises(ConfigError, match=r"different windows \[None, 128\]"):
        CacheClass.of(layers)


# --- issue 25, item 5: one validation of declared numbers, spec files refuse bad fields ---


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # c9a1289 accepted these: a float full built float page sizes (16 x 1000.5 B) and
        # the first take raised a bare TypeError
        ({"full": 1000.5}, "declared full must be an integer, got 1000.5 (float)"),
        ({"full": 1000.0}, "declared full must be an integer, got 1000.0 (float)"),
        ({"full": True}, "declared full must be an integer, got True (bool)"),
        ({"state": "5"}, "declared state must be an integer"),
        ({"full": 10, "weight_bytes": 2.5e9}, "declared weight_bytes must be an integer"),
        ({"window": 10, "window_tokens": 128.0}, "declared window_tokens must be an integer"),
        ({"local": 10, "chunk_tokens": False}, "declared chunk_tokens must be an integer"),
        ({"full": 10, "windows": [(20.0, 128)]}, "positive int bytes and tokens"),
        ({"full": 10, "windows": [(20, 128, 1)]}, "positive int bytes and tokens"),
    ],
)
def test_declared_numbers_are_ints(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        declare_model("m", **kwargs)


def test_an_int_declaration_builds_int_pages():
    """Sibling of the refusals: the same model with int bytes is accepted and its class
    bytes stay ints (the page sizes are ints: E x tokens per page)."""
    spec = declare_model("m", full=1000)
    assert spec.classes[0].bytes_per_token == 1000
    assert type(spec.classes[0].bytes_per_token) is int


@pytest.mark.parametrize("value", [1000.5, 1000.0, True, -1])
def test_api_and_spec_file_refuse_the_same_value_alike(value):
    """One check for both entry points: the spec file's message is declare_model's."""
    with pytest.raises(ConfigError) as api:
        declare_model("m", full=value)
    with pytest.raises(ConfigError) as spec:
        spec_from_mapping({"full": value}, default_name="m", default_source="t")
    assert str(spec.value) == str(api.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # 'bogus' is close to no field; 'windw' and 'stat' are one edit from 'window'
        # and 'state' (difflib ratio >= 0.6), so each is named with its likely field.
        ({"full": 1, "bogus": 2}, r"unknown field 'bogus'; known: active_params, "),
        ({"full": 1, "windw": 2, "stat": 3},
         r"unknown fields 'stat' \(did you mean 'state'\?\), "
         r"'windw' \(did you mean 'window'\?\); known: "),
        ({"window": 1000}, "lacks 'window_tokens'"),
        ({"full": 1, "window_tokens": 128}, "lacks 'window'"),
        ({"local": 1000}, "lacks 'chunk_tokens'"),
        ({}, "has no class"),
        ({"name": None}, "has no class"),  # null is absent
        ({"name": 5, "full": 1}, "'name' must be a string, got 5"),
        ({"full": 1, "source": ["x"]}, "'source' must be a string"),
        ({"full": 1, "windows": [{"bytes": 1}]}, '"bytes" and "tokens"'),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_spec_file_fields_are_checked(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message) as err:
        load_spec_file(path)
    assert str(err.value).startswith(f"spec file {path}: ")


def test_a_spec_file_declares_what_declare_model_would(tmp_path):
    """Every field of the format is a declare_model argument (read from its signature);
    a full file gives the same model as the call with the same values."""
    assert set(SPEC_FILE_FIELDS) == {
        "name", "full", "window", "window_tokens", "local", "chunk_tokens", "state",
        "windows", "locals", "hidden_size", "num_attention_heads", "total_params",
        "active_params", "weight_bytes", "source"}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"full": 2048, "window": 2048, "window_tokens": 1152,
                                "state": 14_745_600, "chunk_tokens": None,
                                "windows": [{"bytes": 8, "tokens": 11}],
                                "weight_bytes": 4_000_000_000}))
    spec = load_spec_file(path)
    assert spec == declare_model("m", full=2048, window=2048, window_tokens=1152,
                                 state=14_745_600, windows=[(8, 11)],
                                 weight_bytes=4_000_000_000, source=f"declared in {path}")


def test_the_cli_refuses_a_float_spec_file_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from kvchain.cli import _load_commands, app

    _load_commands()
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"full": 1000.5}))
    result = CliRunner().invoke(app, ["plan", "--spec", str(path), "--buffer-bytes",
                                      "1000000000"])
    assert result.exit_code == 2, result.output
    assert "declared full must be an integer, got 1000.5" in result.output


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"windows": None}, "declared windows must be a sequence of (bytes, tokens) pairs, "
                        "got None"),
    ({"windows": 5}, "declared windows must be a sequence"),
    ({"locals_": "8,11"}, "declared locals_ must be a sequence"),
])
def test_class_lists_that_are_not_sequences_are_refused_typed(kwargs, needle):
    # Before: a bare TypeError ("'NoneType' object is not iterable"); a string was walked
    # character by character ("got '8'").
    with pytest.raises(ConfigError) as info:
        declare_model("m", full=1000, **kwargs)
    assert needle in str(info.value)


def test_a_field_given_twice_is_refused(tmp_path):
    # Regression: json.loads kept the last value, so {"full": 1000, "full": 2000} declared
    # 2,000 B a token without a word; nested class entries too.
    path = tmp_path / "dup.json"
    path.write_text('{"name": "x", "full": 1000, "full": 2000}')
    with pytest.raises(ConfigError) as err:
        load_spec_file(path)
    assert str(err.value) == (f"spec file {path}: field 'full' is given twice (1000, then "
                              f"2000)")
    path.write_text('{"full": 1000, "windows": [{"bytes": 8, "tokens": 11, "bytes": 9}]}')
    with pytest.raises(ConfigError, match="field 'bytes' is given twice"):
        load_spec_file(path)
    # Distinct keys in distinct objects are fine (the same key in two class entries).
    path.write_text('{"full": 1000, "windows": [{"bytes": 8, "tokens": 11}, '
                    '{"bytes": 4, "tokens": 5}]}')
    assert load_spec_file(path).bytes_per_token(LifetimeClass.FULL) == 1000


def test_the_cli_refuses_a_spec_file_with_a_field_twice_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from kvchain.cli import _load_commands, app

    _load_commands()
    path = tmp_path / "dup.json"
    path.write_text('{"full": 1000, "full": 2000}')
    result = CliRunner().invoke(app, ["plan", "--spec", str(path), "--buffer-bytes",
                                      "1000000000"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "field 'full' is given twice" in result.stderr
