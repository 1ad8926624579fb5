"""Producers of a linear's FP8 input (Triton, CUDA only; imported lazily): the launch that
writes the input (a concatenation, a residual add, SiLU * up) also quantizes it, so that the
linear reads FP8 rows prepared by a launch the step makes anyway.

* ``quant_cat`` / ``add_quant`` / ``quant_act``: one scale per row, as
  :func:`mtpconv.kernels.triton_quant.quant_per_token` gives it;
* ``add_quant_tensor``: one scale for the tensor, as
  :func:`mtpconv.kernels.triton_quant_tensor.quant_per_tensor` gives it.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.triton_quant import quant_per_token, quantize_row_part, rows_of, token_launch
from mtpconv.kernels.triton_quant_tensor import ONCE_CHUNK, once_launch, one_pass_fits, quantize_chunk
from mtpconv.kernels.triton_tile import pdl_enter

__all__ = ["add_quant", "add_quant_tensor", "quant_act", "quant_cat", "quant_per_token"]

# What a row is (``MODE``): SiLU(gate) * up of a ``[gate | up]`` row of x; the row ``[x | y]``;
# the row ``x + y`` (also written out).
ACT, CAT, ADD = 1, 2, 3


@triton.jit
def _producer_kernel(
    x_ptr, y_ptr, sum_ptr, q_ptr, s_ptr, slots_ptr, cnt_ptr, K, KX, stride_xm, stride_ym, stride_qm,
    BLOCK_K: tl.constexpr, MODE: tl.constexpr, PARTS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    offs = part * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    if MODE == 2:  # [x | y]: the first KX columns from x, the rest from y
        in_x = offs < KX
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask & in_x, other=0.0).to(tl.float32)
        x += tl.load(y_ptr + row * stride_ym + offs - KX, mask=mask & ~in_x, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    if MODE == 1:  # [gate | up]: SiLU(gate) * up, rounded to x's dtype as a kernel writing it would
        u = tl.load(x_ptr + row * stride_xm + K + offs, mask=mask, other=0.0).to(tl.float32)
        x = (x / (1.0 + tl.exp(-x)) * u).to(x_ptr.dtype.element_ty).to(tl.float32)
    if MODE == 3:  # x + y, rounded to x's dtype and written (contiguous rows, as q's)
        total = (x + tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32)).to(
            sum_ptr.dtype.element_ty
        )
        tl.store(sum_ptr + row * stride_qm + offs, total, mask=mask)
        x = total.to(tl.float32)
    quantize_row_part(
        x, q_ptr, s_ptr, s_ptr, slots_ptr, cnt_ptr, row, part, offs, mask, stride_qm, False, PARTS
    )


def _produce(
    mode: int, x: torch.Tensor, y: torch.Tensor | None, k: int, total: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    launch = token_launch(m, k, x.device)
    if m:
        _producer_kernel[(m, launch.parts)](
            x, y if y is not None else x, total if total is not None else launch.q, launch.q, launch.scale,
            launch.slots, launch.counts, k, x.shape[1], x.stride(0), y.stride(0) if y is not None else 0,
            launch.q.stride(0), BLOCK_K=launch.block_k, MODE=mode, PARTS=launch.parts,
            num_warps=launch.warps, **pdl.producer_launch(x.device),
        )  # fmt: skip
    return launch.q, launch.scale


def quant_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quant_per_token(SiLU(gate) * up)`` of ``[gate | up]`` rows of width ``2K`` in one
    launch, SiLU * up rounded to x's dtype first (a MoE down projection's input)."""
    x2 = rows_of(x)
    if x2.shape[1] % 2:
        raise ValueError(f"quant_act: [gate | up] rows of even width, got {x2.shape[1]}")
    return _produce(ACT, x2, None, x2.shape[1] // 2)


def quant_cat(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quant_per_token(torch.cat((x, y), -1))`` in one launch, the concatenation never
    written (an MTP drafter's ``fc`` input: the embedding and hidden state side by side)."""
    x2, y2 = rows_of(x), rows_of(y)
    if x2.shape[0] != y2.shape[0] or x.dtype != y.dtype:
        raise ValueError(f"quant_cat: rows {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ")
    return _produce(CAT, x2, y2, x2.shape[1] + y2.shape[1])


def add_quant(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x + y, *quant_per_token(x + y))`` in one launch: a residual add whose sum is also
    the next linear's FP8 input (``[M, K]`` rows; the sum in x's dtype, as torch's add)."""
    x2, y2 = rows_of(x), rows_of(y)
    if x2.shape != y2.shape or x.dtype != y.dtype:
        raise ValueError(f"add_quant: {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ")
    total = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    q, s = _produce(ADD, x2, y2, x2.shape[1], total=total)
    return total.reshape(x.shape), q, s


@triton.jit
def _add_quant_tensor_kernel(
    x_ptr, y_ptr, sum_ptr, q_ptr, s_ptr, slots_ptr, cnt_ptr, numel,
    NPROG: tl.constexpr, SLOTS: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # x + y, rounded to x's dtype and written (a residual add), is what is quantized
    total = (x + tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + offs, total, mask=mask)
    quantize_chunk(total.to(tl.float32), q_ptr, s_ptr, slots_ptr, cnt_ptr, pid, offs, mask, NPROG, SLOTS)


def add_quant_tensor(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x + y, *quant_per_tensor(x + y))`` in one launch (a residual add whose sum is also
    the next linear's FP8 input, one scale for the tensor), up to ``ONCE_CHUNK`` x the SM
    count elements."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"add_quant_tensor: {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ"
        )
    if not one_pass_fits(x.numel(), x.device):
        raise ValueError(f"add_quant_tensor: {x.numel()} elements, one pass takes 1 to {ONCE_CHUNK} x SMs")
    xc, yc = x.contiguous(), y.contiguous()
    total = torch.empty_like(xc)
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    launch = once_launch(xc.numel(), x.device)
    _add_quant_tensor_kernel[(launch.nprog,)](
        xc, yc, total, q, s, launch.slots, launch.counts, xc.numel(),
        NPROG=launch.nprog, SLOTS=triton.next_power_of_2(launch.nprog), CHUNK=launch.chunk,
        num_warps=launch.warps, **pdl.producer_launch(x.device),
    )  # fmt: skip
    return total, q, s
