"""Header-only commands never import torch (it costs over a second at start-up), and
neither does a CPU conversion of a 16-bit drafter.

Each case runs the CLI in-process in a fresh interpreter and then looks at
``sys.modules``: ``inspect``, ``quantize-mtp --dry-run``, ``fix-exclusions`` and
``verify`` read safetensors headers and JSON only (no numpy either); ``quantize-mtp`` of a BF16 drafter
on the CPU quantizes it with numpy (mtpconv.formats.fp8_table). An NVFP4 drafter is
dequantized by torch, so that conversion is the probe's check that it sees torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp

_PROBE = """
import sys
from mtpconv.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code or 0
print("EXIT", code, "TORCH", "torch" in sys.modules, "NUMPY", "numpy" in sys.modules, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("no_torch")
    src = write_checkpoint(root / "src", Spec(family="qwen3_5_moe", quant="nvfp4", shards=2))
    quantize_mtp(str(src), root / "variant", device="cpu")
    return src, root / "variant"


def _probe(args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, timeout=120
    )
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "case",
    ["inspect", "dry-run", "fix-exclusions", "verify"],
)
def test_header_only_command_imports_no_torch(
    case: str, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    src, variant = checkpoints
    args = {
        "inspect": ["inspect", str(src), "--json"],
        "dry-run": ["quantize-mtp", str(src), str(tmp_path / "v"), "--dry-run", "--json"],
        "fix-exclusions": ["fix-exclusions", str(src), str(tmp_path / "fixed")],
        "verify": ["verify", str(variant), "--json"],
    }[case]
    assert _probe(args) == "EXIT 0 TORCH False NUMPY False"  # numpy too: 0.08 s of start-up


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_a_cpu_conversion_of_a_bf16_drafter_imports_no_torch(
    device: str, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    if device == "auto" and any(map(os.path.exists, ("/proc/driver/nvidia/version", "/dev/nvidiactl"))):
        pytest.skip("a GPU driver is present: --device auto asks torch whether CUDA works")
    src, _ = checkpoints
    out = tmp_path / "v"
    quantize = ["quantize-mtp", str(src), str(out), "--device", device, "-q"]
    assert _probe(quantize) == "EXIT 0 TORCH False NUMPY True"
    assert _probe(["verify", str(out), "--json"]) == "EXIT 0 TORCH False NUMPY False"


def test_the_probe_sees_torch_when_a_command_needs_it(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", drafter_quant="nvfp4"))
    assert _probe(
        ["quantize-mtp", str(src), str(tmp_path / "v"), "--device", "cpu", "-q", "--fp8-from-4bit"]
    ) == ("EXIT 0 TORCH True NUMPY True")


def test_build_draft_vocab_from_a_corpus_imports_no_torch(tmp_path: Path) -> None:
    """The ids file is written in torch.save's format without torch (formats/torch_file)."""
    import json

    import torch

    from fixtures.tokenizers import generate_text, write_tiny_tokenizer

    src = write_tiny_tokenizer(tmp_path / "ckpt", vocab_size=512)
    (src / "config.json").write_text(json.dumps({"vocab_size": 512, "eos_token_id": 2}))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in generate_text(50, seed=1)))
    ids = tmp_path / "ids.pt"
    args = ["build-draft-vocab", str(src), "--corpus", str(corpus), "--size", "64", "-o", str(ids), "-q"]
    assert _probe(args) == "EXIT 0 TORCH False NUMPY True"
    loaded = torch.load(ids, weights_only=True)
    assert loaded.dtype == torch.int64 and loaded.numel() == 64
