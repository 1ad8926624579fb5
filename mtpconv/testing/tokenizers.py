"""A tiny, real byte-level BPE tokenizer for tests, trained on generated text.

``write_tiny_tokenizer(directory)`` trains a ``tokenizers`` BPE model (byte-level
pre-tokenizer and decoder, like the Qwen / GPT-2 family) on deterministic
generated text and writes ``tokenizer.json`` + ``tokenizer_config.json`` into
``directory``. ``generate_text`` makes more text from the same word distribution,
so corpora in tests share the tokenizer's statistics (skewed, Zipf-like counts).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "ph", "str", "ée", "ß")


def _lexicon(seed: int, n_words: int = 400) -> list[str]:
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < n_words:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        if word not in words:
            words.append(word)
    return words


def generate_text(n_lines: int, *, seed: int = 0, words_per_line: tuple[int, int] = (3, 20)) -> list[str]:
    """``n_lines`` lines of Zipf-distributed words (deterministic for a seed).

    The lexicon is fixed (seed 0); ``seed`` only changes which lines are drawn, so
    held-out text from another seed has the same distribution.
    """
    lexicon = _lexicon(0)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(*words_per_line)
        words = rng.choices(lexicon, weights=weights, k=n)
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        lines.append(" ".join(words) + rng.choice((".", "!", "?", ",")))
    return lines


def write_tiny_tokenizer(
    directory: str | Path,
    vocab_size: int = 512,
    *,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    eos_token: str | None = "<|im_end|>",
    texts: Sequence[str] | None = None,
    seed: int = 0,
) -> Path:
    """Train a byte-level BPE tokenizer and write it into ``directory``; returns ``directory``.

    Special tokens get the lowest ids (0, 1, ...), in the order given; the 256
    byte-level symbols follow, then merges up to ``vocab_size``. ``texts``
    defaults to 2000 lines of :func:`generate_text`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = list(texts) if texts is not None else generate_text(2000, seed=seed)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for tok in special_tokens
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "added_tokens_decoder": added,
        "eos_token": eos_token,
        "pad_token": special_tokens[0] if special_tokens else None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
