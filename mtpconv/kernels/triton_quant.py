"""Triton activation-quantization kernels for the W8A8 paths (CUDA only; imported lazily).

* ``quant_per_token``: dynamic per-token FP8 quantization in one kernel (a row a
  program, or rows beyond ``TOKEN_CHUNK`` columns split across programs that agree on
  the row's amax), optionally folding the weight scale into the row scale so
  ``torch._scaled_mm`` can run with a unit weight scale, or applying SiLU * up first;
  ``quant_cat`` and ``add_quant`` are the same kernel as the producer of a linear's
  input (a concatenation, a residual add), so that the linear reads FP8 rows prepared
  by a launch the step makes anyway.
* The device functions the other quantizing kernels share (``fp8_scaled``,
  ``fp8_row``, ``agreed_amax``). One scale for the whole tensor:
  :mod:`mtpconv.kernels.triton_quant_tensor`.

The weight-only paths (``triton_skinny``, ``triton_fp8.wo_linear``) need none
of these: they read BF16/FP16 activations directly.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.triton_tile import pdl_enter

# Globals read inside @triton.jit functions must be tl.constexpr.
FP8_MAX = tl.constexpr(448.0)
# Smallest positive normal float32 (same floor as mtpconv.formats.fp8).
FP8_TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def fp8_scaled(x, amax):
    """``x`` in FP8's range for the amax of its row: ``(x / scale clamped, scale)``."""
    scale = tl.maximum(amax, FP8_TINY) / FP8_MAX
    return tl.clamp(x / scale, -FP8_MAX, FP8_MAX), scale


@triton.jit
def fp8_row(x):
    """A float32 row in FP8's range with one scale: ``(x / scale clamped, scale)``."""
    return fp8_scaled(x, tl.max(tl.abs(x), axis=0))


@triton.jit
def agreed_amax(amax, slots_ptr, cnt_ptr, part, PARTS: tl.constexpr, SLOTS: tl.constexpr):
    """The largest of the amaxes that ``PARTS`` resident programs hold, each its own
    ``part``: each writes its amax to its slot and counts itself in on a 64-bit counter
    that only grows (every launch adds ``PARTS``), so a program knows from its own arrival
    when its launch is complete and nothing is reset after it (``SLOTS``: ``PARTS`` rounded
    up to a power of two)."""
    tl.atomic_xchg(slots_ptr + part, amax, sem="relaxed")
    arrived = tl.atomic_add(cnt_ptr, 1, sem="release")
    target = (arrived // PARTS + 1) * PARTS
    now = arrived + 1
    while now < target:  # an acquiring read (adding 0 compiles to a load)
        now = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    offs = tl.arange(0, SLOTS)
    return tl.max(tl.load(slots_ptr + offs, mask=offs < PARTS, other=0.0, volatile=True), axis=0)


# What a per-token quantization reads (``MODE``): a row of x; SiLU(gate) * up of a
# ``[gate | up]`` row of x; the row ``[x | y]``; the row ``x + y`` (also written out).
ROW, ACT, CAT, ADD = 0, 1, 2, 3


@triton.jit
def _quant_per_token_kernel(
    x_ptr,
    y_ptr,
    sum_ptr,
    q_ptr,
    s_ptr,
    ws_ptr,
    slots_ptr,
    cnt_ptr,
    K,
    KX,
    stride_xm,
    stride_ym,
    stride_qm,
    HAS_WS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MODE: tl.constexpr,
    PARTS: tl.constexpr,
    PDL: tl.constexpr,
):
    # Grid (rows, PARTS): each program holds BLOCK_K columns of its row in registers; with
    # PARTS > 1 the row's programs (all resident: rows x PARTS <= the SM count) agree on
    # its amax before they quantize.
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
    amax = tl.max(tl.abs(x), axis=0)
    if PARTS > 1:
        amax = agreed_amax(amax, slots_ptr + row * PARTS, cnt_ptr + row, part, PARTS, PARTS)
    q, scale = fp8_scaled(x, amax)
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if part == 0:
        if HAS_WS:
            scale = scale * tl.load(ws_ptr)
        tl.store(s_ptr + row, scale)


def stream_key(device: torch.device) -> tuple[int, int]:
    # Barrier state is kept per (device, stream): launches on one stream are ordered.
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return device.index or 0, stream


_AGREEMENT: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}
_AGREEMENT_KEEP: list[torch.Tensor] = []  # superseded state: a captured graph may still use it


def agreement_state(
    device: torch.device, user: str, parts: int, groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The host side of :func:`agreed_amax`: float32 slots ``[groups, parts]`` and one int64
    counter a group, per (device, stream, ``user``, parts). Zeroed once, then never reset (the
    counters only grow); replaced by a larger pair when ``groups`` outgrows it, the old pair
    kept alive."""
    key = (*stream_key(device), user, parts)
    state = _AGREEMENT.get(key)
    if state is None or state[1].numel() < groups:
        if state is not None:
            _AGREEMENT_KEEP.extend(state)
        state = (
            torch.zeros(groups * parts, dtype=torch.float32, device=device),
            torch.zeros(groups, dtype=torch.int64, device=device),
        )
        _AGREEMENT[key] = state
    return state


@functools.lru_cache(maxsize=8)
def sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# Per-token quantization: columns a program holds at most before a row is split across
# programs that agree on its amax (while rows x parts fit in one program per SM). Measured
# in the 27B step at 4 tokens (docs/BENCHMARKS.md, issue 12, tenth session): rows of 5120-
# 6144 took 1.6-2.0 us in one program and 2.3-2.7 us split in four; rows of 17408 (SiLU *
# up) 5.8 us in one program and 2.9 us split in sixteen.
TOKEN_CHUNK = 8192


def token_parts(rows: int, k: int, sms: int) -> int:
    """Programs per row: one per ``TOKEN_CHUNK`` columns (a power of two), as many as give
    every program of the launch an SM of its own; one where two would not."""
    parts = int(triton.next_power_of_2(triton.cdiv(k, TOKEN_CHUNK)))
    while parts > 1 and rows * parts > sms:
        parts //= 2
    return parts


def _per_token(
    mode: int,
    x: torch.Tensor,
    y: torch.Tensor | None,
    k: int,
    w_scale: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of the per-token kernel over ``x``'s rows (and ``y``'s): ``(q [M, k],
    scale [M, 1])``; ``total`` receives ``x + y`` in ``ADD``."""
    m = x.shape[0]
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, s
    sms = sm_count(x.device.index or 0) if x.device.type == "cuda" else 1
    parts = token_parts(m, k, sms)
    slots, counts = agreement_state(x.device, "token", parts, max(m, 64)) if parts > 1 else (s, s)
    block_k = triton.next_power_of_2(triton.cdiv(k, parts))
    warps = 4 if block_k <= 2048 else (8 if block_k <= 8192 else 16)
    _quant_per_token_kernel[(m, parts)](
        x,
        y if y is not None else x,
        total if total is not None else q,
        q,
        s,
        w_scale if w_scale is not None else s,
        slots,
        counts,
        k,
        x.shape[1],
        x.stride(0),
        y.stride(0) if y is not None else 0,
        q.stride(0),
        HAS_WS=w_scale is not None,
        BLOCK_K=block_k,
        MODE=mode,
        PARTS=parts,
        num_warps=warps,
        **pdl.producer_launch(x.device),
    )
    return q, s


def quant_per_token(
    x: torch.Tensor, w_scale: torch.Tensor | None = None, *, act: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token FP8 quantization: ``(q [M, K], scale [M, 1] float32)``.

    With ``w_scale`` (0-d) the returned scale is ``row_scale * w_scale``. With ``act`` the
    rows are ``[gate | up]`` pairs of width ``2K`` and what is quantized is
    ``SiLU(gate) * up`` in x's dtype (a MoE down projection's input).
    """
    x2 = _rows(x)
    k = x2.shape[1]
    if act:
        if k % 2:
            raise ValueError(f"quant_per_token: act needs [gate | up] rows of even width, got {k}")
        k //= 2
    return _per_token(ACT if act else ROW, x2, None, k, w_scale)


def quant_cat(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quant_per_token(torch.cat((x, y), -1))`` in one launch, the concatenation never
    written (an MTP drafter's ``fc`` input: the embedding and hidden state side by side)."""
    x2, y2 = _rows(x), _rows(y)
    if x2.shape[0] != y2.shape[0] or x.dtype != y.dtype:
        raise ValueError(f"quant_cat: rows {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ")
    return _per_token(CAT, x2, y2, x2.shape[1] + y2.shape[1])


def add_quant(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x + y, *quant_per_token(x + y))`` in one launch: a residual add whose sum is also
    the next linear's FP8 input (``[M, K]`` rows; the sum in x's dtype, as torch's add)."""
    x2, y2 = _rows(x), _rows(y)
    if x2.shape != y2.shape or x.dtype != y.dtype:
        raise ValueError(f"add_quant: {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ")
    total = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    q, s = _per_token(ADD, x2, y2, x2.shape[1], total=total)
    return total.reshape(x.shape), q, s
