"""CUDA tests: the GPU quantization path and every FP8 linear path.

Skipped where no CUDA device is present (CI). Run on the GPU machine with
``PYTHONPATH=. python -m pytest -q tests/kernels/test_linear_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import Fp8Tensor, quantize_fp8
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


def _case(m: int, n: int, k: int, per_row: bool | str, bias: bool):
    """``per_row``: False/"tensor" (0-d scale), True/"row" ([N]) or "block" (128x128)."""
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV)
    q = quantize_fp8(torch.randn(n, k, generator=g) * 0.05)
    if per_row == "block":
        scale = torch.rand(-(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-4
    elif per_row in (True, "row"):
        scale = torch.rand(n, generator=g) * 1e-3 + 1e-4
    else:
        scale = q.scale
    b = torch.randn(n, generator=g).to(torch.bfloat16).to(DEV) if bias else None
    return x, q.weight.to(DEV), scale.to(DEV), b


def _ref(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """float64 reference on the dequantized weight (any scale layout)."""
    n, k = w.shape
    if reference.is_block_scale(s, n, k):
        full = reference.expand_block_scale(s, n, k).double()
    else:
        full = s.double().reshape(-1, 1)
    y = x.double() @ (w.double() * full).t()
    return y if b is None else y + b.double()


SHAPES = [(1, 512, 1024), (3, 384, 2048), (16, 1024, 512), (64, 640, 1536), (130, 256, 512)]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_every_path_matches_reference(m: int, n: int, k: int, layout: str) -> None:
    x, w, s, b = _case(m, n, k, layout, bias=layout != "tensor")
    ref = _ref(x, w, s, b)
    in_scale = x.float().abs().amax() / 448.0
    paths = available_paths(DEV, static_scale=True, block_scale=layout == "block")
    assert Fp8Path.WO_SKINNY in paths or not triton_available()
    for path in paths:
        if path is Fp8Path.SCALED_MM_STATIC and layout != "tensor":
            continue
        y = run_path(path, x, w, s, b, input_scale=in_scale)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16, path
        # Weight-only paths see only bf16 output rounding; W8A8 paths add FP8
        # activation rounding (about 2**-4 relative per element).
        # (wo_skinny at 2+ tokens rounds activations to FP8 per 128-wide K tile)
        weight_only = path in (Fp8Path.WO_TRITON, Fp8Path.DEQUANT) or (path is Fp8Path.WO_SKINNY and m == 1)
        assert _rel(y, ref) < (1e-2 if weight_only else 6e-2), (path, _rel(y, ref))
    # the selected path: weight-only at one token, W8A8 numerics above
    assert _rel(fp8_linear(x, w, s, b), ref) < (1e-2 if m == 1 else 6e-2)


SKINNY = [(1, 5120, 6144), (1, 333, 1000), (2, 384, 2048), (16, 130, 5120), (17, 256, 512), (3, 4096, 200)]


@pytest.mark.parametrize(("m", "n", "k"), SKINNY)
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_skinny_split_k_matches_dequantized_reference(m: int, n: int, k: int, layout: str) -> None:
    """Tolerance: weight-only, float32 accumulation, one bf16 rounding of the output:
    norm-wise 1e-2 relative, and every element within 1e-2 of the largest |ref|."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, b = _case(m, n, k, layout, bias=layout == "row")
    ref = _ref(x, w, s, b)
    base = ts.default_config(m, n, k, ts.sm_count(0))
    # no split, the default, and as many K pieces as the shape allows
    for programs in (1, 1 << 20):
        for dot, mma, tma, narrow, block_k, warps in (
            (False, 0, False, False, base.block_k, base.warps),
            (True, 0, False, False, base.block_k, base.warps),
            (True, 1, False, False, base.block_k, base.warps),
            (True, 2, False, False, base.block_k, base.warps),
            (False, 0, True, False, min(base.block_k, 256), base.warps),
            (True, 2, True, False, min(base.block_k, 256), base.warps),
            (False, 0, False, True, base.block_k, base.warps),
            (False, 0, False, True, 1024, 4),  # block_k = 256 * warps: no layout exchange
            (False, 0, False, True, 2048, 8),
            (False, 0, False, True, 512, 2),
            (False, 0, False, True, 64, 4),  # block_k < 256 * warps: an exchange, same result
        ):
            if narrow and m > 4:  # the narrow-load GEMV takes 1-4 tokens
                continue
            cfg = base._replace(
                programs=programs, dot=dot, mma=mma, tma=tma, narrow=narrow, block_k=block_k, warps=warps
            )
            if narrow:
                cfg = cfg._replace(block_n=min(cfg.block_n, 8))
            y = ts.skinny_linear(x, w, s, b, config=cfg)
            # mma=2 rounds the activations to FP8 (one scale per token and K tile): W8A8 error;
            # the narrow GEMV is weight-only at 1-4 tokens
            assert _rel(y, ref) < (6e-2 if mma == 2 else 1e-2), (cfg, _rel(y, ref))
            err = 1e-1 if mma == 2 else 1e-2
            assert float((y.double() - ref).abs().max()) <= err * float(ref.abs().max()), cfg
            # deterministic, and the split counters reset themselves between launches
            assert torch.equal(y, ts.skinny_linear(x, w, s, b, config=cfg)), cfg


@pytest.mark.parametrize(("m", "n", "k"), SKINNY)
def test_skinny_fixed_k_pieces_match_the_reference(m: int, n: int, k: int) -> None:
    """``Config.split``: K in 1, 2, 3 or as many pieces as it has steps, whatever the waves;
    within the dequantized reference's tolerance and bit for bit across repeats."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, b = _case(m, n, k, "row", bias=True)
    ref = _ref(x, w, s, b)
    base = ts.default_config(m, n, k, ts.sm_count(0))
    for split in (1, 2, 3, 1 << 20):
        cfg = base._replace(split=split)
        y = ts.skinny_linear(x, w, s, b, config=cfg)
        tol = 6e-2 if cfg.dot and cfg.mma == 2 else 1e-2
        assert _rel(y, ref) < tol, (cfg, _rel(y, ref))
        assert torch.equal(y, ts.skinny_linear(x, w, s, b, config=cfg)), cfg


@pytest.mark.parametrize(("m", "n", "k"), SKINNY)
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_skinny_prepared_fp8_activations_match_reference(m: int, n: int, k: int, layout: str) -> None:
    """FP8 activations quantized per token before the launch (``x_scale``), rows from 1e-3 to
    1e5: against the float64 product of the dequantized activations and weights, the same
    tolerance as weight-only (the MMA sees exactly the values the reference does)."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts
    from mtpconv.kernels.triton_quant import quant_per_token

    x, w, s, b = _case(m, n, k, layout, bias=layout == "row")
    x = (x.float() * torch.logspace(-3, 5, m, device=DEV)[:, None]).to(torch.bfloat16)
    xq, xs = quant_per_token(x)
    ref = _ref(xq.double() * xs.double(), w, s, b)
    y = fp8_linear(xq, w, s, b, x_scale=xs, out_dtype=torch.bfloat16)
    assert torch.equal(y, ts.skinny_linear(xq, w, s, b, x_scale=xs, out_dtype=torch.bfloat16))
    # one scale for the tensor: cuBLAS where the weight scale allows, else the skinny GEMM
    tq, ts_ = reference.quant_per_tensor(x)
    ref_t = _ref(tq.double() * ts_.double(), w, s, b)
    assert _rel(fp8_linear(tq, w, s, b, x_scale=ts_, out_dtype=torch.bfloat16), ref_t) < 1e-2
    rule = ts.Config(True, 64, 128, 4, 3, 4 * ts.sm_count(0), ts.MMA_PREPARED)
    # the default (tuned tile or rule: K in one piece), no split, wide tiles, with and without
    # TMA, K cut to fill the waves, K in three pieces
    cfgs = (rule._replace(programs=1), rule._replace(block_n=128, block_k=256), rule, rule._replace(split=3))
    for cfg in (None, *cfgs):
        for tma in (False, True) if cfg is not None else (False,):
            c = cfg._replace(tma=tma) if cfg is not None else None
            y = ts.skinny_linear(xq, w, s, b, config=c, x_scale=xs, out_dtype=torch.bfloat16)
            assert y.dtype == torch.bfloat16 and y.shape == (m, n)
            assert _rel(y, ref) < 1e-2, (c, _rel(y, ref))
            rows = (y.double() - ref).abs().amax(1) / ref.abs().amax(1)
            assert float(rows.max()) <= 1e-2, c
            assert torch.equal(
                y, ts.skinny_linear(xq, w, s, b, config=c, x_scale=xs, out_dtype=torch.bfloat16)
            )


def test_skinny_prepared_activations_refuse_what_does_not_fit() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts
    from mtpconv.kernels.triton_quant import quant_per_token

    x, w, s, _ = _case(4, 256, 512, "tensor", bias=False)
    xq, xs = quant_per_token(x)
    with pytest.raises(ValueError, match="FP8 activations and weights"):
        ts.skinny_linear(x, w, s, x_scale=xs, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="4 float32 row scales"):
        ts.skinny_linear(xq, w, s, x_scale=xs[:2], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype"):
        ts.skinny_linear(xq, w, s, x_scale=xs)
    with pytest.raises(ValueError, match="mma 3"):
        ts.skinny_linear(
            xq, w, s, x_scale=xs, out_dtype=torch.bfloat16, config=ts.default_config(4, 256, 512, 8)
        )


@pytest.mark.parametrize("narrow", [False, True])
def test_skinny_split_k_in_cuda_graph_replays(narrow: bool) -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, _ = _case(4, 2048, 8192, "tensor", bias=False)
    cfg = ts.default_config(4, 2048, 8192, ts.sm_count(0))._replace(programs=1 << 20)
    if narrow:  # the narrow-load GEMV, four tokens per program
        cfg = cfg._replace(dot=False, mma=0, tma=False, narrow=True, block_n=4, block_k=1024, warps=4)
    assert ts.split_for(32, 8192, cfg.block_k, cfg.programs)[0] > 1
    ts.skinny_linear(x, w, s, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a = ts.skinny_linear(x, w, s, config=cfg)
        c = ts.skinny_linear(x * 2, w, s, config=cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, ts.skinny_linear(x, w, s, config=cfg))
        assert _rel(c, _ref(x * 2, w, s, None)) < (1e-2 if narrow else 6e-2)


@pytest.mark.parametrize(("m", "n", "k"), [(1, 3072, 5120), (1, 40, 14336), (3, 333, 4104), (4, 2048, 4096)])
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_narrow_two_rows_matches_reference(m: int, n: int, k: int, layout: str) -> None:
    """Two rows a program (the one-token rule's choice for few or long rows, and tuned
    entries): weight-only tolerance, split-K on and off."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, b = _case(m, n, k, layout, bias=layout == "row")
    ref = _ref(x, w, s, b)
    for block_k, warps in ((512, 2), (1024, 4), (2048, 8)):
        for programs in (1, 1 << 20):
            cfg = ts.Config(False, 2, block_k, warps, 3, programs, narrow=True)
            y = ts.skinny_linear(x, w, s, b, config=cfg)
            assert _rel(y, ref) < 1e-2, (cfg, _rel(y, ref))
            assert float((y.double() - ref).abs().max()) <= 1e-2 * float(ref.abs().max()), cfg


@pytest.mark.parametrize(("m", "n", "k"), [(1, 5120, 6144), (2, 333, 4104), (4, 2048, 4096), (3, 40, 1000)])
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_narrow_first_tiles_ahead_of_the_wait_change_nothing(m: int, n: int, k: int, layout: str) -> None:
    """``first_ahead`` (one or two K steps' weight tiles loaded before the PDL wait) gives the
    same output bit for bit as the plain K loop, with K even or not, split or not, and with a
    K range shorter than the tiles asked ahead."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, b = _case(m, n, k, layout, bias=layout == "row")
    ref = _ref(x, w, s, b)
    for block_n, block_k, warps in ((4, 1024, 4), (8, 512, 2), (2, 2048, 8)):
        for programs in (1, 1 << 20):
            cfg = ts.Config(False, block_n, block_k, warps, 3, programs, narrow=True)
            plain = ts.skinny_linear(x, w, s, b, config=cfg)
            assert _rel(plain, ref) < 1e-2, (cfg, _rel(plain, ref))
            for ahead in (1, 2):
                y = ts.skinny_linear(x, w, s, b, config=cfg._replace(first_ahead=ahead))
                assert torch.equal(y, plain), (cfg, ahead)


@pytest.mark.parametrize(
    "setting",
    [
        "4096x8192:2x1024x4x1;32768x4096:2x1024x4x2",
        "4096x8192:2x2048x8x2;32768x4096:8x2048x8x1x12",
        "4096x8192:8x2048x8x1x4;32768x4096:8x1024x4x2x4",  # the H200 sweep's bests (twenty-fifth session)
    ],
)
def test_one_token_entries_named_by_the_setting_match_reference(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """fp8_linear at one token on Qwen3.5-397B's fc / o and head shapes, with the entries that
    MTPCONV_GEMV_ONE_TOKEN names in place of the table's (the candidates bench_draft times in
    the step), matches the dequantized reference as the table's entries do."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import skinny_tuned
    from mtpconv.kernels import triton_skinny as ts

    for n, k in ((4096, 8192), (32768, 4096)):
        x, w, s, _ = _case(1, n, k, "tensor", bias=False)
        ref = _ref(x, w, s, None)
        monkeypatch.delenv(skinny_tuned.ONE_TOKEN_ENV, raising=False)
        table = ts.skinny_linear(x, w, s)
        monkeypatch.setenv(skinny_tuned.ONE_TOKEN_ENV, setting)
        entry, first = skinny_tuned.one_token_override(n, k) or pytest.fail(f"{setting} names {n}x{k}")
        sms = ts.sm_count(0)
        assert ts.default_config(1, n, k, sms) == ts._tabled(entry, sms)._replace(first_ahead=first)
        named = ts.skinny_linear(x, w, s)
        assert _rel(table, ref) < 1e-2 and _rel(named, ref) < 1e-2, (n, k, _rel(table, ref), _rel(named, ref))


def test_narrow_configuration_refuses_more_than_four_tokens() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, _ = _case(5, 256, 1024, "tensor", bias=False)
    cfg = ts.Config(False, 4, 1024, 4, 3, 132, narrow=True)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        ts.skinny_linear(x, w, s, config=cfg)


@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 65])
@pytest.mark.parametrize("fp8", [True, False])
def test_grouped_moe_matches_reference(tokens: int, fp8: bool) -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_moe

    g = torch.Generator().manual_seed(tokens)
    e, top, n, k = 40, 8, 256, 200
    raw = torch.randn(e, n, k, generator=g) * 0.05
    q = quantize_fp8(raw)
    w, sc = (q.weight.to(DEV), q.scale.to(DEV)) if fp8 else (raw.to(torch.bfloat16).to(DEV), None)
    deq = (q.weight.double() * q.scale.double()[:, None, None]) if fp8 else raw.to(torch.bfloat16).double()
    deq = deq.to(DEV)
    ids = torch.stack([torch.randperm(e, generator=g)[:top] for _ in range(tokens)]).to(DEV)
    flat = ids.reshape(-1)
    x = torch.randn(tokens, k, generator=g).to(torch.bfloat16).to(DEV)
    # The default for FP8 experts at 2+ tokens is the FP8 MMA (W8A8 error); the
    # weight-only modes (FMA, DOT) keep the 1e-2 bound and are checked as such.
    tol = 6e-2 if fp8 and 1 < tokens <= triton_moe.GROUPED_MAX_TOKENS else 1e-2
    out = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False)
    ref = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    assert _rel(out, ref) < tol
    if fp8 and tokens <= triton_moe.GROUPED_MAX_TOKENS:
        weight_only = triton_moe.moe_grouped(
            x, w, sc, ids, x_per_pair=False, config=(64, 128, 4, 3, triton_moe.DOT)
        )
        assert _rel(weight_only, ref) < 1e-2
    xp = torch.randn(tokens * top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(tokens, top, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw)
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16).double()
    ref = torch.einsum("pk,pnk->pn", act, deq[flat]) * rw.reshape(-1, 1).double()
    assert _rel(out, ref) < tol
    # glu: the experts as [gate; up], SiLU(gate) * up out of the epilogue (the fallback past
    # GROUPED_MAX_TOKENS applies it after wo_moe)
    y = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    ref = torch.nn.functional.silu(y[:, : n // 2]) * y[:, n // 2 :]
    out = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, glu=True)
    assert out.shape == (tokens * top, n // 2) and _rel(out, ref) < tol


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("k", [256, 200, 1024])
def test_grouped_moe_one_token_fma_modes_match_reference(
    fp8: bool, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One token: the FMA mode and the narrow-load FMA mode are weight-only (rel. L2 < 1e-2),
    for a K that is and one that is not a multiple of the tile, and for tiles wider than K;
    also with SiLU(gate) * up out of the epilogue (``glu``, N / 2 columns not a multiple of
    the tile's), and ``routed_experts`` built on it. Each pair serving itself gives, bit for
    bit, what the routing checks of 2+ tokens give (``MTPCONV_MOE_PAIR_CHECKS=1``)."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_moe

    g = torch.Generator().manual_seed(k)
    e, top, n = 32, 8, 264
    raw = torch.randn(e, n, k, generator=g) * 0.05
    q = quantize_fp8(raw)
    w, sc = (q.weight.to(DEV), q.scale.to(DEV)) if fp8 else (raw.to(torch.bfloat16).to(DEV), None)
    deq = (q.weight.double() * q.scale.double()[:, None, None]) if fp8 else raw.to(torch.bfloat16).double()
    deq = deq.to(DEV)
    ids = torch.randperm(e, generator=g)[:top].reshape(1, top).to(DEV)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(DEV)
    xp = torch.randn(top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(1, top, generator=g).to(torch.bfloat16).to(DEV)
    ref = torch.einsum("k,pnk->pn", x[0].double(), deq[ids[0]])
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16).double()
    ref_act = torch.einsum("pk,pnk->pn", act, deq[ids[0]]) * rw.reshape(-1, 1).double()
    ref_glu = torch.nn.functional.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
    for cfg in (
        (16, 128, 4, 3, triton_moe.FMA),
        (16, 128, 4, 3, triton_moe.FMA_NARROW),
        (4, 1024, 4, 3, triton_moe.FMA_NARROW),
        (8, 2048, 8, 3, triton_moe.FMA_NARROW),
        (8, 512, 2, 3, triton_moe.FMA_NARROW),  # the one-token default from K = 512
        (64, 64, 2, 3, triton_moe.FMA_NARROW),  # threads split rows more than K (swept since the 18th)
        (16, 1024, 4, 3, triton_moe.FMA_NARROW),  # FP8 experts from K = 4096 (397B's gate_up, 22nd)
        (64, 128, 4, 3, triton_moe.FMA_NARROW),  # FP8 experts of K = 1024 (397B's down, 22nd)
    ):

        def run(cfg: tuple[int, int, int, int, int] = cfg) -> list[torch.Tensor]:
            return [
                triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, config=cfg),
                triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw, config=cfg),
                triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, glu=True, config=cfg),
            ]

        outs = run()
        for out, want in zip(outs, (ref, ref_act, ref_glu), strict=True):
            assert _rel(out, want) < 1e-2, cfg
        monkeypatch.setenv(triton_moe.PAIR_CHECKS_ENV, "1")
        for out, checked in zip(outs, run(), strict=True):
            assert torch.equal(out, checked), cfg
        monkeypatch.delenv(triton_moe.PAIR_CHECKS_ENV)
    # routed_experts at one token: the gate/up projection writes SiLU * up (glu, the default)
    # and the down projection reads it; within one BF16 rounding of the form before
    dn = quantize_fp8(torch.randn(e, k, n // 2, generator=g) * 0.05)
    down = (dn.weight.to(DEV), dn.scale.to(DEV)) if fp8 else (_dequantized(dn).to(torch.bfloat16), None)
    got = triton_moe.routed_experts(x, (w, sc), down, ids, rw)
    act1 = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, glu=True)
    assert torch.equal(got, triton_moe.moe_grouped(act1, *down, ids, x_per_pair=True, route_w=rw))
    before = triton_moe.routed_experts(x, (w, sc), down, ids, rw, glu=False)
    assert _rel(got, before.double()) < 1e-2
    with pytest.raises(ValueError, match="glu"):
        triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, glu=True)


def _dequantized(q: Fp8Tensor) -> torch.Tensor:
    """float64 experts ``[E, N, K]`` from a quantize_fp8 result with one scale per expert, on DEV."""
    return (q.weight.double() * q.scale.double()[:, None, None]).to(DEV)


def _fp8_experts(
    g: torch.Generator, tokens: int, top: int, n: int, k: int, e: int = 24
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random FP8 experts ``[e, n, k]`` on DEV (weights, scales), their float64
    dequantization and a routing of ``tokens`` tokens to ``top`` distinct experts each."""
    q = quantize_fp8(torch.randn(e, n, k, generator=g) * 0.05)
    ids = torch.stack([torch.randperm(e, generator=g)[:top] for _ in range(tokens)]).to(DEV)
    return q.weight.to(DEV), q.scale.to(DEV), _dequantized(q), ids


@pytest.mark.parametrize("tokens", [2, 5, 16])
def test_grouped_moe_fp8_mma_matches_reference(tokens: int) -> None:
    """The FP8-MMA mode (tokens quantized per K tile in registers): W8A8 error only,
    with a K that is no multiple of the tile; BF16 experts are refused."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_moe

    g = torch.Generator().manual_seed(100 + tokens)
    top, n, k = 6, 192, 328
    w, sc, deq, ids = _fp8_experts(g, tokens, top, n, k)
    flat = ids.reshape(-1)
    mode = (64, 128, 4, 3, triton_moe.DOT_FP8)
    x = torch.randn(tokens, k, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, config=mode)
    ref = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    assert _rel(out, ref) < 6e-2
    xp = torch.randn(tokens * top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(tokens, top, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw, config=mode)
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16).double()
    ref = torch.einsum("pk,pnk->pn", act, deq[flat]) * rw.reshape(-1, 1).double()
    assert _rel(out, ref) < 6e-2
    with pytest.raises(ValueError, match="FP8 experts"):
        triton_moe.moe_grouped(x, deq.to(torch.bfloat16), None, ids, x_per_pair=False, config=mode)


@pytest.mark.parametrize("tokens", [2, 5, 16, 64])
def test_grouped_moe_fp8_activations_match_reference(tokens: int) -> None:
    """FP8 activations quantized per token by a launch of their own (``quant_per_token``,
    with SiLU * up for the down projection), then the FP8 MMA in place (``x_scale``): W8A8
    error only, K no multiple of the tile, every tile the sweep tries; ``routed_experts``
    takes that path by default at 2+ tokens and equals the two launches."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_moe
    from mtpconv.kernels.triton_quant import quant_per_token

    g = torch.Generator().manual_seed(200 + tokens)
    e, top, n, k = 24, 6, 192, 328
    w, sc, deq, ids = _fp8_experts(g, tokens, top, n, k, e)
    flat = ids.reshape(-1)
    # rows from 1e-3 to 1e5: one scale per row keeps each within FP8's range
    x = (
        (torch.randn(tokens, k, generator=g) * torch.logspace(-3, 5, tokens)[:, None])
        .to(torch.bfloat16)
        .to(DEV)
    )
    xq, xs = quant_per_token(x)
    ref = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    xp = torch.randn(tokens * top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(tokens, top, generator=g).to(torch.bfloat16).to(DEV)
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16)
    aq, as_ = quant_per_token(xp, act=True)
    assert _rel(aq.double() * as_.double(), act.double()) < 6e-2
    ref_act = torch.einsum("pk,pnk->pn", act.double(), deq[flat]) * rw.reshape(-1, 1).double()
    tiles = [(64, 64, 4, 3), (256, 128, 8, 4), (64, 256, 4, 5)]  # the last: K >= 4096's default
    for cfg in [None] + [(*t, triton_moe.DOT) for t in tiles]:
        out = triton_moe.moe_grouped(xq, w, sc, ids, x_per_pair=False, x_scale=xs, config=cfg)
        assert out.dtype == torch.bfloat16
        per_pair = (out.double() - ref).norm(dim=1) / ref.norm(dim=1)
        assert float(per_pair.max()) < 6e-2, cfg  # every row, whatever its magnitude
        out = triton_moe.moe_grouped(aq, w, sc, ids, x_per_pair=True, route_w=rw, x_scale=as_, config=cfg)
        assert _rel(out, ref_act) < 6e-2, cfg
    # routed_experts on a gate_up / down pair: the two quantizations and launches above
    gu = quantize_fp8(torch.randn(e, 2 * 96, k, generator=g) * 0.05)
    dn = quantize_fp8(torch.randn(e, k, 96, generator=g) * 0.05)
    gu_w, gu_s, dn_w, dn_s = gu.weight.to(DEV), gu.scale.to(DEV), dn.weight.to(DEV), dn.scale.to(DEV)
    got = triton_moe.routed_experts(x, (gu_w, gu_s), (dn_w, dn_s), ids, rw)
    q1, s1 = quant_per_token(x)
    y = triton_moe.moe_grouped(q1, gu_w, gu_s, ids, x_per_pair=False, x_scale=s1)
    q2, s2 = quant_per_token(y, act=True)
    two = triton_moe.moe_grouped(q2, dn_w, dn_s, ids, x_per_pair=True, route_w=rw, x_scale=s2)
    assert torch.equal(got, two)
    # h's FP8 rows handed over by the launch that wrote h: the same launches, bit for bit
    assert torch.equal(triton_moe.routed_experts(x, (gu_w, gu_s), (dn_w, dn_s), ids, rw, h_fp8=(q1, s1)), two)
    with pytest.raises(ValueError, match="h_fp8"):
        triton_moe.routed_experts(x, (gu_w, gu_s), (dn_w, dn_s), ids, rw, h_fp8=(q1[:, :-16], s1))
    # both FP8 chains against a float64 one on the dequantized experts (the activations
    # rounded to BF16 where the kernels write them): two W8A8 stages, each within 6e-2
    # above, so the chain's bound is 8e-2
    gu_deq, dn_deq = _dequantized(gu), _dequantized(dn)
    pair_x = x.double()[torch.arange(tokens * top, device=DEV) // top]
    y_ref = torch.einsum("pk,pnk->pn", pair_x, gu_deq[flat]).to(torch.bfloat16).float()
    a_ref = (torch.nn.functional.silu(y_ref[:, :96]) * y_ref[:, 96:]).to(torch.bfloat16).double()
    chain_ref = torch.einsum("pk,pnk->pn", a_ref, dn_deq[flat]) * rw.reshape(-1, 1).double()
    fused = triton_moe.routed_experts(x, (gu_w, gu_s), (dn_w, dn_s), ids, rw, split=False)
    errors = (_rel(got, chain_ref), _rel(fused, chain_ref))
    assert max(errors) < 8e-2, errors
    # BF16 experts: SiLU * up by a launch of its own, then the MMA; weight-only numerics
    gu_b, dn_b = gu_w.to(torch.bfloat16), dn_w.to(torch.bfloat16)
    got = triton_moe.routed_experts(x, (gu_b, None), (dn_b, None), ids, rw)
    fused = triton_moe.routed_experts(x, (gu_b, None), (dn_b, None), ids, rw, split=False)
    assert _rel(got, fused) < 1e-2
    with pytest.raises(ValueError, match="differ"):
        triton_moe.routed_experts(x, (gu_w, gu_s), (dn_b, None), ids, rw)


def test_grouped_moe_fp8_activations_refuse_what_does_not_fit() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_moe
    from mtpconv.kernels.triton_quant import quant_per_token

    q = quantize_fp8(torch.randn(4, 64, 128) * 0.05)
    w, sc = q.weight.to(DEV), q.scale.to(DEV)
    ids = torch.tensor([[0, 1], [2, 3]], device=DEV)
    x = torch.randn(2, 128, device=DEV).to(torch.bfloat16)
    xq, xs = quant_per_token(x)
    with pytest.raises(ValueError, match="FP8 activations"):
        triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, x_scale=xs)
    with pytest.raises(ValueError, match="FP8 activations"):
        triton_moe.moe_grouped(xq, w.to(torch.bfloat16), None, ids, x_per_pair=False, x_scale=xs)
    with pytest.raises(ValueError, match="no quantization in registers"):
        triton_moe.moe_grouped(
            xq, w, sc, ids, x_per_pair=False, x_scale=xs, config=(64, 128, 4, 3, triton_moe.DOT_FP8)
        )
    with pytest.raises(ValueError, match="even width"):
        quant_per_token(torch.randn(2, 127, device=DEV).to(torch.bfloat16), act=True)


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


@pytest.mark.parametrize(
    ("rows", "k"),
    [(1, 10240), (4, 17408), (16, 17408), (16, 5120), (4, 34816), (3, 8193), (40, 1024), (64, 34816)],
)
def test_split_rows_per_token_quant_matches_torch_in_graph_replays(rows: int, k: int) -> None:
    """Rows wider than ``TOKEN_CHUNK`` are split across programs that agree on each row's
    amax through counters that only grow: the same scales as torch's, every time, eagerly
    and over CUDA-graph replays of two launches (rows of 1e-3 to 1e4), with SiLU * up too."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_glue, triton_quant

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    parts = triton_quant.token_parts(rows, k, sms)
    assert rows * parts <= sms or parts == 1
    spread = torch.logspace(-3, 4, rows, device=DEV)[:, None]
    x = (torch.randn(rows, k, device=DEV) * spread).to(torch.bfloat16)
    pairs = (torch.randn(rows, 2 * k, device=DEV) * spread).to(torch.bfloat16)

    def check(q: torch.Tensor, s: torch.Tensor, ref_of: torch.Tensor) -> None:
        q_ref, s_ref = reference.quant_per_token(ref_of)
        torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
        assert (q.float() != q_ref.float()).float().mean().item() < 1e-3

    for _ in range(3):
        check(*triton_quant.quant_per_token(x), x)
    check(*triton_quant.quant_per_token(pairs, act=True), triton_glue.silu_mul(pairs))  # the same SiLU
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out1 = triton_quant.quant_per_token(x)
        out2 = triton_quant.quant_per_token(pairs, act=True)
    for scale in (1.0, 1e-3, 300.0):
        x.copy_((x.float() * scale).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        check(*out1, x)
        check(*out2, triton_glue.silu_mul(pairs))


def test_fused_per_tensor_quant_matches_torch_and_resets() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_quant_tensor

    # Several sizes (one program .. every SM), both kernels interleaved, repeated
    # launches: each grid barrier must leave its state ready for the next launch.
    sizes = [(1, 64), (1, 10240), (16, 5120), (64, 17408), (3, 1000), (32, 10240), (16, 17408), (1, 64)]
    for _ in range(3):
        for m, k in sizes:
            x = (torch.randn(m, k, device=DEV) * (m + 1)).to(torch.bfloat16)
            q_ref, s_ref = reference.quant_per_tensor(x)
            fits = (
                m * k
                <= triton_quant_tensor.ONCE_CHUNK
                * torch.cuda.get_device_properties(DEV).multi_processor_count
            )
            for one_pass in (False, True) if fits else (False,):
                q, s = triton_quant_tensor.quant_per_tensor(x, one_pass=one_pass)
                torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
                assert (q.float() != q_ref.float()).float().mean().item() < 1e-3, (m, k, one_pass)
    with pytest.raises(ValueError, match="one pass"):
        triton_quant_tensor.quant_per_tensor(
            torch.ones(64, 17408, device=DEV, dtype=torch.bfloat16), one_pass=True
        )


def test_one_pass_per_tensor_quant_under_graph_replay() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_quant_tensor

    # The one-pass kernel's barrier state lives on the device: replays of a captured
    # graph (two launches of different sizes in it) must each find it reset.
    xa = torch.randn(4, 10240, device=DEV).to(torch.bfloat16)
    xb = torch.randn(16, 5120, device=DEV).to(torch.bfloat16)
    triton_quant_tensor.quant_per_tensor(xa, one_pass=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qa, sa = triton_quant_tensor.quant_per_tensor(xa, one_pass=True)
        qb, sb = triton_quant_tensor.quant_per_tensor(xb, one_pass=True)
    for scale in (1.0, 1e-3, 300.0, 2.0):
        xa.copy_(torch.randn_like(xa) * scale)
        xb.copy_(torch.randn_like(xb) * scale * 7)
        graph.replay()
        torch.cuda.synchronize()
        for x, q, s in ((xa, qa, sa), (xb, qb, sb)):
            q_ref, s_ref = reference.quant_per_tensor(x)
            torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
            assert (q.float() != q_ref.float()).float().mean().item() < 1e-3, scale


def test_default_paths_on_fp8_gpus() -> None:
    from mtpconv.kernels import SKINNY_MAX_TOKENS, select_path

    if torch.cuda.get_device_capability() < (8, 9) or not triton_available():
        pytest.skip("needs sm_89+ and triton")
    for per_row in (False, True):
        assert select_path(DEV, 1, per_row_scale=per_row) is Fp8Path.WO_SKINNY
        assert select_path(DEV, SKINNY_MAX_TOKENS, per_row_scale=per_row) is Fp8Path.WO_SKINNY
    assert select_path(DEV, SKINNY_MAX_TOKENS + 1) is Fp8Path.SCALED_MM_FUSED
    assert select_path(DEV, 64, block_scale=True) is Fp8Path.WO_SKINNY


def test_row_scale_cast_matches_torch() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_fp8

    g = torch.Generator(device=DEV).manual_seed(3)
    for m, n, bias in ((1, 5, False), (4, 14336, True), (16, 1030, True)):
        y32 = torch.randn(m, n, device=DEV, generator=g) * 100
        rows = torch.rand(n, device=DEV, generator=g) * 1e-3
        b = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16) if bias else None
        want = y32 * rows + (b.float() if b is not None else 0)
        got = triton_fp8.row_scale_cast(y32, rows, b, torch.bfloat16)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        # float32 math, then one rounding to bfloat16 (Triton may fuse the multiply-add)
        torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-6)


def test_measured_shape_quantizes_per_token_itself_within_w8a8_tolerance() -> None:
    if torch.cuda.get_device_capability() < (8, 9) or not triton_available():
        pytest.skip("needs sm_89+ and triton")
    # Qwen3-Next-80B qkv is in SELF_PREPARED for 2-16 tokens: fp8_linear takes skinny_token
    # there (bit-identical to calling that path, and to quant_per_token then the prepared
    # launch) and stays within W8A8 error, with one weight scale and with a scale per row.
    from mtpconv.kernels import triton_quant

    for m, per_row in ((2, False), (4, True), (9, False), (16, True)):
        x, w, s, b = _case(m, 9216, 2048, per_row=per_row, bias=m == 9)
        got = fp8_linear(x, w, s, b)
        assert torch.equal(got, run_path(Fp8Path.SKINNY_TOKEN, x, w, s, b)), m
        q, sa = triton_quant.quant_per_token(x)
        assert torch.equal(got, fp8_linear(q, w, s, b, x_scale=sa, out_dtype=x.dtype)), m
        ref = reference.dequant_linear(x.double(), w, s.double(), None if b is None else b.double())
        assert _rel(got, ref) < 6e-2, m


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
