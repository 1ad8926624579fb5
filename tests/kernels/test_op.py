"""The custom op wrapping fp8_linear: same result, and it compiles as one full graph."""

from __future__ import annotations

import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_linear, fp8_linear_op


def _operands(n: int = 48, k: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = quantize_fp8(torch.randn(n, k, generator=g))
    return q.weight, q.scale, torch.randn(n, generator=g)


def test_op_equals_function() -> None:
    w, s, b = _operands()
    x = torch.randn(5, 32)
    assert torch.equal(fp8_linear_op(x, w, s, b), fp8_linear(x, w, s, b))
    assert torch.equal(torch.ops.mtpconv.fp8_linear(x, w, s, None), fp8_linear(x, w, s))


def test_op_compiles_fullgraph_with_dynamic_tokens() -> None:
    w, s, b = _operands()
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp8_linear_op(x, w, s, b) * 2, fullgraph=True, dynamic=True, backend="eager")
    for tokens in (1, 3, 17):
        x = torch.randn(tokens, 32)
        assert torch.equal(f(x), fp8_linear(x, w, s, b) * 2)
