"""Per-shape launch configurations of the skinny GEMM, measured on the H200.

Source: ``PYTHONPATH=$PWD python3 scripts/bench_draft.py --out $OUT/sw --sweep-only
--tokens 1,4,16`` (docs/BENCHMARKS.md, issue 12): the best configuration of the sweep
for each dense FP8 linear of the benchmarked drafters (Qwen3.5-27B and 397B-A17B: the
sweep that added TMA weight loads, ``--models qwen3.5-27b,qwen3.5-397b-a17b``; Qwen3-Next:
the sweep before it). Keys are ``(tokens, N, K)`` with tokens 1, 4 (for 2-4) or 16
(for 5-16); values ``(dot, block_n, block_k, warps, stages, waves, mma, tma)`` with
``waves`` resident programs per SM. Shapes not listed take
the rule in :func:`mtpconv.kernels.triton_skinny.default_config`.
"""

from __future__ import annotations

TUNED: dict[tuple[int, int, int], tuple[bool, int, int, int, int, int, int, bool]] = {
    (1, 1024, 2048): (False, 16, 512, 8, 4, 4, 0, False),  # Qwen3-Next-80B-A3B shared_gate_up, 0.50 TB/s
    (1, 2048, 512): (False, 4, 512, 4, 3, 4, 0, False),  # Qwen3-Next-80B-A3B shared_down, 0.49 TB/s
    (1, 2048, 4096): (False, 16, 512, 8, 4, 4, 0, False),  # Qwen3.5-397B-A17B shared_gate_up, 1.37 TB/s
    (1, 4096, 1024): (False, 4, 512, 4, 4, 12, 0, False),  # Qwen3.5-397B-A17B shared_down, 1.29 TB/s
    (1, 4096, 8192): (False, 8, 1024, 8, 4, 4, 0, False),  # Qwen3.5-397B-A17B fc, 2.73 TB/s
    (1, 5120, 6144): (False, 32, 256, 8, 4, 4, 0, False),  # Qwen3.5-27B o, 2.56 TB/s
    (1, 5120, 10240): (False, 16, 256, 4, 4, 4, 0, False),  # Qwen3.5-27B fc, 2.90 TB/s
    (1, 5120, 17408): (False, 16, 256, 4, 3, 4, 0, False),  # Qwen3.5-27B down, 3.25 TB/s
    (1, 9216, 2048): (False, 4, 512, 4, 3, 12, 0, False),  # Qwen3-Next-80B-A3B qkv, 2.19 TB/s
    (1, 14336, 5120): (False, 16, 512, 8, 3, 4, 0, False),  # Qwen3.5-27B qkv, 3.25 TB/s
    (1, 17408, 4096): (False, 8, 1024, 8, 3, 12, 0, False),  # Qwen3.5-397B-A17B qkv, 2.90 TB/s
    (1, 32768, 2048): (False, 16, 256, 4, 3, 16, 0, False),  # Qwen3-Next-80B-A3B head32k, 3.43 TB/s
    (1, 32768, 4096): (False, 16, 256, 4, 3, 8, 0, False),  # Qwen3.5-397B-A17B head32k, 3.80 TB/s
    (1, 32768, 5120): (False, 16, 256, 4, 3, 4, 0, False),  # Qwen3.5-27B head32k, 3.79 TB/s
    (1, 34816, 5120): (False, 8, 256, 4, 4, 4, 0, False),  # Qwen3.5-27B gate_up, 3.50 TB/s
    (4, 1024, 2048): (True, 64, 256, 4, 4, 2, 2, False),  # Qwen3-Next-80B-A3B shared_gate_up, 0.38 TB/s
    (4, 2048, 512): (True, 32, 256, 4, 4, 2, 2, False),  # Qwen3-Next-80B-A3B shared_down, 0.23 TB/s
    (4, 2048, 4096): (True, 64, 256, 4, 4, 2, 2, False),  # Qwen3.5-397B-A17B shared_gate_up, 1.05 TB/s
    (4, 4096, 1024): (True, 64, 256, 4, 4, 2, 2, False),  # Qwen3.5-397B-A17B shared_down, 0.70 TB/s
    (4, 4096, 8192): (True, 64, 256, 4, 3, 2, 2, True),  # Qwen3.5-397B-A17B fc, 2.35 TB/s
    (4, 5120, 6144): (True, 128, 128, 4, 4, 2, 2, True),  # Qwen3.5-27B o, 2.37 TB/s
    (4, 5120, 10240): (True, 64, 256, 4, 4, 2, 2, True),  # Qwen3.5-27B fc, 2.72 TB/s
    (4, 5120, 17408): (True, 64, 256, 4, 4, 2, 2, True),  # Qwen3.5-27B down, 3.17 TB/s
    (4, 9216, 2048): (True, 64, 128, 8, 3, 8, 2, False),  # Qwen3-Next-80B-A3B qkv, 1.41 TB/s
    (4, 14336, 5120): (True, 64, 128, 4, 3, 4, 2, False),  # Qwen3.5-27B qkv, 2.62 TB/s
    (4, 17408, 4096): (True, 128, 128, 4, 3, 2, 2, True),  # Qwen3.5-397B-A17B qkv, 2.55 TB/s
    (4, 32768, 2048): (True, 128, 128, 4, 4, 2, 2, False),  # Qwen3-Next-80B-A3B head32k, 3.33 TB/s
    (4, 32768, 4096): (True, 64, 128, 4, 4, 4, 2, False),  # Qwen3.5-397B-A17B head32k, 3.63 TB/s
    (4, 32768, 5120): (True, 128, 128, 4, 4, 2, 2, True),  # Qwen3.5-27B head32k, 3.69 TB/s
    (4, 34816, 5120): (True, 64, 128, 4, 3, 4, 2, False),  # Qwen3.5-27B gate_up, 3.17 TB/s
    (16, 1024, 2048): (True, 32, 256, 4, 4, 4, 2, False),  # Qwen3-Next-80B-A3B shared_gate_up, 0.36 TB/s
    (16, 2048, 512): (True, 32, 256, 4, 3, 4, 2, False),  # Qwen3-Next-80B-A3B shared_down, 0.22 TB/s
    (16, 2048, 4096): (True, 64, 256, 4, 3, 2, 2, False),  # Qwen3.5-397B-A17B shared_gate_up, 1.00 TB/s
    (16, 4096, 1024): (True, 64, 256, 4, 4, 2, 2, False),  # Qwen3.5-397B-A17B shared_down, 0.64 TB/s
    (16, 4096, 8192): (True, 64, 256, 4, 3, 2, 2, True),  # Qwen3.5-397B-A17B fc, 2.29 TB/s
    (16, 5120, 6144): (True, 64, 128, 4, 4, 4, 2, False),  # Qwen3.5-27B o, 2.24 TB/s
    (16, 5120, 10240): (True, 64, 128, 4, 3, 4, 2, False),  # Qwen3.5-27B fc, 2.59 TB/s
    (16, 5120, 17408): (True, 64, 256, 4, 4, 2, 2, True),  # Qwen3.5-27B down, 3.02 TB/s
    (16, 9216, 2048): (True, 64, 128, 8, 3, 8, 2, False),  # Qwen3-Next-80B-A3B qkv, 1.39 TB/s
    (16, 14336, 5120): (True, 64, 128, 4, 3, 4, 2, False),  # Qwen3.5-27B qkv, 2.42 TB/s
    (16, 17408, 4096): (True, 128, 128, 4, 3, 2, 2, False),  # Qwen3.5-397B-A17B qkv, 2.37 TB/s
    (16, 32768, 2048): (True, 128, 128, 4, 4, 2, 2, False),  # Qwen3-Next-80B-A3B head32k, 3.28 TB/s
    (16, 32768, 4096): (True, 64, 128, 4, 4, 4, 2, False),  # Qwen3.5-397B-A17B head32k, 3.58 TB/s
    (16, 32768, 5120): (True, 64, 128, 4, 4, 4, 2, True),  # Qwen3.5-27B head32k, 3.64 TB/s
    (16, 34816, 5120): (True, 64, 128, 4, 3, 4, 2, False),  # Qwen3.5-27B gate_up, 3.00 TB/s
}


def token_bucket(m: int) -> int | None:
    """The sweep's token count that stands for ``m`` rows (None beyond 16)."""
    if m == 1:
        return 1
    if m <= 4:
        return 4
    return 16 if m <= 16 else None
