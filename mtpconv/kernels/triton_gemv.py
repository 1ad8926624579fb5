"""Weight-only FP8 GEMV for 1-4 tokens (Triton, CUDA only; imported lazily).

The skinny GEMM's ``Config.narrow`` kernel (:mod:`mtpconv.kernels.triton_skinny`
launches it): ``x @ (w_fp8 * w_scale).T`` on CUDA cores, weight-only numerics, built
so that nothing but weight loads and arithmetic sits in the K loop:

* weight loads of 8 bytes (a contiguity hint caps them), so the weight tile's register
  layout is that of the BF16/FP16 activation row (16-byte loads): no layout exchange
  through shared memory, so no barrier, on any K step (with ``block_k >= 256 * warps``;
  a smaller tile still gets one);
* each thread sums its own 8 products at once, so the accumulator is one float per 8
  weights (the registers of a full 2-D accumulator limited residency to half the SM);
* up to 4 tokens: each weight tile, widened once, meets every token's row (one
  accumulator per token), so the weights are read once for all of them.

With ``FIRST_AHEAD`` (``Config.first_ahead``, per tuned shape) the first one or two K
steps' weight tiles are loaded before the PDL wait: no kernel writes weights, so they are
on their way while the kernel before ends.

Split-K, the scale layouts and the epilogue are the skinny GEMM's
(:func:`mtpconv.kernels.triton_tile.finish_tile`).
"""

# Triton kernels are untyped by nature.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import triton
import triton.language as tl

from mtpconv.kernels.triton_quant import BLOCK_EDGE
from mtpconv.kernels.triton_tile import finish_tile, pdl_enter, pdl_leave, weight_tile

MAX_TOKENS = 4


@triton.jit
def _row(ptrs, ok, mask_k, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    return tl.load(ptrs, mask=ok & mask_k, other=0.0).to(tl.float32)


@triton.jit
def _dot8(wf, xv, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Per thread: the sums of 8 contiguous products of each weight row with ``xv``."""
    return tl.sum(tl.reshape(wf * xv[None, :], (BLOCK_N, BLOCK_K // 8, 8)), axis=2)


@triton.jit
def _accumulate(
    w, x_ptrs, stride_xm, row0, M, mask_k, acc0, acc1, acc2, acc3, s_ptr, offs_n, mask_n, k_at, stride_sn,
    SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One K step: the weight tile ``w`` (as loaded) against each token's activations."""
    wf = w.to(tl.float32)
    if SCALE == 2:
        sb = tl.load(s_ptr + (offs_n // BLOCK_EDGE) * stride_sn + k_at // BLOCK_EDGE, mask=mask_n, other=0.0)
        wf = wf * sb[:, None]
    acc0 += _dot8(wf, _row(x_ptrs, row0 < M, mask_k, EVEN_K), BLOCK_N, BLOCK_K)
    if BLOCK_M > 1:
        acc1 += _dot8(wf, _row(x_ptrs + stride_xm, row0 + 1 < M, mask_k, EVEN_K), BLOCK_N, BLOCK_K)
    if BLOCK_M > 2:
        acc2 += _dot8(wf, _row(x_ptrs + 2 * stride_xm, row0 + 2 < M, mask_k, EVEN_K), BLOCK_N, BLOCK_K)
        acc3 += _dot8(wf, _row(x_ptrs + 3 * stride_xm, row0 + 3 < M, mask_k, EVEN_K), BLOCK_N, BLOCK_K)
    return acc0, acc1, acc2, acc3


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    k_per_split,
    n_split,
    stride_xm,
    stride_wn,
    stride_om,
    stride_sn,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
    FIRST_AHEAD: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = tl.program_id(2) * BLOCK_M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), 8), 8)
    mask_n = offs_n < N
    k_start = pid_k * k_per_split
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    x_ptrs = x_ptr + row0 * stride_xm + k_start + offs_k
    acc0 = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    mask_k = (k_start + offs_k) < K  # replaced on every K step when K is uneven
    if FIRST_AHEAD > 0:
        # The first FIRST_AHEAD K steps' weight tiles are loaded before the PDL wait (no
        # kernel writes weights), so that they are on their way while the previous kernel ends.
        w = weight_tile(w_ptrs, mask_n, mask_k, EVEN_K)
        if FIRST_AHEAD > 1:
            mask_k1 = mask_k
            if not EVEN_K:
                mask_k1 = (k_start + BLOCK_K + offs_k) < K
            w1 = weight_tile(w_ptrs + BLOCK_K, mask_n, mask_k1, EVEN_K)
        pdl_enter(PDL)
        acc0, acc1, acc2, acc3 = _accumulate(
            w, x_ptrs, stride_xm, row0, M, mask_k, acc0, acc1, acc2, acc3, s_ptr, offs_n, mask_n, k_start,
            stride_sn, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
        )  # fmt: skip
        if FIRST_AHEAD > 1:
            acc0, acc1, acc2, acc3 = _accumulate(
                w1, x_ptrs + BLOCK_K, stride_xm, row0, M, mask_k1, acc0, acc1, acc2, acc3, s_ptr, offs_n,
                mask_n, k_start + BLOCK_K, stride_sn, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
            )  # fmt: skip
        w_ptrs += FIRST_AHEAD * BLOCK_K
        x_ptrs += FIRST_AHEAD * BLOCK_K
    else:
        pdl_enter(PDL)
    for kk in range(FIRST_AHEAD * BLOCK_K, k_per_split, BLOCK_K):
        if not EVEN_K:
            mask_k = (k_start + kk + offs_k) < K
        w = weight_tile(w_ptrs, mask_n, mask_k, EVEN_K)
        acc0, acc1, acc2, acc3 = _accumulate(
            w, x_ptrs, stride_xm, row0, M, mask_k, acc0, acc1, acc2, acc3, s_ptr, offs_n, mask_n,
            k_start + kk, stride_sn, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
        )  # fmt: skip
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    pdl_leave(PDL)
    if BLOCK_M == 1:
        acc = tl.reshape(tl.sum(acc0, axis=1), (BLOCK_N, 1))
    elif BLOCK_M == 2:
        acc = tl.join(tl.sum(acc0, axis=1), tl.sum(acc1, axis=1))
    else:  # join puts its operands on a new last axis: [n, i, j] holds token 2i + j
        acc = tl.reshape(
            tl.join(
                tl.join(tl.sum(acc0, axis=1), tl.sum(acc2, axis=1)),
                tl.join(tl.sum(acc1, axis=1), tl.sum(acc3, axis=1)),
            ),
            (BLOCK_N, 4),
        )
    offs_m = row0 + tl.arange(0, BLOCK_M)
    finish_tile(
        acc, s_ptr, b_ptr, o_ptr, ws_ptr, cnt_ptr, offs_n, offs_m, mask_n, offs_m < M, M, N, n_split,
        stride_om, SCALE, HAS_BIAS, USE_SPLIT,
    )  # fmt: skip


def block_m(m: int) -> int:
    """Tokens per program: 1, 2 or 4 (``m`` <= MAX_TOKENS)."""
    return 1 if m == 1 else (2 if m == 2 else 4)
