"""Weight-only FP8 skinny GEMM for decode sizes (Triton, CUDA only; imported lazily).

``skinny_linear(x, w_fp8, w_scale, bias)`` computes ``x @ (w_fp8 * w_scale).T + bias``
for a few rows of BF16/FP16 activations, reading the activations as they are:
no activation-quantization kernel, one launch per linear. FP8 weights are
widened in registers; the weight scale is applied in the epilogue (per tensor:
0-d; per output channel: ``[N]``) or per 128x128 block (``[ceil(N/128),
ceil(K/128)]``) on each K step's partial product.

Bytes, not arithmetic, bound these shapes, so the kernel is built to keep many
weight bytes in flight on every SM:

* split-K: when the output has too few tiles to fill the GPU, each tile's K
  range is cut into ``SPLIT`` pieces; every piece writes a float32 partial to a
  workspace and the last piece to arrive (an atomic counter per tile) sums
  them, applies scale and bias and writes the output, then resets the counter.
  One launch, no memset, safe in CUDA graphs (launches on one stream are
  ordered; the workspace is kept per stream and never freed);
* one token: FMA on CUDA cores with a 2-D accumulator reduced once at the end;
  two or more: ``tl.dot`` with the weight rows on the MMA's M side and the
  tokens (padded to 16) on its N side; ``Config.narrow`` (1-4 tokens): the
  narrow-load GEMV of :mod:`mtpconv.kernels.triton_gemv` instead;
* where the sweep found it faster (``Config.tma``: some 2-16 token shapes, by 1-6%),
  weight tiles arrive by TMA bulk copies through a host-side tensor descriptor.
* launched with programmatic dependent launch where :mod:`mtpconv.kernels.pdl` says so
  (by default on Hopper with Triton 3.6+; ``MTPCONV_PDL``): it waits for the previous
  kernel before reading or writing anything.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mtpconv.formats.scale_layout import BLOCK
from mtpconv.kernels import pdl as pdl_setting
from mtpconv.kernels import triton_gemv
from mtpconv.kernels.kept_state import kept
from mtpconv.kernels.reference import is_block_scale
from mtpconv.kernels.triton_quant import BLOCK_EDGE, FP8_MAX, stream_key
from mtpconv.kernels.triton_tile import finish_tile, pdl_enter, pdl_leave, weight_tile
from mtpconv.kernels.tuning import Entry, Tuning, for_device, token_bucket

SCALE_TENSOR, SCALE_ROW, SCALE_BLOCK = 0, 1, 2


@triton.jit
def _skinny_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    w_desc,
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
    DOT: tl.constexpr,
    MMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    TMA: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_m = offs_m < M
    k_start = pid_k * k_per_split
    pdl_enter(PDL)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    if DOT:
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + (k_start + offs_k)[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        x_ptrs = x_ptr + pid_m * stride_xm + k_start + offs_k
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    mask_k = offs_k < K  # replaced on every K step when K is uneven
    for kk in range(0, k_per_split, BLOCK_K):
        if not EVEN_K:
            mask_k = (k_start + kk + offs_k) < K
        if TMA:  # a bulk copy by the tensor-memory accelerator; zero-filled past N and K
            w = w_desc.load([pid_n * BLOCK_N, k_start + kk])
        else:
            w = weight_tile(w_ptrs, mask_n, mask_k, EVEN_K)
        if SCALE == 2:
            s_at = s_ptr + (offs_n // BLOCK_EDGE) * stride_sn + (k_start + kk) // BLOCK_EDGE
            sb = tl.load(s_at, mask=mask_n, other=0.0)
        if DOT:
            if EVEN_K:
                xt = tl.load(x_ptrs, mask=mask_m[None, :], other=0.0)
            else:
                xt = tl.load(x_ptrs, mask=mask_m[None, :] & mask_k[:, None], other=0.0)
            if MMA == 2:  # FP8 MMA: the tile's tokens quantized here, one scale per token
                xf = xt.to(tl.float32)
                amax = tl.maximum(tl.max(tl.abs(xf), axis=0), 1e-30)
                q = (xf * (FP8_MAX / amax)[None, :]).to(tl.float8e4nv)
                part = tl.dot(w, q) * (amax / FP8_MAX)[None, :]
                if SCALE == 2:
                    part = part * sb[:, None]
                acc += part
            elif MMA == 3:  # FP8 MMA on activations quantized before the launch (x_scale)
                if SCALE == 2:
                    acc += tl.dot(w, xt) * sb[:, None]
                else:
                    acc = tl.dot(w, xt, acc)
            elif MMA == 1:  # FP16 MMA (e4m3 -> f16 is exact; activations must fit fp16)
                if SCALE == 2:
                    acc += tl.dot(w.to(tl.float16), xt.to(tl.float16)) * sb[:, None]
                else:
                    acc = tl.dot(w.to(tl.float16), xt.to(tl.float16), acc)
            elif SCALE == 2:
                acc += tl.dot(w.to(xt.dtype), xt) * sb[:, None]
            else:
                acc = tl.dot(w.to(xt.dtype), xt, acc)
        else:
            if EVEN_K:
                xv = tl.load(x_ptrs).to(tl.float32)
            else:
                xv = tl.load(x_ptrs, mask=mask_k, other=0.0).to(tl.float32)
            if SCALE == 2:
                acc2 += w.to(tl.float32) * xv[None, :] * sb[:, None]
            else:
                acc2 += w.to(tl.float32) * xv[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    pdl_leave(PDL)
    if not DOT:
        acc = tl.reshape(tl.sum(acc2, axis=1), (BLOCK_N, 1))
    if MMA == 3:
        acc = acc * tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[None, :]
    finish_tile(
        acc, s_ptr, b_ptr, o_ptr, ws_ptr, cnt_ptr, offs_n, offs_m, mask_n, mask_m, M, N, n_split,
        stride_om, SCALE, HAS_BIAS, USE_SPLIT,
    )  # fmt: skip


MMA_PREPARED = 3  # Config.mma: FP8 activations quantized before the launch (x_scale)


class Config(NamedTuple):
    """Launch shape: FMA (one token) or dot, tile sizes, warps, stages, resident programs."""

    dot: bool
    block_n: int
    block_k: int
    warps: int
    stages: int
    programs: int  # programs resident at once: K is split so the work fills whole waves
    # dot operands: 0 the activation dtype (bf16: slow, measured); 1 fp16 (weight-only
    # numerics, but activations must fit fp16's range); 2 fp8: each token's 128-wide K
    # tile quantized in registers with its own scale (W8A8 error, any range); 3 fp8 as the
    # caller prepared it (x_scale: one scale per token, applied after the K loop).
    mma: int = 0
    tma: bool = False  # weight tiles by TMA bulk copies (block_k <= 256, K a multiple of 16)
    # 1-4 tokens, dot False: the narrow-load GEMV (mtpconv.kernels.triton_gemv): 8-byte
    # weight loads in the activation row's layout, no barrier in the K loop, an accumulator
    # of one float per 8 weights per thread
    narrow: bool = False
    # K pieces a tile's K range is cut into; 0: the fewest that fill the waves (split_for)
    split: int = 0
    # narrow GEMV: the K steps (of the program's first) whose weight tiles are loaded before
    # the PDL wait
    first_ahead: int = 0


@functools.lru_cache(maxsize=8)
def sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _tabled(entry: Entry, sms: int) -> Config:
    """A :mod:`mtpconv.kernels.tuning` entry (resident programs as waves) as a Config."""
    return Config(*entry._replace(waves=entry.waves * sms))


def default_config(m: int, n: int, k: int, sms: int, table: Tuning | None = None) -> Config:
    """The sweep's best configuration for a benchmarked shape (``table``'s ``skinny``
    entries; None: :func:`mtpconv.kernels.tuning.for_device`'s without a device), else rules
    from sweeps on the H200 (docs/BENCHMARKS.md, *Tuning tables*).

    One token: FMA on CUDA cores (weight-only numerics), the narrow-load GEMV from K = 4096
    (it won every swept shape with K >= 4096 at one token), two rows a program where the
    rows are few (fewer 8-row tiles than a wave of programs: N < 4224 on the H200) or
    long (K >= 14336), else eight. Two or more: FP8 MMA with the activations quantized
    per (token, 128-wide K tile) in registers, which was within 4% of the best
    configuration on every 27B / 397B linear (the FP16 MMA was as fast but overflows on
    activations beyond 65504; the BF16 MMA was 1.5x slower); on other families' shapes it
    is up to 83% slower than the best (64 x 256 tiles by TMA won there on some shapes and
    lost on others: docs/BENCHMARKS.md)."""
    tuned = (table or for_device()).skinny.get((token_bucket(m) or 0, n, k))  # 0: beyond the table
    if tuned is not None:
        return _tabled(tuned, sms)
    if m == 1:
        if k >= 4096:
            programs = 4 * sms  # one wave
            rows = 2 if n < 8 * programs or k >= 14336 else 8
            return Config(False, rows, 1024, 4, 3, programs, narrow=True)
        if n * k <= 8 * 2**20:
            return Config(False, 8, 512, 4, 3, 4 * sms)
        if k <= 2048 or (n >= 12288 and n * k <= 80 * 2**20):
            return Config(False, 16, 512, 8, 3, 4 * sms)
        return Config(False, 16, 256, 4, 3, 8 * sms)
    return Config(True, 64, 128, 4, 3, 4 * sms, 2)


def prepared_config(m: int, n: int, k: int, sms: int, table: Tuning | None = None) -> Config:
    """The launch for FP8 activations prepared before it (``x_scale``): the sweep's best
    (``table``'s ``prepared`` entries, each with ``split`` 1), else the tile of
    :func:`default_config` at 2+ tokens, else 64 x 128 tiles; each tile's K range in one
    program (``split`` 1). Cutting K to fill the waves lost on every shape of
    ``benchmarks/linear_paths.py --prepared --splits --tokens 4,16`` (docs/BENCHMARKS.md:
    17 drafter linears, N 1024-34816, K 512-17408, even those of 16
    tiles on 132 SMs): the fastest configuration ran K in one piece on all 30 (shape, tokens)
    pairs; the fastest in two or four pieces was 4-21% slower where it was among the eight
    fastest at all, the float32 partials and the last piece's sum costing more than idle SMs."""
    table = table or for_device()
    tuned = table.prepared.get((token_bucket(m) or 0, n, k))
    if tuned is not None:
        return _tabled(tuned, sms)
    base = default_config(m, n, k, sms, table)
    if base.dot:
        return base._replace(mma=MMA_PREPARED, split=1)
    return Config(True, 64, 128, 4, 3, 4 * sms, MMA_PREPARED, split=1)


def split_for(tiles: int, k: int, block_k: int, programs: int) -> tuple[int, int]:
    """``(n_split, k_per_split)``: K pieces (multiples of ``block_k``) so that the
    ``tiles * n_split`` programs fill whole waves of ``programs`` resident ones: the
    fewest pieces that use 85% of the wave slots (pieces of >= 4 K steps once the
    tiles alone fill a wave), else the best use."""
    steps = triton.cdiv(k, block_k)
    best = (0.0, 1, steps * block_k)
    for want in range(1, min(steps, 64) + 1):
        k_per = triton.cdiv(steps, want) * block_k
        n_split = triton.cdiv(k, k_per)
        if want > 1 and tiles >= programs and k_per < 4 * block_k:
            break
        units = tiles * n_split
        use = units / (triton.cdiv(units, programs) * programs)
        if use > best[0] + 1e-9:
            best = (use, n_split, k_per)
        if use >= 0.85:
            break
    return best[1], best[2]


_WORK: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}
_KEEP: list[tuple[torch.Tensor, torch.Tensor]] = []  # superseded: a captured graph may still use them


def _workspace(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K partials and the zeroed arrival counters, per (device, stream): launches on
    one stream are ordered (:func:`mtpconv.kernels.kept_state.kept`)."""

    def make(old: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        old_f, old_t = (old[0].numel(), old[1].numel()) if old is not None else (0, 0)
        return (
            torch.empty(max(floats, old_f, 1 << 20), dtype=torch.float32, device=device),
            torch.zeros(max(tiles, old_t, 1 << 14), dtype=torch.int32, device=device),
        )

    return kept(
        _WORK,
        stream_key(device),
        device,
        make,
        lambda state: state[0].numel() >= floats and state[1].numel() >= tiles,
        _KEEP,
    )


def scale_kind(w_scale: torch.Tensor, n: int, k: int) -> int:
    """Which scale layout ``w_scale`` is (raises on any other shape)."""
    if w_scale.numel() == 1:
        return SCALE_TENSOR
    if is_block_scale(w_scale, n, k):
        return SCALE_BLOCK
    if w_scale.numel() == n:
        return SCALE_ROW
    raise ValueError(
        f"weight scale of shape {tuple(w_scale.shape)} fits neither 0-d, [{n}] "
        f"nor 128x128 blocks of a [{n}, {k}] weight"
    )


def skinny_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: Config | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x @ (w * w_scale).T + bias`` for ``x [..., K]`` (any rows; tuned for 1-16).

    ``x_scale`` (``[rows]`` or ``[rows, 1]`` float32): ``x`` is FP8 already, each row
    ``x * x_scale`` (as :func:`mtpconv.kernels.triton_quant.quant_per_token` returns
    them); the MMA reads it as it is and the row scales are applied after the K loop.
    ``out_dtype``: the output's dtype (default ``x``'s; needed with ``x_scale``)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = w.shape[0]
    if x_scale is not None:
        if x.dtype != torch.float8_e4m3fn or w.dtype != torch.float8_e4m3fn:
            raise ValueError(
                f"skinny_linear: x_scale takes FP8 activations and weights, got {x.dtype} and {w.dtype}"
            )
        if x_scale.numel() != m or x_scale.dtype != torch.float32:
            raise ValueError(
                f"skinny_linear: x_scale must be {m} float32 row scales, got "
                f"{tuple(x_scale.shape)} {x_scale.dtype}"
            )
        if out_dtype is None:
            raise ValueError("skinny_linear: FP8 activations (x_scale) need an out_dtype")
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    kind = scale_kind(w_scale, n, k)
    s = w_scale.to(torch.float32)
    s = s.reshape(()) if kind == SCALE_TENSOR else (s.reshape(-1) if kind == SCALE_ROW else s)
    if not s.is_contiguous():
        s = s.contiguous()
    sms = sm_count(x.device.index or 0) if x.device.type == "cuda" else 8
    table = for_device(x.device) if config is None else None
    if x_scale is not None:
        cfg = config if config is not None else prepared_config(m, n, k, sms, table)
        if not cfg.dot or cfg.mma != MMA_PREPARED:
            raise ValueError(f"skinny_linear: FP8 activations (x_scale) take a dot config, mma 3: {cfg}")
    else:
        cfg = config if config is not None else default_config(m, n, k, sms, table)
    gemv = cfg.narrow and not cfg.dot
    if gemv and m > triton_gemv.MAX_TOKENS:
        raise ValueError(f"a narrow configuration takes at most {triton_gemv.MAX_TOKENS} tokens, got {m}")
    dot = not gemv and (cfg.dot or m > 1)
    block_k = min(cfg.block_k, BLOCK) if kind == SCALE_BLOCK else cfg.block_k
    mma_m = min(64, max(16, triton.next_power_of_2(m)))  # the MMA's token tile
    block_m = triton_gemv.block_m(m) if gemv else (mma_m if dot else 1)
    m_tiles = triton.cdiv(m, block_m)
    n_tiles = triton.cdiv(n, cfg.block_n)
    step = max(block_k, BLOCK if kind == SCALE_BLOCK else 1)
    if cfg.split > 0:
        k_per = triton.cdiv(triton.cdiv(k, step), cfg.split) * step
        n_split = triton.cdiv(k, k_per)
    else:
        n_split, k_per = split_for(n_tiles * m_tiles, k, step, cfg.programs)
    if n_split > 1:
        ws, cnt = _workspace(x.device, n_split * m * n, n_tiles * m_tiles)
    else:
        ws, cnt = out, out  # unused pointers
    args = (x2, w, s, bias if bias is not None else s, out, ws, cnt, m, n, k, k_per, n_split)
    strides = (x2.stride(0), w.stride(0), out.stride(0), s.stride(0) if kind == SCALE_BLOCK else 0)
    common = {
        "SCALE": kind,
        "HAS_BIAS": bias is not None,
        "USE_SPLIT": n_split > 1,
        "BLOCK_M": block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": block_k,
        "EVEN_K": k % k_per == 0,
        "num_warps": cfg.warps,
        "num_stages": cfg.stages,
        **pdl_setting.launch(x.device),
    }
    if gemv:
        first = min(cfg.first_ahead, k_per // block_k)
        triton_gemv.gemv_kernel[(n_tiles, n_split, m_tiles)](*args, *strides, FIRST_AHEAD=first, **common)
        return out.reshape(*x.shape[:-1], n)
    tma = cfg.tma and block_k <= 256 and cfg.block_n <= 256 and k % 16 == 0 and w.is_contiguous()
    w_desc: object = w
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, block_k])
    xs = x_scale.reshape(-1) if x_scale is not None else s
    _skinny_kernel[(n_tiles, n_split, m_tiles)](
        x2, xs, w, w_desc, *args[2:], *strides, DOT=dot, MMA=cfg.mma if dot else 0, TMA=tma, **common
    )
    return out.reshape(*x.shape[:-1], n)
