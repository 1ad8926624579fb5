"""``torch.ops.mtpconv.fp8_linear`` and ``torch.ops.mtpconv.fp8_mlp``: :func:`fp8_linear` and
:func:`fp8_mlp` as opaque PyTorch custom ops.

vLLM compiles the drafter's forward with ``torch.compile`` (one full graph, a
dynamic token dimension) and replays it in CUDA graphs. ``fp8_linear`` picks its
kernel from the token count and launches Triton kernels from Python; traced
directly, that choice would become a guard on the dynamic size. As a custom op
with a fake (shape-only) implementation the compiler sees one opaque call, and
the path is chosen at run time from the real shapes. ``fp8_mlp`` (a shared expert's
gate/up, SiLU * up and down) chooses between one launch and three the same way.
"""

from __future__ import annotations

import torch

from mtpconv.kernels.linear import fp8_linear
from mtpconv.kernels.mlp import fp8_mlp


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


@torch.library.custom_op("mtpconv::fp8_mlp", mutates_args=())
def fp8_mlp_op(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> torch.Tensor:
    """``(SiLU(x @ gate.T) * (x @ up.T)) @ down.T`` (see :func:`mtpconv.kernels.fp8_mlp`)."""
    return fp8_mlp(x, gate_up, gate_up_scale, down, down_scale)


@fp8_mlp_op.register_fake
def _(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], down.shape[0]))
