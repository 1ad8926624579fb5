"""``torch.ops.mtpconv.fp8_linear``: :func:`fp8_linear` as an opaque PyTorch custom op.

vLLM compiles the drafter's forward with ``torch.compile`` (one full graph, a
dynamic token dimension) and replays it in CUDA graphs. ``fp8_linear`` picks its
kernel from the token count and launches Triton kernels from Python; traced
directly, that choice would become a guard on the dynamic size. As a custom op
with a fake (shape-only) implementation the compiler sees one opaque call, and
the path is chosen at run time from the real shapes.
"""

from __future__ import annotations

import torch

from mtpconv.kernels.linear import fp8_linear


@torch.library.custom_op("mtpconv::fp8_linear", mutates_args=())
def fp8_linear_op(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (w_fp8 * w_scale).T + bias`` (see :func:`mtpconv.kernels.fp8_linear`)."""
    return fp8_linear(x, w_fp8, w_scale, bias)


@fp8_linear_op.register_fake
def _(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w_fp8.shape[0]))
