"""FP8 linear kernels for the drafter: CUDA fast paths and pure-torch fallbacks.

Importing this package never imports Triton or vLLM; Triton kernels load on
first use with a CUDA tensor. Entry point: :func:`fp8_linear`.
"""

from mtpconv.kernels.linear import (
    FUSED_PER_ROW_MAX_TOKENS,
    WO_MAX_TOKENS,
    Fp8Path,
    available_paths,
    fp8_linear,
    run_path,
    select_path,
    triton_available,
)

__all__ = [
    "FUSED_PER_ROW_MAX_TOKENS",
    "WO_MAX_TOKENS",
    "Fp8Path",
    "available_paths",
    "fp8_linear",
    "run_path",
    "select_path",
    "triton_available",
]
