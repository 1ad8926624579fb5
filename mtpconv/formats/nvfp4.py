"""NVFP4 unpacking and dequantization, ModelOpt and compressed-tensors storage (DESIGN §3).

Both store two e2m1 codes per byte (element ``2j`` in the low nibble, ``2j+1`` in the high
nibble) and one float8_e4m3fn scale per 16 inputs ``[out, in/16]``. They differ only in
names and in the global scale:

- ModelOpt: ``weight`` uint8 ``[out, in/2]``, ``weight_scale``, ``weight_scale_2`` float32
  (a multiplier): ``w = E2M1[code] * weight_scale * weight_scale_2``;
- compressed-tensors (llm-compressor ``nvfp4-pack-quantized``): ``weight_packed``,
  ``weight_scale``, ``weight_global_scale`` float32 (a divisor, ``1 / weight_scale_2``):
  ``w = E2M1[code] * weight_scale / weight_global_scale``.
"""

from __future__ import annotations

import torch

GROUP_SIZE = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_e2m1_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[out, in/2]`` -> uint8 codes ``[out, in]`` (low nibble first)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"NVFP4 weights are uint8, got {packed.dtype}")
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_e2m1_codes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_e2m1_codes` (used by test factories)."""
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _block_scaled(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """``E2M1[code(i, j)] * float(weight_scale[i, j // 16])`` in float32 (exact: both factors
    have at most 4 significant bits, so the product fits float32's mantissa)."""
    codes = unpack_e2m1_codes(weight)
    in_features = codes.shape[-1]
    if weight_scale.shape[-1] * GROUP_SIZE != in_features:
        raise ValueError(
            f"NVFP4 weight_scale has {weight_scale.shape[-1]} groups for {in_features} inputs; "
            f"expected {in_features // GROUP_SIZE} (group size {GROUP_SIZE})"
        )
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=weight.device)
    values = table[codes.long()]
    return values * weight_scale.to(torch.float32).repeat_interleave(GROUP_SIZE, dim=-1)


def _scalar(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.numel() != 1:
        raise ValueError(f"NVFP4 {name} must hold one value, got shape {list(t.shape)}")
    return t.to(torch.float32).reshape(())


def dequantize_nvfp4(
    weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor
) -> torch.Tensor:
    """Exact float32 value of a ModelOpt NVFP4 weight.

    ``w[i, j] = E2M1[code(i, j)] * float(weight_scale[i, j // 16]) * weight_scale_2``.
    """
    return _block_scaled(weight, weight_scale) * _scalar(weight_scale_2, "weight_scale_2")


def dequantize_nvfp4_ct(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_global_scale: torch.Tensor
) -> torch.Tensor:
    """Float32 value of a compressed-tensors NVFP4 weight (DESIGN §3).

    ``w[i, j] = E2M1[code(i, j)] * float(weight_scale[i, j // 16]) / weight_global_scale``,
    a true division (``1 / weight_global_scale`` is rarely exact in float32).
    """
    global_scale = _scalar(weight_global_scale, "weight_global_scale")
    if not bool(torch.isfinite(global_scale)) or float(global_scale) == 0.0:
        raise ValueError(f"NVFP4 weight_global_scale must be finite and non-zero, got {float(global_scale)}")
    return _block_scaled(weight_packed, weight_scale) / global_scale
