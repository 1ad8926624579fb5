"""ModelOpt NVFP4 unpacking and dequantization (DESIGN §3).

``weight`` is uint8 ``[out, in/2]``: element ``2j`` in the low nibble, ``2j+1``
in the high nibble, each an e2m1 code. ``weight_scale`` is float8_e4m3fn
``[out, in/16]``, ``weight_scale_2`` a float32 scalar.
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


def dequantize_nvfp4(
    weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor
) -> torch.Tensor:
    """Exact float32 value of an NVFP4 weight.

    ``w[i, j] = E2M1[code(i, j)] * float(weight_scale[i, j // 16]) * weight_scale_2``.
    """
    codes = unpack_e2m1_codes(weight)
    in_features = codes.shape[-1]
    if weight_scale.shape[-1] * GROUP_SIZE != in_features:
        raise ValueError(
            f"NVFP4 weight_scale has {weight_scale.shape[-1]} groups for {in_features} inputs; "
            f"expected {in_features // GROUP_SIZE} (group size {GROUP_SIZE})"
        )
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=weight.device)
    values = table[codes.long()]
    group_scale = weight_scale.to(torch.float32).repeat_interleave(GROUP_SIZE, dim=-1)
    return values * group_scale * weight_scale_2.to(torch.float32).reshape(())
