"""FP8 linear kernels for the drafter: CUDA fast paths and pure-torch fallbacks.

Importing this package never imports Triton or vLLM; Triton kernels load on
first use with a CUDA tensor. Entry points: :func:`fp8_linear` (the kernel chosen from
:data:`KERNELS`, :mod:`mtpconv.kernels.linear`); :func:`fp8_mlp`, a SiLU-gated MLP of two FP8
linears (one launch where it can); and both as the opaque custom ops :func:`fp8_linear_op`
(``torch.ops.mtpconv.fp8_linear``) and :func:`fp8_mlp_op` (``torch.ops.mtpconv.fp8_mlp``) for
code that ``torch.compile`` traces. Measured launch configurations: :mod:`mtpconv.kernels.tuning`.
"""

from mtpconv.kernels.linear import (
    KERNELS,
    SKINNY_MAX_TOKENS,
    Fp8LinearKernel,
    choose_kernel,
    fp8_linear,
    kernel_named,
    triton_available,
)
from mtpconv.kernels.mlp import fp8_mlp
from mtpconv.kernels.op import fp8_linear_op, fp8_mlp_op

__all__ = [
    "KERNELS",
    "SKINNY_MAX_TOKENS",
    "Fp8LinearKernel",
    "choose_kernel",
    "fp8_linear",
    "fp8_linear_op",
    "fp8_mlp",
    "fp8_mlp_op",
    "kernel_named",
    "triton_available",
]
