"""The ids file written without torch is the file torch.save writes, as torch.load sees it."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mtpconv.formats.draft_ids import load_draft_vocab_ids, save_draft_vocab_ids
from mtpconv.formats.torch_file import write_int64_tensor


@pytest.mark.parametrize("values", [[0], [3, 1, 4, 1, 5], list(range(0, 300_000, 3)), [2**40, -7]])
def test_torch_load_reads_the_tensor_torch_save_would_write(tmp_path: Path, values: list[int]) -> None:
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    write_int64_tensor(np.array(values), ours)
    torch.save(torch.tensor(values, dtype=torch.int64), theirs)
    for kwargs in ({}, {"mmap": True}):
        got = torch.load(ours, weights_only=True, **kwargs)
        want = torch.load(theirs, weights_only=True, **kwargs)
        assert got.dtype == want.dtype == torch.int64
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want) and not got.requires_grad
    # the same records, each record's data 64-byte aligned as torch writes them
    with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
        strip = [sorted(n.split("/", 1)[1] for n in z.namelist()) for z in (a, b)]
        assert strip[0] == strip[1]
        for info in a.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
            assert start % 64 == 0, info.filename


def test_the_saved_ids_file_passes_its_own_contract(tmp_path: Path) -> None:
    path = save_draft_vocab_ids(np.array([9, 2, 5], dtype=np.int64), tmp_path / "ids.pt")
    assert load_draft_vocab_ids(path, vocab_size=10).tolist() == [2, 5, 9]
    save_draft_vocab_ids(torch.tensor([4, 1]), path)  # a torch tensor in, overwritten atomically
    assert load_draft_vocab_ids(path, vocab_size=10).tolist() == [1, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.pt"]
