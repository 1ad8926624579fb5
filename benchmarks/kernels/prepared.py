"""An FP8 linear on FP8 rows its producer prepared (``x * x_scale``), and where that pays.

The benchmark's drafter step hands a linear FP8 rows from the launch that writes its input
(:mod:`benchmarks.kernels.producers`) where :func:`takes_prepared` says the H200 measured it
faster than :func:`mtpconv.kernels.fp8_linear` on BF16 rows. vLLM's drafter forward writes
those inputs with its own kernels, so the plugin never does this.
"""

from __future__ import annotations

from enum import Enum

import torch

from mtpconv.kernels import reference, tuning
from mtpconv.kernels.linear import Device, ScaleLayout, scale_layout, scaled_mm_per_tensor


class Prepared(str, Enum):
    """What a linear's producer hands it in place of BF16 rows (:func:`takes_prepared`)."""

    TOKEN = "token"  # FP8 rows with one scale each: the skinny GEMM's FP8 MMA
    TENSOR = "tensor"  # FP8 rows with one scale for the tensor: cuBLAS (torch._scaled_mm)


def takes_prepared(tokens: int, n: int, k: int, table: tuning.Tuning | None = None) -> Prepared | None:
    """What makes a linear on an ``[n, k]`` weight at ``tokens`` rows faster than BF16 rows, when
    its producer quantizes as it writes, as the H200 measured: per-token FP8 rows on the shapes
    of the tuning table's ``prepared`` launches, per-tensor ones where ``fp8_linear`` would
    quantize per tensor itself (``scaled_mm_fused``); None elsewhere (one token, beyond 16,
    other shapes)."""
    table = table or tuning.for_device()
    bucket = tuning.token_bucket(tokens)
    if tokens < 2 or bucket is None:
        return None
    if (bucket, n, k) in table.prepared:
        return Prepared.TOKEN
    return Prepared.TENSOR if (bucket, n, k) in table.scaled_mm_fused else None


def prepared_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    x_scale: torch.Tensor,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    """``(x * x_scale) @ (w_fp8 * w_scale).T + bias`` for float8_e4m3fn rows ``x [..., K]`` with
    ``x_scale`` float32 0-d (one scale for the tensor) or one per row: cuBLAS with one scale
    for the tensor, the skinny GEMM's FP8 MMA with one a row (or 128x128 weight blocks), or the
    dequantized reference without Triton or CUDA."""
    if x.dtype != torch.float8_e4m3fn:
        raise TypeError(f"prepared_linear: x_scale comes with float8_e4m3fn rows, got {x.dtype}")
    if out_dtype is None:
        raise ValueError("prepared_linear: FP8 rows (x_scale) need an out_dtype")
    n, k = w_fp8.shape
    block = scale_layout(w_scale, n, k) is ScaleLayout.BLOCK
    tokens = x.numel() // max(x.shape[-1], 1)
    per_tensor = x_scale.dim() == 0
    if not per_tensor and x_scale.numel() != tokens:
        raise ValueError(
            f"prepared_linear: x_scale needs 0-d or one scale per row ({tokens}): {tuple(x_scale.shape)}"
        )
    sa = x_scale.to(torch.float32)
    device = Device.of(x.device)
    if device.triton:
        if per_tensor and not block and device.fp8_mma and n % 16 == 0 and k % 16 == 0:  # cuBLAS's rule
            y = scaled_mm_per_tensor(x.reshape(-1, x.shape[-1]), sa, w_fp8, w_scale, bias, out_dtype)
            return y.reshape(*x.shape[:-1], n)
        from mtpconv.kernels import triton_skinny

        rows = sa.expand(tokens) if per_tensor else sa
        out: torch.Tensor = triton_skinny.skinny_linear(
            x, w_fp8, w_scale, bias, x_scale=rows.contiguous(), out_dtype=out_dtype
        )
        return out
    deq = x.to(torch.float32) * (sa if per_tensor else sa.reshape(*x.shape[:-1], 1))
    return reference.dequant_linear(deq, w_fp8, w_scale, bias).to(out_dtype)
