"""FP8 e4m3 per-tensor quantization (the drafter's weight format).

Contract (DESIGN §5): ``scale = max(amax, tiny) / 448`` in float32,
``q = clamp(W / scale, -448, 448)`` rounded to nearest e4m3. A 2-D weight gets a
0-d float32 scale; a fused 3-D expert tensor ``[E, out, in]`` gets one scale per
expert (``[E]``). :func:`stored_scale` lays that value out as the declared format
needs it (one per output channel, one per 128x128 block): replicated, so the
stored FP8 bytes and the weights they dequantize to stay exactly those of the
per-tensor quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpconv.formats.fp8_table import (
    HALF_DTYPES,
    count_non_finite,
    histogram_and_lookup,
    is_non_finite_magnitude,
    max_magnitude,
)
from mtpconv.formats.scale_layout import ScaleLayout, stored_scale_shape

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
    return _div_fp8_max(torch.clamp(amax, min=_TINY))


def _div_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    # A 0-d tensor divisor, not a Python float: CUDA turns `t / 448.0` into a multiply by
    # the reciprocal (last-bit differences from the CPU); tensor / tensor divides exactly.
    return amax / torch.tensor(FP8_MAX, dtype=torch.float32, device=amax.device)


def stored_scale(
    scale: torch.Tensor, layout: ScaleLayout, shape: tuple[int, ...], fused_halves: bool = False
) -> torch.Tensor:
    """The per-tensor (0-d) or per-expert ([E]) ``scale`` replicated into ``layout``."""
    target = stored_scale_shape(layout, shape, fused_halves)
    s = scale.to(torch.float32)
    lead = len(shape) - 2
    s = s.reshape(*s.shape[:lead], *([1] * (len(target) - lead)))
    return s.expand(target).contiguous()


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


class NonFiniteWeightError(ValueError):
    """The weight holds NaN or Inf: no FP8 scale can represent it."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} NaN/Inf values")
        self.count = count


def _all_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern, viewed as ``dtype`` (index = bit pattern)."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.uint16).view(dtype)


def _quantize_half_lut(w: torch.Tensor) -> tuple[Fp8Tensor, QuantError]:
    """FP8 quantization of a 16-bit float CPU tensor through a 65,536-entry table.

    The bytes are those of :func:`quantize_fp8` (same float32 operations, applied
    once per pattern instead of once per element); amax, NaN/Inf and the error
    statistics follow exactly from the patterns (:mod:`mtpconv.formats.fp8_table`).
    """
    codes = w.contiguous().view(torch.uint16).reshape(-1).numpy()
    magnitude = max_magnitude(codes)
    if is_non_finite_magnitude(magnitude, w.dtype):
        raise NonFiniteWeightError(count_non_finite(codes, w.dtype))
    values = _all_codes(w.dtype).to(torch.float32)
    amax = values[magnitude]
    scale = _div_fp8_max(torch.clamp(amax, min=_TINY))
    finite = torch.isfinite(values)
    safe = torch.where(finite, values, torch.zeros_like(values))
    table = torch.clamp(safe / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    hist, q_bytes = histogram_and_lookup(codes, table.view(torch.uint8).numpy())
    q = torch.from_numpy(q_bytes).view(FP8_DTYPE).reshape(w.shape)
    present = torch.from_numpy(hist > 0)
    diff = (table.to(torch.float32) * scale - safe).double()
    counts = torch.from_numpy(hist).double()
    ref_norm = float((counts * safe.double() ** 2).sum().sqrt())
    err_norm = float((counts * diff**2).sum().sqrt())
    error = QuantError(
        rel_l2=err_norm / ref_norm if ref_norm > 0 else 0.0,
        max_abs=float(diff.abs()[present].max()) if codes.size else 0.0,
        amax=float(amax),
    )
    return Fp8Tensor(weight=q, scale=scale), error


def quantize_fp8_checked(w: torch.Tensor) -> tuple[Fp8Tensor, QuantError]:
    """:func:`quantize_fp8` plus its error statistics; raises on NaN/Inf.

    16-bit CPU weights take the exact table path; everything else (float32,
    CUDA tensors) the direct one. Fused 3-D experts are quantized per expert.
    """
    if w.dim() == 3 and w.device.type == "cpu" and w.dtype in HALF_DTYPES:
        parts = [_quantize_half_lut(w[e]) for e in range(w.shape[0])]
        weight = torch.stack([p.weight for p, _ in parts])
        scale = torch.stack([p.scale for p, _ in parts])
        norms = [(e.rel_l2, float(torch.linalg.vector_norm(w[i].float()))) for i, (_, e) in enumerate(parts)]
        total = sum(n * n for _, n in norms) ** 0.5
        rel = (sum((r * n) ** 2 for r, n in norms) ** 0.5 / total) if total > 0 else 0.0
        return Fp8Tensor(weight, scale), QuantError(
            rel_l2=rel, max_abs=max(e.max_abs for _, e in parts), amax=max(e.amax for _, e in parts)
        )
    if w.dim() == 2 and w.device.type == "cpu" and w.dtype in HALF_DTYPES:
        return _quantize_half_lut(w)
    amax = w.abs().amax()
    if not bool(torch.isfinite(amax)):
        raise NonFiniteWeightError(int((~torch.isfinite(w)).sum()))
    fp8 = quantize_fp8(w)
    cpu = Fp8Tensor(weight=fp8.weight.cpu(), scale=fp8.scale.cpu())
    return fp8, quant_error(w.cpu(), cpu)
