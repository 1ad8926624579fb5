"""Triton weight-only FP8 linear ``wo_linear`` (CUDA only; imported lazily).

Nothing outside :mod:`mtpconv.kernels` imports this module; the package imports
it only when a CUDA tensor asks for a Triton path and ``triton`` is installed,
so CPU installs never need Triton.

``wo_linear``: FP8 e4m3 weights are read once and converted to the activation
dtype in registers; activations stay BF16/FP16; the per-tensor (0-d) or
per-row (``[N]``) weight scale is applied to the float32 accumulator. One
program per output block, no split-K (a GEMV at one token, swap-AB ``tl.dot``
above): the kernel of GPUs without FP8 tensor cores (``linear.WoTriton``).
``row_scale_cast``: the per-row weight scale (and bias) of a W8A8 GEMM's float32 output,
applied and cast in one kernel. The activation-quantization kernels live in
``triton_quant`` and ``triton_quant_tensor``.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _wo_dot_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    PER_ROW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Swapped operands: out.T[BLOCK_N, BLOCK_M] = W[BLOCK_N, K] @ x.T[K, BLOCK_M], so the
    # weight rows fill the MMA's M side (>= 16) and the few tokens its N side.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=mask_m[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            mask_k = (k0 + offs_k) < K
            xt = tl.load(x_ptrs, mask=mask_m[None, :] & mask_k[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(w.to(xt.dtype), xt, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if PER_ROW:
        scale = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
        acc = acc * scale[:, None]
    else:
        acc = acc * tl.load(s_ptr)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    o_ptrs = o_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


@triton.jit
def _wo_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    PER_ROW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # One output row per program column: the reduction runs on CUDA cores,
    # which costs nothing next to the weight bytes at one token.
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    x_ptrs = x_ptr + row * stride_xm + offs_k
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    # A [BLOCK_N] accumulator (reduced every step) keeps registers low, so many
    # programs stay resident and many weight bytes are in flight per SM.
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs).to(tl.float32)
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            mask_k = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=mask_k, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        out += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if PER_ROW:  # noqa: SIM108 - constexpr branch, kept as a statement for Triton
        out = out * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    else:
        out = out * tl.load(s_ptr)
    if HAS_BIAS:
        out += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * stride_om + offs_n, out.to(o_ptr.dtype.element_ty), mask=mask_n)


def gemv_config(n: int, k: int) -> tuple[int, int, int]:
    """BLOCK_N, BLOCK_K, num_warps for one-token GEMV (best of a sweep on the H200)."""
    if n >= 12288 and k >= 512:
        return 16, 512, 4
    return 4, min(2048, triton.next_power_of_2(k)), 8


def _dot_config(m: int, n: int, k: int) -> tuple[int, ...]:
    """BLOCK_M, BLOCK_N, BLOCK_K, num_warps[, num_stages] for the tensor-core path."""
    # Best of a sweep on the H200.
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_k = 128 if k >= 128 else max(16, triton.next_power_of_2(k))
    return block_m, 64, block_k, 4, 4


def wo_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: tuple[int, ...] | None = None,
    gemv: bool | None = None,
) -> torch.Tensor:
    """``x @ (w_fp8 * w_scale).T + bias`` with FP8 weights dequantized in registers."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = w_fp8.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    per_row = w_scale.numel() > 1
    b = bias if bias is not None else w_scale  # placeholder pointer when no bias
    use_gemv = (m <= 1) if gemv is None else gemv
    if use_gemv:
        block_n, block_k, warps = config if config is not None else gemv_config(n, k)
        grid = (triton.cdiv(n, block_n), m)
        _wo_gemv_kernel[grid](
            x2,
            w_fp8,
            w_scale,
            b,
            out,
            n,
            k,
            x2.stride(0),
            w_fp8.stride(0),
            out.stride(0),
            PER_ROW=per_row,
            HAS_BIAS=bias is not None,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            EVEN_K=k % block_k == 0,
            num_warps=warps,
        )
    else:
        cfg = config if config is not None else _dot_config(m, n, k)
        block_m, block_n, block_k, warps = cfg[:4]
        stages = cfg[4] if len(cfg) > 4 else 4
        grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
        _wo_dot_kernel[grid](
            x2,
            w_fp8,
            w_scale,
            b,
            out,
            m,
            n,
            k,
            x2.stride(0),
            w_fp8.stride(0),
            out.stride(0),
            PER_ROW=per_row,
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            EVEN_K=k % block_k == 0,
            num_warps=warps,
            num_stages=stages,
        )
    return out.reshape(*x.shape[:-1], n)


@triton.jit
def _row_scale_kernel(y_ptr, s_ptr, b_ptr, o_ptr, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    y = tl.load(y_ptr + row * N + offs, mask=mask, other=0.0) * tl.load(s_ptr + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * N + offs, y.to(o_ptr.dtype.element_ty), mask=mask)


def row_scale_cast(
    y32: torch.Tensor, row_scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """``(y32 * row_scale + bias).to(dtype)`` in one kernel: the per-row weight scale of
    a W8A8 GEMM run with a unit weight scale (``y32`` ``[M, N]`` float32, contiguous)."""
    m, n = y32.shape
    out = torch.empty((m, n), dtype=dtype, device=y32.device)
    s = row_scale.to(torch.float32).contiguous()
    block = 1024
    _row_scale_kernel[(triton.cdiv(n, block), m)](
        y32, s, bias if bias is not None else s, out, n, HAS_BIAS=bias is not None, BLOCK=block
    )
    return out
