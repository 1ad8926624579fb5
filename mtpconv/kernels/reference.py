"""Pure-torch FP8 linear paths: the fallbacks and the oracles for the kernels.

Everything here runs on any device torch supports. ``dequant_linear`` is the
reference semantics of every path in this package::

    y = x @ (w_fp8.float() * w_scale).T + bias

with ``w_scale`` 0-d (per tensor), ``[N]`` (per output channel) or
``[ceil(N/128), ceil(K/128)]`` (one per 128x128 block), computed in float32
and cast to ``x.dtype``.
"""

from __future__ import annotations

import torch

from mtpconv.formats.fp8 import FP8_DTYPE, FP8_MAX
from mtpconv.formats.scale_layout import BLOCK, blocks

_TINY = torch.finfo(torch.float32).tiny


def is_block_scale(w_scale: torch.Tensor, n: int, k: int) -> bool:
    """Whether ``w_scale`` is one scale per 128x128 block of an ``[n, k]`` weight."""
    return w_scale.dim() == 2 and tuple(w_scale.shape) == (blocks(n), blocks(k)) != (n, 1)


def expand_block_scale(w_scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``[ceil(n/128), ceil(k/128)]`` block scales as a float32 ``[n, k]`` tensor."""
    s = w_scale.to(torch.float32)
    return s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


def _row_scale(w_scale: torch.Tensor) -> torch.Tensor:
    s = w_scale.to(torch.float32)
    return s.reshape(-1) if s.numel() > 1 else s.reshape(())


def dequant_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference FP8 weight-only linear in float32 (slow: upcasts the weight)."""
    n, k = w_fp8.shape
    if is_block_scale(w_scale, n, k):
        w32 = w_fp8.to(torch.float32) * expand_block_scale(w_scale, n, k)
        y = x.to(torch.float32) @ w32.t()
    else:
        y = x.to(torch.float32) @ w_fp8.to(torch.float32).t()
        y = y * _row_scale(w_scale)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def quant_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor activation quantization as separate torch ops."""
    x32 = x.to(torch.float32)
    scale = torch.clamp(x32.abs().amax(), min=_TINY) / FP8_MAX
    q = torch.clamp(x32 / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quant_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token (per-row) activation quantization: scale ``[M, 1]``."""
    x32 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    scale = torch.clamp(x32.abs().amax(dim=-1, keepdim=True), min=_TINY) / FP8_MAX
    q = torch.clamp(x32 / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def scaled_mm(
    q: torch.Tensor,
    w_fp8: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``torch._scaled_mm`` with the weight as stored (``[N, K]`` row-major)."""
    return torch._scaled_mm(q, w_fp8.t(), scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)
