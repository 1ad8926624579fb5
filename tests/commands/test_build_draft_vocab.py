"""The build-draft-vocab command against an independent count with a real byte-level BPE tokenizer."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer

from fixtures.tokenizers import generate_text, write_tiny_tokenizer
from mtpconv.checkpoint.digests import sha256_file
from mtpconv.commands.build_draft_vocab import build_draft_vocab
from mtpconv.draft_vocab.selection import select_draft_ids
from mtpconv.errors import DraftVocabError
from mtpconv.formats.draft_ids import load_draft_vocab_ids, sidecar_path

VOCAB = 520  # config.json vocab_size: the 512-token tokenizer padded, as real models pad
EXTRA_EOS = 96  # "~": an EOS id from generation_config.json, no special token, unseen


def _write_source(directory: Path, config: dict[str, object], eos: object = None) -> Path:
    write_tiny_tokenizer(directory, vocab_size=512)
    (directory / "config.json").write_text(json.dumps(config))
    if eos is not None:
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return directory


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_source(
        tmp_path_factory.mktemp("ckpt"), {"vocab_size": VOCAB, "eos_token_id": 2}, eos=[2, EXTRA_EOS]
    )


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return generate_text(1500, seed=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "train.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _oracle(source: Path, texts: Iterable[str]) -> Counter[int]:
    """Independent count: one `encode` per text, no numpy, no batching."""
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    counter: Counter[int] = Counter()
    for text in texts:
        counter.update(tok.encode(text, add_special_tokens=False).ids)
    return counter


def _oracle_top_k(counter: Counter[int], k: int, forced: set[int], ids: range) -> list[int]:
    rest = sorted((i for i in ids if i not in forced), key=lambda i: (-counter[i], i))
    return sorted(forced | set(rest[: k - len(forced)]))


def _cov(counter: Counter[int], ids: Iterable[int]) -> float:
    return sum(counter[i] for i in ids) / sum(counter.values())


FORCED = {0, 1, 2, EXTRA_EOS}


def test_ids_are_top_k_of_an_independent_count(
    source: Path, corpus: Path, lines: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "ids.pt"
    report = build_draft_vocab(source, [corpus], 64, out)
    counter = _oracle(source, lines)
    expected = _oracle_top_k(counter, 64, FORCED, range(VOCAB))
    ids = load_draft_vocab_ids(out, VOCAB)
    assert ids.dtype == torch.int64 and ids.dim() == 1
    assert ids.tolist() == expected == report.ids
    assert set(expected) >= FORCED  # specials and EOS kept though never seen
    assert counter[EXTRA_EOS] == 0 and counter[1] == 0
    assert report.special_ids == [0, 1, 2] and report.eos_ids == [2, EXTRA_EOS]
    assert report.corpus.tokens == sum(counter.values())
    assert report.corpus.texts == len(lines)
    assert report.corpus.distinct_ids == len(counter)
    assert report.coverage == _cov(counter, expected)  # exact: both are int / int
    assert [(p.size, p.coverage) for p in report.coverage_table] == [(64, report.coverage)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.pt", "ids.pt.json"]


def test_sidecar_describes_corpus_and_tokenizer(source: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "ids.pt"
    report = build_draft_vocab(source, [corpus], 32, out)
    doc = json.loads(sidecar_path(out).read_text())
    assert sidecar_path(out).name == "ids.pt.json"
    assert doc["format_version"] == 1 and doc["ids_file"] == "ids.pt"
    assert doc["size"] == 32 and doc["vocab_size"] == VOCAB
    assert doc["ids_sha256"] == sha256_file(out)
    assert doc["tokenizer"] == {"file": "tokenizer.json", "sha256": sha256_file(source / "tokenizer.json")}
    assert doc["coverage"] == report.coverage
    assert doc["coverage_table"] == [{"size": 32, "coverage": report.coverage}]
    (f,) = doc["corpus"]["files"]
    assert f == {
        "path": str(corpus),
        "format": "text",
        "sha256": sha256_file(corpus),
        "bytes": corpus.stat().st_size,
        "texts": report.corpus.texts,
        "tokens": report.corpus.tokens,
        "complete": True,
    }
    assert doc["source"] == {"repo_id": None, "revision": None, "path": str(source.resolve())}
    assert doc["eval"] is None and "seconds" not in doc and "ids" not in doc
    assert report.to_dict()["output"] == str(out)


def test_coverage_table_sizes_and_held_out(source: Path, tmp_path: Path) -> None:
    big = _write_source(tmp_path / "big", {"text_config": {"vocab_size": 10_000}})
    train, held = generate_text(800, seed=3), generate_text(300, seed=4)
    (tmp_path / "train.txt").write_text("\n".join(train))
    (tmp_path / "held.txt").write_text("\n".join(held))
    report = build_draft_vocab(
        big, [tmp_path / "train.txt"], 48, tmp_path / "ids.pt", eval_corpora=[tmp_path / "held.txt"]
    )
    train_c, held_c = _oracle(big, train), _oracle(big, held)
    ids = _oracle_top_k(train_c, 48, {0, 1, 2}, range(10_000))
    big_ids = _oracle_top_k(train_c, 8192, {0, 1, 2}, range(10_000))
    assert report.vocab_size == 10_000
    assert [p.size for p in report.coverage_table] == [48, 8192]  # 16k+ exceed the vocab
    assert report.coverage_table[0].coverage == _cov(train_c, ids) == report.coverage
    assert report.coverage_table[1].coverage == 1.0
    assert report.eval is not None
    assert report.eval.corpus.tokens == sum(held_c.values())
    assert report.eval.coverage == _cov(held_c, ids) < 1.0
    assert [(p.size, p.coverage) for p in report.eval.coverage_table] == [
        (48, _cov(held_c, ids)),
        (8192, _cov(held_c, big_ids)),
    ]


def test_balance_tp_equal_ids_per_contiguous_shard(
    source: Path, corpus: Path, lines: list[str], tmp_path: Path
) -> None:
    report = build_draft_vocab(source, [corpus], 64, tmp_path / "ids.pt", balance_tp=4)
    counter = _oracle(source, lines)
    shard = math.ceil(VOCAB / 4)  # 130
    ids = set(report.ids)
    for i in range(4):
        rng = range(i * shard, min((i + 1) * shard, VOCAB))
        mine = sorted(ids & set(rng))
        assert len(mine) == 16
        assert mine == _oracle_top_k(counter, 16, FORCED & set(rng), rng)
    assert report.balance_tp == 4


def test_balance_tp_refusals(source: Path, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(DraftVocabError, match="size=66 is not divisible by balance_tp=4"):
        build_draft_vocab(source, [corpus], 66, tmp_path / "ids.pt", balance_tp=4)
    with pytest.raises(DraftVocabError, match=r"shard 0 \[0, 260\) holds 4 special/EOS ids"):
        build_draft_vocab(source, [corpus], 4, tmp_path / "ids.pt", balance_tp=2)
    counts = np.zeros(10, np.int64)
    with pytest.raises(DraftVocabError, match=r"shard 2 \[8, 10\) has only 2 ids"):
        select_draft_ids(counts, 9, balance_tp=3)
    assert not (tmp_path / "ids.pt").exists()


def test_all_formats_and_max_tokens(source: Path, tmp_path: Path) -> None:
    a, b, c, d = (generate_text(120, seed=s) for s in (10, 11, 12, 13))
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    with gzip.open(root / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(a) + "\n")
    chat = [
        {
            "messages": [
                {"role": "user", "content": x},
                {"role": "assistant", "content": [{"type": "text", "text": y}]},
            ]
        }
        for x, y in zip(b[::2], b[1::2], strict=True)
    ]
    with gzip.open(root / "sub" / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in chat)
    pq.write_table(pa.table({"content": c}), root / "sub" / "c.parquet")
    (root / "d.jsonl").write_text("".join(json.dumps({"content": x}) + "\n" for x in d))
    # Directory order is sorted paths: a.txt.gz, d.jsonl, sub/b.jsonl.gz, sub/c.parquet.
    ordered = a + d + b + c
    report = build_draft_vocab(source, [root], 40, tmp_path / "ids.pt", text_field="content")
    counter = _oracle(source, ordered)
    assert [Path(f.path).name for f in report.corpus.files] == [
        "a.txt.gz",
        "d.jsonl",
        "b.jsonl.gz",
        "c.parquet",
    ]
    assert [f.format for f in report.corpus.files] == ["text.gz", "jsonl", "jsonl.gz", "parquet"]
    assert report.corpus.tokens == sum(counter.values())
    assert report.ids == _oracle_top_k(counter, 40, FORCED, range(VOCAB))

    # --max-tokens: exactly N tokens, taken in corpus order; the last text is cut.
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    stream = [i for text in ordered for i in tok.encode(text, add_special_tokens=False).ids]
    n_first = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in a)
    limit = n_first + 37
    cut = build_draft_vocab(source, [root], 40, tmp_path / "cut.pt", text_field="content", max_tokens=limit)
    assert cut.corpus.tokens == limit and cut.corpus.truncated
    assert [(Path(f.path).name, f.tokens, f.complete) for f in cut.corpus.files] == [
        ("a.txt.gz", n_first, True),
        ("d.jsonl", 37, False),
    ]
    assert cut.ids == _oracle_top_k(Counter(stream[:limit]), 40, FORCED, range(VOCAB))
    assert cut.coverage == _cov(Counter(stream[:limit]), cut.ids)


def test_plot_written(source: Path, corpus: Path, tmp_path: Path) -> None:
    report = build_draft_vocab(
        source, [corpus], 64, tmp_path / "ids.pt", eval_corpora=[corpus], plot=tmp_path / "cov.png"
    )
    assert report.plot == str(tmp_path / "cov.png")
    assert (tmp_path / "cov.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_reports_every_byte(source: Path, corpus: Path, tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []
            self.done = 0

        def start(self, description: str, total: int) -> None:
            self.calls.append((description, total))

        def advance(self, n: int) -> None:
            self.done += n

    rec = Recorder()
    build_draft_vocab(source, [corpus], 16, tmp_path / "ids.pt", progress=rec)
    assert rec.calls == [("Counting tokens", corpus.stat().st_size)]
    assert rec.done == corpus.stat().st_size


def test_empty_corpus_named(source: Path, corpus: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(DraftVocabError, match=r"empty\.jsonl contains no text \(0 tokens\)"):
        build_draft_vocab(source, [corpus, empty], 16, tmp_path / "ids.pt")
    assert not (tmp_path / "ids.pt").exists()


def test_size_and_output_checks(source: Path, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(DraftVocabError, match="size=521 must be between 1 and vocab_size 520"):
        build_draft_vocab(source, [corpus], 521, tmp_path / "ids.pt")
    with pytest.raises(DraftVocabError, match="4 special/added and EOS tokens"):
        build_draft_vocab(source, [corpus], 3, tmp_path / "ids.pt")
    with pytest.raises(DraftVocabError, match="is a directory"):
        build_draft_vocab(source, [corpus], 16, tmp_path)
