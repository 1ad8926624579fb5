"""CPU tests of the benchmark step's own kernels (``benchmarks.kernels``): an FP8 linear on
prepared FP8 rows and where it pays, the grouped MoE kernel's configurations, and the Triton
kernels under Triton's interpreter (in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks.kernels.prepared import Prepared, prepared_linear, takes_prepared
from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import reference
from tests.helpers import rel_error


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
        y = prepared_linear(q.reshape(2, 3, 96), w.weight, scale, b, x_scale=s, out_dtype=torch.bfloat16)
        ref = deq @ (w.weight.double() * scale.double().reshape(-1, 1)).t()
        ref = ref if b is None else ref + b.double()
        assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
        assert rel_error(y, ref) < 1e-2
    with pytest.raises(TypeError, match="float8_e4m3fn rows"):
        prepared_linear(x, w.weight, w.scale, None, x_scale=s, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype"):
        prepared_linear(q, w.weight, w.scale, None, x_scale=s, out_dtype=None)
    with pytest.raises(ValueError, match="0-d or one scale per row"):
        prepared_linear(q, w.weight, w.scale, None, x_scale=s[:2], out_dtype=torch.bfloat16)


def test_prepared_rows_only_where_measured_faster() -> None:
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
    y = prepared_linear(q, w.weight, w.scale, None, x_scale=s, out_dtype=torch.float16)
    ref = (q.double() * s.double()) @ (w.weight.double() * w.scale.double()).t()
    assert y.dtype == torch.float16 and rel_error(y, ref) < 1e-2


def test_grouped_moe_one_token_rule() -> None:
    """The grouped MoE kernel's measured one-token configurations (triton_moe.default_config)."""
    pytest.importorskip("triton")
    from benchmarks.kernels import moe as triton_moe

    narrow = triton_moe.FMA_NARROW
    assert triton_moe.default_config(1, 2048, 4096, fp8=True) == (16, 1024, 4, 3, narrow)  # 397B gate_up
    assert triton_moe.default_config(1, 1024, 2048, fp8=True) == (8, 512, 2, 3, narrow)  # Next gate_up
    assert triton_moe.default_config(1, 4096, 1024, fp8=True) == (64, 128, 4, 3, narrow)  # 397B down
    assert triton_moe.default_config(1, 2048, 512, fp8=True, act=True) == (8, 512, 2, 3, narrow)  # Next down
    assert triton_moe.default_config(1, 4096, 1024, fp8=False) == (8, 512, 2, 3, narrow)  # BF16 down
    assert triton_moe.default_config(1, 2048, 4096, fp8=False) == (8, 1024, 4, 3, narrow)  # BF16 gate_up
    assert triton_moe.default_config(1, 64, 256, fp8=True)[4] == triton_moe.FMA


def test_grouped_moe_one_token_candidates() -> None:
    """``moe_tuned.one_token_fp8`` replaces the FP8 experts' one-token configuration for the
    K it names while it is active, and nothing else."""
    from benchmarks.kernels import moe_tuned

    narrow = moe_tuned.FMA_NARROW
    with moe_tuned.one_token_fp8({1024: (32, 128, 2, 3, narrow), 4096: (16, 512, 2, 4, moe_tuned.FMA)}):
        assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (32, 128, 2, 3, narrow)
        assert moe_tuned.default_config(1, 2048, 4096, fp8=True) == (16, 512, 2, 4, moe_tuned.FMA)
        assert moe_tuned.default_config(1, 1024, 2048, fp8=True) == (8, 512, 2, 3, narrow)  # K not named
        assert moe_tuned.default_config(1, 2048, 4096, fp8=False) == (8, 1024, 4, 3, narrow)  # BF16
    assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (64, 128, 4, 3, narrow)  # the measured one
    assert moe_tuned.default_config(4, 4096, 1024, fp8=True, fp8_x=True)[:2] == (64, 128)  # 2+ tokens


def test_grouped_moe_prepared_rows_rule() -> None:
    """2+ tokens on FP8 rows quantized beforehand: 64 x 128 tiles in 3 stages, and 64 x 256 in
    5 where K >= 4096 (397B's gate_up, the deep sweep's best at 4 and 16 tokens)."""
    pytest.importorskip("triton")
    from benchmarks.kernels import moe as triton_moe

    dot = triton_moe.DOT
    for tokens in (2, 4, 16):
        assert triton_moe.default_config(tokens, 2048, 4096, fp8=True, fp8_x=True) == (64, 256, 4, 5, dot)
        assert triton_moe.default_config(tokens, 4096, 1024, fp8=True, fp8_x=True) == (64, 128, 4, 3, dot)
        assert triton_moe.default_config(tokens, 1024, 2048, fp8=True, fp8_x=True) == (64, 128, 4, 3, dot)
        # BF16 experts keep the tile the ninth session measured
        assert triton_moe.default_config(tokens, 2048, 4096, fp8=False) == (64, 128, 4, 3, dot)


_INTERPRETED = textwrap.dedent(
    """
    import torch
    from mtpconv.formats.fp8 import quantize_fp8
    from benchmarks.kernels import moe as tm, moe_pairs, producers

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    g = torch.Generator().manual_seed(0)
    e, n, k, t, top = 6, 24, 64, 3, 2
    q = quantize_fp8(torch.randn(e, n, k, generator=g))
    deq = q.weight.double() * q.scale.double()[:, None, None]
    x = torch.randn(t, k, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, e, (t, top), generator=g)
    flat = ids.reshape(-1)
    out = moe_pairs.wo_moe(x, q.weight, q.scale, ids, x_per_pair=False)
    ref = torch.stack([x[p // top].double() @ deq[flat[p]].t() for p in range(t * top)])
    assert rel(out, ref) < 1e-2
    xp = torch.randn(t * top, k, generator=g).to(torch.bfloat16)
    out = moe_pairs.wo_moe(xp, q.weight, q.scale, ids, x_per_pair=True)
    ref = torch.stack([xp[p].double() @ deq[flat[p]].t() for p in range(t * top)])
    assert rel(out, ref) < 1e-2
    # the concatenation's producer quantizes as quant_per_token does (the interpreter
    # truncates casts: compared with itself)
    for m, k2 in [(3, 300), (17, 272)]:
        x = torch.randn(m, k2, generator=g).to(torch.bfloat16)
        qc, sc = producers.quant_cat(x[:, : k2 // 2], x[:, k2 // 2 :])
        qp, sp = producers.quant_per_token(x)
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
    # checks of 2+ tokens give (pair_checks)
    x1 = torch.randn(1, 1024, generator=g).to(torch.bfloat16)
    q = quantize_fp8(torch.randn(e, n, 1024, generator=g))
    deq = q.weight.double() * q.scale.double()[:, None, None]
    ids1 = torch.randperm(e, generator=g)[:top].reshape(1, top)
    y = torch.stack([x1[0].double() @ deq[i].t() for i in ids1[0]])
    for glu, cfg in [(glu, cfg) for glu in (False, True) for cfg in ((8, 512, 2), (64, 128, 4))]:
        def one(checks, glu=glu, cfg=cfg):
            return tm.moe_grouped(x1, q.weight, q.scale, ids1, x_per_pair=False, glu=glu,
                                  config=(*cfg, 3, tm.FMA_NARROW), pair_checks=checks)
        out = one(False)
        ref = torch.nn.functional.silu(y[:, : n // 2]) * y[:, n // 2 :] if glu else y
        assert rel(out, ref) < 1e-2, (glu, cfg)
        assert torch.equal(out, one(True)), (glu, cfg)
    print("interpreted kernels ok")
    """
)


def test_benchmark_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), env.get("PYTHONPATH"))))
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300, cwd=root
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreted kernels ok" in done.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_prepared_rows_on_cuda_match_the_reference(layout: str) -> None:
    """On CUDA: per-token FP8 rows through the skinny GEMM (bit for bit its prepared launch),
    one scale for the tensor through cuBLAS where the weight scale allows, else the skinny GEMM."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny
    from mtpconv.kernels.triton_quant import quant_per_token

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    n, k = 384, 2048
    x = (torch.randn(4, k, generator=g) * torch.logspace(-3, 5, 4)[:, None]).to(torch.bfloat16).to(dev)
    w = quantize_fp8(torch.randn(n, k, generator=g) * 0.05).weight.to(dev)
    scales = {"tensor": torch.tensor(1e-3), "row": torch.rand(n, generator=g) * 1e-3 + 1e-4}
    scales["block"] = torch.rand(-(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-4
    s = scales[layout].to(dev)
    xq, xs = quant_per_token(x)
    y = prepared_linear(xq, w, s, None, x_scale=xs, out_dtype=torch.bfloat16)
    assert torch.equal(y, triton_skinny.skinny_linear(xq, w, s, x_scale=xs, out_dtype=torch.bfloat16))
    assert rel_error(y, reference.dequant_linear(xq.float() * xs, w, s)) < 1e-2
    tq, ts = reference.quant_per_tensor(x)
    ref_t = reference.dequant_linear(tq.float() * ts, w, s)
    assert rel_error(prepared_linear(tq, w, s, None, x_scale=ts, out_dtype=torch.bfloat16), ref_t) < 1e-2
