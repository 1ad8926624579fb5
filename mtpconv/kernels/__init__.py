"""FP8 linear kernels for the drafter: CUDA fast paths and pure-torch fallbacks.

Importing this package never imports Triton or vLLM; Triton kernels load on
first use with a CUDA tensor. Entry points: :func:`fp8_linear`; :func:`fp8_mlp`, a
SiLU-gated MLP of two FP8 linears (one launch where it can); and both as the opaque
custom ops :func:`fp8_linear_op` (``torch.ops.mtpconv.fp8_linear``) and
:func:`fp8_mlp_op` (``torch.ops.mtpconv.fp8_mlp``) for code that ``torch.compile`` traces.
"""

from mtpconv.kernels.linear import (
    FUSED_PER_ROW_MAX_TOKENS,
    SKINNY_MAX_TOKENS,
    WO_MAX_TOKENS,
    Fp8Path,
    Prepared,
    available_paths,
    fp8_linear,
    run_path,
    select_path,
    takes_prepared,
    triton_available,
)
from mtpconv.kernels.mlp import fp8_mlp
from mtpconv.kernels.op import fp8_linear_op, fp8_mlp_op

__all__ = [
    "FUSED_PER_ROW_MAX_TOKENS",
    "SKINNY_MAX_TOKENS",
    "WO_MAX_TOKENS",
    "Fp8Path",
    "Prepared",
    "available_paths",
    "fp8_linear",
    "fp8_linear_op",
    "fp8_mlp",
    "fp8_mlp_op",
    "run_path",
    "select_path",
    "takes_prepared",
    "triton_available",
]
