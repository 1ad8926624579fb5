"""Shared fixtures: isolated Hugging Face environment, tiny checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint


@pytest.fixture(autouse=True)
def _isolated_hf(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test sees the user's HF cache or token, or reaches the network."""
    from huggingface_hub import constants

    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    # huggingface_hub reads its environment once, at import: patch what it computed.
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HUGGINGFACE_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_ASSETS_CACHE", str(home / "assets"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="session")
def nvfp4_vlm_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA-style NVFP4 Qwen3.5-MoE VLM checkpoint with the mtp.fc gap, 3 shards."""
    return write_checkpoint(
        tmp_path_factory.mktemp("nvfp4_vlm_moe"),
        Spec(family="qwen3_5_moe", quant="nvfp4", vlm=True, shards=3),
    )


@pytest.fixture(scope="session")
def bf16_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BF16 Qwen3-Next checkpoint in a single model.safetensors."""
    return write_checkpoint(tmp_path_factory.mktemp("bf16_next"), Spec(family="qwen3_next"))
