"""The FP8 matmul behind every drafter linear and the FP8 draft head.

One function, :func:`choose_kernel`, decides which kernel a weight runs on; the
rest prepares the weight for it once (after loading) and applies it per call.
Weights stay FP8 in memory on every path (DESIGN §6); only the ``dequant``
fallback widens them, per call and transiently.

Kernels:

``cpu_vnni``
    vLLM's weight-only CPU kernel ``_C.fp8_scaled_mm_cpu`` on a weight packed by
    ``_C.convert_weight_packed`` (activations stay BF16). vLLM selects it only on
    AMX machines; it computes correctly on AVX-512 too, for ``N`` and ``K``
    multiples of 32 (other shapes abort the process inside the op, so they are
    never sent there).
``cuda``
    ``mtpconv.kernels.fp8_linear`` (the measured fastest CUDA path) when that
    package is present, else dynamic per-token activation quantization and
    ``torch._scaled_mm`` with row-wise scales.
``dequant``
    Correct everywhere, slow: ``x @ w.to(x.dtype).T`` times the row scales.

No vLLM import at module level: the CUDA path is testable without vLLM.
"""

from __future__ import annotations

import functools

import torch

from mtpconv.formats.e4m3 import FP8_MAX

CPU_VNNI = "cpu_vnni"
CUDA = "cuda"
DEQUANT = "dequant"
_CPU_BLOCK_K = 128


@functools.lru_cache(maxsize=1)
def _cpu_vnni_ops_available() -> bool:
    try:
        import vllm._custom_ops  # noqa: F401  (loads vLLM's _C library)
    except Exception:
        return False
    ops = torch.ops._C
    return hasattr(ops, "fp8_scaled_mm_cpu") and hasattr(ops, "convert_weight_packed")


def choose_kernel(weight: torch.Tensor) -> str:
    """The kernel for an FP8 weight ``[N, K]`` on its device (the one seam)."""
    n, k = weight.shape
    if weight.device.type == "cuda":
        return CUDA
    if weight.device.type == "cpu" and n % 32 == 0 and k % 32 == 0 and _cpu_vnni_ops_available():
        return CPU_VNNI
    return DEQUANT


def row_scales(shard_scales: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """One float32 scale per output row from one scale per fused shard."""
    s = shard_scales.to(torch.float32).reshape(-1)
    if s.numel() != len(widths):
        raise ValueError(f"{s.numel()} scales for {len(widths)} shards")
    return torch.repeat_interleave(s, torch.tensor(widths, device=s.device))


class PreparedFp8:
    """An FP8 weight in its kernel's layout plus the scales the kernel needs."""

    def __init__(self, weight: torch.Tensor, row_scale: torch.Tensor, kernel: str | None = None):
        if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
            raise TypeError(f"expected a 2-D float8_e4m3fn weight, got {weight.dtype} {tuple(weight.shape)}")
        self.kernel = kernel or choose_kernel(weight)
        self.n, self.k = weight.shape
        self.row_scale = row_scale.to(device=weight.device, dtype=torch.float32).contiguous()
        # A single scale for every row folds into the kernel; otherwise rows are rescaled after.
        first = self.row_scale[:1]
        self.uniform = bool((self.row_scale == first).all())
        self.scalar_scale = first.reshape(()).clone()
        if self.kernel == CPU_VNNI:
            self.weight = torch.ops._C.convert_weight_packed(weight.contiguous())
            blocks = -(-self.k // _CPU_BLOCK_K)
            one = torch.ones((), dtype=torch.float32, device=weight.device)
            s = self.scalar_scale if self.uniform else one
            self.block_scale = s.reshape(1, 1).expand(1, blocks).contiguous()
            self.block_n = -(-self.n // 32) * 32
        else:
            self.weight = weight.contiguous()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ (w * scale).T + bias`` for ``x [..., K]``, in ``x.dtype``."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.k)
        y: torch.Tensor
        if self.kernel == CPU_VNNI and x.dtype == torch.bfloat16:
            y = torch.ops._C.fp8_scaled_mm_cpu(
                x2, self.weight, self.block_scale, [self.block_n, _CPU_BLOCK_K], None, x.dtype, True
            )
            if not self.uniform:
                y = (y.to(torch.float32) * self.row_scale).to(x.dtype)
        elif self.kernel == CUDA:
            # A 0-d scale lets fp8_linear take its fastest (fused per-tensor) path.
            scale = self.scalar_scale if self.uniform else self.row_scale
            y = _cuda_fp8_linear(x2, self.weight, scale, bias)
            bias = None
        else:
            w = self.weight if self.kernel != CPU_VNNI else None
            if w is None:  # packed for the CPU kernel but called with a non-BF16 input
                raise TypeError(f"the CPU FP8 kernel needs bfloat16 activations, got {x.dtype}")
            y = (torch.nn.functional.linear(x2, w.to(x.dtype)).to(torch.float32) * self.row_scale).to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*lead, self.n)


def _cuda_fp8_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``scale`` is 0-d (one per tensor) or ``[N]`` (one per output row)."""
    from mtpconv.kernels import fp8_linear_op

    # The custom op keeps the kernel choice out of vLLM's compiled graph.
    out: torch.Tensor = fp8_linear_op(x, w, scale, bias)
    return out


def scaled_mm_per_token(x: torch.Tensor, w: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token FP8 activations and ``torch._scaled_mm`` (row-wise scales)."""
    x32 = x.to(torch.float32)
    sa = torch.clamp(x32.abs().amax(dim=-1, keepdim=True), min=1e-12) / FP8_MAX
    q = torch.clamp(x32 / sa, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    y = torch._scaled_mm(q, w.t(), scale_a=sa, scale_b=row_scale.reshape(1, -1), out_dtype=x.dtype)
    return y
