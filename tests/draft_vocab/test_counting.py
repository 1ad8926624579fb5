"""count_tokens gives exactly the counts of a straightforward reference count.

The reference reads each file the plain way (json.loads per line, gzip.open),
encodes one text at a time with a fresh tokenizer (default BPE cache, offsets,
plain ``encode``) and counts with collections.Counter; the counter under test
streams, pipelines, uses ``encode_batch_fast``, an enlarged BPE cache and numpy.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from fixtures.tokenizers import DEFAULT_SPECIAL_TOKENS, generate_text, write_tiny_tokenizer
from mtpconv.corpus import discover_corpus_files
from mtpconv.draft_vocab import counting
from mtpconv.draft_vocab.counting import count_tokens

VOCAB = 1024


def _reference_texts(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        lines = f.read().splitlines()
    if ".jsonl" not in path.name:
        return lines
    texts = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if isinstance(record.get("text"), str):
            texts.append(record["text"])
        else:
            for message in record["messages"]:
                content = message["content"]
                if isinstance(content, str):
                    texts.append(content)
                else:
                    texts += [part["text"] for part in content if "text" in part]
    return texts


def _reference_ids(tokenizer_path: Path, files: list[Path]) -> list[int]:
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    ids: list[int] = []
    for path in files:
        for text in _reference_texts(path):
            ids += tokenizer.encode(text, add_special_tokens=False).ids
    return ids


def _with_specials(rng: random.Random, lines: list[str]) -> str:
    out = []
    for line in lines:
        if rng.random() < 0.3:
            special = rng.choice(DEFAULT_SPECIAL_TOKENS)
            line = f"{line}{special}" if rng.random() < 0.5 else f"{special} {line}"
        out.append(line)
    return "\n".join(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("counting")
    tok_dir = write_tiny_tokenizer(root / "tok", VOCAB)
    rng = random.Random(7)
    lines = generate_text(3000, seed=3)
    # Numbers make many distinct words: more than a small BPE cache holds.
    lines += [" ".join(str(rng.randint(0, 10**6)) for _ in range(8)) for _ in range(300)]
    rng.shuffle(lines)
    text = root / "plain.txt"
    text.write_text(_with_specials(rng, lines[:800]) + "\n", encoding="utf-8")
    jsonl = root / "docs.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for i in range(800, 1600, 8):
            f.write(json.dumps({"text": _with_specials(rng, lines[i : i + 8])}, ensure_ascii=False) + "\n")
        f.write("\n")  # blank lines are skipped
    chat = root / "chat.jsonl.gz"
    with gzip.open(chat, "wt", encoding="utf-8") as f:
        for i in range(1600, len(lines), 6):
            messages = [
                {"role": "system", "content": "<|im_start|>" + lines[i]},
                {"role": "user", "content": [{"type": "text", "text": lines[i + 1]}, {"type": "image"}]},
                {"role": "assistant", "content": _with_specials(rng, lines[i + 2 : i + 6])},
            ]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return tok_dir / "tokenizer.json", [text, jsonl, chat]


@pytest.mark.parametrize("batch_chars", [1 << 20, 3000, 1])
def test_counts_are_bit_identical_to_reference(corpus: tuple[Path, list[Path]], batch_chars: int) -> None:
    tokenizer_path, paths = corpus
    reference = np.bincount(_reference_ids(tokenizer_path, paths), minlength=VOCAB)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    counts, stats = count_tokens(tokenizer, discover_corpus_files(paths), VOCAB, batch_chars=batch_chars)
    assert counts.dtype == np.int64
    assert np.array_equal(counts, reference)
    assert stats.tokens == int(reference.sum())
    assert [s.tokens for s in stats.files] == [len(_reference_ids(tokenizer_path, [p])) for p in paths]
    assert all(counts[tokenizer.token_to_id(tok)] > 0 for tok in DEFAULT_SPECIAL_TOKENS)


def test_counts_with_a_tiny_bpe_cache_are_the_same(
    corpus: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer_path, paths = corpus
    files = discover_corpus_files(paths)
    big, _ = count_tokens(Tokenizer.from_file(str(tokenizer_path)), files, VOCAB, batch_chars=5000)
    monkeypatch.setattr(counting, "BPE_CACHE_WORDS", 8)
    small, _ = count_tokens(Tokenizer.from_file(str(tokenizer_path)), files, VOCAB, batch_chars=5000)
    assert np.array_equal(big, small)


@pytest.mark.parametrize("max_tokens", [1, 777, 20_000])
def test_max_tokens_counts_the_first_tokens_of_the_reference(
    corpus: tuple[Path, list[Path]], max_tokens: int
) -> None:
    tokenizer_path, paths = corpus
    ids = _reference_ids(tokenizer_path, paths)
    assert len(ids) > max_tokens
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    counts, stats = count_tokens(
        tokenizer, discover_corpus_files(paths), VOCAB, max_tokens=max_tokens, batch_chars=4000
    )
    assert np.array_equal(counts, np.bincount(ids[:max_tokens], minlength=VOCAB))
    assert stats.tokens == max_tokens and stats.truncated
