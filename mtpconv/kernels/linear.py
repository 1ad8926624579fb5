"""``fp8_linear``: one call for every FP8 drafter linear, on the kernel measured fastest.

Every kernel computes ``x @ (w_fp8 * w_scale).T + bias``. Kernel choice follows vLLM's
own pattern (``vllm/model_executor/layers/quantization/kernels``): :data:`KERNELS` is an
ordered list of kernel classes, each saying whether it supports the device
(:meth:`Fp8LinearKernel.supports`) and whether it is the kernel for a call
(:meth:`Fp8LinearKernel.takes`: token count, weight shape, scale layout); the first that
says yes to both runs. ``MTPCONV_DISABLED_KERNELS`` (names, comma-separated) leaves kernels
out of the choice; a benchmark names one through ``fp8_linear(..., kernel=...)``.

The order and the shapes named in the tuning table (:mod:`mtpconv.kernels.tuning`) come
from measurements on the H200 (docs/BENCHMARKS.md): the skinny GEMM up to
``SKINNY_MAX_TOKENS`` tokens, quantizing per token first (``skinny_token``) or per tensor
for cuBLAS (``scaled_mm_fused``) on the shapes the table names, cuBLAS beyond.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import torch

from mtpconv.formats.scale_layout import BLOCK, blocks
from mtpconv.kernels import reference, tuning
from mtpconv.kernels.kept_state import kept

Bias = torch.Tensor | None
SKINNY_MAX_TOKENS = 16  # the skinny GEMM's rows at most, where it is chosen
DISABLED_ENV = "MTPCONV_DISABLED_KERNELS"


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether ``triton`` is importable (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


class ScaleLayout(Enum):
    """How ``w_scale`` covers an ``[N, K]`` weight."""

    TENSOR = "tensor"  # 0-d
    ROW = "row"  # [N]
    BLOCK = "block"  # [ceil(N/128), ceil(K/128)]


@dataclass(frozen=True)
class Device:
    """What a device offers the kernels."""

    cuda: bool
    triton: bool
    fp8_mma: bool  # FP8 tensor cores (torch._scaled_mm): sm_89 or newer

    @classmethod
    def of(cls, device: torch.device) -> Device:
        cuda = device.type == "cuda"
        return cls(cuda, cuda and triton_available(), cuda and _capability(device.index or 0) >= (8, 9))


@dataclass(frozen=True)
class Call:
    """What one ``fp8_linear`` call asks: ``tokens`` rows on an ``[n, k]`` weight."""

    tokens: int
    n: int
    k: int
    scale: ScaleLayout

    def key(self) -> tuning.Key | None:
        """The call's key in the tuning table (None beyond its token counts)."""
        bucket = tuning.token_bucket(self.tokens)
        return None if bucket is None else (bucket, self.n, self.k)


class Fp8LinearKernel:
    """One way to run an FP8 linear. Subclasses say where they run and which calls they are
    chosen for; :data:`KERNELS` orders them."""

    name: ClassVar[str]
    block_scales: ClassVar[bool] = False  # runs 128x128 block scales

    @classmethod
    def supports(cls, device: Device) -> bool:
        raise NotImplementedError

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        """Whether this kernel is the one for ``call`` (given that it supports the device
        and no kernel before it in :data:`KERNELS` takes the call)."""
        raise NotImplementedError

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        raise NotImplementedError


class SkinnyToken(Fp8LinearKernel):
    """The activations quantized per token in one Triton launch, then the skinny GEMM's FP8
    MMA on them with each tile's K range whole: at 2-16 tokens on the table's
    ``skinny_token`` shapes, where the two launches beat one."""

    name = "skinny_token"
    block_scales = True

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.triton and device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is not ScaleLayout.BLOCK and call.tokens >= 2 and call.key() in table.skinny_token

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        from mtpconv.kernels import triton_quant, triton_skinny

        q, sa = triton_quant.quant_per_token(x.reshape(-1, x.shape[-1]))
        out = triton_skinny.skinny_linear(q, w_fp8, w_scale, bias, x_scale=sa, out_dtype=x.dtype)
        return out.reshape(*x.shape[:-1], w_fp8.shape[0])


class ScaledMmFused(Fp8LinearKernel):
    """A dynamic per-tensor activation scale computed and applied in one Triton launch, then
    per-tensor ``torch._scaled_mm`` (a per-row weight scale applied after a float32 GEMM, in
    one kernel): at 2-16 tokens on the table's ``scaled_mm_fused`` shapes, and beyond 16
    tokens with a per-tensor weight scale."""

    name = "scaled_mm_fused"

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.triton and device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        if call.scale is ScaleLayout.BLOCK:
            return False
        if call.tokens > SKINNY_MAX_TOKENS:
            return call.scale is ScaleLayout.TENSOR
        return call.tokens >= 2 and call.key() in table.scaled_mm_fused

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        from mtpconv.kernels import triton_quant_tensor

        q, sa = triton_quant_tensor.quant_per_tensor(x)
        y = scaled_mm_per_tensor(q, sa, w_fp8, w_scale, bias, x.dtype)
        return y.reshape(*x.shape[:-1], w_fp8.shape[0])


class WoTriton(Fp8LinearKernel):
    """Weight-only, FP8 weights converted in registers, activations BF16/FP16, one Triton
    launch: GPUs without FP8 tensor cores."""

    name = "wo_triton"

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.triton and not device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is not ScaleLayout.BLOCK

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        from mtpconv.kernels import triton_fp8

        y: torch.Tensor = triton_fp8.wo_linear(x, w_fp8, w_scale, bias)
        return y


class WoSkinny(Fp8LinearKernel):
    """The split-K skinny GEMM (:mod:`mtpconv.kernels.triton_skinny`) on BF16/FP16 rows, one
    launch, every scale layout: up to ``SKINNY_MAX_TOKENS`` tokens, and block scales at any
    token count."""

    name = "wo_skinny"
    block_scales = True

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.triton

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is ScaleLayout.BLOCK or call.tokens <= SKINNY_MAX_TOKENS

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        from mtpconv.kernels import triton_skinny

        out: torch.Tensor = triton_skinny.skinny_linear(x, w_fp8, w_scale, bias)
        return out


class ScaledMmToken(Fp8LinearKernel):
    """Dynamic per-token activation quantization in one Triton launch (a per-tensor weight
    scale folded into the row scale), then row-wise ``torch._scaled_mm``."""

    name = "scaled_mm_token"

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.triton and device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is not ScaleLayout.BLOCK

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        from mtpconv.kernels import triton_quant

        n = w_fp8.shape[0]
        x2 = x.reshape(-1, x.shape[-1])
        if w_scale.numel() > 1:
            q, sa = triton_quant.quant_per_token(x2)
            sb = _weight_scale_row(w_scale, n)
        else:
            q, sa = triton_quant.quant_per_token(x2, w_scale)
            sb = _ones_row(n, x.device)
        return _scaled_mm_like(x, q, sa, w_fp8, sb, bias)


class ScaledMmTokenTorch(Fp8LinearKernel):
    """Per-token activation quantization as torch ops, then row-wise ``torch._scaled_mm``:
    FP8 GPUs without Triton, per-row weight scales."""

    name = "scaled_mm_token_torch"

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is ScaleLayout.ROW

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        q, sa = reference.quant_per_token(x)
        return _scaled_mm_like(x, q, sa, w_fp8, _weight_scale_row(w_scale, w_fp8.shape[0]), bias)


class ScaledMmTensor(Fp8LinearKernel):
    """A per-tensor activation scale as torch ops, then ``torch._scaled_mm``: FP8 GPUs
    without Triton."""

    name = "scaled_mm_tensor"

    @classmethod
    def supports(cls, device: Device) -> bool:
        return device.fp8_mma

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return call.scale is not ScaleLayout.BLOCK

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        q, sa = reference.quant_per_tensor(x.reshape(-1, x.shape[-1]))
        if w_scale.numel() > 1:
            sa = sa.reshape(1, 1).expand(q.shape[0], 1).contiguous()
            sb = _weight_scale_row(w_scale, w_fp8.shape[0])
        else:
            sb = w_scale.to(torch.float32)
        return _scaled_mm_like(x, q, sa, w_fp8, sb, bias)


class Dequant(Fp8LinearKernel):
    """Pure torch, any device: upcasts the weight on every call. Correct, slow: the fallback."""

    name = "dequant"
    block_scales = True

    @classmethod
    def supports(cls, device: Device) -> bool:
        return True

    @classmethod
    def takes(cls, call: Call, table: tuning.Tuning) -> bool:
        return True

    @staticmethod
    def run(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: Bias) -> torch.Tensor:
        return reference.dequant_linear(x, w_fp8, w_scale, bias)


# The choice, first match wins (see the module docstring).
KERNELS: tuple[type[Fp8LinearKernel], ...] = (
    SkinnyToken,
    ScaledMmFused,
    WoTriton,
    WoSkinny,
    ScaledMmToken,
    ScaledMmTokenTorch,
    ScaledMmTensor,
    Dequant,
)


def kernel_named(name: str) -> type[Fp8LinearKernel]:
    """The kernel of :data:`KERNELS` called ``name`` (``ValueError`` naming them all)."""
    for kernel in KERNELS:
        if kernel.name == name:
            return kernel
    raise ValueError(f"no FP8 linear kernel {name!r}: one of {', '.join(k.name for k in KERNELS)}")


@functools.lru_cache(maxsize=8)
def _disabled(value: str) -> frozenset[str]:
    names = frozenset(filter(None, (v.strip() for v in value.split(","))))
    for name in names:
        try:
            kernel_named(name)
        except ValueError as exc:
            raise ValueError(f"{DISABLED_ENV}: {exc}") from None
    return names


def disabled_kernels() -> frozenset[str]:
    """The kernels ``MTPCONV_DISABLED_KERNELS`` leaves out of the choice."""
    return _disabled(os.environ.get(DISABLED_ENV, ""))


def usable(device: torch.device, scale: ScaleLayout) -> list[type[Fp8LinearKernel]]:
    """The kernels that can run on ``device`` with ``scale`` (in :data:`KERNELS`' order)."""
    dev = Device.of(device)
    return [k for k in KERNELS if k.supports(dev) and (scale is not ScaleLayout.BLOCK or k.block_scales)]


def choose_kernel(device: torch.device, call: Call) -> type[Fp8LinearKernel]:
    """The first kernel of :data:`KERNELS`, not disabled, that supports ``device`` and takes ``call``."""
    dev = Device.of(device)
    table = tuning.for_device(device)
    off = disabled_kernels()
    for kernel in KERNELS:
        if kernel.name not in off and kernel.supports(dev) and kernel.takes(call, table):
            return kernel
    left_out = ",".join(sorted(off))
    raise ValueError(f"no FP8 linear kernel left for {call} on {device} ({DISABLED_ENV}={left_out})")


_ONES: dict[tuple[object, ...], torch.Tensor] = {}


def _ones_scalar(device: torch.device) -> torch.Tensor:
    return kept(_ONES, (device,), device, lambda _: torch.ones((), dtype=torch.float32, device=device))


def _ones_row(n: int, device: torch.device) -> torch.Tensor:
    return kept(_ONES, (n, device), device, lambda _: torch.ones((1, n), dtype=torch.float32, device=device))


def _weight_scale_row(w_scale: torch.Tensor, n: int) -> torch.Tensor:
    s = w_scale.to(torch.float32)
    return s.reshape(1, n) if s.numel() > 1 else _ones_row(n, s.device) * s.reshape(1, 1)


def _scaled_mm_like(
    x: torch.Tensor, q: torch.Tensor, sa: torch.Tensor, w_fp8: torch.Tensor, sb: torch.Tensor, bias: Bias
) -> torch.Tensor:
    """``torch._scaled_mm`` of ``x``'s FP8 rows ``q`` (scales ``sa``) on ``w_fp8`` (scales ``sb``),
    in ``x``'s dtype and leading shape."""
    return reference.scaled_mm(q, w_fp8, sa, sb, bias, x.dtype).reshape(*x.shape[:-1], w_fp8.shape[0])


def scaled_mm_per_tensor(
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
        from mtpconv.kernels import triton_fp8

        y32 = reference.scaled_mm(q, w_fp8, sa, _ones_scalar(q.device), None, torch.float32)
        y: torch.Tensor = triton_fp8.row_scale_cast(y32, w_scale, bias, out_dtype)
        return y
    return reference.scaled_mm(q, w_fp8, sa, w_scale.to(torch.float32), bias, out_dtype)


def scale_layout(w_scale: torch.Tensor, n: int, k: int) -> ScaleLayout:
    """Which layout ``w_scale`` is for an ``[n, k]`` weight (``ValueError`` for none)."""
    if reference.is_block_scale(w_scale, n, k):
        return ScaleLayout.BLOCK
    if w_scale.numel() == 1:
        return ScaleLayout.TENSOR
    if w_scale.numel() == n:
        return ScaleLayout.ROW
    raise ValueError(
        f"w_scale must be 0-d, [{n}] or [{blocks(n)}, {blocks(k)}] "
        f"({BLOCK}x{BLOCK} blocks), got shape {tuple(w_scale.shape)}"
    )


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    kernel: type[Fp8LinearKernel] | None = None,
) -> torch.Tensor:
    """``x @ (w_fp8 * w_scale).T + bias`` on the kernel :func:`choose_kernel` picks.

    ``x``: ``[..., K]`` bf16/fp16 (float32 works on the ``dequant`` kernel);
    ``w_fp8``: ``[N, K]`` float8_e4m3fn, row-major; ``w_scale``: float32 0-d
    (per-tensor), ``[N]`` (per output row, e.g. fused q/k/v with one scale
    per shard expanded to rows) or ``[ceil(N/128), ceil(K/128)]`` (one per
    128x128 block); ``bias``: ``[N]`` or None. Returns
    ``[..., N]`` in ``x.dtype``. Safe inside CUDA graph capture (no host
    sync, no data-dependent choice). ``kernel``: run that one (a benchmark's choice); it must
    support the device and the scale layout.
    """
    if w_fp8.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_linear needs a float8_e4m3fn weight, got {w_fp8.dtype}")
    if w_fp8.dim() != 2 or x.shape[-1] != w_fp8.shape[1]:
        raise ValueError(f"fp8_linear shapes do not match: x {tuple(x.shape)}, weight {tuple(w_fp8.shape)}")
    n, k = w_fp8.shape
    scale = scale_layout(w_scale, n, k)
    if kernel is None:
        kernel = choose_kernel(x.device, Call(x.numel() // max(k, 1), n, k, scale))
    elif kernel not in usable(x.device, scale):
        raise ValueError(f"FP8 linear kernel {kernel.name} does not run {scale.value} scales on {x.device}")
    return kernel.run(x, w_fp8, w_scale, bias)
