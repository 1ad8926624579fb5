"""The shard reader: raw bytes and tensors, one open shard at a time."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.checkpoint.reader import ShardReader


def _two_shards(tmp_path: Path) -> Path:
    first = {"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(2, 3).to(torch.bfloat16)}
    save_file(first, str(tmp_path / "s1.safetensors"))
    save_file({"c": torch.tensor([7, 8], dtype=torch.uint8)}, str(tmp_path / "s2.safetensors"))
    weight_map = {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_reads_bytes_and_tensors(tmp_path: Path) -> None:
    files = load_checkpoint_files(_two_shards(tmp_path))
    with ShardReader(files) as reader:
        assert torch.equal(reader.tensor("a"), torch.arange(4, dtype=torch.float32))
        b = reader.tensor("b")
        assert b.dtype == torch.bfloat16 and b.shape == (2, 3)
        assert bytes(reader.read_bytes("c")) == b"\x07\x08"
        assert bytes(reader.read_bytes("a")) == torch.arange(4, dtype=torch.float32).numpy().tobytes()
        assert reader.info("c").file == "s2.safetensors"


def test_one_shard_open_at_a_time(tmp_path: Path) -> None:
    files = load_checkpoint_files(_two_shards(tmp_path))
    reader = ShardReader(files)
    first = reader.handle("a")
    assert reader.handle("b") is first  # same shard: same handle
    second = reader.handle("c")
    assert first.closed and not second.closed
    assert torch.equal(reader.tensor("a"), torch.arange(4, dtype=torch.float32))  # reopens s1
    assert second.closed
    reader.close()
    reader.close()  # idempotent


def test_closed_on_error(tmp_path: Path) -> None:
    files = load_checkpoint_files(_two_shards(tmp_path))
    try:
        with ShardReader(files) as reader:
            handle = reader.handle("a")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert handle.closed
