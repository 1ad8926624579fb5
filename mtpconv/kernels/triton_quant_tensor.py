"""Triton per-tensor FP8 activation quantization for the W8A8 paths (CUDA only; imported lazily).

* ``quant_per_tensor``: dynamic per-tensor quantization in one launch (reading
  the activation once, its chunks in registers across a grid barrier, up to 4096
  elements x the SM count; two passes above).

Per-token quantization and the device functions shared with it:
:mod:`mtpconv.kernels.triton_quant`.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.kept_state import kept
from mtpconv.kernels.triton_quant import (
    FP8_MAX,
    FP8_TINY,
    agreed_amax,
    agreement_state,
    fp8_scaled,
    sm_count,
    stream_key,
)
from mtpconv.kernels.triton_tile import pdl_enter


@triton.jit
def _quant_tensor_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    amax_ptr,
    sync_ptr,
    numel,
    chunk,
    NPROG: tl.constexpr,
    BLOCK: tl.constexpr,
):
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
    scale = tl.maximum(amax, FP8_TINY) / FP8_MAX
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


@triton.jit
def quantize_chunk(
    x, q_ptr, s_ptr, slots_ptr, cnt_ptr, pid, offs, mask, NPROG: tl.constexpr, SLOTS: tl.constexpr
):  # fmt: skip
    """Program ``pid`` holds the float32 chunk ``x`` of the tensor: the programs agree on the
    amax (``agreed_amax``; NPROG is at most the SM count, so all are resident), then the chunk
    goes to ``q`` in FP8 and program 0 writes the scale."""
    amax = tl.max(tl.abs(x), axis=0)
    if NPROG > 1:
        amax = agreed_amax(amax, slots_ptr, cnt_ptr, pid, NPROG, SLOTS)
    q, scale = fp8_scaled(x, amax)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if pid == 0:
        tl.store(s_ptr, scale)


@triton.jit
def _quant_tensor_once_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    slots_ptr,
    cnt_ptr,
    numel,
    NPROG: tl.constexpr,
    SLOTS: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    # Dynamic per-tensor quantization reading the activation once (decode sizes): each
    # program holds its chunk in registers while the programs agree on the amax.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    quantize_chunk(x, q_ptr, s_ptr, slots_ptr, cnt_ptr, pid, offs, mask, NPROG, SLOTS)


# Activations up to this many elements are quantized by a single program.
SINGLE_PROGRAM_MAX = 96 * 1024
# One-pass kernel: elements per program (held in registers); it takes activations of
# up to ONCE_CHUNK x the SM count elements (one program per SM at most, all resident).
ONCE_CHUNK = 4096
ONCE_ALONE = 16384
_SYNC: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _sync_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-pass kernel's amax and its arrival / departure counters, zeroed
    (:func:`mtpconv.kernels.kept_state.kept`)."""

    def make(_: object) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.zeros(1, dtype=torch.float32, device=device),
            torch.zeros(2, dtype=torch.int32, device=device),
        )

    return kept(_SYNC, stream_key(device), device, make)


class OnceLaunch(NamedTuple):
    """The one-pass kernel's grid over ``numel`` elements: programs, their chunk, the barrier
    state they agree through, warps."""

    nprog: int
    chunk: int
    slots: torch.Tensor
    counts: torch.Tensor
    warps: int


def once_launch(numel: int, device: torch.device) -> OnceLaunch:
    """How the one-pass kernel covers ``numel`` elements (up to ``ONCE_CHUNK`` x the SM count)."""
    # Up to ONCE_ALONE elements one program holds them all (no barrier).
    chunk = triton.next_power_of_2(numel) if numel <= ONCE_ALONE else ONCE_CHUNK
    nprog = triton.cdiv(numel, chunk)
    slots, counts = agreement_state(device, "tensor", nprog, 1)
    return OnceLaunch(nprog, chunk, slots, counts, max(4, min(16, chunk // 1024)))


def one_pass_fits(numel: int, device: torch.device) -> bool:
    """Whether the one-pass kernel takes ``numel`` elements on ``device``."""
    return 0 < numel <= ONCE_CHUNK * sm_count(device.index or 0)


def _once(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """The one-pass per-tensor kernel over contiguous ``x``."""
    launch = once_launch(x.numel(), x.device)
    _quant_tensor_once_kernel[(launch.nprog,)](
        x, q, s, launch.slots, launch.counts, x.numel(),
        NPROG=launch.nprog, SLOTS=triton.next_power_of_2(launch.nprog), CHUNK=launch.chunk,
        num_warps=launch.warps, **pdl.producer_launch(x.device),
    )  # fmt: skip


def quant_per_tensor(x: torch.Tensor, one_pass: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor FP8 quantization in one kernel: ``(q [M, K], scale 0-d)``.

    ``one_pass`` (default: wherever it fits, up to ``ONCE_CHUNK`` x the SM count
    elements): the kernel that reads the activation once, its chunks in registers
    across a grid barrier; else one program with two passes at decode sizes, the
    two-pass grid barrier above ``SINGLE_PROGRAM_MAX``."""
    xc = x.reshape(-1, x.shape[-1])
    if not xc.is_contiguous():
        xc = xc.contiguous()
    numel = xc.numel()
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    fits = one_pass_fits(numel, x.device)
    if one_pass is None:
        one_pass = fits
    elif one_pass and not fits:
        raise ValueError(f"quant_per_tensor: {numel} elements, one pass takes {ONCE_CHUNK} x SMs")
    if one_pass:
        _once(xc, q, s)
        return q, s
    amax, sync = _sync_state(x.device)
    if numel <= SINGLE_PROGRAM_MAX:
        # One program, no atomics (two passes over at most 192 KB that the previous
        # kernel just wrote to L2).
        block = 4096
        chunk = triton.cdiv(numel, block) * block
        nprog, warps = 1, 16
    else:
        block = 1024
        per_prog = max(4 * block, triton.cdiv(numel, sm_count(x.device.index or 0)))
        chunk = triton.cdiv(per_prog, block) * block
        nprog, warps = triton.cdiv(numel, chunk), 4
    _quant_tensor_kernel[(nprog,)](
        xc, q, s, amax, sync, numel, chunk, NPROG=nprog, BLOCK=block, num_warps=warps
    )
    return q, s
