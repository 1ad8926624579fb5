"""The rewrite pipeline: one fsync per written file, source digests from the reads."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.manifest import read_manifest


@pytest.mark.parametrize("quant", ["bf16", "nvfp4"])
def test_each_written_file_is_fsynced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quant: str
) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5_moe", quant=quant, shards=3))
    synced: Counter[str] = Counter()
    real = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.is_file():
            synced[path.name] += 1
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    plan = quantize_mtp(str(src), tmp_path / "v", device="cpu", copy=True).plan
    written = [p.name for p in (tmp_path / "v").iterdir()]
    # temp names (".x.tmp-PID") of the JSON writers count for the file they become
    by_final = Counter({n: c for n, c in synced.items() if not n.startswith(".")})
    for n, c in synced.items():
        if n.startswith("."):
            by_final[next(w for w in written if n.startswith(f".{w}"))] += c
    assert dict(by_final) == {n: 1 for n in written}
    manifest = read_manifest(tmp_path / "v")
    assert manifest is not None
    for shard in plan.rewritten:  # hashed ahead, while torch loads
        assert (
            manifest.source["files"][shard.file]
            == hashlib.sha256((src / shard.file).read_bytes()).hexdigest()
        )


@pytest.mark.parametrize("shape", [(70, 90), (3, 40, 50)])
def test_the_numpy_and_torch_paths_give_the_same_bytes(shape: tuple[int, ...]) -> None:
    """A 16-bit weight on the CPU is quantized by the numpy table; the same values through
    torch (as an NVFP4 or CUDA conversion would take them) give the same bytes and scales."""
    import numpy as np
    import torch

    from mtpconv.shard_rewrite import HalfCodes, _quantize

    g = torch.Generator().manual_seed(5)
    w = (torch.randn(*shape, generator=g) * 0.03).to(torch.bfloat16)
    table, table_err = _quantize("w", HalfCodes(w.view(torch.uint16).numpy(), "BF16"), "cpu")
    direct, direct_err = _quantize("w", w.float(), "cpu")  # float32: torch's direct formula
    assert table.weight.dtype == direct.weight.dtype == np.uint8
    assert np.array_equal(table.weight, direct.weight)
    assert table.scale.dtype == direct.scale.dtype == np.float32
    assert np.array_equal(table.scale, direct.scale)
    assert table_err.max_abs == direct_err.max_abs and table_err.amax == direct_err.amax
    assert table_err.rel_l2 == pytest.approx(direct_err.rel_l2, rel=1e-4)
