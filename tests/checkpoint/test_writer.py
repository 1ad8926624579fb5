"""The shard writer's tensor path and the index the writer owns."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtpconv.checkpoint.index import INDEX_NAME, load_checkpoint_files
from mtpconv.checkpoint.writer import IndexWriter, ShardWriter, TensorSpec, link_or_copy, tensor_bytes


def test_tensor_bytes_are_the_raw_little_endian_bytes() -> None:
    t = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float32).t()  # not contiguous
    assert bytes(tensor_bytes(t)) == t.contiguous().numpy().tobytes()
    fp8 = torch.tensor([1.0, -448.0]).to(torch.float8_e4m3fn)
    assert bytes(tensor_bytes(fp8)) == bytes(fp8.view(torch.uint8).tolist())


def test_write_tensor_checks_the_planned_dtype(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "x.safetensors", [TensorSpec("w", "BF16", (2,))], None)
    with pytest.raises(AssertionError, match="expected w as BF16"):
        writer.write_tensor("w", torch.zeros(2, dtype=torch.float32))
    writer.write_tensor("w", torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    writer.close()
    assert torch.equal(load_file(str(tmp_path / "x.safetensors"))["w"], torch.tensor([1.0, 2.0]).bfloat16())


def test_index_writer_writes_what_the_shards_hold(tmp_path: Path) -> None:
    index = IndexWriter({"total_size": 1, "format": "pt"})
    shards = {
        "b.safetensors": [TensorSpec("z", "F32", (2,))],
        "a.safetensors": [TensorSpec("y", "U8", (3,)), TensorSpec("x", "BF16", ())],
    }
    for file, specs in shards.items():
        writer = ShardWriter(tmp_path / file, specs, None)
        for spec in specs:
            writer.write(spec.name, b"\0" * spec.nbytes)
        writer.close()
        index.add(file, ((s.name, s.nbytes) for s in specs))
    digest = index.write(tmp_path)
    text = (tmp_path / INDEX_NAME).read_text()
    assert json.loads(text) == {
        "metadata": {"total_size": 13, "format": "pt"},
        "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"},
    }
    assert list(json.loads(text)["weight_map"]) == ["x", "y", "z"]  # sorted by name
    assert text.endswith("}\n")
    assert digest == hashlib.sha256(text.encode()).hexdigest()
    files = load_checkpoint_files(tmp_path)
    assert files.total_tensor_bytes == 13 == files.index_metadata["total_size"]


def test_index_writer_never_writes_through_a_link(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / INDEX_NAME).write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    link_or_copy(source / INDEX_NAME, out / INDEX_NAME)
    IndexWriter({}).write(out)
    assert (source / INDEX_NAME).read_text() == "{}"
    assert json.loads((out / INDEX_NAME).read_text()) == {"metadata": {"total_size": 0}, "weight_map": {}}
