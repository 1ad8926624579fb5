"""The benchmark drafter step's routing, sum and producer kernels (``benchmarks.kernels``) against torch.

Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/benchmarks/test_glue_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def torch_routing(logits: torch.Tensor, top_k: int, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits[:, :n_experts].double(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("tokens", [1, 4, 16, 33])
@pytest.mark.parametrize(("n_experts", "top_k"), [(512, 10), (64, 8), (100, 1), (256, 16)])
def test_topk_softmax_matches_softmax_topk_renormalise(tokens: int, n_experts: int, top_k: int) -> None:
    from benchmarks.kernels import glue

    g = torch.Generator(device="cuda").manual_seed(tokens * 1000 + n_experts)
    # float32 logits: no two equal, so the ids must be exactly torch.topk's, in its order
    logits = torch.randn(tokens, n_experts, device="cuda", generator=g) * 3
    ids, w, gate = glue.topk_softmax(logits, top_k, n_experts, weight_dtype=torch.float32)
    ref_ids, ref_w = torch_routing(logits, top_k, n_experts)
    assert gate is None
    assert ids.dtype == torch.int64 and ids.shape == (tokens, top_k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("append", [False, True])
def test_topk_softmax_bf16_logits_and_shared_gate(append: bool) -> None:
    from benchmarks.kernels import glue

    n_experts, top_k, tokens = 512, 10, 7
    g = torch.Generator(device="cuda").manual_seed(3)
    # bf16 logits (as the router GEMM gives them) can tie: compare the picked values
    logits = (torch.randn(tokens, n_experts + 1, device="cuda", generator=g) * 2).to(torch.bfloat16)
    ids, w, gate = glue.topk_softmax(
        logits, top_k, n_experts, weight_dtype=torch.bfloat16, append_shared=append
    )
    ref_ids, ref_w = torch_routing(logits.float(), top_k, n_experts)
    routed = ids[:, :top_k]
    assert torch.equal(logits.gather(1, routed), logits.gather(1, ref_ids))
    assert all(len(set(row.tolist())) == top_k for row in routed)
    assert int(routed.max()) < n_experts
    torch.testing.assert_close(w[:, :top_k].double(), ref_w, rtol=1e-2, atol=1e-3)  # one bf16 rounding
    sig = torch.sigmoid(logits[:, n_experts:].float())
    if append:
        assert gate is None and ids.shape == (tokens, top_k + 1) and w.shape == (tokens, top_k + 1)
        assert torch.equal(ids[:, top_k], torch.full((tokens,), n_experts, device="cuda"))
        torch.testing.assert_close(w[:, top_k:].float(), sig, rtol=1e-2, atol=1e-3)
    else:
        assert gate is not None and gate.shape == (tokens, 1) and gate.dtype == torch.bfloat16
        torch.testing.assert_close(gate.float(), sig, rtol=1e-2, atol=1e-3)


def test_topk_softmax_refuses_what_does_not_fit() -> None:
    from benchmarks.kernels import glue

    logits = torch.zeros(2, 64, device="cuda")
    with pytest.raises(ValueError, match="64 experts, top 65"):
        glue.topk_softmax(logits, 65, 64, weight_dtype=torch.float32)
    with pytest.raises(ValueError, match="for 32 experts"):
        glue.topk_softmax(logits, 4, 32, weight_dtype=torch.float32)
    with pytest.raises(ValueError, match="append_shared needs the shared gate"):
        glue.topk_softmax(logits, 4, 64, weight_dtype=torch.float32, append_shared=True)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("tokens", "top_k", "hidden"), [(1, 10, 4096), (4, 11, 2048), (16, 8, 1000)])
def test_combine_matches_torch(tokens: int, top_k: int, hidden: int, shared: bool) -> None:
    from benchmarks.kernels import glue

    g = torch.Generator(device="cuda").manual_seed(tokens + top_k)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)

    h, rows = r(tokens, hidden), r(tokens * top_k, hidden)
    ref = h.float() + rows.float().view(tokens, top_k, hidden).sum(1)
    args: tuple[torch.Tensor, ...] = ()
    if shared:
        s, gate = r(tokens, hidden), torch.rand(tokens, 1, device="cuda", generator=g).to(torch.bfloat16)
        ref = ref + gate.float() * s.float()
        args = (s, gate)
    out = glue.combine(h, rows, *args)
    assert out.dtype == h.dtype and out.shape == h.shape
    torch.testing.assert_close(out.float(), ref, rtol=2**-7, atol=1e-5)


def test_combine_refuses_what_does_not_fit() -> None:
    from benchmarks.kernels import glue

    h = torch.zeros(2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not fit"):
        glue.combine(h, torch.zeros(3, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="come together"):
        glue.combine(h, torch.zeros(4, 64, device="cuda", dtype=torch.bfloat16), h)


def test_glue_in_a_cuda_graph() -> None:
    """Routing, SiLU * up and the sum captured once and replayed on new inputs."""
    from benchmarks.kernels import glue
    from mtpconv.kernels.triton_glue import silu_mul

    n_experts, top_k, tokens, hidden = 512, 10, 4, 2048
    g = torch.Generator(device="cuda").manual_seed(7)
    logits = torch.randn(tokens, n_experts + 1, device="cuda", generator=g)
    x = torch.randn(tokens, 2 * hidden, device="cuda", generator=g).to(torch.bfloat16)
    h = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, w, gate = glue.topk_softmax(logits, top_k, n_experts, weight_dtype=torch.float32)
        assert gate is not None
        y = silu_mul(x)
        rows = (y.float().repeat_interleave(top_k, 0) * w.reshape(-1, 1)).to(torch.bfloat16)
        return ids, w, glue.combine(h, rows, y, gate.to(torch.bfloat16))

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for scale in (1e-3, 1.0, 50.0):
        logits.copy_(torch.randn(logits.shape, device="cuda", generator=g) * scale)
        x.copy_(torch.randn(x.shape, device="cuda", generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        expected = run()
        for a, b in zip(out, expected, strict=True):
            assert torch.equal(a, b)


def _same_fp8(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))


@pytest.mark.parametrize("tokens", [1, 4, 16, 33])
@pytest.mark.parametrize("hidden", [2048, 5120, 100])
def test_producers_quantize_as_quant_per_token(tokens: int, hidden: int) -> None:
    """A linear's input prepared by its producer (the concatenation before fc, the slice of
    the attention stand-in, a residual add, the MoE sum) is bit for bit what the producer's
    output quantized by ``quant_per_token`` would be, and the producer's own output is
    unchanged (rows of 1e-3 to 1e4)."""
    from benchmarks.kernels import glue, producers
    from mtpconv.kernels import triton_quant, triton_quant_tensor

    g = torch.Generator(device="cuda").manual_seed(tokens * 7 + hidden)
    spread = torch.logspace(-3, 4, tokens, device="cuda")[:, None]

    def rows(width: int = hidden, per_token: int = 1) -> torch.Tensor:
        x = torch.randn(tokens * per_token, width, device="cuda", generator=g)
        return (x * spread.repeat_interleave(per_token, 0)).to(torch.bfloat16)

    a, b = rows(), rows()
    assert _same_fp8(producers.quant_cat(a, b), triton_quant.quant_per_token(torch.cat((a, b), -1)))
    total, q, s = producers.add_quant(a, b)
    assert torch.equal(total, a + b)
    assert _same_fp8((q, s), triton_quant.quant_per_token(a + b))
    total, q, s = producers.add_quant_tensor(a, b)  # one scale for the tensor
    assert torch.equal(total, a + b) and s.dim() == 0
    assert _same_fp8((q, s), triton_quant_tensor.quant_per_tensor(a + b))
    wide = rows(width=3 * hidden)
    assert _same_fp8(
        triton_quant.quant_per_token(wide[:, :hidden]),
        triton_quant.quant_per_token(wide[:, :hidden].contiguous()),
    )
    q, s = triton_quant.quant_per_token(a)
    assert float((q.float() * s - a.float()).norm() / a.float().norm()) < 6e-2
    experts = rows(per_token=4)
    gate = torch.rand(tokens, 1, device="cuda", generator=g).to(torch.bfloat16)
    for extra in ((), (b, gate)):
        out, q, s = glue.combine_quant(a, experts, *extra)
        assert torch.equal(out, glue.combine(a, experts, *extra))
        assert _same_fp8((q, s), triton_quant.quant_per_token(out))


def test_producers_refuse_what_does_not_fit() -> None:
    from benchmarks.kernels import producers

    a = torch.randn(4, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="quant_cat"):
        producers.quant_cat(a, a[:3])
    with pytest.raises(ValueError, match="add_quant"):
        producers.add_quant(a, a[:, :32])
    with pytest.raises(ValueError, match="add_quant"):
        producers.add_quant(a, a.half())
    with pytest.raises(ValueError, match="add_quant_tensor"):
        producers.add_quant_tensor(a, a[:3])
    with pytest.raises(ValueError, match="one pass takes"):
        big = torch.zeros(4096 * 1024, device="cuda", dtype=torch.bfloat16)
        producers.add_quant_tensor(big, big)
