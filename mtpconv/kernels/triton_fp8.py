"""Triton kernels for FP8 drafter linears (imported lazily, CUDA only).

Nothing outside :mod:`mtpconv.kernels` imports this module; the package imports
it only when a CUDA tensor asks for a Triton path and ``triton`` is installed,
so CPU installs never need Triton.

Kernels:

* ``wo_linear``: weight-only FP8 linear. FP8 e4m3 weights are read once and
  converted to the activation dtype in registers; activations stay BF16/FP16;
  the per-tensor (0-d) or per-row (``[N]``) weight scale is applied to the
  float32 accumulator. At decode sizes the linear is bound by weight bytes,
  so this reads half of what a BF16 linear reads and launches one kernel.
* ``wo_moe``: the same idea for routed experts: one GEMV per (token, expert)
  pair against a 3-D ``[E, N, K]`` weight with one scale per expert.
* ``quant_per_token``: dynamic per-token activation quantization in one
  kernel (one program per row), optionally folding the weight scale into the
  row scale so ``torch._scaled_mm`` can run with a unit weight scale.
* ``quant_static``: activation quantization with a given scale.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Globals read inside @triton.jit functions must be tl.constexpr.
FP8_MAX = tl.constexpr(448.0)
# Smallest positive normal float32 (same floor as mtpconv.formats.fp8).
_TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def _wo_dot_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, o_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_om,
    PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
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
    x_ptr, w_ptr, s_ptr, b_ptr, o_ptr,
    N, K,
    stride_xm, stride_wn, stride_om,
    PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
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


@triton.jit
def _wo_moe_kernel(
    x_ptr, w_ptr, s_ptr, ids_ptr, o_ptr,
    N, K, TOPK,
    stride_xm, stride_we, stride_wn, stride_om,
    X_PER_PAIR: tl.constexpr, HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
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


@triton.jit
def _quant_per_token_kernel(
    x_ptr, q_ptr, s_ptr, ws_ptr,
    K, stride_xm, stride_qm,
    HAS_WS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(amax, _TINY) / FP8_MAX
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if HAS_WS:
        scale = scale * tl.load(ws_ptr)
    tl.store(s_ptr + row, scale)


@triton.jit
def _quant_static_kernel(x_ptr, q_ptr, s_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.clamp(x / tl.load(s_ptr), -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_tensor_kernel(
    x_ptr, q_ptr, s_ptr, amax_ptr, sync_ptr,
    numel, chunk,
    NPROG: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # Dynamic per-tensor quantization in ONE launch. With one program (small
    # activations: decode) it is a plain two-pass loop. With several, every
    # program folds its chunk's amax into a global atomic max, waits at a grid
    # barrier (NPROG is at most the SM count, so all programs are resident),
    # then quantizes its chunk with the global scale; the last program out
    # resets the barrier state for the next launch.
    pid = tl.program_id(0)
    start = pid * chunk
    local = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, chunk, BLOCK):
        offs = start + off + tl.arange(0, BLOCK)
        mask = (offs < numel) & (off + tl.arange(0, BLOCK) < chunk)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        local = tl.maximum(local, tl.abs(x))
    amax = tl.max(local, axis=0)
    if NPROG > 1:
        tl.atomic_max(amax_ptr, amax)
        arrived = tl.atomic_add(sync_ptr, 1) + 1
        while arrived < NPROG:
            arrived = tl.atomic_add(sync_ptr, 0)
        amax = tl.atomic_max(amax_ptr, 0.0)
    scale = tl.maximum(amax, _TINY) / FP8_MAX
    for off in range(0, chunk, BLOCK):
        offs = start + off + tl.arange(0, BLOCK)
        mask = (offs < numel) & (off + tl.arange(0, BLOCK) < chunk)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if pid == 0:
        tl.store(s_ptr, scale)
    if NPROG > 1:
        departed = tl.atomic_add(sync_ptr + 1, 1) + 1
        if departed == NPROG:
            tl.atomic_xchg(amax_ptr, 0.0)
            tl.atomic_xchg(sync_ptr, 0)
            tl.atomic_xchg(sync_ptr + 1, 0)


def _gemv_config(n: int, k: int) -> tuple[int, int, int]:
    """BLOCK_N, BLOCK_K, num_warps for one-token GEMV (best of a sweep on the H200)."""
    if n >= 12288 and k >= 512:
        return 16, 512, 4
    return 4, min(2048, triton.next_power_of_2(k)), 8


def _dot_config(m: int, n: int, k: int) -> tuple[int, ...]:
    """BLOCK_M, BLOCK_N, BLOCK_K, num_warps[, num_stages] for the tensor-core path."""
    # Best of a sweep on the H200 (scripts/bench_draft.py --sweep).
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
        block_n, block_k, warps = config if config is not None else _gemv_config(n, k)
        grid = (triton.cdiv(n, block_n), m)
        _wo_gemv_kernel[grid](
            x2, w_fp8, w_scale, b, out, n, k,
            x2.stride(0), w_fp8.stride(0), out.stride(0),
            PER_ROW=per_row, HAS_BIAS=bias is not None,
            BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
            num_warps=warps,
        )  # fmt: skip
    else:
        cfg = config if config is not None else _dot_config(m, n, k)
        block_m, block_n, block_k, warps = cfg[:4]
        stages = cfg[4] if len(cfg) > 4 else 4
        grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
        _wo_dot_kernel[grid](
            x2, w_fp8, w_scale, b, out, m, n, k,
            x2.stride(0), w_fp8.stride(0), out.stride(0),
            PER_ROW=per_row, HAS_BIAS=bias is not None,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], n)


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
    block_n, block_k, warps = _gemv_config(n * pairs, k)
    grid = (triton.cdiv(n, block_n), pairs)
    _wo_moe_kernel[grid](
        x, w, w_scale if w_scale is not None else ids, ids, out, n, k, topk,
        x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        X_PER_PAIR=x_per_pair, HAS_SCALE=w_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
        num_warps=warps,
    )  # fmt: skip
    return out


def quant_per_token(
    x: torch.Tensor, w_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token FP8 quantization: ``(q [M, K], scale [M, 1] float32)``.

    With ``w_scale`` (0-d) the returned scale is ``row_scale * w_scale``.
    """
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block_k = triton.next_power_of_2(k)
    warps = 4 if block_k <= 2048 else (8 if block_k <= 8192 else 16)
    _quant_per_token_kernel[(m,)](
        x2, q, s, w_scale if w_scale is not None else s, k, x2.stride(0), q.stride(0),
        HAS_WS=w_scale is not None, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    return q, s


# Activations up to this many elements are quantized by a single program.
SINGLE_PROGRAM_MAX = 96 * 1024
_SYNC: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _sync_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # One barrier state per (device, stream): launches on one stream are ordered.
    key = (device.index or 0, torch.cuda.current_stream(device).cuda_stream)
    state = _SYNC.get(key)
    if state is None:
        state = (
            torch.zeros(1, dtype=torch.float32, device=device),
            torch.zeros(2, dtype=torch.int32, device=device),
        )
        _SYNC[key] = state
    return state


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def quant_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor FP8 quantization in one kernel: ``(q [M, K], scale 0-d)``."""
    xc = x.reshape(-1, x.shape[-1])
    if not xc.is_contiguous():
        xc = xc.contiguous()
    numel = xc.numel()
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    amax, sync = _sync_state(x.device)
    if numel <= SINGLE_PROGRAM_MAX:
        # One program, no atomics: cheapest at decode sizes (two passes over
        # at most 192 KB that the previous kernel just wrote to L2).
        block = 4096
        chunk = triton.cdiv(numel, block) * block
        nprog, warps = 1, 16
    else:
        block = 1024
        per_prog = max(4 * block, triton.cdiv(numel, _sm_count(x.device.index or 0)))
        chunk = triton.cdiv(per_prog, block) * block
        nprog, warps = triton.cdiv(numel, chunk), 4
    _quant_tensor_kernel[(nprog,)](
        xc, q, s, amax, sync, numel, chunk, NPROG=nprog, BLOCK=block, num_warps=warps
    )
    return q, s


def quant_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 quantization of ``x`` with a given float32 scale (one kernel)."""
    xc = x.reshape(-1, x.shape[-1]).contiguous()
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=x.device)
    numel = xc.numel()
    block = 1024
    _quant_static_kernel[(triton.cdiv(numel, block),)](xc, q, scale, numel, BLOCK=block)
    return q
