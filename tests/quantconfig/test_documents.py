"""quantconfig.documents: loading both files, key order, errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtpconv.errors import QuantConfigError
from mtpconv.jsonio import dumps_json
from mtpconv.quantconfig.documents import QuantConfigs, load_quant_configs, quant_location
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


@pytest.mark.parametrize(
    ("keys", "source"),
    [
        (("quantization_config",), "config.json"),
        (("text_config", "quantization_config"), "config.json (text_config)"),
        (("compression_config",), "config.json (compression_config)"),
    ],
)
def test_quant_location(keys: tuple[str, ...], source: str) -> None:
    body = {"quant_method": "fp8"}
    cfg: dict[str, Any] = {"text_config": {"hidden_size": 8}}
    node = cfg
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = body
    loc = quant_location(cfg)
    assert loc is not None and loc.keys == keys and loc.body is body and loc.source == source


def test_quant_location_top_level_wins_and_none() -> None:
    cfg = {"quantization_config": {"a": 1}, "text_config": {"quantization_config": {"b": 2}}}
    loc = quant_location(cfg)
    assert loc is not None and loc.keys == ("quantization_config",)
    assert quant_location({"text_config": "x", "model_type": "m"}) is None
    with pytest.raises(QuantConfigError, match="'text_config.quantization_config' must be an object"):
        quant_location({"text_config": {"quantization_config": [1]}})


def test_dumped_names_only_the_files_present() -> None:
    assert list(QuantConfigs({"a": 1}, None).dumped()) == ["config.json"]
    both = QuantConfigs({"a": 1}, {"quantization": {}}).dumped()
    assert list(both) == ["config.json", "hf_quant_config.json"]
    assert both["config.json"] == dumps_json({"a": 1})
