"""Header-only reading: validation of the index against the shard headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.errors import CheckpointFormatError, SourceError


def _sharded(tmp_path: Path) -> Path:
    save_file({"a": torch.zeros(2)}, str(tmp_path / "s1.safetensors"))
    save_file({"b": torch.zeros(2)}, str(tmp_path / "s2.safetensors"))
    return tmp_path


def _index(tmp_path: Path, doc: object) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    (tmp_path / "model.safetensors.index.json").write_text(text)


def test_index_ok(tmp_path: Path) -> None:
    _index(
        _sharded(tmp_path),
        {"metadata": {"total_size": 16}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}},
    )
    files = load_checkpoint_files(tmp_path)
    assert files.weight_map == {"a": "s1.safetensors", "b": "s2.safetensors"}
    assert files.total_tensor_bytes == 16


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"weight_map": {"a": "missing.safetensors"}}, "missing"),
        ({"weight_map": {"a": "s2.safetensors"}}, "has no such tensor"),
        ({"weight_map": {"a": "../s1.safetensors"}}, "outside the checkpoint"),
        ({"weight_map": {"a": "/etc/passwd"}}, "outside the checkpoint"),
        ({"weight_map": {"a": 3}}, "weight_map must map"),
        ({"weights": {}}, "not a safetensors index"),
        ('{"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}}', "twice"),
        ("{nope", "not valid JSON"),
    ],
)
def test_bad_index(tmp_path: Path, doc: object, message: str) -> None:
    _index(_sharded(tmp_path), doc)
    with pytest.raises(CheckpointFormatError, match=message):
        load_checkpoint_files(tmp_path)


def test_symlink_outside_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"a": torch.zeros(2)}, str(outside / "w.safetensors"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").symlink_to(outside / "w.safetensors")
    with pytest.raises(CheckpointFormatError, match="outside the checkpoint"):
        load_checkpoint_files(ckpt)


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no safetensors"):
        load_checkpoint_files(tmp_path)


def test_duplicate_tensor_without_index(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    save_file({"a": torch.zeros(2)}, str(tmp_path / "y.safetensors"))
    with pytest.raises(CheckpointFormatError, match="in both"):
        load_checkpoint_files(tmp_path)


def test_shard_tensors_follow_the_weight_map(tmp_path: Path) -> None:
    _index(_sharded(tmp_path), {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    files = load_checkpoint_files(tmp_path)
    assert list(files.shard_tensors("s1.safetensors")) == ["a"]
    assert files.shard_tensors("s2.safetensors")["b"].nbytes == 8
