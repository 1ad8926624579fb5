"""CPU tests for mtpconv.kernels: fallbacks, selection, and the Triton kernels' logic.

The Triton kernels run here under Triton's interpreter (TRITON_INTERPRET=1, set
in a subprocess so the rest of the test session keeps compiled Triton). The
interpreter's bf16 ``tl.dot`` and its float->fp8 rounding are wrong (seen with
triton 3.9), so the interpreted checks use fp16 for the tensor-core path and
leave the activation-quantization kernels to tests/kernels/test_linear_cuda.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_linear, reference, tuning
from mtpconv.kernels.linear import (
    Call,
    Dequant,
    ScaledMmFused,
    ScaledMmTensor,
    ScaledMmToken,
    ScaledMmTokenTorch,
    ScaleLayout,
    SkinnyToken,
    WoSkinny,
    WoTriton,
    choose_kernel,
    kernel_named,
    usable,
)
from tests.helpers import rel_error

CPU = torch.device("cpu")


def _case(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    q = quantize_fp8(torch.randn(n, k, generator=g))
    return x, q.weight, q.scale


def test_dequant_linear_matches_float64_reference() -> None:
    x, w, s = _case(5, 24, 48)
    bias = torch.randn(24).to(torch.bfloat16)
    y = reference.dequant_linear(x, w, s, bias)
    ref = x.double() @ (w.double() * s.double()).t() + bias.double()
    assert y.dtype == torch.bfloat16
    assert rel_error(y, ref) < 1e-2


def test_per_row_scale_equals_per_tensor_when_uniform() -> None:
    x, w, s = _case(3, 16, 32)
    rows = s.expand(16).clone()
    assert torch.equal(reference.dequant_linear(x, w, s), reference.dequant_linear(x, w, rows))


def _pick(tokens: int, scale: ScaleLayout = ScaleLayout.TENSOR, shape: tuple[int, int] = (256, 512)):
    return choose_kernel(torch.device("cuda", 0), Call(tokens, *shape, scale))


def _gpu(monkeypatch: pytest.MonkeyPatch, cap: tuple[int, int] = (9, 0), triton: bool = True) -> None:
    """choose_kernel on ``cuda:0`` as a GPU of capability ``cap`` (with or without Triton) sees it,
    with the fallback table (no CUDA needed)."""
    from mtpconv.kernels import linear

    monkeypatch.delenv(linear.DISABLED_ENV, raising=False)
    monkeypatch.setattr(linear, "_capability", lambda index: cap)
    monkeypatch.setattr(linear, "triton_available", lambda: triton)
    monkeypatch.setattr(tuning, "_device_name", lambda index: "NVIDIA H200")


def test_fp8_linear_on_cpu_uses_dequant_and_keeps_leading_dims() -> None:
    x, w, s = _case(6, 8, 32)
    x3 = x.reshape(2, 3, 32)
    assert choose_kernel(CPU, Call(6, 8, 32, ScaleLayout.TENSOR)) is Dequant
    y = fp8_linear(x3, w, s)
    assert y.shape == (2, 3, 8)
    assert torch.equal(y.reshape(6, 8), reference.dequant_linear(x, w, s))


def test_fp8_linear_rejects_bad_inputs() -> None:
    x, w, s = _case(2, 8, 32)
    with pytest.raises(TypeError):
        fp8_linear(x, w.to(torch.bfloat16), s)
    with pytest.raises(ValueError, match="shapes"):
        fp8_linear(x[:, :16], w, s)
    with pytest.raises(ValueError, match="w_scale"):
        fp8_linear(x, w, torch.ones(3))


def test_only_dequant_runs_on_cpu() -> None:
    assert usable(CPU, ScaleLayout.TENSOR) == [Dequant]


def test_a_named_kernel_is_run_or_refused() -> None:
    x, w, s = _case(2, 8, 32)
    assert torch.equal(fp8_linear(x, w, s, kernel=Dequant), reference.dequant_linear(x, w, s))
    with pytest.raises(ValueError, match="wo_triton does not run tensor scales on cpu"):
        fp8_linear(x, w, s, kernel=WoTriton)
    assert kernel_named("wo_skinny") is WoSkinny
    with pytest.raises(ValueError, match="no FP8 linear kernel 'fast'"):
        kernel_named("fast")


def test_selection_rules_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    for cap, triton, scale, tokens, want in [
        ((9, 0), True, ScaleLayout.TENSOR, 1, WoSkinny),
        ((9, 0), True, ScaleLayout.TENSOR, 16, WoSkinny),
        ((9, 0), True, ScaleLayout.TENSOR, 17, ScaledMmFused),
        ((9, 0), True, ScaleLayout.TENSOR, 64, ScaledMmFused),
        ((9, 0), True, ScaleLayout.ROW, 1, WoSkinny),
        ((9, 0), True, ScaleLayout.ROW, 16, WoSkinny),
        ((9, 0), True, ScaleLayout.ROW, 17, ScaledMmToken),
        ((9, 0), False, ScaleLayout.TENSOR, 4, ScaledMmTensor),
        ((9, 0), False, ScaleLayout.ROW, 4, ScaledMmTokenTorch),
        ((8, 0), True, ScaleLayout.TENSOR, 4, WoTriton),
        ((8, 0), False, ScaleLayout.TENSOR, 4, Dequant),
    ]:
        _gpu(monkeypatch, cap, triton)
        got = _pick(tokens, scale)
        assert got is want, (cap, triton, scale, tokens, got)
        assert got in usable(torch.device("cuda", 0), scale)


def test_a_disabled_kernel_leaves_the_call_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MTPCONV_DISABLED_KERNELS`` takes kernels out of the choice; the next in KERNELS' order
    that takes the call runs; an unknown name is refused naming the setting."""
    from mtpconv.kernels import linear

    _gpu(monkeypatch)
    qkv = (14336, 5120)  # Qwen3.5-27B: skinny_token at 2-16 tokens
    assert _pick(4, shape=qkv) is SkinnyToken
    monkeypatch.setenv(linear.DISABLED_ENV, "skinny_token")
    assert _pick(4, shape=qkv) is ScaledMmFused  # also a scaled_mm_fused shape
    monkeypatch.setenv(linear.DISABLED_ENV, "skinny_token, scaled_mm_fused")
    assert _pick(4, shape=qkv) is WoSkinny and _pick(64) is ScaledMmToken
    monkeypatch.setenv(linear.DISABLED_ENV, "dequant")
    with pytest.raises(ValueError, match="no FP8 linear kernel left"):
        choose_kernel(CPU, Call(4, 8, 32, ScaleLayout.TENSOR))
    monkeypatch.setenv(linear.DISABLED_ENV, "wo_skiny")
    with pytest.raises(ValueError, match="MTPCONV_DISABLED_KERNELS: no FP8 linear kernel 'wo_skiny'"):
        _pick(4)


def test_measured_shapes_take_their_measured_kernel_at_two_to_sixteen_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gpu(monkeypatch)
    table = tuning.load("NVIDIA H200")
    qkv, down = (14336, 5120), (5120, 17408)  # Qwen3.5-27B
    shared_gate_up, other = (2048, 4096), (777, 333)  # Qwen3.5-397B's; not measured
    tensor, row = ScaleLayout.TENSOR, ScaleLayout.ROW
    for tokens, shape, scale, want in [
        (0, qkv, tensor, WoSkinny),  # no rows: the skinny GEMM, as for any shape
        (1, qkv, tensor, WoSkinny),  # one token: the GEMV everywhere
        (2, qkv, tensor, SkinnyToken),
        (4, qkv, tensor, SkinnyToken),
        (16, qkv, tensor, SkinnyToken),
        (4, qkv, row, SkinnyToken),  # per-row scales (fused shards) too
        (4, down, tensor, SkinnyToken),
        (16, down, row, SkinnyToken),
        (4, shared_gate_up, tensor, WoSkinny),  # the quantization's launch cost more
        (16, shared_gate_up, tensor, SkinnyToken),
        (4, other, tensor, WoSkinny),
        (17, down, tensor, ScaledMmFused),
    ]:
        got = _pick(tokens, scale, shape)
        assert got is want, (tokens, shape, scale, got)
    assert _pick(4, ScaleLayout.BLOCK, qkv) is WoSkinny
    for bucket, n, k in table.skinny_token:  # every entry is reachable from its bucket
        assert _pick(bucket, shape=(n, k)) is SkinnyToken
    # cuBLAS's measured shapes all run better on per-token rows now
    assert table.scaled_mm_fused <= table.skinny_token


def test_block_scales_select_skinny_or_dequant(monkeypatch: pytest.MonkeyPatch) -> None:
    for triton, want in ((True, WoSkinny), (False, Dequant)):
        _gpu(monkeypatch, triton=triton)
        for tokens in (1, 64):
            assert _pick(tokens, ScaleLayout.BLOCK) is want
        assert want in usable(torch.device("cuda", 0), ScaleLayout.BLOCK)


def test_block_scale_reference_and_validation() -> None:
    g = torch.Generator().manual_seed(1)
    n, k = 200, 300  # partial blocks on both sides
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    w = quantize_fp8(torch.randn(n, k, generator=g)).weight
    blocks = torch.rand(2, 3, generator=g) + 0.5
    full = blocks.double()[torch.arange(n) // 128][:, torch.arange(k) // 128]
    ref = x.double() @ (w.double() * full).t()
    assert rel_error(fp8_linear(x, w, blocks), ref) < 1e-2
    assert reference.is_block_scale(blocks, n, k) and not reference.is_block_scale(torch.ones(n, 1), n, k)
    with pytest.raises(ValueError, match="128x128"):
        fp8_linear(x, w, torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not run block scales"):
        fp8_linear(x, w, blocks, kernel=ScaledMmTensor)


def test_per_token_rows_split_only_while_every_program_has_an_sm() -> None:
    tq = pytest.importorskip("mtpconv.kernels.triton_quant")
    assert tq.TOKEN_CHUNK == 8192
    assert tq.token_parts(4, 17408, 132) == 4 and tq.token_parts(16, 34816, 132) == 8
    assert tq.token_parts(64, 34816, 132) == 2  # 64 x 8 would not fit: 64 x 2
    assert tq.token_parts(16, 8192, 132) == 1 and tq.token_parts(1, 8193, 132) == 2
    assert tq.token_parts(200, 10240, 132) == 1


def test_agreement_state_is_kept_per_user_and_grows_without_reset() -> None:
    tq = pytest.importorskip("mtpconv.kernels.triton_quant")
    cpu = torch.device("cpu")
    slots, counts = tq.agreement_state(cpu, "test-token", 4, 64)
    assert slots.shape == (256,) and counts.shape == (64,) and counts.dtype == torch.int64
    counts += 12  # what launches leave behind: the counters only grow
    assert tq.agreement_state(cpu, "test-token", 4, 10)[1] is counts  # fits: the same pair
    assert tq.agreement_state(cpu, "test-tensor", 4, 1)[1] is not counts  # another user's own
    grown = tq.agreement_state(cpu, "test-token", 4, 70)
    assert grown[1].numel() == 70 and int(grown[1].sum()) == 0
    assert any(old[1] is counts for old in tq._AGREEMENT_KEEP)  # a captured graph may still use it


def test_reference_activation_quantizers_round_trip() -> None:
    x = torch.randn(4, 64).to(torch.bfloat16)
    q, s = reference.quant_per_token(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 1)
    assert float(q.float().abs().max()) == 448.0
    assert rel_error(q.float() * s, x.float()) < 0.05
    qt, st = reference.quant_per_tensor(x)
    assert st.dim() == 0 and rel_error(qt.float() * st, x.float()) < 0.05


def test_kernel_package_imports_without_triton_or_vllm() -> None:
    code = textwrap.dedent(
        """
        import sys
        import mtpconv.kernels
        assert "triton" not in sys.modules, "triton imported at import time"
        assert "vllm" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


_INTERPRETED = textwrap.dedent(
    """
    import torch
    from mtpconv.formats.fp8 import quantize_fp8
    from mtpconv.kernels import reference, triton_fp8 as tk, triton_skinny as ts

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    g = torch.Generator().manual_seed(0)
    for m, n, k, dtype, gemv in [
        (1, 48, 64, torch.bfloat16, True),
        (2, 20, 1000, torch.bfloat16, True),
        (3, 40, 96, torch.float16, False),
        (17, 32, 272, torch.float16, False),
    ]:
        x = torch.randn(m, k, generator=g).to(dtype)
        q = quantize_fp8(torch.randn(n, k, generator=g))
        rows = torch.rand(n, generator=g) + 0.5
        bias = torch.randn(n, generator=g).to(dtype)
        for scale, b in ((q.scale, None), (rows, bias)):
            y = tk.wo_linear(x, q.weight, scale, b, gemv=gemv)
            ref = reference.dequant_linear(x, q.weight, scale, b)
            assert y.shape == (m, n) and y.dtype == dtype
            assert rel(y, ref) < 1e-2, (m, n, k, dtype, gemv, rel(y, ref))

    # skinny GEMM: one-token FMA (bf16) and fp16 tl.dot, with and without split-K,
    # every scale layout
    for m, n, k, dtype, progs in [(1, 48, 256, torch.bfloat16, 1), (1, 40, 1000, torch.bfloat16, 64),
                                  (3, 40, 300, torch.float16, 64), (17, 32, 272, torch.float16, 1)]:
        x = torch.randn(m, k, generator=g).to(dtype)
        q = quantize_fp8(torch.randn(n, k, generator=g))
        rows = torch.rand(n, generator=g) + 0.5
        blocks = torch.rand(-(-n // 128), -(-k // 128), generator=g) + 0.5
        bias = torch.randn(n, generator=g).to(dtype)
        for scale, b in ((q.scale, None), (rows, bias), (blocks, bias)):
            y = ts.skinny_linear(x, q.weight, scale, b, config=ts.Config(m > 1, 16, 64, 4, 2, progs))
            assert rel(y, reference.dequant_linear(x, q.weight, scale, b)) < 1e-2, (m, n, k, progs)
    # FP8 rows prepared before the launch (x_scale), with and without split-K
    for m, n, k, progs in [(3, 40, 300, 64), (17, 32, 272, 1)]:
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        xq, xs = reference.quant_per_token(x)
        q = quantize_fp8(torch.randn(n, k, generator=g))
        rows = torch.rand(n, generator=g) + 0.5
        blocks = torch.rand(-(-n // 128), -(-k // 128), generator=g) + 0.5
        for scale in (q.scale, rows, blocks):
            cfg = ts.Config(True, 16, 64, 4, 2, progs, ts.MMA_PREPARED)
            y = ts.skinny_linear(xq, q.weight, scale, config=cfg, x_scale=xs, out_dtype=torch.bfloat16)
            ref = reference.dequant_linear(xq.float() * xs, q.weight, scale)
            assert rel(y, ref) < 1e-2, (m, n, k, progs)
    print("interpreted kernels ok")
    """
)


def test_triton_weight_only_kernels_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreted kernels ok" in done.stdout


def test_tuned_27b_o_loads_its_first_tile_ahead() -> None:
    """The one tuned shape that takes ``first_ahead`` (its tuning entry's first_ahead) gets it; others not."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny as ts

    assert ts.default_config(1, 5120, 6144, 132).first_ahead == 1
    assert ts.default_config(1, 5120, 10240, 132).first_ahead == 0
    assert ts.default_config(4, 5120, 6144, 132).first_ahead == 0


def test_a_replaced_table_is_what_every_launch_reads() -> None:
    """``tuning.replaced`` puts a benchmark's candidate entries in place of the device's table
    for the launches inside it, and only there."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny as ts

    table = tuning.for_device()
    candidate = tuning.Entry(False, 2, 1024, 4, 3, 4, 0, False, True, first_ahead=1)
    swapped = dataclasses.replace(table, skinny={**table.skinny, (1, 4096, 8192): candidate})
    before = ts.default_config(1, 4096, 8192, 132)
    with tuning.replaced(swapped):
        got = ts.default_config(1, 4096, 8192, 132)
        assert tuning.for_device(torch.device("cuda", 3)) is swapped
    assert (got.block_n, got.block_k, got.warps, got.first_ahead, got.programs) == (2, 1024, 4, 1, 4 * 132)
    assert got.narrow and not got.dot and got != before
    assert ts.default_config(1, 4096, 8192, 132) == before  # the table again
