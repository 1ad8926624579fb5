"""FP8 e4m3 per-tensor quantization (the drafter's weight format).

Contract (DESIGN §5): ``scale = max(amax, tiny) / 448`` in float32,
``q = clamp(W / scale, -448, 448)`` rounded to nearest e4m3. A 2-D weight gets a
0-d float32 scale; a fused 3-D expert tensor ``[E, out, in]`` gets one scale per
expert (``[E]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# Smallest positive normal float32: keeps an all-zero weight finite (scale > 0).
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 e4m3 tensor and its float32 scale (0-d, or ``[E]`` for 3-D)."""

    weight: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True)
class QuantError:
    """How far a dequantized FP8 tensor is from the original."""

    rel_l2: float
    max_abs: float
    amax: float


def fp8_scale(w: torch.Tensor) -> torch.Tensor:
    """Per-tensor (2-D) or per-expert (3-D) float32 scale of ``w``."""
    w32 = w.to(torch.float32)
    amax = w32.abs().amax(dim=(1, 2)) if w32.dim() == 3 else w32.abs().amax()
    return torch.clamp(amax, min=_TINY) / FP8_MAX


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
