"""Routed experts as one GEMV per (token, expert) pair (Triton, CUDA only; imported lazily).

``wo_moe`` re-reads an expert for every token routed to it: the measured baseline of
the grouped kernel (:mod:`benchmarks.kernels.moe`), which falls back to it beyond
the tokens one of its tiles takes.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels.triton_fp8 import gemv_config


@triton.jit
def _wo_moe_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    o_ptr,
    N,
    K,
    TOPK,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    X_PER_PAIR: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    if X_PER_PAIR:  # noqa: SIM108 - constexpr branch, kept as a statement for Triton
        row = pair
    else:
        row = pair // TOPK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    x_ptrs = x_ptr + row * stride_xm + offs_k
    w_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
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
    if HAS_SCALE:
        out = out * tl.load(s_ptr + expert)
    tl.store(o_ptr + pair * stride_om + offs_n, out.to(o_ptr.dtype.element_ty), mask=mask_n)


def wo_moe(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    *,
    x_per_pair: bool,
) -> torch.Tensor:
    """Routed-expert GEMVs: output ``[T*topk, N]``, row ``p`` = x_row @ W[ids[p]].T * s.

    ``w`` is ``[E, N, K]`` (FP8 with ``w_scale`` ``[E]``, or BF16 with ``None``).
    ``x`` is ``[T, K]`` indexed by ``p // topk``, or ``[T*topk, K]`` when
    ``x_per_pair`` (the down projection's input).
    """
    ids = topk_ids.reshape(-1)
    pairs = ids.numel()
    topk = topk_ids.shape[-1]
    _, n, k = w.shape
    out = torch.empty((pairs, n), dtype=x.dtype, device=x.device)
    # the per-pair GEMV's tiles: those of triton_fp8.wo_linear's one-token GEMV
    block_n, block_k, warps = gemv_config(n * pairs, k)
    grid = (triton.cdiv(n, block_n), pairs)
    _wo_moe_kernel[grid](
        x,
        w,
        w_scale if w_scale is not None else ids,
        ids,
        out,
        n,
        k,
        topk,
        x.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        X_PER_PAIR=x_per_pair,
        HAS_SCALE=w_scale is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        num_warps=warps,
    )
    return out
