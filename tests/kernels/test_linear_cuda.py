"""CUDA tests: the GPU quantization path and every FP8 linear kernel.

Skipped where no CUDA device is present (CI). Run on the GPU machine with
``PYTHONPATH=. python -m pytest -q tests/kernels/test_linear_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.formats.nvfp4 import dequantize_nvfp4
from mtpconv.kernels import fp8_linear, reference, triton_available, tuning
from mtpconv.kernels.linear import (
    Dequant,
    ScaleLayout,
    SkinnyToken,
    WoSkinny,
    WoTriton,
    choose_kernel,
    usable,
)
from tests.helpers import rel_error

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = torch.device("cuda")


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
    kernels = usable(DEV, ScaleLayout(layout))
    assert WoSkinny in kernels or not triton_available()
    for kernel in kernels:
        y = fp8_linear(x, w, s, b, kernel=kernel)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16, kernel.name
        # Weight-only kernels see only bf16 output rounding; W8A8 ones add FP8
        # activation rounding (about 2**-4 relative per element).
        # (wo_skinny at 2+ tokens rounds activations to FP8 per 128-wide K tile)
        weight_only = kernel in (WoTriton, Dequant) or (kernel is WoSkinny and m == 1)
        assert rel_error(y, ref) < (1e-2 if weight_only else 6e-2), (kernel.name, rel_error(y, ref))
    # the selected path: weight-only at one token, W8A8 numerics above
    assert rel_error(fp8_linear(x, w, s, b), ref) < (1e-2 if m == 1 else 6e-2)


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
            assert rel_error(y, ref) < (6e-2 if mma == 2 else 1e-2), (cfg, rel_error(y, ref))
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
        assert rel_error(y, ref) < tol, (cfg, rel_error(y, ref))
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
    rule = ts.Config(True, 64, 128, 4, 3, 4 * ts.sm_count(0), ts.MMA_PREPARED)
    # the default (tuned tile or rule: K in one piece), no split, wide tiles, with and without
    # TMA, K cut to fill the waves, K in three pieces
    cfgs = (rule._replace(programs=1), rule._replace(block_n=128, block_k=256), rule, rule._replace(split=3))
    for cfg in (None, *cfgs):
        for tma in (False, True) if cfg is not None else (False,):
            c = cfg._replace(tma=tma) if cfg is not None else None
            y = ts.skinny_linear(xq, w, s, b, config=c, x_scale=xs, out_dtype=torch.bfloat16)
            assert y.dtype == torch.bfloat16 and y.shape == (m, n)
            assert rel_error(y, ref) < 1e-2, (c, rel_error(y, ref))
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
        assert rel_error(c, _ref(x * 2, w, s, None)) < (1e-2 if narrow else 6e-2)


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
            assert rel_error(y, ref) < 1e-2, (cfg, rel_error(y, ref))
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
            assert rel_error(plain, ref) < 1e-2, (cfg, rel_error(plain, ref))
            for ahead in (1, 2):
                y = ts.skinny_linear(x, w, s, b, config=cfg._replace(first_ahead=ahead))
                assert torch.equal(y, plain), (cfg, ahead)


@pytest.mark.parametrize(
    "candidates",
    [
        {(4096, 8192): (2, 1024, 4, 1, 4), (32768, 4096): (2, 1024, 4, 2, 4)},
        {(4096, 8192): (2, 2048, 8, 2, 4), (32768, 4096): (8, 2048, 8, 1, 12)},
        {(4096, 8192): (8, 2048, 8, 1, 4), (32768, 4096): (8, 1024, 4, 2, 4)},  # the H200 sweep's bests
    ],
)
def test_one_token_candidates_in_a_replaced_table_match_reference(
    candidates: dict[tuple[int, int], tuple[int, int, int, int, int]],
) -> None:
    """fp8_linear at one token on Qwen3.5-397B's fc / o and head shapes, with candidate narrow-GEMV
    entries (rows, block_k, warps, first_ahead, waves) in place of the table's
    (``tuning.replaced``: what the drafter-step benchmark times), launches those entries and
    matches the dequantized reference as the table's entries do."""
    if not triton_available():
        pytest.skip("needs triton")
    import dataclasses

    from mtpconv.kernels import triton_skinny as ts

    table = tuning.for_device(DEV)
    entries = {
        (1, n, k): tuning.Entry(False, rows, block_k, warps, 3, waves, 0, False, True, first_ahead=first)
        for (n, k), (rows, block_k, warps, first, waves) in candidates.items()
    }
    swapped = dataclasses.replace(table, skinny={**table.skinny, **entries})
    sms = ts.sm_count(0)
    for (_, n, k), entry in entries.items():
        x, w, s, _ = _case(1, n, k, "tensor", bias=False)
        ref = _ref(x, w, s, None)
        own = fp8_linear(x, w, s)
        with tuning.replaced(swapped):
            assert ts.default_config(1, n, k, sms) == ts._tabled(entry, sms)
            named = fp8_linear(x, w, s)
        assert rel_error(own, ref) < 1e-2 and rel_error(named, ref) < 1e-2, (
            n,
            k,
            rel_error(own, ref),
            rel_error(named, ref),
        )


def test_narrow_configuration_refuses_more_than_four_tokens() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, _ = _case(5, 256, 1024, "tensor", bias=False)
    cfg = ts.Config(False, 4, 1024, 4, 3, 132, narrow=True)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        ts.skinny_linear(x, w, s, config=cfg)


def test_triton_gemv_and_dot_agree_for_few_tokens() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_fp8

    x, w, s, _ = _case(4, 4096, 2048, per_row=False, bias=False)
    a = triton_fp8.wo_linear(x, w, s, gemv=True)
    c = triton_fp8.wo_linear(x, w, s, gemv=False)
    assert rel_error(a, c) < 1e-2


def test_triton_per_token_quant_matches_torch() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_quant

    x = (torch.randn(37, 5120, device=DEV) * 3).to(torch.bfloat16)
    q, s = triton_quant.quant_per_token(x)
    q_ref, s_ref = reference.quant_per_token(x)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    # Triton's float32 division may differ from torch's in the last bit, which
    # can flip a rounding tie: allow a tiny fraction of one-step differences.
    differ = (q.float() != q_ref.float()).float().mean().item()
    assert differ < 1e-3
    assert rel_error(q.float() * s, x.float()) < 0.05


@pytest.mark.parametrize(
    ("rows", "k"),
    [(1, 10240), (4, 17408), (16, 17408), (16, 5120), (4, 34816), (3, 8193), (40, 1024), (64, 34816)],
)
def test_split_rows_per_token_quant_matches_torch_in_graph_replays(rows: int, k: int) -> None:
    """Rows wider than ``TOKEN_CHUNK`` are split across programs that agree on each row's
    amax through counters that only grow: the same scales as torch's, every time, eagerly
    and over CUDA-graph replays of two launches (rows of 1e-3 to 1e4)."""
    if not triton_available():
        pytest.skip("needs triton")
    from mtpconv.kernels import triton_quant

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    parts = triton_quant.token_parts(rows, k, sms)
    assert rows * parts <= sms or parts == 1
    spread = torch.logspace(-3, 4, rows, device=DEV)[:, None]
    x = (torch.randn(rows, k, device=DEV) * spread).to(torch.bfloat16)
    y = (torch.randn(rows, k, device=DEV) * spread * 3).to(torch.bfloat16)

    def check(q: torch.Tensor, s: torch.Tensor, ref_of: torch.Tensor) -> None:
        q_ref, s_ref = reference.quant_per_token(ref_of)
        torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
        assert (q.float() != q_ref.float()).float().mean().item() < 1e-3

    for _ in range(3):
        check(*triton_quant.quant_per_token(x), x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out1 = triton_quant.quant_per_token(x)
        out2 = triton_quant.quant_per_token(y)
    for scale in (1.0, 1e-3, 300.0):
        x.copy_((x.float() * scale).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        check(*out1, x)
        check(*out2, y)


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
    from mtpconv.kernels import SKINNY_MAX_TOKENS
    from mtpconv.kernels.linear import Call, ScaledMmFused

    if torch.cuda.get_device_capability() < (8, 9) or not triton_available():
        pytest.skip("needs sm_89+ and triton")
    for scale in (ScaleLayout.TENSOR, ScaleLayout.ROW):
        assert choose_kernel(DEV, Call(1, 256, 512, scale)) is WoSkinny
        assert choose_kernel(DEV, Call(SKINNY_MAX_TOKENS, 256, 512, scale)) is WoSkinny
    assert choose_kernel(DEV, Call(SKINNY_MAX_TOKENS + 1, 256, 512, ScaleLayout.TENSOR)) is ScaledMmFused
    assert choose_kernel(DEV, Call(64, 256, 512, ScaleLayout.BLOCK)) is WoSkinny


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
    # Qwen3-Next-80B qkv is a skinny_token shape at 2-16 tokens: fp8_linear takes skinny_token
    # there (bit-identical to calling that kernel, and to quant_per_token then the prepared
    # launch) and stays within W8A8 error, with one weight scale and with a scale per row.
    from mtpconv.kernels import triton_quant, triton_skinny

    for m, per_row in ((2, False), (4, True), (9, False), (16, True)):
        x, w, s, b = _case(m, 9216, 2048, per_row=per_row, bias=m == 9)
        got = fp8_linear(x, w, s, b)
        assert torch.equal(got, fp8_linear(x, w, s, b, kernel=SkinnyToken)), m
        q, sa = triton_quant.quant_per_token(x)
        assert torch.equal(got, triton_skinny.skinny_linear(q, w, s, b, x_scale=sa, out_dtype=x.dtype)), m
        ref = reference.dequant_linear(x.double(), w, s.double(), None if b is None else b.double())
        assert rel_error(got, ref) < 6e-2, m


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
