"""quantize-mtp --draft-vocab: the sliced draft head and its ids file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.checkpoint.digests import sha256_file
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.errors import ConversionError
from mtpconv.formats.fp8 import dequantize_fp8, quantize_fp8
from mtpconv.formats.nvfp4 import dequantize_nvfp4
from mtpconv.manifest import DRAFT_VOCAB_IDS_NAME, read_manifest
from mtpconv.variant_check import bad_files
from tests.helpers import load_tensor, run_cli

IDS = [0, 1, 2, 5, 17, 100, 200, 255]


def _ids_file(tmp_path: Path, ids: list[int] = IDS, coverage: float | None = 0.9) -> Path:
    path = tmp_path / "vocab.pt"
    torch.save(torch.tensor(ids, dtype=torch.int64), path)
    if coverage is not None:
        (tmp_path / "vocab.pt.json").write_text(
            json.dumps({"size": len(ids), "coverage": coverage, "corpus": {"files": [{"path": "c.txt"}]}})
        )
    return path


def test_bf16_head_is_exact_rows(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    dst = tmp_path / "dst"
    quantize_mtp(str(src), dst, draft_vocab=_ids_file(tmp_path), draft_head_dtype="bf16", device="cpu")
    head = load_tensor(dst, "mtp.draft_lm_head.weight")
    assert head.dtype == torch.bfloat16
    assert torch.equal(head, load_tensor(src, "lm_head.weight")[torch.tensor(IDS)])
    ids = torch.load(dst / DRAFT_VOCAB_IDS_NAME, weights_only=True)
    assert ids.tolist() == IDS and ids.dtype == torch.int64
    manifest = read_manifest(dst)
    assert manifest is not None and manifest.draft_vocab is not None
    dv = manifest.draft_vocab
    assert (dv.size, dv.head_dtype, dv.coverage) == (8, "bf16", 0.9)
    assert dv.sha256 == sha256_file(dst / DRAFT_VOCAB_IDS_NAME)
    assert bad_files(dst, manifest) == []


def test_fp8_head_within_fp8_error(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_next", shards=2))
    dst = tmp_path / "dst"
    quantize_mtp(str(src), dst, draft_vocab=_ids_file(tmp_path), device="cpu")
    rows = load_tensor(src, "lm_head.weight")[torch.tensor(IDS)].float()
    q = load_tensor(dst, "mtp.draft_lm_head.weight")
    scale = load_tensor(dst, "mtp.draft_lm_head.weight_scale")
    assert q.dtype == torch.float8_e4m3fn and scale.dim() == 0
    expected = quantize_fp8(rows)
    assert torch.equal(q.view(torch.uint8), expected.weight.view(torch.uint8))
    back = dequantize_fp8(q, scale)
    assert float((back - rows).abs().max()) <= float(rows.abs().max()) / 16  # e4m3: 3 mantissa bits
    # The head has its own file, outside the index: stock vLLM never loads it.
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert not any("draft_lm_head" in n for n in index["weight_map"])
    assert "draft_head" not in " ".join(index["weight_map"].values())
    manifest = read_manifest(dst)
    assert manifest is not None and manifest.draft_vocab is not None
    assert manifest.draft_vocab.head_file == "mtpconv/draft_head.safetensors"
    assert (dst / manifest.draft_vocab.head_file).is_file()


def test_tied_embeddings_and_nvfp4_head(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "tied", Spec(family="qwen3_5", tie_word_embeddings=True))
    quantize_mtp(
        str(src), tmp_path / "tied-v", draft_vocab=_ids_file(tmp_path), draft_head_dtype="bf16", device="cpu"
    )
    assert torch.equal(
        load_tensor(tmp_path / "tied-v", "mtp.draft_lm_head.weight"),
        load_tensor(src, "model.embed_tokens.weight")[torch.tensor(IDS)],
    )
    src = write_checkpoint(
        tmp_path / "fp4", Spec(family="qwen3_5", quant="nvfp4", quant_head=True, exclude=["mtp*"])
    )
    quantize_mtp(
        str(src), tmp_path / "fp4-v", draft_vocab=_ids_file(tmp_path), draft_head_dtype="bf16", device="cpu"
    )
    full = dequantize_nvfp4(
        load_tensor(src, "lm_head.weight"),
        load_tensor(src, "lm_head.weight_scale"),
        load_tensor(src, "lm_head.weight_scale_2"),
    )
    assert torch.equal(
        load_tensor(tmp_path / "fp4-v", "mtp.draft_lm_head.weight"),
        full[torch.tensor(IDS)].to(torch.bfloat16),
    )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([5, 3], "sorted"),
        ([1, 1], "more than once"),
        ([0, 256], "outside the vocabulary"),
        ([-1, 2], "outside the vocabulary"),
    ],
)
def test_bad_ids_refused(
    tmp_path: Path, ids: list[int], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    path = _ids_file(tmp_path, ids, coverage=None)
    code, _, err = run_cli(
        ["quantize-mtp", str(src), str(tmp_path / "v"), "--draft-vocab", str(path)], capsys
    )
    assert code == 1 and "vocab.pt" in err and message in err.lower()
    assert not (tmp_path / "v").exists()


def test_draft_head_needs_a_drafter_the_plugin_serves(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="deepseek_v3"))
    with pytest.raises(ConversionError) as err:
        quantize_mtp(str(src), tmp_path / "v", draft_vocab=_ids_file(tmp_path), device="cpu")
    message = str(err.value)
    assert "serves a truncated draft head for the drafters of mimo, " in message
    assert "qwen3_5" in message and "this checkpoint is deepseek_v3" in message
    assert not (tmp_path / "v").exists()
