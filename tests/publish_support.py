"""Shared by the publish and model-card tests: a tiny real ``-mtpfp8`` variant, the
recording stand-in for ``HfApi`` at the publish seam, and Hub isolation."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from mtpconv import console
from mtpconv.checkpoint.digests import sha256_file
from mtpconv.commands import publish
from mtpconv.manifest import (
    DrafterSection,
    DraftVocabSection,
    Manifest,
    write_manifest,
)

TOKEN = "hf_SECRETtoken1234567890"
H = 32
LINEARS = ["mtp.fc", "mtp.layers.0.self_attn.q_proj"]


@pytest.fixture(autouse=True)
def isolate_hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """No Hub token, no Hub cache, no network, no real HfApi; a wide terminal."""
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "MTPCONV_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "200")

    def no_hub() -> Any:
        raise AssertionError("a test reached for the real Hub client")

    def no_network(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a test opened a network connection")

    monkeypatch.setattr(publish, "make_api", no_hub)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    console.set_quiet(False)
    yield
    console.set_quiet(False)


def _fp8(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)


def _bf16(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def make_variant(
    root: Path,
    *,
    source: dict[str, Any] | None = None,
    draft_vocab: bool = True,
    readme: str | None = None,
    readme_listed: bool = False,
    license_file: bool = False,
    errors: dict[str, dict[str, float]] | None = None,
) -> tuple[Path, Manifest]:
    """A tiny but real -mtpfp8 variant: two shards + index, FP8 drafter, manifest."""
    root.mkdir(parents=True, exist_ok=True)
    shard1 = {
        "model.embed_tokens.weight": _bf16((256, H), 1),
        "lm_head.weight": _bf16((256, H), 2),
    }
    shard2 = {
        "mtp.fc.weight": _fp8((H, 2 * H), 3),
        "mtp.fc.weight_scale": torch.tensor(0.01, dtype=torch.float32),
        "mtp.layers.0.self_attn.q_proj.weight": _fp8((H, H), 4),
        "mtp.layers.0.self_attn.q_proj.weight_scale": torch.tensor(0.02, dtype=torch.float32),
        "mtp.norm.weight": _bf16((H,), 5),
    }
    if draft_vocab:
        shard2["mtp.draft_lm_head.weight"] = _fp8((64, H), 6)
        shard2["mtp.draft_lm_head.weight_scale"] = torch.tensor(0.03, dtype=torch.float32)
        torch.save(torch.arange(64, dtype=torch.int64), root / "mtp_draft_vocab_ids.pt")
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, str(root / names[0]))
    save_file(shard2, str(root / names[1]))
    weight_map = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "hidden_size": H}))
    if readme is not None:
        (root / "README.md").write_text(readme)
    if license_file:
        (root / "LICENSE").write_text("Some license text.\n")
    listed = sorted(
        p.name for p in root.iterdir() if p.is_file() and (p.name != "README.md" or readme_listed)
    )
    vocab = None
    if draft_vocab:
        vocab = DraftVocabSection(
            size=64,
            file="mtp_draft_vocab_ids.pt",
            sha256=sha256_file(root / "mtp_draft_vocab_ids.pt"),
            head_tensor="mtp.draft_lm_head.weight",
            head_dtype="fp8",
            coverage=0.9731,
            corpus={"name": "tiny-corpus", "documents": 1200, "tokens": 345678},
        )
    manifest = Manifest(
        source=source
        if source is not None
        else {"path": None, "repo_id": "acme/Tiny-MTP", "revision": "abc123", "files": {}},
        family="qwen3_5",
        drafter=DrafterSection(prefix="mtp.", fp8_linears=list(LINEARS)),
        draft_vocab=vocab,
        quantization_error=errors
        if errors is not None
        else {
            "mtp.fc": {"rel_l2": 0.021, "max_abs": 0.004, "amax": 1.5},
            "mtp.layers.0.self_attn.q_proj": {"rel_l2": 0.035, "max_abs": 0.002, "amax": 0.9},
        },
        files={rel: sha256_file(root / rel) for rel in listed},
    )
    write_manifest(root, manifest)
    return root, manifest


class RecordingApi:
    """Stands in for HfApi at the seam and records every call with its exact arguments."""

    def __init__(self, *, private_repo: bool = True, fail: dict[str, Exception] | None = None):
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.private_repo = private_repo
        self.fail = fail or {}

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if name in self.fail:
            raise self.fail[name]

    def whoami(self, token: str | None = None) -> dict[str, Any]:
        self._record("whoami", token=token)
        return {"name": "alice", "type": "user"}

    def create_repo(self, repo_id: str, **kwargs: Any) -> str:
        self._record("create_repo", repo_id, **kwargs)
        return f"https://huggingface.co/{repo_id}"

    def repo_info(self, repo_id: str, **kwargs: Any) -> Any:
        self._record("repo_info", repo_id, **kwargs)
        return SimpleNamespace(private=self.private_repo)

    def create_branch(self, repo_id: str, **kwargs: Any) -> None:
        self._record("create_branch", repo_id, **kwargs)

    def create_commit(self, repo_id: str, operations: Any, **kwargs: Any) -> Any:
        ops = [(op.path_in_repo, op.path_or_fileobj) for op in operations]
        self._record("create_commit", repo_id, ops, **kwargs)
        pr = "https://huggingface.co/x/y/discussions/1" if kwargs.get("create_pr") else None
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/c0ffee", pr_url=pr)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]
