"""CUDA tests of the benchmark step's grouped MoE kernels (``benchmarks.kernels.moe``) against
float64 references. Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/benchmarks/test_moe_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import Fp8Tensor, quantize_fp8
from mtpconv.kernels import triton_available
from tests.helpers import rel_error

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = torch.device("cuda")


@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 65])
@pytest.mark.parametrize("fp8", [True, False])
def test_grouped_moe_matches_reference(tokens: int, fp8: bool) -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from benchmarks.kernels import moe as triton_moe

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
    assert rel_error(out, ref) < tol
    if fp8 and tokens <= triton_moe.GROUPED_MAX_TOKENS:
        weight_only = triton_moe.moe_grouped(
            x, w, sc, ids, x_per_pair=False, config=(64, 128, 4, 3, triton_moe.DOT)
        )
        assert rel_error(weight_only, ref) < 1e-2
    xp = torch.randn(tokens * top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(tokens, top, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw)
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16).double()
    ref = torch.einsum("pk,pnk->pn", act, deq[flat]) * rw.reshape(-1, 1).double()
    assert rel_error(out, ref) < tol
    # glu: the experts as [gate; up], SiLU(gate) * up out of the epilogue (the fallback past
    # GROUPED_MAX_TOKENS applies it after wo_moe)
    y = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    ref = torch.nn.functional.silu(y[:, : n // 2]) * y[:, n // 2 :]
    out = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, glu=True)
    assert out.shape == (tokens * top, n // 2) and rel_error(out, ref) < tol


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("k", [256, 200, 1024])
def test_grouped_moe_one_token_fma_modes_match_reference(fp8: bool, k: int) -> None:
    """One token: the FMA mode and the narrow-load FMA mode are weight-only (rel. L2 < 1e-2),
    for a K that is and one that is not a multiple of the tile, and for tiles wider than K;
    also with SiLU(gate) * up out of the epilogue (``glu``, N / 2 columns not a multiple of
    the tile's), and ``routed_experts`` built on it. Each pair serving itself gives, bit for
    bit, what the routing checks of 2+ tokens give (``pair_checks``)."""
    if not triton_available():
        pytest.skip("needs triton")
    from benchmarks.kernels import moe as triton_moe

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

        def run(cfg: tuple[int, int, int, int, int] = cfg, checks: bool = False) -> list[torch.Tensor]:
            return [
                triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, config=cfg, pair_checks=checks),
                triton_moe.moe_grouped(
                    xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw, config=cfg, pair_checks=checks
                ),
                triton_moe.moe_grouped(
                    x, w, sc, ids, x_per_pair=False, glu=True, config=cfg, pair_checks=checks
                ),
            ]

        outs = run()
        for out, want in zip(outs, (ref, ref_act, ref_glu), strict=True):
            assert rel_error(out, want) < 1e-2, cfg
        for out, checked in zip(outs, run(checks=True), strict=True):
            assert torch.equal(out, checked), cfg
    # routed_experts at one token: the gate/up projection writes SiLU * up (glu, the default)
    # and the down projection reads it; within one BF16 rounding of the form before
    dn = quantize_fp8(torch.randn(e, k, n // 2, generator=g) * 0.05)
    down = (dn.weight.to(DEV), dn.scale.to(DEV)) if fp8 else (_dequantized(dn).to(torch.bfloat16), None)
    got = triton_moe.routed_experts(x, (w, sc), down, ids, rw)
    act1 = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, glu=True)
    assert torch.equal(got, triton_moe.moe_grouped(act1, *down, ids, x_per_pair=True, route_w=rw))
    before = triton_moe.routed_experts(x, (w, sc), down, ids, rw, glu=False)
    assert rel_error(got, before.double()) < 1e-2
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
    from benchmarks.kernels import moe as triton_moe

    g = torch.Generator().manual_seed(100 + tokens)
    top, n, k = 6, 192, 328
    w, sc, deq, ids = _fp8_experts(g, tokens, top, n, k)
    flat = ids.reshape(-1)
    mode = (64, 128, 4, 3, triton_moe.DOT_FP8)
    x = torch.randn(tokens, k, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(x, w, sc, ids, x_per_pair=False, config=mode)
    ref = torch.einsum("pk,pnk->pn", x.double()[torch.arange(tokens * top, device=DEV) // top], deq[flat])
    assert rel_error(out, ref) < 6e-2
    xp = torch.randn(tokens * top, 2 * k, generator=g).to(torch.bfloat16).to(DEV)
    rw = torch.rand(tokens, top, generator=g).to(torch.bfloat16).to(DEV)
    out = triton_moe.moe_grouped(xp, w, sc, ids, x_per_pair=True, act=True, route_w=rw, config=mode)
    act = (torch.nn.functional.silu(xp[:, :k].float()) * xp[:, k:].float()).to(torch.bfloat16).double()
    ref = torch.einsum("pk,pnk->pn", act, deq[flat]) * rw.reshape(-1, 1).double()
    assert rel_error(out, ref) < 6e-2
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
    from benchmarks.kernels import moe as triton_moe
    from benchmarks.kernels.producers import quant_act, quant_per_token

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
    aq, as_ = quant_act(xp)
    assert rel_error(aq.double() * as_.double(), act.double()) < 6e-2
    ref_act = torch.einsum("pk,pnk->pn", act.double(), deq[flat]) * rw.reshape(-1, 1).double()
    tiles = [(64, 64, 4, 3), (256, 128, 8, 4), (64, 256, 4, 5)]  # the last: K >= 4096's default
    for cfg in [None] + [(*t, triton_moe.DOT) for t in tiles]:
        out = triton_moe.moe_grouped(xq, w, sc, ids, x_per_pair=False, x_scale=xs, config=cfg)
        assert out.dtype == torch.bfloat16
        per_pair = (out.double() - ref).norm(dim=1) / ref.norm(dim=1)
        assert float(per_pair.max()) < 6e-2, cfg  # every row, whatever its magnitude
        out = triton_moe.moe_grouped(aq, w, sc, ids, x_per_pair=True, route_w=rw, x_scale=as_, config=cfg)
        assert rel_error(out, ref_act) < 6e-2, cfg
    # routed_experts on a gate_up / down pair: the two quantizations and launches above
    gu = quantize_fp8(torch.randn(e, 2 * 96, k, generator=g) * 0.05)
    dn = quantize_fp8(torch.randn(e, k, 96, generator=g) * 0.05)
    gu_w, gu_s, dn_w, dn_s = gu.weight.to(DEV), gu.scale.to(DEV), dn.weight.to(DEV), dn.scale.to(DEV)
    got = triton_moe.routed_experts(x, (gu_w, gu_s), (dn_w, dn_s), ids, rw)
    q1, s1 = quant_per_token(x)
    y = triton_moe.moe_grouped(q1, gu_w, gu_s, ids, x_per_pair=False, x_scale=s1)
    q2, s2 = quant_act(y)
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
    errors = (rel_error(got, chain_ref), rel_error(fused, chain_ref))
    assert max(errors) < 8e-2, errors
    # BF16 experts: SiLU * up by a launch of its own, then the MMA; weight-only numerics
    gu_b, dn_b = gu_w.to(torch.bfloat16), dn_w.to(torch.bfloat16)
    got = triton_moe.routed_experts(x, (gu_b, None), (dn_b, None), ids, rw)
    fused = triton_moe.routed_experts(x, (gu_b, None), (dn_b, None), ids, rw, split=False)
    assert rel_error(got, fused) < 1e-2
    with pytest.raises(ValueError, match="differ"):
        triton_moe.routed_experts(x, (gu_w, gu_s), (dn_b, None), ids, rw)


def test_grouped_moe_fp8_activations_refuse_what_does_not_fit() -> None:
    if not triton_available():
        pytest.skip("needs triton")
    from benchmarks.kernels import moe as triton_moe
    from benchmarks.kernels.producers import quant_act, quant_per_token

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
        quant_act(torch.randn(2, 127, device=DEV).to(torch.bfloat16))


@pytest.mark.parametrize(("rows", "k"), [(1, 10240), (4, 17408), (16, 17408), (3, 8193), (64, 34816)])
def test_silu_mul_rows_quantize_as_quant_per_token(rows: int, k: int) -> None:
    """``quant_act``: SiLU * up of ``[gate | up]`` rows quantized per token in one launch, bit for
    bit ``quant_per_token(silu_mul(x))`` (split rows included), eagerly and in graph replays."""
    if not triton_available():
        pytest.skip("needs triton")
    from benchmarks.kernels.producers import quant_act
    from mtpconv.kernels.triton_glue import silu_mul
    from mtpconv.kernels.triton_quant import quant_per_token

    spread = torch.logspace(-3, 4, rows, device=DEV)[:, None]
    pairs = (torch.randn(rows, 2 * k, device=DEV) * spread).to(torch.bfloat16)

    def same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
        return torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))

    assert same(quant_act(pairs), quant_per_token(silu_mul(pairs)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quant_act(pairs)
    for scale in (1.0, 1e-3, 300.0):
        pairs.copy_((pairs.float() * scale).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert same(out, quant_per_token(silu_mul(pairs)))
