"""An FP8 gated MLP for 1-4 tokens in one launch (Triton, CUDA only; imported lazily).

``fused_mlp(x, gate_up, gate_up_scale, down, down_scale)`` computes
``(SiLU(x @ gate.T) * (x @ up.T)) @ down.T`` with ``gate_up = [gate; up]`` stored FP8
(``[2I, H]``) and ``down`` FP8 (``[H, I]``), each with a per-tensor (0-d) or per-row
(``[2I]`` / ``[H]``) scale, weight-only numerics (float32 sums, the intermediate kept in
float32). It is the MoE drafters' shared expert: its two small linears (1-8 MB at the
benchmarked shapes) and the SiLU * up between them took three launches, each too short to
reach the GPU's bandwidth (docs/BENCHMARKS.md, issue 12).

One launch of resident programs (``per_sm`` a SM, their registers capped so that they all
fit at once, the grid barrier's condition):

1. each program loads its first rows of ``down`` into registers first: weights do not
   depend on the previous kernel, so with PDL they are read while it finishes;
2. gate and up rows, interleaved so that a program holds both halves of its intermediate
   columns, are read with the narrow-load GEMV's 8-byte loads and per-thread sums
   (:mod:`mtpconv.kernels.triton_gemv`); SiLU(gate) * up goes to a float32 workspace;
3. the programs meet at a grid barrier: a 64-bit counter that only grows (every launch
   adds its program count), as :func:`mtpconv.kernels.triton_quant.agreed_amax` agrees;
4. each program multiplies its ``down`` rows with the whole intermediate (read from L2).

With ``split=True`` steps 2 and 4 are two launches instead, with no barrier (the form
Triton's interpreter can run: it runs programs one after another).
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.kept_state import kept
from mtpconv.kernels.mlp import MAX_TOKENS, fits
from mtpconv.kernels.triton_gemv import _dot8, _row
from mtpconv.kernels.triton_quant import agreement_state, sm_count, stream_key
from mtpconv.kernels.triton_tile import pdl_enter, pdl_leave, weight_tile

WARPS = 4
REGISTERS_PER_SM = 65536  # a 64K register file on every NVIDIA GPU Triton builds for (sm_80+)
BLOCK_K = 256 * WARPS  # gate/up K step: the narrow loads' layout needs no exchange from here
DOWN_TILE_BYTES = 16 * 1024  # the down rows a program holds in registers across the barrier
BOTH, GATE_UP, DOWN = 0, 1, 2  # what one launch does (PHASE)


@triton.jit
def _gate_up_unit(
    x_ptr, gu_ptr, gs_ptr, act_ptr, unit, M, H, NI, stride_xm,
    GU_ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr, EVEN_H: tl.constexpr,
):  # fmt: skip
    """SiLU(gate) * up of ``BLOCK_I`` intermediate columns for every token, into ``act``."""
    r = tl.arange(0, 2 * BLOCK_I)
    col = unit * BLOCK_I + r // 2
    ok = col < NI
    row = col + (r % 2) * NI  # even r: gate rows, odd r: up rows
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), 8), 8)
    w_ptrs = gu_ptr + row[:, None].to(tl.int64) * H + offs_k[None, :]
    x_ptrs = x_ptr + offs_k
    t0 = offs_k * 0  # token 0, as a vector: the interpreter masks with no 0-d bool
    acc0 = tl.zeros((2 * BLOCK_I, BLOCK_K // 8), dtype=tl.float32)
    if BLOCK_M > 1:
        acc1 = tl.zeros((2 * BLOCK_I, BLOCK_K // 8), dtype=tl.float32)
    if BLOCK_M > 2:
        acc2 = tl.zeros((2 * BLOCK_I, BLOCK_K // 8), dtype=tl.float32)
        acc3 = tl.zeros((2 * BLOCK_I, BLOCK_K // 8), dtype=tl.float32)
    mask_k = offs_k < H  # replaced on every K step when H is uneven
    # UNROLL K steps at a time, unrolled, so that the compiler issues their loads before
    # their sums: more bytes in flight on each SM.
    for k0 in range(0, H, UNROLL * BLOCK_K):
        for kk in tl.static_range(0, UNROLL * BLOCK_K, BLOCK_K):
            if not EVEN_H:
                mask_k = (k0 + kk + offs_k) < H
            wf = weight_tile(w_ptrs, ok, mask_k, EVEN_H).to(tl.float32)
            acc0 += _dot8(wf, _row(x_ptrs, t0 < M, mask_k, EVEN_H), 2 * BLOCK_I, BLOCK_K)
            if BLOCK_M > 1:
                acc1 += _dot8(wf, _row(x_ptrs + stride_xm, t0 + 1 < M, mask_k, EVEN_H), 2 * BLOCK_I, BLOCK_K)
            if BLOCK_M > 2:
                acc2 += _dot8(
                    wf, _row(x_ptrs + 2 * stride_xm, t0 + 2 < M, mask_k, EVEN_H), 2 * BLOCK_I, BLOCK_K
                )
                acc3 += _dot8(
                    wf, _row(x_ptrs + 3 * stride_xm, t0 + 3 < M, mask_k, EVEN_H), 2 * BLOCK_I, BLOCK_K
                )
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    scale = tl.load(gs_ptr + row, mask=ok, other=0.0) if GU_ROW else tl.load(gs_ptr)
    cols = unit * BLOCK_I + tl.arange(0, BLOCK_I)
    _act_out(acc0, scale, act_ptr, cols, NI, 0, M, BLOCK_I)
    if BLOCK_M > 1:
        _act_out(acc1, scale, act_ptr + NI, cols, NI, 1, M, BLOCK_I)
    if BLOCK_M > 2:
        _act_out(acc2, scale, act_ptr + 2 * NI, cols, NI, 2, M, BLOCK_I)
        _act_out(acc3, scale, act_ptr + 3 * NI, cols, NI, 3, M, BLOCK_I)


@triton.jit
def _act_out(acc, scale, act_row, cols, NI, t: tl.constexpr, M, BLOCK_I: tl.constexpr):
    """Token ``t``'s interleaved gate / up sums -> SiLU(gate) * up of its columns."""
    gate, up = tl.split(tl.reshape(tl.sum(acc, axis=1) * scale, (BLOCK_I, 2)))
    tl.store(act_row + cols, gate / (1.0 + tl.exp(-gate)) * up, mask=(cols < NI) & (cols * 0 + t < M))


@triton.jit
def _act_row(act_ptr, t: tl.constexpr, M, NI, I_PAD: tl.constexpr):
    """Token ``t``'s SiLU(gate) * up from the workspace (zeros past ``M`` tokens)."""
    offs_i = tl.arange(0, I_PAD)
    # (vector masks: the interpreter masks with no 0-d bool)
    mask = (offs_i < NI) & (offs_i * 0 + t < M)
    return tl.load(act_ptr + t * NI + offs_i, mask=mask, other=0.0, cache_modifier=".cg")


@triton.jit
def _down_out(wf, a, scale, o_ptr, rows, t: tl.constexpr, M, H, stride_om):
    y = tl.sum(wf * a[None, :], axis=1) * scale
    tl.store(o_ptr + t * stride_om + rows, y.to(o_ptr.dtype.element_ty), mask=(rows < H) & (rows * 0 + t < M))


@triton.jit
def _down_rows(
    wb, rows, act_ptr, ds_ptr, o_ptr, M, H, NI, stride_om,
    DN_ROW: tl.constexpr, BLOCK_M: tl.constexpr, I_PAD: tl.constexpr, ACT_FIRST: tl.constexpr,
):  # fmt: skip
    """``BLOCK_H`` output rows of every token from the ``down`` rows ``wb`` held.
    ``ACT_FIRST``: every token's intermediate is loaded before the first output is stored
    (the compiler cannot move a load above a store it may alias), so their L2 round trips
    overlap."""
    wf = wb.to(tl.float32)
    scale = tl.load(ds_ptr + rows, mask=rows < H, other=0.0) if DN_ROW else tl.load(ds_ptr)
    if ACT_FIRST and BLOCK_M > 1:
        a0 = _act_row(act_ptr, 0, M, NI, I_PAD)
        a1 = _act_row(act_ptr, 1, M, NI, I_PAD)
        if BLOCK_M > 2:
            a2 = _act_row(act_ptr, 2, M, NI, I_PAD)
            a3 = _act_row(act_ptr, 3, M, NI, I_PAD)
        _down_out(wf, a0, scale, o_ptr, rows, 0, M, H, stride_om)
        _down_out(wf, a1, scale, o_ptr, rows, 1, M, H, stride_om)
        if BLOCK_M > 2:
            _down_out(wf, a2, scale, o_ptr, rows, 2, M, H, stride_om)
            _down_out(wf, a3, scale, o_ptr, rows, 3, M, H, stride_om)
    else:
        for t in tl.static_range(BLOCK_M):
            _down_out(wf, _act_row(act_ptr, t, M, NI, I_PAD), scale, o_ptr, rows, t, M, H, stride_om)


@triton.jit
def _down_tile(dn_ptr, rows, H, NI, I_PAD: tl.constexpr):
    offs_i = tl.arange(0, I_PAD)
    mask = (rows < H)[:, None] & (offs_i < NI)[None, :]
    return tl.load(dn_ptr + rows[:, None].to(tl.int64) * NI + offs_i[None, :], mask=mask, other=0.0)


@triton.jit
def _all_arrive(cnt_ptr, PROGRAMS: tl.constexpr):
    """Return once all ``PROGRAMS`` programs of this launch have called it (their stores
    before it visible to the loads after it, at GPU scope)."""
    tl.debug_barrier()  # every thread's stores are issued before one thread counts in
    arrived = tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
    target = (arrived // PROGRAMS + 1) * PROGRAMS
    now = arrived + 1
    while now < target:  # an acquiring read (adding 0 compiles to a load)
        now = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _mlp_kernel(
    x_ptr, gu_ptr, gs_ptr, dn_ptr, ds_ptr, act_ptr, cnt_ptr, o_ptr, M, H, NI, stride_xm, stride_om,
    GU_ROW: tl.constexpr, DN_ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, I_PAD: tl.constexpr, PROGRAMS: tl.constexpr,
    PHASE: tl.constexpr, UNROLL: tl.constexpr, EVEN_H: tl.constexpr, PDL: tl.constexpr,
    ACT_FIRST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid * BLOCK_H + tl.arange(0, BLOCK_H)
    if PHASE != 1:  # this program's first down rows, before the wait: weights are not written
        wb = _down_tile(dn_ptr, rows, H, NI, I_PAD)
    pdl_enter(PDL)
    if PHASE != 2:
        for unit in range(pid, tl.cdiv(NI, BLOCK_I), PROGRAMS):
            _gate_up_unit(
                x_ptr, gu_ptr, gs_ptr, act_ptr, unit, M, H, NI, stride_xm,
                GU_ROW, BLOCK_M, BLOCK_I, BLOCK_K, UNROLL, EVEN_H,
            )  # fmt: skip
    if PHASE == 0:
        _all_arrive(cnt_ptr, PROGRAMS)
    pdl_leave(PDL)  # after the barrier: a dependent launched early takes no slot it needs
    if PHASE != 1:
        _down_rows(wb, rows, act_ptr, ds_ptr, o_ptr, M, H, NI, stride_om, DN_ROW, BLOCK_M, I_PAD, ACT_FIRST)
        for unit in range(pid + PROGRAMS, tl.cdiv(H, BLOCK_H), PROGRAMS):
            more = unit * BLOCK_H + tl.arange(0, BLOCK_H)
            _down_rows(
                _down_tile(dn_ptr, more, H, NI, I_PAD), more, act_ptr, ds_ptr, o_ptr, M, H, NI,
                stride_om, DN_ROW, BLOCK_M, I_PAD, ACT_FIRST,
            )  # fmt: skip


_ACT: dict[tuple[object, ...], torch.Tensor] = {}
_ACT_KEEP: list[torch.Tensor] = []  # superseded workspaces: a captured graph may still use them


def _act_workspace(device: torch.device, floats: int) -> torch.Tensor:
    """The float32 intermediate, per (device, stream): launches on one stream are ordered
    (:func:`mtpconv.kernels.kept_state.kept`)."""

    def make(_: object) -> torch.Tensor:
        return torch.empty(max(floats, 1 << 14), dtype=torch.float32, device=device)

    return kept(_ACT, stream_key(device), device, make, lambda ws: ws.numel() >= floats, _ACT_KEEP)


def _scale(s: torch.Tensor) -> torch.Tensor:
    """A 0-d or per-row scale (as :func:`mtpconv.kernels.mlp.fits` checked) as float32."""
    s = s.to(torch.float32).reshape(-1 if s.numel() > 1 else ())
    return s if s.is_contiguous() else s.contiguous()


def default_unroll(h: int, block_k: int = BLOCK_K) -> int:
    """Gate / up K steps unrolled together: all of H up to 4 steps. Measured on the H200
    (``benchmarks/bench_mlp.py``, twelfth session): at 4 tokens on 397B's shared expert 4 steps
    took 11.6 us against 12.3 with 2 (two calls); at one token 4 and 2 were within 0.2 us;
    1 step was the slowest at 1-4 tokens."""
    return int(max(1, min(triton.cdiv(h, block_k), 4)))


def default_per_sm(m: int, h: int) -> int:
    """Programs a SM: 4 at one token with H >= 4096, else 2. Measured on the H200
    (``benchmarks/bench_mlp.py``, twelfth session, two calls): 397B's shared expert at one
    token 6.80 / 6.74 us with 4 against 7.25 / 7.11 with 2; with 4 at 2-4 tokens, and on
    Next-80B's (H = 2048) at 1-4, up to 1.1 us slower."""
    return 4 if m == 1 and h >= 4096 else 2


def fused_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down: torch.Tensor,
    down_scale: torch.Tensor,
    *,
    split: bool = False,
    unroll: int | None = None,
    per_sm: int | None = None,
    warps: int = WARPS,
    down_tile_bytes: int = DOWN_TILE_BYTES,
    act_first: bool = True,
) -> torch.Tensor:
    """``(SiLU(x @ gate.T) * (x @ up.T)) @ down.T`` for ``x [..., H]`` of 1-4 rows (BF16 or
    FP16; the output takes its dtype). ``split``: two launches, no barrier. ``unroll``: gate /
    up K steps whose loads are issued together (default :func:`default_unroll`). ``per_sm``:
    programs a SM (1, 2 or 4), each held to 64K / (``per_sm`` x 32 x ``warps``) registers (default
    :func:`default_per_sm`). ``warps`` (4 or 8) a program; ``down_tile_bytes``: the ``down``
    rows a program holds across the barrier. ``act_first``: each program loads every token's
    intermediate before it stores its first output (False: one token at a time, the form
    before; on the H200 at 4 tokens 11.6 against 11.2 us on 397B's shared expert, 7.0 against
    6.4 on Next-80B's: ``benchmarks/bench_mlp.py``, fifteenth session)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, h = x2.shape
    if not fits(x2, gate_up, gate_up_scale, down, down_scale):
        raise ValueError(
            f"fused_mlp takes 1-{MAX_TOKENS} rows of H = a multiple of 16 and contiguous FP8 "
            f"[2I, H] / [H, I] weights with 0-d or per-row scales: got x {tuple(x2.shape)}, "
            f"gate_up {tuple(gate_up.shape)} {gate_up.dtype}, down {tuple(down.shape)} {down.dtype}"
        )
    i = gate_up.shape[0] // 2
    gs, ds = _scale(gate_up_scale), _scale(down_scale)
    out = torch.empty((m, h), dtype=x.dtype, device=x.device)
    per_sm = per_sm or default_per_sm(m, h)
    if per_sm not in (1, 2, 4):
        raise ValueError(f"fused_mlp: per_sm is 1, 2 or 4, got {per_sm}")
    if warps not in (4, 8):
        raise ValueError(f"fused_mlp: warps is 4 or 8, got {warps}")
    block_k = 256 * warps
    programs = per_sm * (sm_count(x.device.index or 0) if x.device.type == "cuda" else 8)
    block_i = triton.next_power_of_2(triton.cdiv(i, programs))
    i_pad = triton.next_power_of_2(i)
    block_h = min(triton.next_power_of_2(triton.cdiv(h, programs)), max(1, down_tile_bytes // i_pad))
    programs = min(programs, max(triton.cdiv(i, block_i), triton.cdiv(h, block_h)))
    unroll = unroll or default_unroll(h, block_k)
    act = _act_workspace(x.device, MAX_TOKENS * i)
    cnt = agreement_state(x.device, "mlp", programs, 1)[1]
    common = {
        "GU_ROW": gs.numel() > 1,
        "DN_ROW": ds.numel() > 1,
        "BLOCK_M": 1 if m == 1 else (2 if m == 2 else 4),
        "BLOCK_I": block_i,
        "BLOCK_K": block_k,
        "BLOCK_H": block_h,
        "I_PAD": i_pad,
        "PROGRAMS": programs,
        "UNROLL": unroll,
        "ACT_FIRST": act_first,
        "EVEN_H": h % (unroll * block_k) == 0,
        "num_warps": warps,
        # at most 255 registers a thread: a cap only from 4 programs a SM
        "maxnreg": min(255, REGISTERS_PER_SM // (per_sm * warps * 32)) // 8 * 8,
        **pdl.launch(x.device),
    }
    args = (x2, gate_up, gs, down, ds, act, cnt, out, m, h, i, x2.stride(0), out.stride(0))
    for phase in (GATE_UP, DOWN) if split else (BOTH,):
        _mlp_kernel[(programs,)](*args, PHASE=phase, **common)
    return out.reshape(*x.shape[:-1], h)
