"""`mtpconv build-draft-vocab` through the real Typer app."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures.tokenizers import generate_text, write_tiny_tokenizer
from mtpconv.cli import app, main
from mtpconv.errors import DraftVocabError


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = write_tiny_tokenizer(tmp_path_factory.mktemp("ckpt"), vocab_size=512)
    (d / "config.json").write_text(json.dumps({"vocab_size": 512, "eos_token_id": 2}))
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in generate_text(400, seed=5)))
    return p


def _cmd(*args: object) -> list[str]:
    """``build-draft-vocab`` and its arguments as strings."""
    return ["build-draft-vocab", *map(str, args)]


def _run_main(args: list[str]) -> tuple[int, str, str]:
    """Run the console-script entry point (which maps errors to one line) in isolation."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, out.getvalue().decode(), err.getvalue().decode()


def test_json_output(source: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ids.pt"
    args = _cmd(source, "--corpus", corpus, "--size", "64", "-o", out, "--eval-corpus", corpus, "--json")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["size"] == 64 and doc["output"] == str(out)
    assert doc["eval"]["coverage"] == doc["coverage"]  # same text held out
    assert out.exists() and Path(str(out) + ".json").exists()


def test_table_output(source: Path, corpus: Path, tmp_path: Path) -> None:
    args = _cmd(source, "--corpus", corpus, "--size", "32", "-o", tmp_path / "ids.pt", "--balance-tp", "2")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Coverage of" in result.stdout and "32 (K)" in result.stdout
    assert f"Wrote {tmp_path / 'ids.pt'} (32 of 512 ids" in result.stdout


def test_default_output_name(
    source: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, _cmd(source, "--corpus", corpus, "--size", "16"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mtp_draft_vocab_ids.pt").exists()


def test_bad_input_exit_1(source: Path, corpus: Path, tmp_path: Path) -> None:
    args = _cmd(source, "--corpus", corpus, "--size", "30", "-o", tmp_path / "ids.pt", "--balance-tp", "4")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and isinstance(result.exception, DraftVocabError)
    code, out, err = _run_main(args)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "Error: --size 30 is not divisible by --balance-tp 4; pick a multiple of 4."
    ]
    assert not (tmp_path / "ids.pt").exists()


def test_binary_corpus_one_error_line(source: Path, tmp_path: Path) -> None:
    blob = tmp_path / "blob.txt"
    blob.write_bytes(bytes(range(256)) * 4)
    code, _, err = _run_main(_cmd(source, "--corpus", blob, "--size", "16", "-o", tmp_path / "ids.pt"))
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("Error: corpus file ") and "blob.txt" in line and "binary" in line


def test_hub_repo_id_offline(
    source: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repo id resolves through the HF cache, offline, fetching no weights."""
    import huggingface_hub.constants as hf_constants

    # huggingface_hub reads HF_HOME / HF_HUB_OFFLINE once, at import: point its
    # frozen copies at this test's cache whatever imported it first.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", os.path.join(os.environ["HF_HOME"], "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    missing = _run_main(_cmd("acme/absent", "--corpus", corpus, "--size", "16", "-o", tmp_path / "x.pt"))
    assert missing[0] == 1 and "not in the local Hugging Face cache" in missing[2]

    repo = Path(os.environ["HF_HOME"]) / "hub" / "models--acme--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    result = CliRunner().invoke(
        app,
        _cmd("acme/tiny", "--corpus", corpus, "--size", "16", "-o", tmp_path / "ids.pt", "--json"),
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"] == {"repo_id": "acme/tiny", "revision": None, "path": None}
