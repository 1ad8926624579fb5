"""quantconfig.documents: loading both files, key order, errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpconv.errors import QuantConfigError
from mtpconv.jsonio import dumps_json
from mtpconv.quantconfig.documents import load_quant_configs
from tests.quantconfig.helpers import (
    key_paths,
)
from tests.quantconfig.samples import (
    modelopt_nvfp4_configs,
    qwen35_moe_config,
)

# --------------------------------------------------------------------------- loading


def test_load_both_files_keeps_key_order(tmp_path: Path) -> None:
    hq, qc = modelopt_nvfp4_configs()
    cfg = qwen35_moe_config(qc)
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hq))
    loaded = load_quant_configs(tmp_path)
    assert loaded.config == cfg and list(loaded.config) == list(cfg)
    assert key_paths(loaded.config) == key_paths(cfg)
    assert loaded.hf_quant == hq
    assert loaded.config_path == tmp_path / "config.json"
    assert loaded.hf_quant_path == tmp_path / "hf_quant_config.json"


def test_load_without_hf_quant(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(qwen35_moe_config()))
    loaded = load_quant_configs(tmp_path)
    assert loaded.hf_quant is None and loaded.hf_quant_path is None


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("config.json", "{not json", "not valid JSON"),
        ("config.json", "[1, 2]", "JSON object"),
        ("hf_quant_config.json", '{"a": ', "not valid JSON"),
        ("hf_quant_config.json", '"text"', "JSON object"),
    ],
)
def test_load_bad_json_names_the_file(tmp_path: Path, name: str, text: str, needle: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_text(text)
    with pytest.raises(QuantConfigError, match=needle) as info:
        load_quant_configs(tmp_path)
    assert name in str(info.value)


def test_load_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(QuantConfigError, match="config.json is missing"):
        load_quant_configs(tmp_path)


def test_load_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(QuantConfigError, match="config.json"):
        load_quant_configs(tmp_path)


def test_dumps_config_format() -> None:
    doc = {"b": 1, "a": {"z": [1, 2], "é": "ü"}}
    text = dumps_json(doc)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    assert list(json.loads(text)) == ["b", "a"]
