"""Triton activation-quantization kernels for the W8A8 paths (CUDA only; imported lazily).

* ``quant_per_token``: dynamic per-token FP8 quantization in one kernel (a row a
  program, or rows beyond ``TOKEN_CHUNK`` columns split across programs that agree on
  the row's amax), optionally folding the weight scale into the row scale so
  ``torch._scaled_mm`` can run with a unit weight scale.
* The pieces other quantizing kernels share (``fp8_scaled``, ``agreed_amax``,
  ``quantize_row_part``, ``token_launch``). One scale for the whole tensor:
  :mod:`mtpconv.kernels.triton_quant_tensor`.

The weight-only paths (``triton_skinny``, ``triton_fp8.wo_linear``) need none
of these: they read BF16/FP16 activations directly.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mtpconv.formats.e4m3 import FP8_MAX as E4M3_MAX
from mtpconv.formats.fp8_table import TINY
from mtpconv.formats.scale_layout import BLOCK
from mtpconv.kernels import pdl
from mtpconv.kernels.kept_state import kept
from mtpconv.kernels.triton_tile import pdl_enter

# Globals read inside @triton.jit functions must be tl.constexpr.
FP8_MAX = tl.constexpr(float(E4M3_MAX))
# Smallest positive normal float32 (the floor of mtpconv.formats.fp8's scales).
FP8_TINY = tl.constexpr(float(TINY))
BLOCK_EDGE = tl.constexpr(BLOCK)  # the side of a weight-scale block


@triton.jit
def fp8_scaled(x, amax):
    """``x`` in FP8's range for the amax of its row: ``(x / scale clamped, scale)``."""
    scale = tl.maximum(amax, FP8_TINY) / FP8_MAX
    return tl.clamp(x / scale, -FP8_MAX, FP8_MAX), scale


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


@triton.jit
def quantize_row_part(
    x, q_ptr, s_ptr, ws_ptr, slots_ptr, cnt_ptr, row, part, offs, mask, stride_qm,
    HAS_WS: tl.constexpr, PARTS: tl.constexpr,
):  # fmt: skip
    """Program ``part`` of row ``row`` holds the float32 columns ``x``: with ``PARTS > 1`` the
    row's programs (all resident: rows x PARTS <= the SM count) agree on its amax; then the
    columns go to ``q`` in FP8 and part 0 writes the row's scale (times ``*ws_ptr`` with
    ``HAS_WS``)."""
    amax = tl.max(tl.abs(x), axis=0)
    if PARTS > 1:
        amax = agreed_amax(amax, slots_ptr + row * PARTS, cnt_ptr + row, part, PARTS, PARTS)
    q, scale = fp8_scaled(x, amax)
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if part == 0:
        if HAS_WS:
            scale = scale * tl.load(ws_ptr)
        tl.store(s_ptr + row, scale)


@triton.jit
def _quant_per_token_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    ws_ptr,
    slots_ptr,
    cnt_ptr,
    K,
    stride_xm,
    stride_qm,
    HAS_WS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PARTS: tl.constexpr,
    PDL: tl.constexpr,
):
    # Grid (rows, PARTS): each program holds BLOCK_K columns of its row in registers.
    pdl_enter(PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    offs = part * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    quantize_row_part(
        x, q_ptr, s_ptr, ws_ptr, slots_ptr, cnt_ptr, row, part, offs, mask, stride_qm, HAS_WS, PARTS
    )


def stream_key(device: torch.device) -> tuple[int, int]:
    # Barrier state is kept per (device, stream): launches on one stream are ordered.
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return device.index or 0, stream


_AGREEMENT: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}
# superseded state: a captured graph may still use it
_AGREEMENT_KEEP: list[tuple[torch.Tensor, torch.Tensor]] = []


def agreement_state(
    device: torch.device, user: str, parts: int, groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The host side of :func:`agreed_amax`: float32 slots ``[groups, parts]`` and one int64
    counter a group, per (device, stream, ``user``, parts). Zeroed once, then never reset (the
    counters only grow); replaced by a larger pair when ``groups`` outgrows it, the old pair
    kept alive (:func:`mtpconv.kernels.kept_state.kept`)."""

    def make(_: object) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.zeros(groups * parts, dtype=torch.float32, device=device),
            torch.zeros(groups, dtype=torch.int64, device=device),
        )

    key = (*stream_key(device), user, parts)
    return kept(_AGREEMENT, key, device, make, lambda state: state[1].numel() >= groups, _AGREEMENT_KEEP)


@functools.lru_cache(maxsize=8)
def sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[M, K]`` rows with unit column stride."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# Per-token quantization: columns a program holds at most before a row is split across
# programs that agree on its amax (while rows x parts fit in one program per SM). Measured
# in the 27B step at 4 tokens (docs/BENCHMARKS.md): rows of 5120-6144 took 1.6-2.0 us in
# one program and 2.3-2.7 us split in four; rows of 17408 (SiLU * up) 5.8 us in one program
# and 2.9 us split in sixteen.
TOKEN_CHUNK = 8192


def token_parts(rows: int, k: int, sms: int) -> int:
    """Programs per row: one per ``TOKEN_CHUNK`` columns (a power of two), as many as give
    every program of the launch an SM of its own; one where two would not."""
    parts = int(triton.next_power_of_2(triton.cdiv(k, TOKEN_CHUNK)))
    while parts > 1 and rows * parts > sms:
        parts //= 2
    return parts


class TokenLaunch(NamedTuple):
    """The shape of a per-token quantizing launch over ``[M, k]`` rows (grid ``(M, parts)``)
    and the outputs it fills: ``q [M, k]`` FP8, ``scale [M, 1]`` float32."""

    q: torch.Tensor
    scale: torch.Tensor
    parts: int
    slots: torch.Tensor
    counts: torch.Tensor
    block_k: int
    warps: int


def token_launch(m: int, k: int, device: torch.device) -> TokenLaunch:
    """Outputs and launch shape of a per-token quantization of ``m`` rows of ``k`` columns."""
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty((m, 1), dtype=torch.float32, device=device)
    sms = sm_count(device.index or 0) if device.type == "cuda" and m else 1
    parts = token_parts(m, k, sms) if m else 1
    slots, counts = agreement_state(device, "token", parts, max(m, 64)) if parts > 1 else (s, s)
    block_k = triton.next_power_of_2(triton.cdiv(k, parts))
    warps = 4 if block_k <= 2048 else (8 if block_k <= 8192 else 16)
    return TokenLaunch(q, s, parts, slots, counts, block_k, warps)


def quant_per_token(
    x: torch.Tensor, w_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token FP8 quantization: ``(q [M, K], scale [M, 1] float32)``; with
    ``w_scale`` (0-d) the returned scale is ``row_scale * w_scale``."""
    x2 = rows_of(x)
    m, k = x2.shape
    launch = token_launch(m, k, x.device)
    if m:
        _quant_per_token_kernel[(m, launch.parts)](
            x2, launch.q, launch.scale, w_scale if w_scale is not None else launch.scale,
            launch.slots, launch.counts, k, x2.stride(0), launch.q.stride(0),
            HAS_WS=w_scale is not None, BLOCK_K=launch.block_k, PARTS=launch.parts,
            num_warps=launch.warps, **pdl.producer_launch(x.device),
        )  # fmt: skip
    return launch.q, launch.scale
