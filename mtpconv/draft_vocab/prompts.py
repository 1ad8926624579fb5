"""The prompts file of ``build-draft-vocab --generate``: one JSON object per line.

Each line holds either ``{"prompt": "text"}`` or ``{"messages": [{"role": ...,
"content": ...}, ...]}`` (a chat, rendered later with the checkpoint's own chat
template). The whole file is checked before any model is read, so a bad line is a
usage error naming the file and the line, not a failure after minutes of generation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import DraftVocabUsageError
from mtpconv.jsonio import read_json


class PromptKind(str, Enum):
    """How a prompt line is given to the model."""

    TEXT = "prompt"  # plain text, tokenized as the engine tokenizes any prompt
    CHAT = "messages"  # rendered with the chat template, generation prompt added


@dataclass(frozen=True)
class Prompt:
    """One prompt line: its kind and its text or messages."""

    kind: PromptKind
    value: str | list[dict[str, str]]
    line: int


@dataclass(frozen=True)
class PromptsFile:
    """A checked prompts file: its path, digest and prompts in order."""

    path: Path
    sha256: str
    prompts: list[Prompt]


def has_chat_template(directory: Path) -> bool:
    """Whether the checkpoint ships a chat template (tokenizer_config.json or a template file)."""
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return False
    doc = read_json(config, DraftVocabUsageError, require_object=False)
    return isinstance(doc, dict) and bool(doc.get("chat_template"))


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok:
        raise DraftVocabUsageError(
            f"{where}: messages must be a non-empty list of {{role, content}} string objects."
        )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _parse_line(text: str, where: str, line: int, chat_ok: bool, template_of: str) -> Prompt:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftVocabUsageError(
            f"{where} is not valid JSON ({exc.msg}); write one object per line."
        ) from exc
    if not isinstance(doc, dict):
        raise DraftVocabUsageError(f'{where} is not a JSON object; write {{"prompt": "..."}}.')
    if isinstance(doc.get("prompt"), str) and "messages" not in doc:
        if not doc["prompt"]:
            raise DraftVocabUsageError(f"{where} has an empty prompt; remove the line or fill it.")
        return Prompt(PromptKind.TEXT, doc["prompt"], line)
    if "messages" in doc and "prompt" not in doc:
        messages = _messages(doc["messages"], where)
        if not chat_ok:
            raise DraftVocabUsageError(
                f"{where} holds chat messages but {template_of} has no chat template; "
                'give the line as {"prompt": "..."} or add a chat template to the checkpoint.'
            )
        return Prompt(PromptKind.CHAT, messages, line)
    raise DraftVocabUsageError(f'{where} needs exactly one of a "prompt" string or a "messages" list.')


def read_prompts(path: str | os.PathLike[str], *, chat_template: bool, model: str) -> PromptsFile:
    """Every prompt of ``path`` (blank lines skipped), checked; ``model`` names the checkpoint.

    Raises :class:`DraftVocabUsageError` (exit 2) naming the line of the first
    malformed prompt, a chat line when the checkpoint has no chat template, or a
    file without prompts.
    """
    p = Path(path)
    prompts: list[Prompt] = []
    try:
        with p.open(encoding="utf-8") as fh:
            for number, text in enumerate(fh, start=1):
                if text.strip():
                    prompts.append(_parse_line(text, f"{p} line {number}", number, chat_template, model))
    except UnicodeDecodeError as exc:
        raise DraftVocabUsageError(f"{p} is not UTF-8 text; write the prompts as UTF-8 JSONL.") from exc
    except OSError as exc:
        raise DraftVocabUsageError(f"cannot read the prompts file {p} ({exc.strerror or exc}).") from exc
    if not prompts:
        raise DraftVocabUsageError(f"{p} holds no prompts; write one JSON object per line.")
    return PromptsFile(p, sha256_file(p), prompts)
