"""``load_model_source`` returns one rank's bytes under ``tp``: a spec file, which declares
bytes and cannot be split, must say so rather than return them unsplit."""

from __future__ import annotations

import json

import pytest

from kvchain.catalog.loader import load_model_source
from kvchain.errors import ConfigError
from kvchain.model.layers import LifetimeClass


def test_a_spec_file_at_tp_1_is_its_own_bytes(tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "m", "full": 32_000}))
    assert load_model_source("unused", spec_file=path).bytes_per_token(LifetimeClass.FULL) \
        == 32_000


def test_a_spec_file_with_tp_2_is_refused(tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "m", "full": 32_000}))
    with pytest.raises(ConfigError, match="--tp 2 does not apply to --spec: a spec file "
                       "declares one rank's bytes"):
        load_model_source("unused", spec_file=path, tp=2)
    # refused before the file is read: a missing file gives the same refusal
    with pytest.raises(ConfigError, match="--tp 4 does not apply"):
        load_model_source("unused", spec_file=tmp_path / "absent.json", tp=4)
