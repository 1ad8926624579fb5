"""CUDA tests: the GPU quantization path and every FP8 linear path.

Skipped where no CUDA device is present (CI). Run on the GPU machine with
``PYTHONPATH=. python -m pytest -q tests/test_kernels_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.formats.nvfp4 import dequantize_nvfp4
from mtpconv.kernels import Fp8Path, available_paths, fp8_linear, reference, triton_available
from mtpconv.kernels.linear import run_path

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = torch.device("cuda")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = [
        torch.randn(333, 517, generator=g).to(torch.bfloat16),
        (torch.randn(256, 1024, generator=g) * 1e-3).to(torch.float16),
        torch.randn(64, 96, generator=g) * 37.0,
        torch.randn(5, 48, 80, generator=g).to(torch.bfloat16),
        torch.zeros(16, 32, dtype=torch.bfloat16),
    ]
    spread = torch.randn(128, 512, generator=g) * torch.logspace(-30, 30, 512)
    out.append(spread)  # values from subnormal-after-scaling to the max
    mixed = torch.randn(3, 64, 64, generator=g)
    mixed[1] = 0.0  # one all-zero expert
    out.append(mixed)
    return out


@pytest.mark.parametrize("index", range(7))
def test_quantize_fp8_cuda_bytes_identical_to_cpu(index: int) -> None:
    w = _weights()[index]
    cpu = quantize_fp8(w)
    gpu = quantize_fp8(w.to(DEV))
    assert gpu.weight.device.type == "cuda"
    assert _same_bytes(cpu.weight, gpu.weight)
    assert _same_bytes(cpu.scale, gpu.scale)


def test_nvfp4_to_fp8_cuda_bytes_identical_to_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    out_f, in_f = 192, 256
    packed = torch.randint(0, 256, (out_f, in_f // 2), generator=g, dtype=torch.uint8)
    block = (torch.rand(out_f, in_f // 16, generator=g) * 400 + 1).to(torch.float8_e4m3fn)
    s2 = torch.tensor(3.5e-4)
    cpu_deq = dequantize_nvfp4(packed, block, s2)
    gpu_deq = dequantize_nvfp4(packed.to(DEV), block.to(DEV), s2.to(DEV))
    assert _same_bytes(cpu_deq, gpu_deq)
    cpu, gpu = quantize_fp8(cpu_deq), quantize_fp8(gpu_deq)
    assert _same_bytes(cpu.weight, gpu.weight)
    assert _same_bytes(cpu.scale, gpu.scale)


def _case(m: int, n: int, k: int, per_row: bool, bias: bool):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV)
    q = quantize_fp8(torch.randn(n, k, generator=g) * 0.05)
    scale = (torch.rand(n, generator=g) * 1e-3 + 1e-4) if per_row else q.scale
    b = torch.randn(n, generator=g).to(torch.bfloat16).to(DEV) if bias else None
    return x, q.weight.to(DEV), scale.to(DEV), b


SHAPES = [(1, 512, 1024), (3, 384, 2048), (16, 1024, 512), (64, 640, 1536), (130, 256, 512)]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("per_row", [False, True])
def test_every_path_matches_reference(m: int, n: int, k: int, per_row: bool) -> None:
    x, w, s, b = _case(m, n, k, per_row, bias=per_row)
    ref = x.double() @ (w.double() * s.double().reshape(-1, 1)).t()
    if b is not None:
        ref = ref + b.double()
    in_scale = x.float().abs().amax() / 448.0
    for path in available_paths(DEV, static_scale=True):
        if path is Fp8Path.SCALED_MM_STATIC and per_row:
            continue
        y = run_path(path, x, w, s, b, input_scale=in_scale)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16, path
        # Weight-only paths see only bf16 output rounding; W8A8 paths add FP8
        # activation rounding (about 2**-4 relative per element).
        tol = 1e-2 if path in (Fp8Path.WO_TRITON, Fp8Path.DEQUANT) else 6e-2
        assert _rel(y, ref) < tol, (path, _rel(y, ref))


def test_triton_gemv_and_dot_agree_for_few_tokens() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_fp8

    x, w, s, _ = _case(4, 4096, 2048, per_row=False, bias=False)
    a = triton_fp8.wo_linear(x, w, s, gemv=True)
    c = triton_fp8.wo_linear(x, w, s, gemv=False)
    assert _rel(a, c) < 1e-2


def test_triton_per_token_quant_matches_torch() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_fp8

    x = (torch.randn(37, 5120, device=DEV) * 3).to(torch.bfloat16)
    q, s = triton_fp8.quant_per_token(x)
    q_ref, s_ref = reference.quant_per_token(x)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    # Triton's float32 division may differ from torch's in the last bit, which
    # can flip a rounding tie: allow a tiny fraction of one-step differences.
    differ = (q.float() != q_ref.float()).float().mean().item()
    assert differ < 1e-3
    assert _rel(q.float() * s, x.float()) < 0.05


def test_fused_per_tensor_quant_matches_torch_and_resets() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_fp8

    # Several sizes (one program .. every SM) and repeated launches: the grid
    # barrier must reset itself between launches.
    sizes = [(1, 64), (1, 10240), (16, 5120), (64, 17408), (3, 1000), (32, 10240), (1, 64)]
    for m, k in sizes:
        x = (torch.randn(m, k, device=DEV) * (m + 1)).to(torch.bfloat16)
        q, s = triton_fp8.quant_per_tensor(x)
        q_ref, s_ref = reference.quant_per_tensor(x)
        torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
        assert (q.float() != q_ref.float()).float().mean().item() < 1e-3, (m, k)


def test_default_path_is_fused_scaled_mm_on_fp8_gpus() -> None:
    from mtpconv.kernels import select_path

    if torch.cuda.get_device_capability() < (8, 9) or not triton_available():
        pytest.skip("needs sm_89+ and triton")
    assert select_path(DEV, 1) is Fp8Path.SCALED_MM_FUSED
    assert select_path(DEV, 64) is Fp8Path.SCALED_MM_FUSED
    assert select_path(DEV, 1, per_row_scale=True) is Fp8Path.WO_TRITON


def test_fp8_linear_is_cuda_graph_capturable() -> None:
    x, w, s, b = _case(4, 2048, 1024, per_row=False, bias=True)
    eager = fp8_linear(x, w, s, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fp8_linear(x, w, s, b)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fp8_linear(x, w, s, b))
    assert not torch.equal(captured, eager)
