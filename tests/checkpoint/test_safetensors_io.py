"""Header-only reading: validation of safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtpconv.checkpoint.safetensors_io import read_header, read_tensor
from mtpconv.errors import CheckpointFormatError


def _raw(path: Path, header: object, data: bytes = b"", declared_len: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    n = len(raw) if declared_len is None else declared_len
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def test_header_matches_safetensors(tmp_path: Path) -> None:
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4).to(torch.bfloat16)}
    save_file(t, str(tmp_path / "x.safetensors"))
    h = read_header(tmp_path / "x.safetensors")
    assert h.tensors["a"].shape == (2, 3) and h.tensors["a"].dtype == "F32"
    with open(tmp_path / "x.safetensors", "rb") as f:
        assert torch.equal(read_tensor(f, h.tensors["a"]), t["a"])
        assert torch.equal(read_tensor(f, h.tensors["b"]), t["b"])


@pytest.mark.parametrize(
    ("header", "data", "declared", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"", None, "outside the data region"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs 12"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            None,
            "overlap",
        ),
        ({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", None, "unsupported dtype"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "invalid shape"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4, None, "data_offsets"),
        ([1, 2], b"", None, "not a JSON object"),
        ({"a": 1}, b"", None, "not an object"),
        ({}, b"", 10**12, "declares a"),
    ],
)
def test_bad_headers(tmp_path: Path, header: object, data: bytes, declared: int | None, message: str) -> None:
    path = _raw(tmp_path / "bad.safetensors", header, data, declared)
    with pytest.raises(CheckpointFormatError, match=message) as exc:
        read_header(path)
    assert "bad.safetensors" in str(exc.value)


def test_not_json_and_too_short(tmp_path: Path) -> None:
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{{")
    with pytest.raises(CheckpointFormatError, match="not valid JSON"):
        read_header(tmp_path / "a.safetensors")
    (tmp_path / "b.safetensors").write_bytes(b"abc")
    with pytest.raises(CheckpointFormatError, match="too short"):
        read_header(tmp_path / "b.safetensors")


def test_duplicate_header_key(tmp_path: Path) -> None:
    raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    (tmp_path / "d.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(CheckpointFormatError, match="duplicate key"):
        read_header(tmp_path / "d.safetensors")
