"""Streaming corpus readers: every format, directories, and clear errors on bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtpconv.corpus import CorpusFile, discover_corpus_files, iter_text_batches
from mtpconv.errors import DraftVocabError


def _texts(cf: CorpusFile, **kw: object) -> list[str]:
    return [t for b in iter_text_batches(cf, **kw) for t in b.texts]  # type: ignore[arg-type]


def _one(path: Path) -> CorpusFile:
    (cf,) = discover_corpus_files([path])
    return cf


def test_plain_text_one_text_per_line(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("first line\nsecond ß line\r\n\nlast", encoding="utf-8")
    cf = _one(p)
    assert (cf.format, cf.compressed, cf.size) == ("text", False, p.stat().st_size)
    assert _texts(cf) == ["first line", "second ß line", "", "last"]


def test_unknown_suffix_named_explicitly_is_text(tmp_path: Path) -> None:
    p = tmp_path / "notes.log"
    p.write_text("x\ny\n")
    assert _one(p).format == "text"


def test_gzip_text_and_jsonl(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("one\ntwo\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "three"}) + "\n")
    a, b = discover_corpus_files([tmp_path / "a.txt.gz", tmp_path / "b.jsonl.gz"])
    assert (a.kind, b.kind) == ("text.gz", "jsonl.gz")
    assert _texts(a) == ["one", "two"]
    assert _texts(b) == ["three"]


def test_jsonl_text_field_and_chat_messages(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    rows = [
        {"text": "plain", "id": 1},
        {"text": None},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image", "url": "x"},
                        {"type": "text", "text": "b"},
                    ],
                },
                {"role": "tool", "content": None},
            ]
        },
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert _texts(_one(p)) == ["plain", "hi", "a", "b"]


def test_jsonl_custom_field(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"body": "x"}) + "\n")
    assert _texts(_one(p), text_field="body") == ["x"]
    with pytest.raises(DraftVocabError, match=r"c\.jsonl, line 1 has neither a string 'text'"):
        _texts(_one(p))


def test_jsonl_invalid_line_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DraftVocabError, match=r"bad\.jsonl, line 2 is not valid JSON"):
        _texts(_one(p))


def test_parquet_column_streamed(tmp_path: Path) -> None:
    p = tmp_path / "d.parquet"
    texts = [f"row {i}" for i in range(5000)] + [None]
    pq.write_table(pa.table({"text": texts, "n": list(range(5001))}), p, row_group_size=700)
    batches = list(iter_text_batches(_one(p), batch_chars=10_000))
    assert len(batches) > 1
    assert [t for b in batches for t in b.texts] == texts[:-1]
    assert batches[-1].position == p.stat().st_size
    assert all(a.position <= b.position for a, b in zip(batches, batches[1:], strict=False))


def test_parquet_missing_or_non_string_column(tmp_path: Path) -> None:
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["x"], "n": [1]}), p)
    with pytest.raises(DraftVocabError, match=r"d\.parquet has no column 'text' \(columns: body, n\)"):
        _texts(_one(p))
    with pytest.raises(DraftVocabError, match="column 'n' has type int64, not string"):
        _texts(_one(p), text_field="n")


def test_parquet_gz_refused(tmp_path: Path) -> None:
    p = tmp_path / "d.parquet.gz"
    p.write_bytes(b"")
    with pytest.raises(DraftVocabError, match="gzip-compressed Parquet"):
        discover_corpus_files([p])


def test_directory_sorted_recursive_filtered(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z\n")
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "b" / "y.parquet").write_bytes(b"")
    (tmp_path / "README").write_text("not corpus")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "h.txt").write_text("h\n")
    files = discover_corpus_files([tmp_path])
    assert [f.path.relative_to(tmp_path).as_posix() for f in files] == ["a.jsonl", "b/y.parquet", "b/z.txt"]


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(DraftVocabError, match="does not exist"):
        discover_corpus_files([tmp_path / "nope.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftVocabError, match="holds no .txt, .jsonl or .parquet"):
        discover_corpus_files([tmp_path / "empty"])
    with pytest.raises(DraftVocabError, match="no corpus given"):
        discover_corpus_files([])


@pytest.mark.parametrize(
    ("name", "payload", "message"),
    [
        ("bin.txt", b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00", "not UTF-8 text"),
        ("nul.txt", b"abc\x00def\n", "contains NUL bytes"),
        ("bad.txt.gz", b"this is not gzip", "not a valid gzip file"),
        ("bad.parquet", b"PAR1 nope", "not a readable Parquet file"),
    ],
)
def test_binary_files_refused_naming_the_file(
    tmp_path: Path, name: str, payload: bytes, message: str
) -> None:
    p = tmp_path / name
    p.write_bytes(payload)
    with pytest.raises(DraftVocabError, match=message) as info:
        _texts(_one(p))
    assert str(p) in str(info.value)


def test_batches_hold_about_batch_chars(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("".join(f"line {i:05d}\n" for i in range(3000)))
    batches = list(iter_text_batches(_one(p), batch_chars=1000))
    assert all(sum(map(len, b.texts)) < 1000 + 20 for b in batches)
    assert sum(len(b.texts) for b in batches) == 3000
    assert batches[-1].position == p.stat().st_size
