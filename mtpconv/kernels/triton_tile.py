"""Device-side pieces shared by the skinny GEMM and the GEMV (Triton, CUDA only).

:mod:`mtpconv.kernels.triton_skinny` and :mod:`mtpconv.kernels.triton_gemv` are one
launch per linear over a ``(n tiles, K pieces, m tiles)`` grid; these functions are the
parts of their kernels that are the same: the PDL entry, the weight-tile load and the
end of a tile (split-K reduction, scale, bias, store). Triton inlines them.
"""

# Triton kernels are untyped by nature.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With PDL on: wait for the previous kernel (everything after may read what it wrote)
    and, in mode ``early``, let the next kernel launch (:mod:`mtpconv.kernels.pdl`)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_leave(PDL: tl.constexpr):
    """With PDL in mode ``late``: let the next kernel launch (called after the main loop)."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def weight_tile(w_ptrs, mask_n, mask_k, EVEN_K: tl.constexpr):
    """One ``[BLOCK_N, BLOCK_K]`` weight tile, read once (evict first), zero past N and K."""
    if EVEN_K:
        return tl.load(w_ptrs, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
    return tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0, eviction_policy="evict_first")


@triton.jit
def finish_tile(
    acc,
    s_ptr,
    b_ptr,
    o_ptr,
    ws_ptr,
    cnt_ptr,
    offs_n,
    offs_m,
    mask_n,
    mask_m,
    M,
    N,
    n_split,
    stride_om,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_SPLIT: tl.constexpr,
):
    """One program's ``[BLOCK_N, BLOCK_M]`` partial sums: straight to the epilogue, or (split-K)
    into the workspace, the last of the tile's pieces to arrive summing them (grid
    ``(n tiles, pieces, m tiles)``)."""
    mask = mask_n[:, None] & mask_m[None, :]
    tile_off = offs_m[None, :] * N + offs_n[:, None]
    if USE_SPLIT:
        tl.store(ws_ptr + tl.program_id(1) * M * N + tile_off, acc, mask=mask)
        # Every thread's partial is issued before one thread bumps the counter
        # (release at GPU scope); the last piece reads the partials from L2.
        tl.debug_barrier()
        tile = tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == n_split - 1:
            acc = tl.zeros_like(acc)
            for s in range(0, n_split):
                acc += tl.load(ws_ptr + s * M * N + tile_off, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(acc, s_ptr, b_ptr, o_ptr, offs_n, offs_m, mask_n, mask, stride_om, SCALE, HAS_BIAS)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        _epilogue(acc, s_ptr, b_ptr, o_ptr, offs_n, offs_m, mask_n, mask, stride_om, SCALE, HAS_BIAS)


@triton.jit
def _epilogue(
    acc,
    s_ptr,
    b_ptr,
    o_ptr,
    offs_n,
    offs_m,
    mask_n,
    mask,
    stride_om,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    if SCALE == 0:
        acc = acc * tl.load(s_ptr)
    elif SCALE == 1:
        acc = acc * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    o_ptrs = o_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mask)
