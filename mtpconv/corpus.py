"""Streaming corpus readers: text batches from plain text, JSON Lines and Parquet.

Formats, chosen by file name (a trailing ``.gz`` means gzip-compressed):

- plain text (any other name): one text per line;
- JSON Lines (``.jsonl``, ``.ndjson``): per line, the string field ``text_field``,
  or else a chat ``messages`` list whose ``content`` values are counted (a content
  is a string or a list of parts, whose ``"text"`` strings are counted); a null
  ``text_field`` is skipped;
- Parquet (``.parquet``; needs the ``parquet`` extra, pyarrow): the string column
  ``text_field``, read one record batch at a time.

A directory stands for every file of these formats below it, recursively, in
sorted path order (hidden files and unrecognised names are skipped). Memory stays
flat in corpus size: batches hold about ``batch_chars`` characters. Unreadable,
binary or empty files raise :class:`~mtpconv.errors.DraftVocabError` naming the file.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mtpconv.errors import DraftVocabError, Param

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md"})
JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
PARQUET_SUFFIXES = frozenset({".parquet"})
DEFAULT_BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class CorpusFile:
    """One corpus file and how to read it."""

    path: Path
    format: str  # "text" | "jsonl" | "parquet"
    compressed: bool
    size: int  # bytes on disk

    @property
    def kind(self) -> str:
        return self.format + (".gz" if self.compressed else "")


@dataclass
class TextBatch:
    """Texts read from one file, and how many bytes of the file are consumed so far."""

    texts: list[str]
    position: int


def _classify(path: Path, *, explicit: bool) -> CorpusFile | None:
    name = path.name.lower()
    compressed = name.endswith(".gz")
    suffix = Path(name[:-3] if compressed else name).suffix
    if suffix in JSONL_SUFFIXES:
        fmt = "jsonl"
    elif suffix in PARQUET_SUFFIXES:
        if compressed:
            raise DraftVocabError(
                f"corpus file {path} is a gzip-compressed Parquet file, which cannot be "
                "streamed; decompress it (Parquet compresses its columns itself)."
            )
        fmt = "parquet"
    elif suffix in TEXT_SUFFIXES or explicit:
        fmt = "text"
    else:
        return None
    return CorpusFile(path=path, format=fmt, compressed=compressed, size=path.stat().st_size)


def discover_corpus_files(paths: Sequence[str | os.PathLike[str]]) -> list[CorpusFile]:
    """Expand files and directories into corpus files, in the order given.

    A file named explicitly is read as plain text unless its name says JSON Lines
    or Parquet; inside a directory only recognised names are taken.
    """
    if not paths:
        raise DraftVocabError("no corpus given; pass at least one file or directory.")
    files: list[CorpusFile] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = [
                cf
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
                and (cf := _classify(p, explicit=False)) is not None
            ]
            if not found:
                raise DraftVocabError(
                    f"corpus directory {path} holds no .txt, .jsonl or .parquet file "
                    "(optionally .gz); name the files themselves."
                )
            files.extend(found)
        elif path.is_file():
            cf = _classify(path, explicit=True)
            assert cf is not None
            files.append(cf)
        else:
            raise DraftVocabError(f"corpus path {path} does not exist.")
    return files


def _open_binary(cf: CorpusFile) -> tuple[BinaryIO, BinaryIO]:
    """(raw file, decompressed stream); the raw file's position is the progress."""
    raw = open(cf.path, "rb")  # noqa: SIM115 - closed by the caller
    if cf.compressed:
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw, raw


def _lines(cf: CorpusFile) -> Iterator[tuple[int, str, BinaryIO]]:
    """(line number, line without its newline, raw file) for a text or JSONL file."""
    raw, stream = _open_binary(cf)
    with raw, stream:
        reader = io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline=None)
        lineno = 0
        try:
            for lineno, line in enumerate(reader, start=1):  # noqa: B007 - used on error
                if "\x00" in line:
                    raise DraftVocabError(
                        f"corpus file {cf.path} contains NUL bytes (line {lineno}); it looks "
                        "binary. Pass text, JSON Lines or Parquet files."
                    )
                yield lineno, line.rstrip("\n"), raw
        except UnicodeDecodeError as exc:
            raise DraftVocabError(
                f"corpus file {cf.path} is not UTF-8 text (near line {lineno + 1}: {exc.reason}); "
                "it looks binary. Pass text, JSON Lines or Parquet files."
            ) from exc
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise DraftVocabError(
                f"corpus file {cf.path} is not a valid gzip file ({exc}); "
                "check the file or drop the .gz suffix."
            ) from exc


def _message_texts(messages: Any, where: str) -> Iterator[str]:
    if not isinstance(messages, list):
        raise DraftVocabError(f"{where}: 'messages' is not a list.")
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]
        elif content is not None:
            raise DraftVocabError(f"{where}: a message content is neither a string nor a list.")


def _jsonl_texts(cf: CorpusFile, text_field: str) -> Iterator[tuple[str, BinaryIO]]:
    for lineno, line, raw in _lines(cf):
        if not line.strip():
            continue
        where = f"corpus file {cf.path}, line {lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DraftVocabError(f"{where} is not valid JSON ({exc.msg}).") from exc
        except RecursionError:
            raise DraftVocabError(f"{where} is JSON nested too deeply to hold a text.") from None
        if not isinstance(record, dict):
            raise DraftVocabError(f"{where} is not a JSON object.")
        text = record.get(text_field)
        if isinstance(text, str):
            yield text, raw
        elif "messages" in record:
            for content in _message_texts(record["messages"], where):
                yield content, raw
        elif text is None and text_field in record:
            continue  # an explicit null, like a null cell in Parquet: nothing to count
        else:
            raise DraftVocabError(
                f"{where} has neither a string {text_field!r} field nor a 'messages' list; "
                "name the text field with ",
                Param("text_field"),
                ".",
            )


def _batched(items: Iterable[tuple[str, BinaryIO]], batch_chars: int, end: int) -> Iterator[TextBatch]:
    texts: list[str] = []
    chars = 0
    for text, raw in items:
        texts.append(text)
        chars += len(text)
        if chars >= batch_chars:
            yield TextBatch(texts, raw.tell())
            texts, chars = [], 0
    if texts:
        yield TextBatch(texts, end)  # the file is closed (read to its end) by now


def _parquet_batches(cf: CorpusFile, text_field: str, batch_chars: int) -> Iterator[TextBatch]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DraftVocabError(
            f"corpus file {cf.path} is Parquet, which needs pyarrow: pip install 'mtpconv[parquet]'."
        ) from exc
    try:
        pf = pq.ParquetFile(cf.path)
    except (pa.ArrowException, OSError) as exc:
        raise DraftVocabError(f"corpus file {cf.path} is not a readable Parquet file ({exc}).") from exc
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DraftVocabError(
            f"corpus file {cf.path} has no column {text_field!r} (columns: {', '.join(names)}); "
            "name the text column with ",
            Param("text_field"),
            ".",
        )
    column_type = pf.schema_arrow.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DraftVocabError(
            f"corpus file {cf.path}: column {text_field!r} has type {column_type}, not string."
        )
    total_rows = max(pf.metadata.num_rows, 1)
    rows = chars = 0
    texts: list[str] = []
    try:
        for record_batch in pf.iter_batches(batch_size=1024, columns=[text_field]):
            rows += record_batch.num_rows
            for text in record_batch.column(0).to_pylist():
                if text is not None:
                    texts.append(text)
                    chars += len(text)
            if chars >= batch_chars:
                yield TextBatch(texts, cf.size * rows // total_rows)
                texts, chars = [], 0
    except pa.ArrowException as exc:
        raise DraftVocabError(f"corpus file {cf.path} cannot be read as Parquet ({exc}).") from exc
    if texts:
        yield TextBatch(texts, cf.size)


def iter_text_batches(
    cf: CorpusFile, *, text_field: str = "text", batch_chars: int = DEFAULT_BATCH_CHARS
) -> Iterator[TextBatch]:
    """Stream the texts of one corpus file in batches of about ``batch_chars`` characters."""
    if cf.format == "parquet":
        yield from _parquet_batches(cf, text_field, batch_chars)
    elif cf.format == "jsonl":
        yield from _batched(_jsonl_texts(cf, text_field), batch_chars, cf.size)
    else:
        yield from _batched(((line, raw) for _, line, raw in _lines(cf)), batch_chars, cf.size)
