"""FP8 e4m3 per-tensor quantization (the drafter's weight format).

Contract (DESIGN §5): ``scale = max(amax, tiny) / 448`` in float32,
``q = clamp(W / scale, -448, 448)`` rounded to nearest e4m3. A 2-D weight gets a
0-d float32 scale; a fused 3-D expert tensor ``[E, out, in]`` gets one scale per
expert (``[E]``). :func:`mtpconv.formats.fp8_table.replicate_scale` lays that value
out as the declared format needs it (one per output channel, one per 128x128 block):
replicated, so the stored FP8 bytes and the weights they dequantize to stay exactly
those of the per-tensor quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpconv.checkpoint.safetensors_io import torch_dtype
from mtpconv.formats.e4m3 import FP8_MAX
from mtpconv.formats.fp8_table import (
    HALF_DTYPES,
    TINY,
    NonFiniteWeightError,
    QuantError,
    quantize_table,
)

__all__ = [  # the torch API of the FP8 format; the numpy pieces it re-exports come first
    "FP8_MAX",
    "NonFiniteWeightError",
    "QuantError",
    "FP8_DTYPE",
    "Fp8Tensor",
    "fp8_scale",
    "quantize_fp8",
    "dequantize_fp8",
    "quant_error",
    "quantize_fp8_checked",
]

FP8_DTYPE = torch.float8_e4m3fn
# The 16-bit float dtypes the table path takes, by their safetensors names.
_HALF_NAMES = {torch_dtype(name): name for name in HALF_DTYPES}


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 e4m3 tensor and its float32 scale (0-d, or ``[E]`` for 3-D)."""

    weight: torch.Tensor
    scale: torch.Tensor


def fp8_scale(w: torch.Tensor) -> torch.Tensor:
    """Per-tensor (2-D) or per-expert (3-D) float32 scale of ``w``."""
    w32 = w.to(torch.float32)
    amax = w32.abs().amax(dim=(1, 2)) if w32.dim() == 3 else w32.abs().amax()
    return _div_fp8_max(torch.clamp(amax, min=float(TINY)))


def _div_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    # A 0-d tensor divisor, not a Python float: CUDA turns `t / 448.0` into a multiply by
    # the reciprocal (last-bit differences from the CPU); tensor / tensor divides exactly.
    return amax / torch.tensor(FP8_MAX, dtype=torch.float32, device=amax.device)


def _broadcast(scale: torch.Tensor, ndim: int) -> torch.Tensor:
    return scale.reshape(-1, 1, 1) if ndim == 3 and scale.dim() == 1 else scale


def quantize_fp8(w: torch.Tensor) -> Fp8Tensor:
    """Quantize a float weight to FP8 e4m3 with per-tensor (per-expert) scale.

    Runs on whatever device ``w`` lives on; CPU and CUDA give identical bytes
    because every step is an exactly rounded float32 operation.
    """
    if not torch.is_floating_point(w):
        raise TypeError(f"quantize_fp8 needs a floating tensor, got {w.dtype}")
    if w.dim() not in (2, 3):
        raise ValueError(f"quantize_fp8 needs a 2-D or 3-D weight, got shape {tuple(w.shape)}")
    w32 = w.to(torch.float32)
    scale = fp8_scale(w32)
    q = torch.clamp(w32 / _broadcast(scale, w32.dim()), -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Tensor(weight=q, scale=scale)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 weight and its scale back to float32."""
    return q.to(torch.float32) * _broadcast(scale.to(torch.float32), q.dim())


def quant_error(original: torch.Tensor, fp8: Fp8Tensor) -> QuantError:
    """Relative L2 and max-abs error of ``fp8`` against ``original``."""
    ref = original.to(torch.float32)
    diff = dequantize_fp8(fp8.weight, fp8.scale) - ref
    norm = float(torch.linalg.vector_norm(ref))
    err = float(torch.linalg.vector_norm(diff))
    return QuantError(
        rel_l2=err / norm if norm > 0 else 0.0,
        max_abs=float(diff.abs().max()) if diff.numel() else 0.0,
        amax=float(ref.abs().max()) if ref.numel() else 0.0,
    )


def _quantize_half_lut(w: torch.Tensor) -> tuple[Fp8Tensor, QuantError]:
    """FP8 quantization of a 16-bit float CPU tensor through the 65,536-entry table
    (:mod:`mtpconv.formats.fp8_table`): the bytes of :func:`quantize_fp8`, exact error
    statistics; a 3-D tensor is quantized per expert."""
    q, scale, error = quantize_table(w.contiguous().view(torch.uint16).numpy(), _HALF_NAMES[w.dtype])
    return Fp8Tensor(torch.from_numpy(q).view(FP8_DTYPE), torch.from_numpy(scale)), error


def quantize_fp8_checked(w: torch.Tensor) -> tuple[Fp8Tensor, QuantError]:
    """:func:`quantize_fp8` plus its error statistics; raises on NaN/Inf.

    16-bit CPU weights take the exact table path; everything else (float32,
    CUDA tensors) the direct one. Fused 3-D experts are quantized per expert.
    """
    if w.dim() in (2, 3) and w.device.type == "cpu" and w.dtype in _HALF_NAMES:
        return _quantize_half_lut(w)
    amax = w.abs().amax()
    if not bool(torch.isfinite(amax)):
        raise NonFiniteWeightError(int((~torch.isfinite(w)).sum()))
    fp8 = quantize_fp8(w)
    cpu = Fp8Tensor(weight=fp8.weight.cpu(), scale=fp8.scale.cpu())
    return fp8, quant_error(w.cpu(), cpu)
