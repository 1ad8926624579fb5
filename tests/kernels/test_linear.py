"""CPU tests for mtpconv.kernels: fallbacks, selection, and the Triton kernels' logic.

The Triton kernels run here under Triton's interpreter (TRITON_INTERPRET=1, set
in a subprocess so the rest of the test session keeps compiled Triton). The
interpreter's bf16 ``tl.dot`` and its float->fp8 rounding are wrong (seen with
triton 3.9), so the interpreted checks use fp16 for the tensor-core path and
leave the activation-quantization kernels to tests/kernels/test_linear_cuda.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import Fp8Path, available_paths, fp8_linear, reference, select_path
from mtpconv.kernels.linear import run_path

CPU = torch.device("cpu")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


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
    assert _rel(y, ref) < 1e-2


def test_per_row_scale_equals_per_tensor_when_uniform() -> None:
    x, w, s = _case(3, 16, 32)
    rows = s.expand(16).clone()
    assert torch.equal(reference.dequant_linear(x, w, s), reference.dequant_linear(x, w, rows))


def test_fp8_linear_on_cpu_uses_dequant_and_keeps_leading_dims() -> None:
    x, w, s = _case(6, 8, 32)
    x3 = x.reshape(2, 3, 32)
    assert select_path(CPU, 6) is Fp8Path.DEQUANT
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


def test_available_paths_on_cpu_is_only_dequant() -> None:
    assert available_paths(CPU) == [Fp8Path.DEQUANT]


def test_forced_path_is_honoured_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTPCONV_FP8_PATH", "dequant")
    assert select_path(CPU, 1) is Fp8Path.DEQUANT
    monkeypatch.setenv("MTPCONV_FP8_PATH", "wo_triton")
    with pytest.raises(ValueError, match="cannot run"):
        select_path(CPU, 1)


def test_selection_rules_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtpconv.kernels import linear

    gpu = torch.device("cuda", 0)
    monkeypatch.delenv("MTPCONV_FP8_PATH", raising=False)
    for cap, triton, per_row, tokens, want in [
        ((9, 0), True, False, 1, Fp8Path.WO_SKINNY),
        ((9, 0), True, False, 16, Fp8Path.WO_SKINNY),
        ((9, 0), True, False, 17, Fp8Path.SCALED_MM_FUSED),
        ((9, 0), True, False, 64, Fp8Path.SCALED_MM_FUSED),
        ((9, 0), True, True, 1, Fp8Path.WO_SKINNY),
        ((9, 0), True, True, 16, Fp8Path.WO_SKINNY),
        ((9, 0), True, True, 17, Fp8Path.SCALED_MM_TOKEN),
        ((9, 0), False, False, 4, Fp8Path.SCALED_MM_TENSOR),
        ((9, 0), False, True, 4, Fp8Path.SCALED_MM_TOKEN_TORCH),
        ((8, 0), True, False, 4, Fp8Path.WO_TRITON),
        ((8, 0), False, False, 4, Fp8Path.DEQUANT),
    ]:
        monkeypatch.setattr(linear, "_capability", lambda index, cap=cap: cap)
        monkeypatch.setattr(linear, "triton_available", lambda triton=triton: triton)
        got = select_path(gpu, tokens, per_row_scale=per_row)
        assert got is want, (cap, triton, per_row, tokens, got)
        assert got in available_paths(gpu)


def test_measured_shapes_take_their_measured_path_at_two_to_sixteen_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtpconv.kernels import linear
    from mtpconv.kernels.skinny_tuned import SELF_PREPARED

    gpu = torch.device("cuda", 0)
    monkeypatch.delenv("MTPCONV_FP8_PATH", raising=False)
    monkeypatch.setattr(linear, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(linear, "triton_available", lambda: True)
    qkv, down = (14336, 5120), (5120, 17408)  # Qwen3.5-27B
    shared_gate_up, other = (2048, 4096), (777, 333)  # Qwen3.5-397B's; not measured
    for tokens, shape, per_row, want in [
        (0, qkv, False, Fp8Path.WO_SKINNY),  # no rows: the skinny GEMM, as for any shape
        (1, qkv, False, Fp8Path.WO_SKINNY),  # one token: the GEMV everywhere
        (2, qkv, False, Fp8Path.SKINNY_TOKEN),
        (4, qkv, False, Fp8Path.SKINNY_TOKEN),
        (16, qkv, False, Fp8Path.SKINNY_TOKEN),
        (4, qkv, True, Fp8Path.SKINNY_TOKEN),  # per-row scales (fused shards) too
        (4, down, False, Fp8Path.SKINNY_TOKEN),
        (16, down, True, Fp8Path.SKINNY_TOKEN),
        (4, shared_gate_up, False, Fp8Path.WO_SKINNY),  # the quantization's launch cost more
        (16, shared_gate_up, False, Fp8Path.SKINNY_TOKEN),
        (4, other, False, Fp8Path.WO_SKINNY),
        (17, down, False, Fp8Path.SCALED_MM_FUSED),
    ]:
        got = select_path(gpu, tokens, per_row_scale=per_row, shape=shape)
        assert got is want, (tokens, shape, per_row, got)
        assert got in available_paths(gpu)
    assert select_path(gpu, 4, shape=qkv, block_scale=True) is Fp8Path.WO_SKINNY
    for bucket, n, k in SELF_PREPARED:  # every entry is reachable from its bucket
        assert select_path(gpu, bucket, shape=(n, k)) is Fp8Path.SKINNY_TOKEN
    # cuBLAS's measured shapes all run better on per-token rows now
    assert linear.SCALED_MM_SHAPES <= SELF_PREPARED


def test_block_scales_select_skinny_or_dequant(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtpconv.kernels import linear

    gpu = torch.device("cuda", 0)
    monkeypatch.delenv("MTPCONV_FP8_PATH", raising=False)
    monkeypatch.setattr(linear, "_capability", lambda index: (9, 0))
    for triton, want in ((True, Fp8Path.WO_SKINNY), (False, Fp8Path.DEQUANT)):
        monkeypatch.setattr(linear, "triton_available", lambda triton=triton: triton)
        for tokens in (1, 64):
            assert select_path(gpu, tokens, block_scale=True) is want
        assert available_paths(gpu, block_scale=True)[-1] is want


def test_block_scale_reference_and_validation() -> None:
    g = torch.Generator().manual_seed(1)
    n, k = 200, 300  # partial blocks on both sides
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    w = quantize_fp8(torch.randn(n, k, generator=g)).weight
    blocks = torch.rand(2, 3, generator=g) + 0.5
    full = blocks.double()[torch.arange(n) // 128][:, torch.arange(k) // 128]
    ref = x.double() @ (w.double() * full).t()
    assert _rel(fp8_linear(x, w, blocks), ref) < 1e-2
    assert reference.is_block_scale(blocks, n, k) and not reference.is_block_scale(torch.ones(n, 1), n, k)
    with pytest.raises(ValueError, match="128x128"):
        fp8_linear(x, w, torch.ones(3, 3))
    with pytest.raises(ValueError, match="block"):
        run_path(Fp8Path.SCALED_MM_TENSOR, x, w, blocks)


def test_fp8_rows_prepared_by_their_producer_on_cpu() -> None:
    """``x_scale``: FP8 rows with one scale each give the product of the dequantized rows
    (the reference without CUDA), in ``out_dtype``, any leading dims; what does not fit is
    refused."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, 96, generator=g) * torch.logspace(-3, 4, 3)[:, None]).to(torch.bfloat16)
    q, s = reference.quant_per_token(x.reshape(-1, 96))
    w = quantize_fp8(torch.randn(40, 96, generator=g))
    rows = torch.rand(40, generator=g) + 0.5
    bias = torch.randn(40, generator=g).to(torch.bfloat16)
    deq = (q.double() * s.double()).reshape(2, 3, 96)
    for scale, b in ((w.scale, None), (rows, bias)):
        y = fp8_linear(q.reshape(2, 3, 96), w.weight, scale, b, x_scale=s, out_dtype=torch.bfloat16)
        ref = deq @ (w.weight.double() * scale.double().reshape(-1, 1)).t()
        ref = ref if b is None else ref + b.double()
        assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
        assert _rel(y, ref) < 1e-2
    with pytest.raises(TypeError, match="float8_e4m3fn rows"):
        fp8_linear(x, w.weight, w.scale, x_scale=s, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype"):
        fp8_linear(q, w.weight, w.scale, x_scale=s)
    with pytest.raises(ValueError, match="0-d or one scale per row"):
        fp8_linear(q, w.weight, w.scale, x_scale=s[:2], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="neither a path"):
        fp8_linear(q, w.weight, w.scale, x_scale=s, out_dtype=torch.bfloat16, path=Fp8Path.DEQUANT)


def test_prepared_rows_only_where_measured_faster() -> None:
    from mtpconv.kernels import Prepared, takes_prepared

    assert takes_prepared(4, 5120, 10240) is Prepared.TOKEN  # 27B fc
    assert takes_prepared(16, 5120, 17408) is Prepared.TOKEN  # 27B down
    assert takes_prepared(2, 5120, 6144) is Prepared.TOKEN  # 2-4 tokens: the 4-token measurement
    # 27B gate_up: the unsplit skinny GEMM on per-token rows beat cuBLAS on per-tensor ones
    assert takes_prepared(4, 34816, 5120) is Prepared.TOKEN
    assert takes_prepared(1, 5120, 10240) is None  # one token: the weight-only GEMV
    assert takes_prepared(1, 34816, 5120) is None
    assert takes_prepared(17, 5120, 10240) is None and takes_prepared(4, 777, 333) is None


def test_fp8_rows_with_one_scale_for_the_tensor_on_cpu() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    q, s = reference.quant_per_tensor(x)
    w = quantize_fp8(torch.randn(24, 64, generator=g))
    y = fp8_linear(q, w.weight, w.scale, x_scale=s, out_dtype=torch.float16)
    ref = (q.double() * s.double()) @ (w.weight.double() * w.scale.double()).t()
    assert y.dtype == torch.float16 and _rel(y, ref) < 1e-2


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
    assert any(t is counts for t in tq._AGREEMENT_KEEP)  # a captured graph may still use the old


def test_static_path_needs_input_scale() -> None:
    x, w, s = _case(2, 16, 32)
    with pytest.raises(ValueError, match="input_scale"):
        run_path(Fp8Path.SCALED_MM_STATIC, x, w, s)


def test_reference_activation_quantizers_round_trip() -> None:
    x = torch.randn(4, 64).to(torch.bfloat16)
    q, s = reference.quant_per_token(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 1)
    assert float(q.float().abs().max()) == 448.0
    assert _rel(q.float() * s, x.float()) < 0.05
    qt, st = reference.quant_per_tensor(x)
    assert st.dim() == 0 and _rel(qt.float() * st, x.float()) < 0.05
    qs = reference.quant_static(x, st)
    assert torch.equal(qs.float(), qt.float())


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
    from mtpconv.kernels import reference, triton_fp8 as tk

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

    e, n, k, t, top = 6, 24, 64, 3, 2
    q = quantize_fp8(torch.randn(e, n, k, generator=g))
    deq = q.weight.double() * q.scale.double()[:, None, None]
    x = torch.randn(t, k, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, e, (t, top), generator=g)
    flat = ids.reshape(-1)
    out = tk.wo_moe(x, q.weight, q.scale, ids, x_per_pair=False)
    ref = torch.stack([x[p // top].double() @ deq[flat[p]].t() for p in range(t * top)])
    assert rel(out, ref) < 1e-2
    xp = torch.randn(t * top, k, generator=g).to(torch.bfloat16)
    out = tk.wo_moe(xp, q.weight, q.scale, ids, x_per_pair=True)
    ref = torch.stack([xp[p].double() @ deq[flat[p]].t() for p in range(t * top)])
    assert rel(out, ref) < 1e-2
    from mtpconv.kernels import triton_moe as tm, triton_skinny as ts

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
    # FP8 rows prepared before the launch (x_scale), with and without split-K; the producers
    # quantize as quant_per_token does (the interpreter truncates casts: compared with itself)
    from mtpconv.kernels import triton_quant as tq
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
        a = x[:, : k // 2]
        qc, sc = tq.quant_cat(a, x[:, k // 2 :])
        qp, sp = tq.quant_per_token(x)
        assert torch.equal(sc, sp) and torch.equal(qc.view(torch.uint8), qp.view(torch.uint8))
    # grouped experts (fp16 tl.dot), SiLU * up fused and routing weights
    q = quantize_fp8(torch.randn(e, n, k, generator=g))
    deq = q.weight.double() * q.scale.double()[:, None, None]
    ids = torch.stack([torch.randperm(e, generator=g)[:top] for _ in range(t)])
    flat = ids.reshape(-1)
    x = torch.randn(t, k, generator=g).to(torch.float16)
    out = tm.moe_grouped(x, q.weight, q.scale, ids, x_per_pair=False, config=(16, 32, 4, 2, True))
    assert rel(out, torch.stack([x[p // top].double() @ deq[flat[p]].t() for p in range(t * top)])) < 1e-2
    xp = torch.randn(t * top, 2 * k, generator=g).to(torch.float16)
    rw = torch.rand(t, top, generator=g).to(torch.float16)
    out = tm.moe_grouped(xp, q.weight, q.scale, ids, x_per_pair=True, act=True, route_w=rw,
                         config=(16, 32, 4, 2, True))
    act = torch.nn.functional.silu(xp[:, :k].double()) * xp[:, k:].double()
    ref = torch.stack([act[p] @ deq[flat[p]].t() * rw.reshape(-1)[p].double() for p in range(t * top)])
    assert rel(out, ref) < 1e-2
    # one token (the narrow-load FMA): each pair serves itself, bit for bit what the routing
    # checks of 2+ tokens give (MTPCONV_MOE_PAIR_CHECKS=1)
    import os
    x1 = torch.randn(1, 1024, generator=g).to(torch.bfloat16)
    q = quantize_fp8(torch.randn(e, n, 1024, generator=g))
    deq = q.weight.double() * q.scale.double()[:, None, None]
    ids1 = torch.randperm(e, generator=g)[:top].reshape(1, top)
    y = torch.stack([x1[0].double() @ deq[i].t() for i in ids1[0]])
    for glu, cfg in [(glu, cfg) for glu in (False, True) for cfg in ((8, 512, 2), (64, 128, 4))]:
        def one(glu=glu, cfg=cfg):
            return tm.moe_grouped(x1, q.weight, q.scale, ids1, x_per_pair=False, glu=glu,
                                  config=(*cfg, 3, tm.FMA_NARROW))
        out = one()
        ref = torch.nn.functional.silu(y[:, : n // 2]) * y[:, n // 2 :] if glu else y
        assert rel(out, ref) < 1e-2, (glu, cfg)
        os.environ[tm.PAIR_CHECKS_ENV] = "1"
        checked = one()
        del os.environ[tm.PAIR_CHECKS_ENV]
        assert torch.equal(out, checked), (glu, cfg)
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
    """The one tuned shape that takes ``first_ahead`` (skinny_tuned.FIRST_AHEAD) gets it; others not."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny as ts

    assert ts.default_config(1, 5120, 6144, 132).first_ahead == 1
    assert ts.default_config(1, 5120, 10240, 132).first_ahead == 0
    assert ts.default_config(4, 5120, 6144, 132).first_ahead == 0


def test_gemv_one_token_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """MTPCONV_GEMV_ONE_TOKEN replaces a one-token entry of the table for the shape it names,
    and only there; a malformed entry is refused naming the setting."""
    pytest.importorskip("triton")
    from mtpconv.kernels import skinny_tuned
    from mtpconv.kernels import triton_skinny as ts

    table = ts.default_config(1, 4096, 8192, 132)
    monkeypatch.setenv(skinny_tuned.ONE_TOKEN_ENV, "4096x8192:2x1024x4x1; 32768x4096:2x1024x4x2x12")
    swapped = ts.default_config(1, 4096, 8192, 132)
    assert (swapped.block_n, swapped.block_k, swapped.warps, swapped.first_ahead) == (2, 1024, 4, 1)
    assert swapped.narrow and not swapped.dot and swapped.programs == 4 * 132 and swapped != table
    head = ts.default_config(1, 32768, 4096, 132)
    assert (head.block_n, head.first_ahead, head.programs) == (2, 2, 12 * 132)
    assert ts.default_config(4, 4096, 8192, 132) == ts._tabled(skinny_tuned.TUNED[(4, 4096, 8192)], 132)
    assert ts.default_config(1, 5120, 6144, 132).first_ahead == 1  # not named: the table's
    for bad in ("4096x8192:2x1024", "4096:2x1024x4", "4096x8192:0x1024x4", "4096x8192:2x1024x4x1x4x9"):
        monkeypatch.setenv(skinny_tuned.ONE_TOKEN_ENV, bad)
        with pytest.raises(ValueError, match=f"MTPCONV_GEMV_ONE_TOKEN: '{bad}'"):
            ts.default_config(1, 4096, 8192, 132)
    monkeypatch.setenv(skinny_tuned.ONE_TOKEN_ENV, "4096x8192:2x1024x4;4096x8192:2x")  # refused whole
    with pytest.raises(ValueError, match="MTPCONV_GEMV_ONE_TOKEN: '4096x8192:2x'"):
        ts.default_config(1, 4096, 8192, 132)


def test_grouped_moe_one_token_rule() -> None:
    """The grouped MoE kernel's measured one-token configurations (triton_moe.default_config)."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_moe

    narrow = triton_moe.FMA_NARROW
    assert triton_moe.default_config(1, 2048, 4096, fp8=True) == (16, 1024, 4, 3, narrow)  # 397B gate_up
    assert triton_moe.default_config(1, 1024, 2048, fp8=True) == (8, 512, 2, 3, narrow)  # Next gate_up
    assert triton_moe.default_config(1, 4096, 1024, fp8=True) == (64, 128, 4, 3, narrow)  # 397B down
    assert triton_moe.default_config(1, 2048, 512, fp8=True, act=True) == (8, 512, 2, 3, narrow)  # Next down
    assert triton_moe.default_config(1, 4096, 1024, fp8=False) == (8, 512, 2, 3, narrow)  # BF16 down
    assert triton_moe.default_config(1, 2048, 4096, fp8=False) == (8, 1024, 4, 3, narrow)  # BF16 gate_up
    assert triton_moe.default_config(1, 64, 256, fp8=True)[4] == triton_moe.FMA


def test_grouped_moe_one_token_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MTPCONV_MOE_ONE_TOKEN_FP8`` replaces the FP8 experts' one-token configuration for the
    K it names, and nothing else; a malformed entry is refused with the setting's name."""
    from mtpconv.kernels import moe_tuned

    narrow = moe_tuned.FMA_NARROW
    monkeypatch.setenv(moe_tuned.ONE_TOKEN_FP8_ENV, "1024:32x128x2; 4096:16x512x2x4x0")
    assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (32, 128, 2, 3, narrow)
    assert moe_tuned.default_config(1, 2048, 4096, fp8=True) == (16, 512, 2, 4, moe_tuned.FMA)
    assert moe_tuned.default_config(1, 1024, 2048, fp8=True) == (8, 512, 2, 3, narrow)  # K not named
    assert moe_tuned.default_config(1, 2048, 4096, fp8=False) == (8, 1024, 4, 3, narrow)  # BF16
    monkeypatch.setenv(moe_tuned.ONE_TOKEN_FP8_ENV, "")
    assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (64, 128, 4, 3, narrow)  # the measured one
    assert moe_tuned.default_config(4, 4096, 1024, fp8=True, fp8_x=True)[:2] == (64, 128)  # 2+ tokens
    monkeypatch.setenv(moe_tuned.ONE_TOKEN_FP8_ENV, "1024:64x128")
    with pytest.raises(ValueError, match="MTPCONV_MOE_ONE_TOKEN_FP8: '1024:64x128'"):
        moe_tuned.default_config(1, 4096, 1024, fp8=True)
    monkeypatch.setenv(moe_tuned.ONE_TOKEN_FP8_ENV, "down:64x128x4")
    with pytest.raises(ValueError, match="MTPCONV_MOE_ONE_TOKEN_FP8: 'down:64x128x4'"):
        moe_tuned.default_config(1, 4096, 1024, fp8=True)


def test_grouped_moe_prepared_rows_rule() -> None:
    """2+ tokens on FP8 rows quantized beforehand: 64 x 128 tiles in 3 stages, and 64 x 256 in
    5 where K >= 4096 (397B's gate_up, the deep sweep's best at 4 and 16 tokens)."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_moe

    dot = triton_moe.DOT
    for tokens in (2, 4, 16):
        assert triton_moe.default_config(tokens, 2048, 4096, fp8=True, fp8_x=True) == (64, 256, 4, 5, dot)
        assert triton_moe.default_config(tokens, 4096, 1024, fp8=True, fp8_x=True) == (64, 128, 4, 3, dot)
        assert triton_moe.default_config(tokens, 1024, 2048, fp8=True, fp8_x=True) == (64, 128, 4, 3, dot)
        # BF16 experts keep the tile the ninth session measured
        assert triton_moe.default_config(tokens, 2048, 4096, fp8=False) == (64, 128, 4, 3, dot)
