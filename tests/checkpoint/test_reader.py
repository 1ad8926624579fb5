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


def _big_shard(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(300, 1000 + i, generator=g).to(torch.bfloat16) for i in range(3)}
    save_file(tensors, str(tmp_path / "s.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(tensors, "s.safetensors")})
    )
    return tmp_path


def test_stream_views_hash_and_release(tmp_path: Path) -> None:
    """Views of the mapped shard hash like the file; released pages read back the same
    bytes; the file is untouched; a view outlives close()."""
    import hashlib

    from mtpconv.checkpoint.reader import ShardStream
    from mtpconv.checkpoint.safetensors_io import tensor_from_bytes

    files = load_checkpoint_files(_big_shard(tmp_path))
    path = tmp_path / "s.safetensors"
    before = path.read_bytes()
    stream = ShardStream(path)
    infos = sorted((files.tensors[n] for n in ("t0", "t1", "t2")), key=lambda i: i.start)
    first = stream.read(infos[0])
    copy = bytes(first)
    stream.release(infos[0].start, infos[0].end)
    assert bytes(first) == copy  # a released page is read again from the file
    t = tensor_from_bytes(first, infos[0])
    t.mul_(2)  # a private mapping: writing a view never reaches the file
    chunks = list(stream.chunks(infos[1]))
    assert b"".join(bytes(c) for _, c in chunks) == before[infos[1].start : infos[1].end]
    assert all(before[at : at + len(c)] == bytes(c) for at, c in chunks)  # the offsets are the file's
    kept = stream.read(infos[2])
    assert stream.finish() == hashlib.sha256(before).hexdigest()
    assert bytes(kept) == before[infos[2].start : infos[2].end]  # still valid after close
    assert path.read_bytes() == before


def test_stream_out_of_order_and_truncated(tmp_path: Path) -> None:
    import hashlib

    import pytest

    from mtpconv.checkpoint.reader import ShardStream
    from mtpconv.errors import CheckpointFormatError

    files = load_checkpoint_files(_big_shard(tmp_path))
    path = tmp_path / "s.safetensors"
    infos = sorted((files.tensors[n] for n in ("t0", "t1", "t2")), key=lambda i: i.start)
    stream = ShardStream(path)
    stream.read(infos[1])
    stream.read(infos[0])  # behind the position: the digest takes a second pass
    assert stream.finish() == hashlib.sha256(path.read_bytes()).hexdigest()
    with open(path, "r+b") as f:
        f.truncate(infos[2].end - 10)
    stream = ShardStream(path)
    with pytest.raises(CheckpointFormatError, match="truncated"):
        stream.read(infos[2])
    stream.close()
