"""quantize-mtp --device cuda writes the same bytes as the CPU path.

Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/test_variant_cuda.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.formats.fp8 import quantize_fp8_checked
from tests.helpers import raw_tensors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_checked_quantization_same_bytes_on_cuda(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(1024, 768, generator=g) * 0.03).to(dtype)
    cpu, cpu_err = quantize_fp8_checked(w)
    gpu, gpu_err = quantize_fp8_checked(w.cuda())
    assert torch.equal(cpu.weight.view(torch.uint8), gpu.weight.cpu().view(torch.uint8))
    assert torch.equal(cpu.scale, gpu.scale.cpu())
    assert cpu_err.max_abs == gpu_err.max_abs


@pytest.mark.parametrize(
    "spec",
    [
        Spec(family="qwen3_5_moe", quant="nvfp4", vlm=True, shards=3, hidden=256, intermediate=512),
        Spec(family="qwen3_next", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"], hidden=256),
        Spec(family="qwen3_5_moe", fused_experts=True, hidden=256),
    ],
)
def test_quantize_mtp_cuda_matches_cpu(tmp_path: Path, spec: Spec) -> None:
    src = write_checkpoint(tmp_path / "src", spec)
    quantize_mtp(str(src), tmp_path / "cpu", device="cpu", fp8_from_4bit=True)
    quantize_mtp(str(src), tmp_path / "cuda", device="cuda", fp8_from_4bit=True)
    assert raw_tensors(tmp_path / "cpu") == raw_tensors(tmp_path / "cuda")
    for shard in sorted((tmp_path / "cpu").glob("*.safetensors")):
        assert shard.read_bytes() == (tmp_path / "cuda" / shard.name).read_bytes()
