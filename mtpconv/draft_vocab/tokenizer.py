"""The checkpoint's own fast tokenizer, its head size, special/added ids and EOS ids.

Counting uses ``tokenizer.json`` of the checkpoint (never a tokenizer guessed by
name); the head size is the config's ``vocab_size`` read by
:func:`mtpconv.layouts.vocab_size_of`, the lookup quantize-mtp uses too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import DraftVocabError
from mtpconv.jsonio import read_json
from mtpconv.layouts import text_config, vocab_size_of

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# What a Hub repo id fetches for build-draft-vocab: configs and tokenizer, never weights.
TOKENIZER_SOURCE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@dataclass
class TokenizerInfo:
    """The tokenizer of one checkpoint and the ids a draft vocabulary must keep."""

    tokenizer: Tokenizer
    path: Path
    sha256: str
    vocab_size: int  # rows of the model's head (config.json), not the tokenizer's size
    special_ids: list[int]
    eos_ids: list[int]


def _id_list(value: Any, where: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise DraftVocabError(f"{where}: eos_token_id {value!r} is not an integer or a list of them.")
    return [int(v) for v in values]


def _read_vocab_size(config: Any, config_path: Path) -> int:
    vocab_size = vocab_size_of(config) if isinstance(config, dict) else None
    if vocab_size is None or vocab_size < 1:
        raise DraftVocabError(
            f"{config_path} has no positive integer vocab_size (nor text_config.vocab_size)."
        )
    return vocab_size


def _load_tokenizer(source: Path) -> tuple[Tokenizer, Path]:
    from tokenizers import Tokenizer

    tok_path = source / "tokenizer.json"
    if not tok_path.is_file():
        raise DraftVocabError(
            f"{source} has no tokenizer.json; build-draft-vocab counts with the checkpoint's "
            "own fast tokenizer. Copy tokenizer.json from the base model into the checkpoint."
        )
    try:
        return Tokenizer.from_file(str(tok_path)), tok_path
    except Exception as exc:  # the Rust side raises plain Exception on a bad file
        raise DraftVocabError(f"{tok_path} is not a valid tokenizers file ({exc}).") from exc


def load_tokenizer_info(source_dir: str | os.PathLike[str]) -> TokenizerInfo:
    """The checkpoint's tokenizer, head size, special/added ids and EOS ids."""
    source = Path(source_dir)
    config_path = source / "config.json"
    if not config_path.is_file():
        raise DraftVocabError(f"{source} has no config.json; point SRC at a model checkpoint.")
    config = read_json(config_path, DraftVocabError, require_object=False)
    vocab_size = _read_vocab_size(config, config_path)

    tokenizer, tok_path = _load_tokenizer(source)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        raise DraftVocabError(f"{tok_path} has an empty vocabulary.")
    max_id = max(vocab.values())
    if max_id >= vocab_size:
        raise DraftVocabError(
            f"{tok_path} has token id {max_id}, but config.json says vocab_size {vocab_size}; "
            "the tokenizer does not belong to this checkpoint."
        )
    special_ids = sorted(tokenizer.get_added_tokens_decoder())

    # EOS ids of the top level and of a VLM's text model alike end a draft.
    eos: set[int] = set()
    eos.update(_id_list(config.get("eos_token_id"), str(config_path)))
    eos.update(_id_list(text_config(config).get("eos_token_id"), str(config_path)))
    gen_path = source / "generation_config.json"
    if gen_path.is_file():
        gen = read_json(gen_path, DraftVocabError, require_object=False)
        if isinstance(gen, dict):
            eos.update(_id_list(gen.get("eos_token_id"), str(gen_path)))
    bad = sorted(i for i in eos if not 0 <= i < vocab_size)
    if bad:
        raise DraftVocabError(f"EOS id {bad[0]} in {source} is outside the vocabulary [0, {vocab_size}).")
    return TokenizerInfo(tokenizer, tok_path, sha256_file(tok_path), vocab_size, special_ids, sorted(eos))


def resolve_tokenizer_source(spec: str, revision: str | None = None) -> tuple[Path, dict[str, str | None]]:
    """A local checkpoint directory, or the tokenizer and config files of a Hub repo.

    Only :data:`TOKENIZER_SOURCE_FILES` are fetched for a repo id (through the HF
    cache, so ``HF_HOME`` / ``HF_TOKEN`` / ``HF_HUB_OFFLINE`` apply), never weights.
    Returns the directory and a ``{"repo_id", "revision", "path"}`` description.
    """
    from mtpconv.checkpoint.source import resolve_source

    source = resolve_source(spec, revision, allow_patterns=TOKENIZER_SOURCE_FILES)
    return source.directory, source.describe()
