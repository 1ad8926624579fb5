"""``fp8_linear``: one call for every FP8 drafter linear, on the fastest path measured.

Paths (``Fp8Path``), all computing ``x @ (w_fp8 * w_scale).T + bias``:

``wo_skinny``
    Weight-only split-K skinny GEMM (``triton_skinny``): reads BF16/FP16
    activations directly (no activation-quantization kernel), one launch,
    every weight-scale layout (per tensor, per channel, 128x128 blocks).
    The default for up to ``SKINNY_MAX_TOKENS`` tokens on sm_89+ GPUs (but for the
    measured shapes below at 2-16 tokens), and for block scales at any token count.
``skinny_token``
    The activations quantized per token in one Triton launch, then the skinny GEMM's FP8
    MMA on them with each tile's K range whole (the launch a producer's FP8 rows get,
    :func:`takes_prepared`). The default at 2-16 tokens on the shapes of
    ``skinny_tuned.SELF_PREPARED``, where the two launches beat the one-launch paths.
``scaled_mm_fused``
    Dynamic per-tensor activation scale computed and applied in ONE Triton
    kernel (reading the activation once at decode sizes), then per-tensor
    ``torch._scaled_mm`` (a per-row weight scale is applied after a float32
    GEMM, in one kernel). The default beyond ``SKINNY_MAX_TOKENS`` tokens with
    a per-tensor weight scale, and at 2-16 tokens on the shapes of
    ``SCALED_MM_SHAPES`` outside ``SELF_PREPARED`` (docs/BENCHMARKS.md).
``wo_triton``
    Weight-only: FP8 weights converted in registers, activations stay
    BF16/FP16, one Triton kernel. Fastest at one token with per-row scales;
    its 2+-token (tensor-core) variant loses to the paths above.
``scaled_mm_token``
    Dynamic per-token activation quantization in one Triton kernel (weight
    scale folded into the row scale), then ``torch._scaled_mm`` row-wise.
``scaled_mm_token_torch``
    The same with the quantization as torch ops (CUDA without Triton).
``scaled_mm_tensor``
    Dynamic per-tensor activation scale as torch ops + ``torch._scaled_mm``
    (what a naive port does; kept as the measured baseline).
``scaled_mm_static``
    Static (calibrated) activation scale; needs ``input_scale``.
``dequant``
    Pure torch, any device: upcasts the weight on every call. Correct, slow;
    the CPU fallback (the vLLM plugin has its own CPU kernel).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from enum import Enum
from types import ModuleType

import torch

from mtpconv.kernels import reference
from mtpconv.kernels.skinny_tuned import SELF_PREPARED, TUNED_PREPARED, token_bucket

# Selection thresholds measured on the H200 (docs/BENCHMARKS.md, per-linear
# tables at Qwen3.5-27B shapes). With per-row weight scales: the weight-only
# kernel up to WO_MAX_TOKENS, the fused path up to FUSED_PER_ROW_MAX_TOKENS,
# row-wise ``torch._scaled_mm`` beyond.
WO_MAX_TOKENS = 1
FUSED_PER_ROW_MAX_TOKENS = 16
SKINNY_MAX_TOKENS = 16
# (tokens bucket, N, K) of the benchmarked drafters where ``scaled_mm_fused`` beat the
# tuned skinny GEMM at both token counts of the bucket (2 and 4 for bucket 4, 8 and 16
# for bucket 16), with a per-tensor weight scale and with per-row scales (vLLM's fused
# q/k/v and gate/up), side by side on the H200 (``scripts/bench_paths.py [--per-row]``;
# docs/BENCHMARKS.md, issue 12, sixth session): the wide linears (qkv, the 27B MLP's
# gate_up); all in ``SELF_PREPARED`` since the fourteenth session, which select_path checks
# first. us fused / skinny at 4 and 16 tokens, per-tensor scale:
SCALED_MM_SHAPES = frozenset(
    {
        (4, 14336, 5120), (16, 14336, 5120),  # Qwen3.5-27B qkv: 24.3 / 27.4, 25.6 / 29.9
        (4, 34816, 5120), (16, 34816, 5120),  # Qwen3.5-27B gate_up: 50.9 / 56.3, 51.5 / 59.7
        (4, 17408, 4096), (16, 17408, 4096),  # Qwen3.5-397B qkv: 24.2 / 27.5, 25.5 / 29.5
        (4, 9216, 2048), (16, 9216, 2048),  # Qwen3-Next-80B qkv: 9.5 / 13.3, 10.4 / 13.5
    }
)  # fmt: skip
_ENV_FORCE = "MTPCONV_FP8_PATH"


class Fp8Path(str, Enum):
    """The FP8 linear implementations this package can run."""

    WO_SKINNY = "wo_skinny"
    SKINNY_TOKEN = "skinny_token"
    SCALED_MM_FUSED = "scaled_mm_fused"
    WO_TRITON = "wo_triton"
    SCALED_MM_TOKEN = "scaled_mm_token"
    SCALED_MM_TOKEN_TORCH = "scaled_mm_token_torch"
    SCALED_MM_TENSOR = "scaled_mm_tensor"
    SCALED_MM_STATIC = "scaled_mm_static"
    DEQUANT = "dequant"


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether ``triton`` is importable (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _triton() -> ModuleType:
    from mtpconv.kernels import triton_fp8

    return triton_fp8


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _fp8_mma(device: torch.device) -> bool:
    """FP8 tensor-core matmul (``torch._scaled_mm``) needs sm_89 or newer."""
    return device.type == "cuda" and _capability(device.index or 0) >= (8, 9)


def available_paths(
    device: torch.device, *, static_scale: bool = False, block_scale: bool = False
) -> list[Fp8Path]:
    """Paths that can run on ``device`` (the order carries no preference)."""
    paths = [Fp8Path.DEQUANT]
    if device.type != "cuda":
        return paths
    if triton_available():
        paths.append(Fp8Path.WO_SKINNY)
        if block_scale:  # only the skinny kernel and the reference apply 128x128 blocks
            return paths
        paths.append(Fp8Path.WO_TRITON)
    elif block_scale:
        return paths
    if _fp8_mma(device):
        paths += [Fp8Path.SCALED_MM_TOKEN_TORCH, Fp8Path.SCALED_MM_TENSOR]
        if triton_available():
            paths += [Fp8Path.SCALED_MM_FUSED, Fp8Path.SCALED_MM_TOKEN, Fp8Path.SKINNY_TOKEN]
        if static_scale:
            paths.append(Fp8Path.SCALED_MM_STATIC)
    return paths


def select_path(
    device: torch.device,
    tokens: int,
    *,
    static_scale: bool = False,
    per_row_scale: bool = False,
    block_scale: bool = False,
    shape: tuple[int, int] | None = None,
) -> Fp8Path:
    """The fastest measured path for ``tokens`` rows on ``device`` (``shape``: the
    weight's ``(N, K)``, which picks the path at 2-16 tokens for the measured shapes).

    ``MTPCONV_FP8_PATH`` forces a path (for debugging and benchmarks); a forced
    path that cannot run here raises ``ValueError``.
    """
    forced = os.environ.get(_ENV_FORCE)
    if forced:
        path = Fp8Path(forced)
        if path not in available_paths(device, static_scale=static_scale, block_scale=block_scale):
            raise ValueError(f"{_ENV_FORCE}={forced} cannot run on {device}")
        return path
    if device.type != "cuda":
        return Fp8Path.DEQUANT
    triton = triton_available()
    if block_scale:
        return Fp8Path.WO_SKINNY if triton else Fp8Path.DEQUANT
    if not _fp8_mma(device):  # no FP8 tensor cores (before sm_89)
        return Fp8Path.WO_TRITON if triton else Fp8Path.DEQUANT
    if not triton:
        return Fp8Path.SCALED_MM_TOKEN_TORCH if per_row_scale else Fp8Path.SCALED_MM_TENSOR
    if tokens <= SKINNY_MAX_TOKENS and not static_scale:
        bucket = token_bucket(tokens)
        if tokens >= 2 and shape is not None and (bucket, *shape) in SELF_PREPARED:
            return Fp8Path.SKINNY_TOKEN
        if tokens >= 2 and shape is not None and (bucket, *shape) in SCALED_MM_SHAPES:
            return Fp8Path.SCALED_MM_FUSED
        return Fp8Path.WO_SKINNY
    if per_row_scale:
        if tokens <= WO_MAX_TOKENS:
            return Fp8Path.WO_TRITON
        if tokens <= FUSED_PER_ROW_MAX_TOKENS:
            return Fp8Path.SCALED_MM_FUSED
        return Fp8Path.SCALED_MM_TOKEN
    return Fp8Path.SCALED_MM_FUSED


@functools.lru_cache(maxsize=16)
def _ones_scalar(device: torch.device) -> torch.Tensor:
    return torch.ones((), dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=64)
def _ones_row(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones((1, n), dtype=torch.float32, device=device)


def _weight_scale_row(w_scale: torch.Tensor, n: int) -> torch.Tensor:
    s = w_scale.to(torch.float32)
    return s.reshape(1, n) if s.numel() > 1 else _ones_row(n, s.device) * s.reshape(1, 1)


def _scaled_mm_per_tensor(
    q: torch.Tensor,
    sa: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``torch._scaled_mm`` on FP8 rows ``q [M, K]`` with one scale ``sa`` (0-d)."""
    if w_scale.numel() > 1:
        # Row-wise torch._scaled_mm is slow at decode sizes (BENCHMARKS.md): run
        # the per-tensor GEMM to float32 and apply the row scales after it.
        y32 = reference.scaled_mm(q, w_fp8, sa, _ones_scalar(q.device), None, torch.float32)
        y: torch.Tensor = _triton().row_scale_cast(y32, w_scale, bias, out_dtype)
        return y
    return reference.scaled_mm(q, w_fp8, sa, w_scale.to(torch.float32), bias, out_dtype)


def run_path(
    path: Fp8Path,
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run one named path (no selection). Shapes: ``x [..., K]``, ``w_fp8 [N, K]``."""
    if path is Fp8Path.DEQUANT:
        return reference.dequant_linear(x, w_fp8, w_scale, bias)
    if path in (Fp8Path.WO_SKINNY, Fp8Path.SKINNY_TOKEN):
        from mtpconv.kernels import triton_quant, triton_skinny

        if path is Fp8Path.WO_SKINNY:
            out: torch.Tensor = triton_skinny.skinny_linear(x, w_fp8, w_scale, bias)
            return out
        q, sa = triton_quant.quant_per_token(x.reshape(-1, x.shape[-1]))
        out = triton_skinny.skinny_linear(q, w_fp8, w_scale, bias, x_scale=sa, out_dtype=x.dtype)
        return out.reshape(*x.shape[:-1], w_fp8.shape[0])
    if reference.is_block_scale(w_scale, *w_fp8.shape):
        raise ValueError(f"{path.value} does not take 128x128 block scales")
    if path is Fp8Path.WO_TRITON:
        y: torch.Tensor = _triton().wo_linear(x, w_fp8, w_scale, bias)
        return y
    lead = x.shape[:-1]
    n = w_fp8.shape[0]
    per_row_w = w_scale.numel() > 1
    if path is Fp8Path.SCALED_MM_FUSED:
        q, sa = _triton().quant_per_tensor(x)
        y = _scaled_mm_per_tensor(q, sa, w_fp8, w_scale, bias, x.dtype)
    elif path is Fp8Path.SCALED_MM_TOKEN:
        # Fold a per-tensor weight scale into the row scale: scale_b is then ones.
        if per_row_w:
            q, sa = _triton().quant_per_token(x)
            sb = w_scale.to(torch.float32).reshape(1, n)
        else:
            q, sa = _triton().quant_per_token(x, w_scale)
            sb = _ones_row(n, x.device)
        y = reference.scaled_mm(q, w_fp8, sa, sb, bias, x.dtype)
    elif path is Fp8Path.SCALED_MM_TOKEN_TORCH:
        q, sa = reference.quant_per_token(x)
        y = reference.scaled_mm(q, w_fp8, sa, _weight_scale_row(w_scale, n), bias, x.dtype)
    elif path is Fp8Path.SCALED_MM_TENSOR:
        q, sa = reference.quant_per_tensor(x.reshape(-1, x.shape[-1]))
        if per_row_w:
            y = reference.scaled_mm(
                q,
                w_fp8,
                sa.reshape(1, 1).expand(q.shape[0], 1).contiguous(),
                w_scale.to(torch.float32).reshape(1, n),
                bias,
                x.dtype,
            )
        else:
            y = reference.scaled_mm(q, w_fp8, sa, w_scale.to(torch.float32), bias, x.dtype)
    elif path is Fp8Path.SCALED_MM_STATIC:
        if input_scale is None:
            raise ValueError("scaled_mm_static needs input_scale")
        if per_row_w:
            raise ValueError("scaled_mm_static needs a per-tensor weight scale")
        s_in = input_scale.to(torch.float32)
        q = _triton().quant_static(x, s_in) if triton_available() else reference.quant_static(x, s_in)
        y = reference.scaled_mm(q, w_fp8, s_in, w_scale.to(torch.float32), bias, x.dtype)
    else:  # pragma: no cover - exhaustive over Fp8Path
        raise ValueError(f"unknown FP8 path {path!r}")
    return y.reshape(*lead, n)


class Prepared(str, Enum):
    """What a linear's producer hands it in place of BF16 rows (:func:`takes_prepared`)."""

    TOKEN = "token"  # FP8 rows with one scale each: the skinny GEMM's FP8 MMA
    TENSOR = "tensor"  # FP8 rows with one scale for the tensor: cuBLAS (torch._scaled_mm)


def takes_prepared(tokens: int, n: int, k: int) -> Prepared | None:
    """What makes :func:`fp8_linear` on a ``[n, k]`` weight at ``tokens`` rows faster than
    BF16 rows, when the producer of its input quantizes as it writes (a concatenation, a
    residual add or SiLU * up: :mod:`mtpconv.kernels.triton_quant`), as the H200 measured:
    per-token FP8 rows on the shapes of ``skinny_tuned.TUNED_PREPARED``, per-tensor ones
    where ``fp8_linear`` would quantize per tensor itself (``SCALED_MM_SHAPES``); None
    elsewhere (one token, beyond 16, other shapes)."""
    bucket = token_bucket(tokens)
    if tokens < 2 or bucket is None:
        return None
    if (bucket, n, k) in TUNED_PREPARED:
        return Prepared.TOKEN
    return Prepared.TENSOR if (bucket, n, k) in SCALED_MM_SHAPES else None


def _prepared_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    x_scale: torch.Tensor,
    out_dtype: torch.dtype | None,
    block: bool,
) -> torch.Tensor:
    """:func:`fp8_linear` on FP8 rows ``x * x_scale``: cuBLAS with one scale for the tensor,
    the skinny GEMM's FP8 MMA with one a row (or 128x128 weight blocks: ``block``), or the
    dequantized reference without Triton or CUDA."""
    if x.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_linear: x_scale comes with float8_e4m3fn rows, got {x.dtype}")
    if out_dtype is None:
        raise ValueError("fp8_linear: FP8 rows (x_scale) need an out_dtype")
    tokens = x.numel() // max(x.shape[-1], 1)
    per_tensor = x_scale.dim() == 0
    if not per_tensor and x_scale.numel() != tokens:
        raise ValueError(
            f"fp8_linear: x_scale needs 0-d or one scale per row ({tokens}): {tuple(x_scale.shape)}"
        )
    sa = x_scale.to(torch.float32)
    if x.device.type == "cuda" and triton_available():
        n, k = w_fp8.shape
        if per_tensor and not block and _fp8_mma(x.device) and n % 16 == 0 and k % 16 == 0:  # cuBLAS's rule
            y = _scaled_mm_per_tensor(x.reshape(-1, x.shape[-1]), sa, w_fp8, w_scale, bias, out_dtype)
            return y.reshape(*x.shape[:-1], w_fp8.shape[0])
        from mtpconv.kernels import triton_skinny

        rows = sa.expand(tokens) if per_tensor else sa
        out: torch.Tensor = triton_skinny.skinny_linear(
            x, w_fp8, w_scale, bias, x_scale=rows.contiguous(), out_dtype=out_dtype
        )
        return out
    deq = x.to(torch.float32) * (sa if per_tensor else sa.reshape(*x.shape[:-1], 1))
    return reference.dequant_linear(deq, w_fp8, w_scale, bias).to(out_dtype)


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    input_scale: torch.Tensor | None = None,
    path: Fp8Path | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x @ (w_fp8 * w_scale).T + bias`` on the fastest measured path.

    ``x``: ``[..., K]`` bf16/fp16 (float32 works on the ``dequant`` path);
    ``w_fp8``: ``[N, K]`` float8_e4m3fn, row-major; ``w_scale``: float32 0-d
    (per-tensor), ``[N]`` (per output row, e.g. fused q/k/v with one scale
    per shard expanded to rows) or ``[ceil(N/128), ceil(K/128)]`` (one per
    128x128 block); ``bias``: ``[N]`` or None. Returns
    ``[..., N]`` in ``x.dtype``. Safe inside CUDA graph capture (no host
    sync, no data-dependent choice).

    ``x_scale``: ``x`` is float8_e4m3fn rows already, each ``x * x_scale`` (float32: 0-d,
    one scale for the tensor, or one value per row; see :func:`takes_prepared`), and
    ``out_dtype`` the output's dtype; ``path`` and ``input_scale`` do not apply then.
    """
    if w_fp8.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_linear needs a float8_e4m3fn weight, got {w_fp8.dtype}")
    if w_fp8.dim() != 2 or x.shape[-1] != w_fp8.shape[1]:
        raise ValueError(f"fp8_linear shapes do not match: x {tuple(x.shape)}, weight {tuple(w_fp8.shape)}")
    n, k = w_fp8.shape
    block = reference.is_block_scale(w_scale, n, k)
    if not block and w_scale.numel() not in (1, n):
        raise ValueError(
            f"w_scale must be 0-d, [{n}] or [{-(-n // 128)}, {-(-k // 128)}] (128x128 "
            f"blocks), got shape {tuple(w_scale.shape)}"
        )
    if x_scale is not None:
        if path is not None or input_scale is not None:
            raise ValueError("fp8_linear: x_scale takes neither a path nor an input_scale")
        return _prepared_linear(x, w_fp8, w_scale, bias, x_scale, out_dtype, block)
    if path is None:
        tokens = x.numel() // max(x.shape[-1], 1)
        path = select_path(
            x.device,
            tokens,
            static_scale=input_scale is not None and not block,
            per_row_scale=w_scale.numel() > 1 and not block,
            block_scale=block,
            shape=(n, k),
        )
    return run_path(path, x, w_fp8, w_scale, bias, input_scale=input_scale)
