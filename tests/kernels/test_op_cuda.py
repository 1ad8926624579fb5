"""The fp8_linear custom op under torch.compile + CUDA graphs, as vLLM runs a drafter.

Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/kernels/test_op_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_linear, fp8_linear_op

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_compiled_fullgraph_dynamic_and_graph_replay(layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    q = quantize_fp8(torch.randn(4096, 2048, generator=g) * 0.02)
    w = q.weight.cuda()
    if layout == "block":
        s = (torch.rand(32, 16, generator=g) * 1e-4 + 1e-4).cuda()
    else:
        s = (torch.rand(4096, generator=g) * 1e-4 + 1e-4).cuda() if layout == "row" else q.scale.cuda()
    b = torch.randn(4096, generator=g).cuda().to(torch.bfloat16)
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp8_linear_op(x, w, s, b), fullgraph=True, dynamic=True)
    for tokens in (1, 4, 16, 33):
        x = torch.randn(tokens, 2048, device="cuda").to(torch.bfloat16)
        assert torch.equal(f(x), fp8_linear(x, w, s, b))
    # capture and replay in a CUDA graph, as vLLM does for decode batch sizes
    x = torch.randn(8, 2048, device="cuda").to(torch.bfloat16)
    expected = fp8_linear(x, w, s, b)
    f(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        f(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x)
    x.copy_(x * 1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("per_row", [False, True])
def test_mlp_op_compiled_fullgraph_dynamic_and_graph_replay(per_row: bool) -> None:
    """``torch.ops.mtpconv.fp8_mlp`` (the plugin's shared-expert call) under inductor with a
    dynamic token count: bit-equal to ``fp8_mlp`` at one launch (1-4 tokens) and at three
    (more), and inside a captured CUDA graph."""
    from mtpconv.kernels import fp8_mlp, fp8_mlp_op

    g = torch.Generator().manual_seed(1)
    h, i = 4096, 1024  # Qwen3.5-397B's shared expert
    gu = quantize_fp8(torch.randn(2 * i, h, generator=g) / h**0.5)
    dn = quantize_fp8(torch.randn(h, i, generator=g) / i**0.5)
    gs, ds = gu.scale, dn.scale
    if per_row:
        gs = gs * (torch.rand(2 * i, generator=g) + 0.5)
        ds = ds * (torch.rand(h, generator=g) + 0.5)
    w = tuple(t.cuda() for t in (gu.weight, gs, dn.weight, ds))
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp8_mlp_op(x, *w) + x, fullgraph=True, dynamic=True)
    for tokens in (1, 3, 4, 16):
        x = torch.randn(tokens, h, device="cuda").to(torch.bfloat16)
        assert torch.equal(f(x), fp8_mlp(x, *w) + x), tokens
    x = torch.randn(2, h, device="cuda").to(torch.bfloat16)
    expected = fp8_mlp(x, *w) + x
    f(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    torch._dynamo.reset()
