"""``fp8_mlp``: a SiLU-gated MLP with FP8 weights (an MoE drafter's shared expert) in one call.

``(SiLU(x @ gate.T) * (x @ up.T)) @ down.T`` with ``gate_up = [gate; up]`` (``[2I, H]``) and
``down`` (``[H, I]``) stored FP8, each with its scale. On Hopper GPUs with Triton, 1-4 rows
and per-tensor or per-row scales take one launch
(:func:`mtpconv.kernels.triton_mlp.fused_mlp`), measured faster there than the three
launches it replaces (docs/BENCHMARKS.md, issue 12, twelfth session); everything else takes
those three: :func:`mtpconv.kernels.fp8_linear`, SiLU * up, :func:`fp8_linear`.
``MTPCONV_FUSED_MLP=0`` keeps the three launches everywhere.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from mtpconv.kernels import pdl
from mtpconv.kernels.linear import fp8_linear, triton_available

ENV = "MTPCONV_FUSED_MLP"
MAX_TOKENS = 4


def shapes_match(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """``x [..., H]``, ``gate_up [2I, H]``, ``down [H, I]``."""
    if gate_up.dim() != 2 or down.dim() != 2 or x.dim() == 0:
        return False
    two_i, h = gate_up.shape
    return two_i % 2 == 0 and x.shape[-1] == h and tuple(down.shape) == (h, two_i // 2)


def fits(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> bool:
    """Whether the one-launch kernel takes ``x [..., H]`` and these weights: 1-4 rows,
    contiguous FP8 ``[2I, H]`` / ``[H, I]`` weights with H a multiple of 16, per-tensor or
    per-row scales."""
    if not shapes_match(x, gate_up, down):
        return False
    two_i, h = gate_up.shape
    m = x.numel() // h if h else 0
    return (
        1 <= m <= MAX_TOKENS
        and gate_up.dtype == down.dtype == torch.float8_e4m3fn
        and gate_up.is_contiguous()
        and down.is_contiguous()
        and h % 16 == 0
        and gate_up_scale.numel() in (1, two_i)
        and down_scale.numel() in (1, h)
    )


def fused_here(x: torch.Tensor) -> bool:
    """Whether ``x``'s device takes the one-launch kernel: a Hopper (or newer) NVIDIA GPU,
    where it was measured, with Triton, unless ``MTPCONV_FUSED_MLP=0``."""
    if os.environ.get(ENV, "").strip() == "0":
        return False
    return x.device.type == "cuda" and triton_available() and pdl.hopper(x.device.index or 0)


def one_launch(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> bool:
    """Whether :func:`fp8_mlp` runs on these operands in one launch (else three)."""
    return fused_here(x) and fits(x, gate_up, gate_up_scale, down, down_scale)


def fp8_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> torch.Tensor:
    """``(SiLU(x @ gate.T) * (x @ up.T)) @ down.T`` for ``x [..., H]``; ``gate_up`` FP8
    ``[2I, H]`` (gate rows first), ``down`` FP8 ``[H, I]``, each scale 0-d, per row or (three
    launches only) 128x128 blocks. The output has ``x``'s dtype and leading shape."""
    if not shapes_match(x, gate_up, down):
        raise ValueError(
            f"fp8_mlp takes x [..., H], gate_up [2I, H] and down [H, I]: got x {tuple(x.shape)}, "
            f"gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}"
        )
    if one_launch(x, gate_up, gate_up_scale, down, down_scale):
        from mtpconv.kernels import triton_mlp

        return triton_mlp.fused_mlp(x, gate_up, gate_up_scale, down, down_scale)
    return three_launches(x, gate_up, gate_up_scale, down, down_scale)


def three_launches(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
) -> torch.Tensor:
    """:func:`fp8_mlp` as :func:`fp8_linear`, SiLU * up (one Triton launch on CUDA, torch
    ops elsewhere), :func:`fp8_linear`."""
    y = fp8_linear(x, gate_up, gate_up_scale)
    if y.is_cuda and triton_available() and y.numel():
        from mtpconv.kernels import triton_glue

        act = triton_glue.silu_mul(y.reshape(-1, y.shape[-1])).reshape(*y.shape[:-1], -1)
    else:
        i = y.shape[-1] // 2
        act = (F.silu(y[..., :i].float()) * y[..., i:].float()).to(y.dtype)
    return fp8_linear(act, down, down_scale)
