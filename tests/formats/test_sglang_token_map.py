"""Our ids file is SGLang's ``--speculative-token-map`` format, loaded SGLang's way.

SGLang is not installed here. Its load path, from its source
(sgl-project/sglang ``python/sglang/srt/speculative/spec_utils.py``, ``load_token_map``;
older releases have it in ``eagle_worker.py`` with int32), is::

    hot_token_id = torch.load(token_map_path, weights_only=True)
    return torch.tensor(hot_token_id, dtype=torch.int64)

and for EAGLE/NEXTN drafters (``eagle_worker.py``, ``init_lm_head``) it slices the target
head ``head.data[hot_token_id]`` and maps drafted indices back with
``hot_token_id[topk_index]``. `_sglang_load_token_map` repeats those two lines exactly;
the test then checks what SGLang would do with the result.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.formats.draft_ids import save_draft_vocab_ids
from mtpconv.manifest import DRAFT_VOCAB_IDS_NAME


def _sglang_load_token_map(path: Path, dtype: torch.dtype) -> torch.Tensor:
    hot_token_id = torch.load(path, weights_only=True)
    return torch.tensor(hot_token_id, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_sglang_load_path_gives_the_ids(tmp_path: Path, dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 3, 4, 17, 200, 255])
    path = save_draft_vocab_ids(ids[torch.randperm(len(ids))], tmp_path / DRAFT_VOCAB_IDS_NAME)
    with warnings.catch_warnings():
        # torch.tensor(tensor) only warns ("use clone().detach()"); an error would fail here
        warnings.simplefilter("ignore", UserWarning)
        hot = _sglang_load_token_map(path, dtype)
    assert hot.dtype == dtype and hot.dim() == 1
    assert hot.tolist() == ids.tolist()  # sorted ascending, exactly the ids

    head = torch.randn(256, 8)
    sliced = head.data[hot]  # what SGLang's draft head becomes
    assert torch.equal(sliced, head[ids])
    topk_index = torch.tensor([[0, 5], [2, 1]])  # indices into the sliced head
    assert hot[topk_index].tolist() == [[0, 255], [4, 3]]  # mapped back to target ids


def test_the_variant_carries_a_loadable_token_map(tmp_path: Path) -> None:
    spec = Spec(family="qwen3_5")
    src = write_checkpoint(tmp_path / "src", spec)
    ids = torch.arange(0, spec.vocab, 4)
    save_draft_vocab_ids(ids, tmp_path / "ids.pt")
    quantize_mtp(str(src), tmp_path / "dst", device="cpu", draft_vocab=tmp_path / "ids.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        hot = _sglang_load_token_map(tmp_path / "dst" / DRAFT_VOCAB_IDS_NAME, torch.int64)
    assert hot.tolist() == ids.tolist()


def test_inspect_says_stock_vllm_skips_the_truncated_head(tmp_path: Path) -> None:
    from mtpconv.commands.inspect import inspect_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    save_draft_vocab_ids(torch.arange(0, 256, 2), tmp_path / "ids.pt")
    quantize_mtp(str(src), tmp_path / "dst", device="cpu", draft_vocab=tmp_path / "ids.pt")
    view = inspect_checkpoint(str(tmp_path / "dst")).stock_vllm
    assert view is not None and view.of.value == "variant"
    assert "mtpconv/draft_head.safetensors) is outside the index" in view.reason
    assert {r.gets for r in view.rows} == {"FP8_PER_CHANNEL_PER_TOKEN"}
