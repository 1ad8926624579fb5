"""The checkpoint's tokenizer and head size, and the one vocab_size lookup shared with quantize-mtp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.tokenizers import generate_text, write_tiny_tokenizer
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.build_draft_vocab import build_draft_vocab
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.draft_vocab.tokenizer import load_tokenizer_info
from mtpconv.errors import DraftVocabError
from mtpconv.formats.draft_ids import save_draft_vocab_ids
from mtpconv.layouts import detect_layout, vocab_size_of


def test_tokenizer_and_config_errors(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    with pytest.raises(DraftVocabError, match="has no config.json"):
        load_tokenizer_info(d)
    (d / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(DraftVocabError, match="no positive integer vocab_size"):
        load_tokenizer_info(d)
    (d / "config.json").write_text(json.dumps({"vocab_size": 600}))
    with pytest.raises(DraftVocabError, match="has no tokenizer.json"):
        load_tokenizer_info(d)
    (d / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(DraftVocabError, match="is not a valid tokenizers file"):
        load_tokenizer_info(d)
    write_tiny_tokenizer(d, vocab_size=512)
    (d / "config.json").write_text(json.dumps({"vocab_size": 500}))
    with pytest.raises(DraftVocabError, match="has token id 511, but config.json says vocab_size"):
        load_tokenizer_info(d)
    (d / "config.json").write_text(json.dumps({"vocab_size": 600}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 600}))
    with pytest.raises(DraftVocabError, match=r"EOS id 600 .* outside the vocabulary \[0, 600\)"):
        load_tokenizer_info(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    info = load_tokenizer_info(d)
    assert (info.vocab_size, info.eos_ids, info.special_ids) == (600, [2, 5], [0, 1, 2])


def test_vocab_size_lookup_prefers_the_text_model() -> None:
    assert vocab_size_of({"vocab_size": 600, "text_config": {"vocab_size": 520}}) == 520
    assert vocab_size_of({"vocab_size": 600, "text_config": {"hidden_size": 8}}) == 600
    assert vocab_size_of({"vocab_size": 600}) == 600
    assert vocab_size_of({"vocab_size": True, "text_config": {}}) is None


def test_build_draft_vocab_and_quantize_mtp_agree_when_the_config_disagrees(tmp_path: Path) -> None:
    """Top-level vocab_size 1024, text_config.vocab_size 512: both commands use 512."""
    src = write_checkpoint(
        tmp_path / "src", Spec(family="qwen3_5_moe", vlm=True, vocab=512, extra_config={"vocab_size": 1024})
    )
    write_tiny_tokenizer(src, vocab_size=512)
    config = json.loads((src / "config.json").read_text())
    assert (config["vocab_size"], config["text_config"]["vocab_size"]) == (1024, 512)
    layout = detect_layout(config, load_checkpoint_files(src).tensors)
    assert layout.vocab_size == load_tokenizer_info(src).vocab_size == vocab_size_of(config) == 512

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(generate_text(200, seed=7)))
    report = build_draft_vocab(src, [corpus], 16, tmp_path / "ids.pt")
    assert report.vocab_size == 512
    assert (
        quantize_mtp(str(src), tmp_path / "v", draft_vocab=tmp_path / "ids.pt", dry_run=True).draft_vocab_size
        == 16
    )
    # An id valid under the top-level value only is refused by quantize-mtp, as by the count.
    save_draft_vocab_ids(torch.tensor([0, 700]), tmp_path / "wide.pt")
    with pytest.raises(DraftVocabError, match=r"has id 700, outside the vocabulary \[0, 512\)"):
        quantize_mtp(str(src), tmp_path / "v", draft_vocab=tmp_path / "wide.pt", dry_run=True)
