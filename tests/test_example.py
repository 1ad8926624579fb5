"""The bundled example (scripts/make_example.py, what scripts/demo.sh runs) looks like a real
Qwen3.5 release, and the README's usage commands run on it (issue 47)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "tiny-qwen3.5-moe-nvfp4"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_example.py"), str(out)], check=True)
    return out


def test_the_example_states_its_max_context(example: Path) -> None:
    text = json.loads((example / "config.json").read_text())["text_config"]
    assert text["max_position_embeddings"] == 262144  # Qwen3.5's released value


def test_the_readme_commands_run_on_the_example(example: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    variant = tmp_path / "tiny-qwen3.5-moe-nvfp4-mtpfp8"
    ids = tmp_path / "vocab.pt"
    corpus = ROOT / "examples" / "corpus.jsonl"
    commands = [
        ["inspect", str(example)],
        ["inspect", str(example), "--json"],
        ["quantize-mtp", str(example), str(variant), "--dry-run"],
        ["build-draft-vocab", str(example), "--corpus", str(corpus), "--size", "128", "--output", str(ids)],
        ["quantize-mtp", str(example), str(variant), "--draft-vocab", str(ids)],
        ["fix-exclusions", str(example), str(tmp_path / "fixed")],
        ["set-draft-window", str(variant), "64"],
        ["set-draft-window", str(variant), "--clear"],
        ["verify", str(variant)],
        ["inspect", str(variant)],
        ["publish", str(variant), "--repo-id", "me/tiny-mtpfp8", "--dry-run"],
    ]
    for args in commands:
        code, out, err = run_cli(args, capsys)
        assert code == 0, f"mtpconv {' '.join(args)} -> {code}\n{err}"
        assert "Error:" not in err, err
    code, out, _ = run_cli(["inspect", str(example), "--json"], capsys)
    findings = json.loads(out)["findings"]
    # The example has the real mtp.fc gap and nothing else wrong.
    assert {f["code"] for f in findings if f["severity"] == "error"} == {"plain-declared-quantized"}
