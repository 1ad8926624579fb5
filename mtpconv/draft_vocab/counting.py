"""Count token ids over a corpus with the checkpoint's tokenizer, streamed.

No BOS/EOS templates are added; special tokens written literally in the text
are counted. Reading, parsing and counting overlap with encoding on a worker
thread (the tokenizer releases the GIL), so counting runs at encoding speed; the
encoding itself is cheaper than a plain ``encode_batch``: no offsets
(``encode_batch_fast``) and a BPE word cache large enough for a real corpus's
distinct words (the default keeps 10,000; every miss redoes the merges).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.corpus import DEFAULT_BATCH_CHARS, CorpusFile, TextBatch, iter_text_batches
from mtpconv.errors import DraftVocabError, Param

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from mtpconv.progress import ProgressCallback

IntArray = npt.NDArray[np.int64]

# Distinct pre-tokens (words) a BPE model memoizes while counting: ~100 bytes each,
# so at most a few tens of MB, against 10,000 by default, which a web corpus
# overflows within its first megabytes (later words then miss forever).
BPE_CACHE_WORDS = 1 << 18


@dataclass
class CorpusFileStats:
    """One corpus file as counted: identity, size and what it contributed."""

    path: str
    format: str
    sha256: str
    bytes: int
    texts: int
    tokens: int
    complete: bool  # False when --max-tokens stopped inside this file


@dataclass
class CorpusStats:
    """What a count read: its files (in order), texts, tokens and distinct ids."""

    files: list[CorpusFileStats]
    text_field: str
    texts: int
    tokens: int
    distinct_ids: int
    max_tokens: int | None = None
    truncated: bool = False  # stopped by max_tokens before the end of the corpus


def _enlarge_bpe_cache(tokenizer: Tokenizer) -> None:
    """Let a BPE model memoize more words; the ids are the same (a cache of a pure function).

    BPE only consults its cache without dropout; ``_resize_cache`` exists in
    tokenizers >= 0.21 (where it is missing, the default cache stays).
    """
    model = tokenizer.model
    resize = getattr(model, "_resize_cache", None)
    if resize is not None and getattr(model, "dropout", None) is None:
        resize(BPE_CACHE_WORDS)


def _encoder(tokenizer: Tokenizer) -> Callable[[list[str]], list[Any]]:
    _enlarge_bpe_cache(tokenizer)
    # encode_batch_fast (tokenizers >= 0.21) skips offsets, which we never read.
    fast = getattr(tokenizer, "encode_batch_fast", None)
    batch = fast if fast is not None else tokenizer.encode_batch

    def encode(texts: list[str]) -> list[Any]:
        return list(batch(texts, add_special_tokens=False))

    return encode


def _file_batches(
    files: Sequence[CorpusFile], text_field: str, batch_chars: int
) -> Iterator[tuple[int, TextBatch | None]]:
    """(file index, batch) over all files; (index, None) marks the end of a file."""
    for i, cf in enumerate(files):
        for batch in iter_text_batches(cf, text_field=text_field, batch_chars=batch_chars):
            yield i, batch
        yield i, None


def _pipelined(
    items: Iterator[tuple[int, TextBatch | None]], encode: Callable[[list[str]], list[Any]]
) -> Generator[tuple[int, TextBatch | None, list[Any] | None], None, None]:
    """Encode batch n+1 on a worker thread while the caller counts batch n.

    The tokenizer releases the GIL while it encodes, so reading, parsing and
    counting overlap with encoding; at most two batches are alive at a time.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: list[tuple[int, TextBatch | None, Future[list[Any]] | None]] = []
        try:
            for i, batch in items:
                future = pool.submit(encode, batch.texts) if batch is not None else None
                if future is not None:
                    for j, b, f in pending:
                        yield j, b, f.result() if f is not None else None
                    pending = []
                pending.append((i, batch, future))
            for j, b, f in pending:
                yield j, b, f.result() if f is not None else None
        finally:
            for _, _, f in pending:
                if f is not None:
                    f.cancel()


def count_tokens(
    tokenizer: Tokenizer,
    files: Sequence[CorpusFile],
    vocab_size: int,
    *,
    text_field: str = "text",
    max_tokens: int | None = None,
    progress: ProgressCallback | None = None,
    description: str = "Counting tokens",
    batch_chars: int = DEFAULT_BATCH_CHARS,
) -> tuple[IntArray, CorpusStats]:
    """Count token ids over ``files`` (streamed); ``counts[i]`` = occurrences of id i.

    Stops after exactly ``max_tokens`` tokens when given (the last text may be cut);
    files not reached by then are not listed in the returned stats. Texts are
    encoded ``batch_chars`` characters at a time (memory, not the counts, depends on it).
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    stats: list[CorpusFileStats] = []
    texts = [0] * len(files)
    tokens = [0] * len(files)
    done = [0] * len(files)
    total = 0
    truncated = False
    if progress is not None:
        progress.start(description, sum(cf.size for cf in files))

    def finish(i: int, complete: bool) -> None:
        cf = files[i]
        if complete and tokens[i] == 0:
            raise DraftVocabError(
                f"corpus file {cf.path} contains no text (0 tokens); remove it or check ",
                Param("text_field"),
                ".",
            )
        stats.append(
            CorpusFileStats(
                str(cf.path), cf.kind, sha256_file(cf.path), cf.size, texts[i], tokens[i], complete
            )
        )
        if progress is not None and complete:
            progress.advance(cf.size - done[i])

    stream = _pipelined(_file_batches(files, text_field, batch_chars), _encoder(tokenizer))
    for i, batch, encodings in stream:
        if batch is None or encodings is None:
            finish(i, complete=True)
            continue
        if max_tokens is not None and total >= max_tokens:
            truncated = True
            if tokens[i]:
                finish(i, complete=False)
            break
        # One flat pass over the id lists, no per-encoding arrays.
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64)
        n_texts = len(batch.texts)
        cut = max_tokens is not None and total + ids.size > max_tokens
        if max_tokens is not None and cut:
            keep = max_tokens - total
            lengths = np.cumsum([len(e.ids) for e in encodings])
            n_texts = int(np.searchsorted(lengths, keep, side="left")) + 1
            ids = ids[:keep]
        binned = np.bincount(ids, minlength=vocab_size)
        if binned.size > vocab_size:  # load_tokenizer_info rules this out; never silent
            raise DraftVocabError(f"the tokenizer produced id {binned.size - 1} >= vocab_size {vocab_size}.")
        counts += binned
        total += ids.size
        tokens[i] += ids.size
        texts[i] += n_texts
        if progress is not None:
            progress.advance(batch.position - done[i])
        done[i] = batch.position
        if cut:
            truncated = True
            finish(i, complete=False)
            break
    stream.close()
    corpus = CorpusStats(
        stats,
        text_field,
        sum(s.texts for s in stats),
        total,
        int(np.count_nonzero(counts)),
        max_tokens,
        truncated,
    )
    return counts, corpus
