"""The grouped MoE kernel's launch configurations, measured on the H200.

:func:`default_config` gives ``(BLOCK_N, BLOCK_K, warps, stages, mode)`` for
:func:`benchmarks.kernels.moe.moe_grouped` (which re-exports it and the modes), from the
sweeps of ``benchmarks/sweep_moe.py`` recorded in docs/BENCHMARKS.md (issue 12).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# the config's last field: how a weight tile meets the tokens (FMA_NARROW: FMA with the
# kernel's NARROW loads and in-thread sums)
FMA, DOT, DOT_FP8, FMA_NARROW = 0, 1, 2, 3

Config = tuple[int, int, int, int, int]  # (BLOCK_N, BLOCK_K, warps, stages, mode)

# FP8 experts at one token: configurations for a given K in place of the measured ones, for
# timing candidates inside a whole drafter step (:func:`one_token_fp8`)
_ONE_TOKEN_FP8: dict[int, Config] = {}


@contextlib.contextmanager
def one_token_fp8(configs: dict[int, Config]) -> Iterator[None]:
    """FP8 experts of inner size K at one token take ``configs[K]`` while the context is active."""
    before = dict(_ONE_TOKEN_FP8)
    _ONE_TOKEN_FP8.update(configs)
    try:
        yield
    finally:
        _ONE_TOKEN_FP8.clear()
        _ONE_TOKEN_FP8.update(before)


def default_config(tokens: int, n: int, k: int, fp8: bool, act: bool = False, fp8_x: bool = False) -> Config:
    """Best measured ``(BLOCK_N, BLOCK_K, warps, stages, mode)`` on the H200 for experts
    ``[E, n, k]`` (the measured rule depends on ``k``, the precision and what the kernel does
    to its input: SiLU * up with ``act``, nothing with FP8 activations, ``fp8_x``).

    One token, from ``sweep_moe.py --tokens 1`` (docs/BENCHMARKS.md, eighth
    session; 397B and Next-80B experts, both projections and precisions): the narrow-load
    FMA with 8-row tiles, 512-wide K steps and 2 warps was the best of 24 configurations
    in all four FP8 cases (by 6-23% over the previous choice) and on the BF16 down
    projections (K <= 1024; by 3-22%); the BF16 gate_up projections keep 1024-wide K steps
    with 4 warps (within 1% of their best). With PDL on (twelfth session, the same sweep):
    FP8 experts with K >= 4096 (397B's gate_up) take 1024-wide K steps with 4 warps too,
    24.5 us against 27.3 with 512-wide ones; on Next-80B's (K = 2048) and both down
    projections 512-wide steps with 2 warps stayed the best. Without the routing checks
    (twenty-second session, ``sweep_moe.py --tokens 1 --models qwen3.5-397b-a17b
    --precisions fp8``): 397B's gate_up takes 16-row tiles (24.9 us against 26.1 with 8
    rows) and its down projection (K = 1024) 64 x 128 tiles with 4 warps, whose threads
    split the rows more than K (13.7 us against 14.4); Next-80B's were not swept then.
    Experts with K < 512 (not swept) take the FMA.

    2+ tokens, from ``sweep_moe.py --tokens 4,16 --split`` (docs/BENCHMARKS.md, ninth
    session): the MMA with 64 x 128 tiles, 4 warps and 3 stages on inputs that need nothing
    more (FP8 activations quantized per token beforehand, BF16 ones without SiLU *
    up), within 1.1% of the best of 32 tiles in all eight FP8 and four BF16 cases; BF16
    experts with SiLU * up in the kernel 64-wide K tiles where K <= 1024 (the down
    projections: within 4% of the best, where 128-wide tiles lost up to 23%; seventh
    session), 128-wide ones above; FP8 experts quantizing in registers 128 x 128 tiles with
    8 warps (within 1% of the best; seventh session). FP8 activations over K >= 4096 (397B's
    gate_up): 64 x 256 tiles in 5 stages, 79.6 us against 81.4 at 4 tokens and 266.8 against
    269.1 at 16, the best of ``sweep_moe.py --tokens 4,16 --split --deep`` (5-8 stages;
    fourteenth session), where the down projections (K = 1024) gained nothing."""
    if tokens == 1 and not fp8_x:
        override = _ONE_TOKEN_FP8.get(k) if fp8 else None
        if override is not None:
            return override
        if k < 512:
            return 16, 256, 4, 3, FMA
        if fp8 and k >= 4096:
            return 16, 1024, 4, 3, FMA_NARROW
        if fp8 and k == 1024:
            return 64, 128, 4, 3, FMA_NARROW
        if fp8 or k <= 1024:
            return 8, 512, 2, 3, FMA_NARROW
        return 8, 1024, 4, 3, FMA_NARROW
    if fp8 and not fp8_x:
        return 128, 128, 8, 3, DOT_FP8
    if fp8_x and k >= 4096:
        return 64, 256, 4, 5, DOT
    return 64, 64 if act and k <= 1024 else 128, 4, 3, DOT
