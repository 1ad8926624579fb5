"""Triton activation-quantization kernels for the W8A8 paths (CUDA only; imported lazily).

* ``quant_per_token``: dynamic per-token FP8 quantization in one kernel (one
  program per row), optionally folding the weight scale into the row scale so
  ``torch._scaled_mm`` can run with a unit weight scale, or applying SiLU * up first;
  ``quant_cat`` and ``add_quant`` are the same kernel as the producer of a linear's
  input (a concatenation, a residual add), so that the linear reads FP8 rows prepared
  by a launch the step makes anyway (``add_quant_tensor``: the same with one scale for
  the tensor, as the one-pass kernel below).
* ``quant_per_tensor``: dynamic per-tensor quantization in one launch (reading
  the activation once, its chunks in registers across a grid barrier, up to 4096
  elements x the SM count; two passes above).
* ``quant_static``: quantization with a given scale.

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

# Globals read inside @triton.jit functions must be tl.constexpr.
FP8_MAX = tl.constexpr(448.0)
# Smallest positive normal float32 (same floor as mtpconv.formats.fp8).
_TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def fp8_scaled(x, amax):
    """``x`` in FP8's range for the amax of its row: ``(x / scale clamped, scale)``."""
    scale = tl.maximum(amax, _TINY) / FP8_MAX
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
):
    # Grid (rows, PARTS): each program holds BLOCK_K columns of its row in registers; with
    # PARTS > 1 the row's programs (all resident: rows x PARTS <= the SM count) agree on
    # its amax before they quantize.
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


@triton.jit
def _quant_static_kernel(x_ptr, q_ptr, s_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.clamp(x / tl.load(s_ptr), -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


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


@triton.jit
def _quant_tensor_once_kernel(
    x_ptr,
    y_ptr,
    sum_ptr,
    q_ptr,
    s_ptr,
    slots_ptr,
    cnt_ptr,
    numel,
    NPROG: tl.constexpr,
    SLOTS: tl.constexpr,
    CHUNK: tl.constexpr,
    ADD: tl.constexpr,
):
    # Dynamic per-tensor quantization reading the activation once (decode sizes): each
    # program holds its chunk in registers while the programs agree on the amax
    # (agreed_amax; NPROG is at most the SM count, so all are resident).
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ADD:  # x + y, rounded to x's dtype and written (a residual add), is what is quantized
        total = (x + tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + offs, total, mask=mask)
        x = total.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    if NPROG > 1:
        amax = agreed_amax(amax, slots_ptr, cnt_ptr, pid, NPROG, SLOTS)
    q, scale = fp8_scaled(x, amax)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    if pid == 0:
        tl.store(s_ptr, scale)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# Per-token quantization: columns a program holds at most before a row is split across
# programs that agree on its amax (while rows x parts fit in one program per SM). Measured
# in the 27B step at 4 tokens (docs/BENCHMARKS.md, issue 12, tenth session): rows of 5120-
# 6144 took 1.6-2.0 us in one program and 2.3-2.7 us split in four; rows of 17408 (SiLU *
# up) 5.8 us in one program and 2.9 us split in sixteen.
TOKEN_CHUNK = 8192
_TOKEN_STATE: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_TOKEN_KEEP: list[torch.Tensor] = []  # superseded state: a captured graph may still use it


def _token_state(device: torch.device, rows: int, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots ``[rows, parts]`` and per-row counters for split rows, per (device, stream,
    parts); grown, never shrunk or reset (the counters only grow)."""
    key = (*_stream_key(device), parts)
    state = _TOKEN_STATE.get(key)
    if state is None or state[1].numel() < rows:
        if state is not None:
            _TOKEN_KEEP.extend(state)
        cap = max(rows, 64)
        state = (
            torch.zeros(cap * parts, dtype=torch.float32, device=device),
            torch.zeros(cap, dtype=torch.int64, device=device),
        )
        _TOKEN_STATE[key] = state
    return state


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
    sms = _sm_count(x.device.index or 0) if x.device.type == "cuda" else 1
    parts = token_parts(m, k, sms)
    slots, counts = _token_state(x.device, m, parts) if parts > 1 else (s, s)
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


# Activations up to this many elements are quantized by a single program.
SINGLE_PROGRAM_MAX = 96 * 1024
# One-pass kernel: elements per program (held in registers); it takes activations of
# up to ONCE_CHUNK x the SM count elements (one program per SM at most, all resident).
ONCE_CHUNK = 4096
ONCE_ALONE = 16384
_SYNC: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_ONCE: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _stream_key(device: torch.device) -> tuple[int, int]:
    # Barrier state is kept per (device, stream): launches on one stream are ordered.
    return device.index or 0, torch.cuda.current_stream(device).cuda_stream


def _sync_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-pass kernel's amax and its arrival / departure counters."""
    key = _stream_key(device)
    state = _SYNC.get(key)
    if state is None:
        state = (
            torch.zeros(1, dtype=torch.float32, device=device),
            torch.zeros(2, dtype=torch.int32, device=device),
        )
        _SYNC[key] = state
    return state


def _once_state(device: torch.device, nprog: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-pass kernel's amax slots and its counter, one pair per program count."""
    key = (*_stream_key(device), nprog)
    state = _ONCE.get(key)
    if state is None:
        state = (
            torch.zeros(nprog, dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int64, device=device),
        )
        _ONCE[key] = state
    return state


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _once(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    y: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> None:
    """The one-pass per-tensor kernel over contiguous ``x`` (``x + y`` into ``total``)."""
    numel = x.numel()
    # Up to ONCE_ALONE elements one program holds them all (no barrier).
    chunk = triton.next_power_of_2(numel) if numel <= ONCE_ALONE else ONCE_CHUNK
    nprog = triton.cdiv(numel, chunk)
    slots, count = _once_state(x.device, nprog)
    _quant_tensor_once_kernel[(nprog,)](
        x, y if y is not None else x, total if total is not None else q, q, s, slots, count, numel,
        NPROG=nprog, SLOTS=triton.next_power_of_2(nprog), CHUNK=chunk, ADD=y is not None,
        num_warps=max(4, min(16, chunk // 1024)),
    )  # fmt: skip


def add_quant_tensor(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x + y, *quant_per_tensor(x + y))`` in one launch (a residual add whose sum is also
    the next linear's FP8 input, one scale for the tensor), up to ``ONCE_CHUNK`` x the SM
    count elements."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"add_quant_tensor: {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype} differ"
        )
    numel = x.numel()
    if not 0 < numel <= ONCE_CHUNK * _sm_count(x.device.index or 0):
        raise ValueError(f"add_quant_tensor: {numel} elements, one pass takes 1 to {ONCE_CHUNK} x SMs")
    xc, yc = x.contiguous(), y.contiguous()
    total = torch.empty_like(xc)
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    _once(xc, q, s, yc, total)
    return total, q, s


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
    fits = 0 < numel <= ONCE_CHUNK * _sm_count(x.device.index or 0)
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
