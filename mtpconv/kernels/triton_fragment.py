"""FP16 tensor-core GEMM on register fragments, for 1-16 tokens (Triton, CUDA only).

The skinny GEMM's ``Config.mma == 3`` kernel (:mod:`mtpconv.kernels.triton_skinny`
launches it): ``x @ (w_fp8 * w_scale).T`` with ``mma.sync`` (m16n8k16, FP16 operands,
float32 accumulation) fed straight from the registers the weights were loaded into,
with no shared memory and no barrier in the K loop:

* each thread loads 8 contiguous bytes of a weight row, as in the narrow GEMV. An MMA
  sums over K, so the order of K inside one MMA is free: the 8 bytes of thread ``t`` of
  a lane quad are taken as that thread's K slots of two m16n8k16 MMAs, and the
  activations are read in the same order. The weight tile's own register layout is
  the MMA's operand layout; no weight byte is moved between threads;
* FP8 e4m3 widens to FP16 exactly (one conversion per two weights); activations are
  scaled by 2**-6 into FP16 (range 4.2e6, exact scaling; values under 1e-3 keep an
  absolute error below 2e-6), products and sums are float32, the 2**6 comes back in the
  epilogue. Numerics are weight-only (no FP8 activation);
* an MMA takes 8 tokens (the lanes' ``lane // 4``); 9-16 tokens run a second MMA on
  the same weight registers.

Tile: ``[KR, BR, 8, 32]`` weights per K step (K steps of ``32 * KR``, ``8 * BR`` rows,
warps along ``BR``); two row repetitions of a thread form one MMA's rows ``g`` and
``g + 8``. The accumulator holds the MMA's float32 results as bytes (four per value) in
a tensor of the weight tile's shape, so Triton keeps it in the fragment's registers.
Split-K and the epilogue are the skinny GEMM's (:func:`mtpconv.kernels.triton_tile.finish_tile`).
Tensor and per-row weight scales; 128x128 block scales take the other kernels.
"""

# Triton kernels are untyped by nature.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels.triton_tile import finish_tile, pdl_enter

MAX_TOKENS = 16

# Activations enter the MMA as x * 2**-6 (four BF16 values in, four FP16 out, per int64).
_X_ASM = tl.constexpr("""
{
.reg .b32 lo, hi, f0, f1, f2, f3, o0, o1;
mov.b64 {lo, hi}, $1;
shl.b32 f0, lo, 16;
and.b32 f1, lo, 0xffff0000;
shl.b32 f2, hi, 16;
and.b32 f3, hi, 0xffff0000;
mul.f32 f0, f0, 0f3C800000;
mul.f32 f1, f1, 0f3C800000;
mul.f32 f2, f2, 0f3C800000;
mul.f32 f3, f3, 0f3C800000;
cvt.rn.f16x2.f32 o0, f1, f0;
cvt.rn.f16x2.f32 o1, f3, f2;
mov.b64 $0, {o0, o1};
}
""")
X_SCALE = tl.constexpr(64.0)  # the epilogue's factor back


_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


def _mma_asm(groups: int, words: int) -> str:
    """PTX for one thread's part of the MMAs over two weight rows (A and B) of ``words``
    4-byte words each, for 1 or 2 groups of 8 tokens, operands numbered as Triton passes
    them for ``pack = 2 * words``: per group ``2 * words`` float32 accumulators out; the
    weight words (row A's, then row B's); per group ``2 * words`` activations (int64 =
    four FP16 at a word's K positions; the second half repeats the first, unused) and
    ``2 * words`` accumulators in. Word ``i`` is one m16n8k16 MMA (its K slots are the
    word's 4 bytes, in both rows); words ``2c`` and ``2c + 1`` add into accumulator set
    ``c``, held at element positions ``2c, 2c + 1`` (row A, tokens ``2t, 2t + 1``) and
    ``words + 2c, words + 2c + 1`` (row B)."""
    n = 2 * words
    w0 = groups * n
    text = [
        "{",
        f".reg .b16 al<{words}>, ah<{words}>, bl<{words}>, bh<{words}>;",
        f".reg .b32 f<{4 * words}>, xl, xh;",
    ]
    for i in range(words):
        text.append(f"mov.b32 {{al{i}, ah{i}}}, ${w0 + i};")
        text.append(f"mov.b32 {{bl{i}, bh{i}}}, ${w0 + words + i};")
        for j, half in enumerate((f"al{i}", f"bl{i}", f"ah{i}", f"bh{i}")):
            text.append(f"cvt.rn.f16x2.e4m3x2 f{4 * i + j}, {half};")
    for grp in range(groups):
        x0 = w0 + n + 2 * n * grp
        c0 = x0 + n
        for i in range(words):
            c = i // 2
            slots = (2 * c, 2 * c + 1, words + 2 * c, words + 2 * c + 1)
            out = ", ".join(f"${grp * n + p}" for p in slots)
            acc = out if i % 2 else ", ".join(f"${c0 + p}" for p in slots)
            a = ", ".join(f"f{4 * i + j}" for j in range(4))
            text.append(f"mov.b64 {{xl, xh}}, ${x0 + i};")
            text.append(f"{_MMA} {{{out}}}, {{{a}}}, {{xl, xh}}, {{{acc}}};")
    return "\n".join(text + ["}"])


def _constraints(groups: int, words: int) -> str:
    n = 2 * words
    return ",".join(["=r"] * (groups * n) + ["r"] * n + (["l"] * n + ["r"] * n) * groups)


_ASM = {(g, q): tl.constexpr(_mma_asm(g, q)) for g in (1, 2) for q in (2, 4)}
_ASM_1_2, _ASM_2_2, _ASM_1_4, _ASM_2_4 = (_ASM[k] for k in ((1, 2), (2, 2), (1, 4), (2, 4)))
_CON = {(g, q): tl.constexpr(_constraints(g, q)) for g in (1, 2) for q in (2, 4)}
_CON_1_2, _CON_2_2, _CON_1_4, _CON_2_4 = (_CON[k] for k in ((1, 2), (2, 2), (1, 4), (2, 4)))


@triton.jit
def _mma(w, x0, acc0, x1, acc1, GROUPS: tl.constexpr, WORDS: tl.constexpr):
    if WORDS == 2:
        if GROUPS == 1:
            return tl.inline_asm_elementwise(
                _ASM_1_2, _CON_1_2, [w, x0, acc0], dtype=tl.float32, is_pure=True, pack=4
            ), acc1
        return tl.inline_asm_elementwise(
            _ASM_2_2, _CON_2_2, [w, x0, acc0, x1, acc1], dtype=(tl.float32, tl.float32), is_pure=True, pack=4
        )
    if GROUPS == 1:
        return tl.inline_asm_elementwise(
            _ASM_1_4, _CON_1_4, [w, x0, acc0], dtype=tl.float32, is_pure=True, pack=8
        ), acc1
    return tl.inline_asm_elementwise(
        _ASM_2_4, _CON_2_4, [w, x0, acc0, x1, acc1], dtype=(tl.float32, tl.float32), is_pure=True, pack=8
    )


@triton.jit
def _x_half(x_ptrs, tok, M, mask_k, EVEN_K: tl.constexpr):
    """One token group's activations at the weight tile's K positions, as FP16 x 2**-6."""
    if EVEN_K:
        x = tl.load(x_ptrs, mask=tok < M, other=0)
    else:
        x = tl.load(x_ptrs, mask=(tok < M) & mask_k, other=0)
    return tl.inline_asm_elementwise(_X_ASM, "=l,l", [x], dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def _w_tile(w_ptrs, mask_n, mask_k, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(w_ptrs, mask=mask_n, other=0, eviction_policy="evict_first")
    return tl.load(w_ptrs, mask=mask_n & mask_k, other=0, eviction_policy="evict_first")


@triton.jit
def _rows(acc, BLOCK_N: tl.constexpr, WARPS: tl.constexpr, RR: tl.constexpr, WORDS: tl.constexpr):
    """``[BLOCK_N, 8]``: the accumulator ``[g, warp, rr, kr, 4 t + p]`` summed over K steps
    and accumulator sets, rows ``8 (RR warp + rr) + g`` in order, token ``2 t + p % 2``."""
    acc = tl.sum(acc, axis=3)
    acc = tl.sum(tl.reshape(acc, (8, WARPS, RR, 4, WORDS // 2, 2)), axis=4)
    return tl.reshape(tl.permute(tl.reshape(acc, (8, WARPS, RR, 8)), (1, 2, 0, 3)), (BLOCK_N, 8))


@triton.jit
def fragment_kernel(
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
    WARPS: tl.constexpr,
    WORDS: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    RR: tl.constexpr = BLOCK_N // (8 * WARPS)  # row groups of 8 per warp
    Q: tl.constexpr = 4 * WORDS  # 4-byte words of a row per K step of one kr
    KR: tl.constexpr = BLOCK_K // (4 * Q)
    GROUPS: tl.constexpr = BLOCK_M // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = tl.program_id(2) * BLOCK_M  # the program's first token
    k_start = pid_k * k_per_split
    pdl_enter(PDL)
    # Dimensions [g, warp, rr, kr, q]: row 8 (RR warp + rr) + g, bytes 4 (Q kr + q) .. + 3
    # of the K step. Triton's coalescing orders the dimensions by contiguity (q first, in
    # runs of WORDS), ties by index, so the lanes run over q (4) and g (8) and the warps
    # over the warp dimension: lane // 4 is g, as the MMA wants, and the activations
    # ([g, warp, 1, kr, q], every warp its own copy) have the weights' layout without a
    # broadcast dimension, so no exchange between threads.
    g = tl.arange(0, 8)[:, None, None, None, None]
    wi = tl.arange(0, WARPS)[None, :, None, None, None]
    rr = tl.arange(0, RR)[None, None, :, None, None]
    kq = tl.max_contiguous(tl.multiple_of(tl.arange(0, Q), WORDS), WORDS)[None, None, None, None, :]
    k4 = tl.arange(0, KR)[None, None, None, :, None] * Q + kq  # in groups of 4 K
    rows = pid_n * BLOCK_N + (wi * RR + rr) * 8 + g  # [8, WARPS, RR, 1, 1]
    mask_n = rows < N
    # int32 = 4 weight bytes, int64 = 4 activations
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + rows.to(tl.int64) * (stride_wn // 4) + k_start // 4 + k4
    tok = row0 + g + 0 * wi
    x_ptrs = x_ptr.to(tl.pointer_type(tl.int64)) + tok * (stride_xm // 4) + k_start // 4 + k4
    x_step = 8 * (stride_xm // 4)  # to the second token group
    acc0 = tl.zeros((8, WARPS, RR, KR, Q), dtype=tl.float32)
    acc1 = acc0
    mask_k = k4 < K // 4  # replaced on every K step when K is uneven
    if PREFETCH:  # the next K step's weights load while this one's MMAs run
        w_next = _w_tile(w_ptrs, mask_n, mask_k, EVEN_K)
    for kk in range(0, k_per_split, BLOCK_K):
        if not EVEN_K:
            mask_k = (k_start + kk) // 4 + k4 < K // 4
        if PREFETCH:
            w = w_next
            # k_per_split is a multiple of BLOCK_K: the next step is in the piece or not at all
            more = kk + BLOCK_K < k_per_split
            nxt = (k_start + kk + BLOCK_K) // 4 + k4 < K // 4
            w_next = _w_tile(w_ptrs + BLOCK_K // 4, mask_n & more, nxt, EVEN_K)
        else:
            w = _w_tile(w_ptrs, mask_n, mask_k, EVEN_K)
        x0 = _x_half(x_ptrs, tok, M, mask_k, EVEN_K)
        x1 = x0
        if GROUPS == 2:
            x1 = _x_half(x_ptrs + x_step, tok + 8, M, mask_k, EVEN_K)
        acc0, acc1 = _mma(w, x0, acc0, x1, acc1, GROUPS, WORDS)
        w_ptrs += BLOCK_K // 4
        x_ptrs += BLOCK_K // 4
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    acc = _rows(acc0, BLOCK_N, WARPS, RR, WORDS)
    if GROUPS == 2:
        acc1s = _rows(acc1, BLOCK_N, WARPS, RR, WORDS)
        acc = tl.reshape(tl.permute(tl.join(acc, acc1s), (0, 2, 1)), (BLOCK_N, 16))
    acc = acc * X_SCALE
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    finish_tile(
        acc, s_ptr, b_ptr, o_ptr, ws_ptr, cnt_ptr, offs_n, offs_m, offs_n < N, offs_m < M, M, N, n_split,
        stride_om, SCALE, HAS_BIAS, USE_SPLIT,
    )  # fmt: skip


def block_m(m: int) -> int:
    """Tokens per program: one MMA token group (8) or two (16)."""
    return 8 if m <= 8 else 16


def variant(mma: int) -> tuple[int, bool]:
    """``(WORDS, PREFETCH)`` of a ``Config.mma`` of 3-6: 4-byte words per row and thread per
    K step (2: 8-byte loads, 4: 16-byte loads), and whether the next step's weights load
    during this step's MMAs."""
    return (2 if mma in (3, 5) else 4), mma >= 5


def usable(x2: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, warps: int, words: int = 2) -> bool:
    """Whether the kernel's layout holds for these operands: BF16 activations, pointers
    and row strides divisible by 16 (Triton then vectorizes the loads as the MMA's register
    layout assumes; a smaller alignment would change the layout), K a multiple of 16,
    an even number of 8-row groups per warp and K steps of whole ``16 * words`` bytes."""
    k = x2.shape[1]
    rows_per_warp = block_n // (8 * warps)
    return (
        x2.dtype in (torch.bfloat16,)
        and w.element_size() == 1
        and k % 16 == 0
        and block_k % (16 * words) == 0
        and block_n % (8 * warps) == 0
        and rows_per_warp % 2 == 0
        and w.stride(1) == 1
        and x2.stride(1) == 1
        and all(v % 16 == 0 for v in (w.data_ptr(), x2.data_ptr(), w.stride(0), x2.stride(0)))
    )
