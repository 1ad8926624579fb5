"""``silu_mul``: ``SiLU(gate) * up`` of ``[T, 2I]`` rows in one Triton launch (CUDA only;
imported lazily): the step between an FP8 MLP's two linears when it runs in three launches
(:func:`mtpconv.kernels.mlp.three_launches`). Arithmetic is float32, the output rounded once.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.triton_tile import pdl_enter

ELEMENTS_PER_PROGRAM = 1024  # one program per token and chunk


@triton.jit
def _silu_mul_kernel(x_ptr, o_ptr, N, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + N + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(o_ptr + row * stride_o + offs, y.to(o_ptr.dtype.element_ty), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``SiLU(x[:, :I]) * x[:, I:]`` of ``x`` ``[T, 2I]``, one launch; ``[T, I]`` in x's dtype."""
    t, width = x.shape
    if width % 2 or x.stride(1) != 1:
        raise ValueError(f"silu_mul: x {tuple(x.shape)} is not [T, 2I] with contiguous rows")
    n = width // 2
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t:
        grid = (t, triton.cdiv(n, ELEMENTS_PER_PROGRAM))
        _silu_mul_kernel[grid](
            x, out, n, x.stride(0), out.stride(0), BLOCK=ELEMENTS_PER_PROGRAM,
            **pdl.producer_launch(x.device),
        )  # fmt: skip
    return out
