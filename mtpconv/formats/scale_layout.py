"""How a drafter linear's FP8 scale is laid out on disk (DESIGN §5), without torch.

The stored scale is always the per-tensor value; its *layout* is the one the declared
format needs, so the plan (headers only) can size it and a replicated value dequantizes
to the same weights.
"""

from __future__ import annotations

from enum import Enum

BLOCK = 128  # the block edge of vLLM's FP8_PB_WO / FP8_BLOCK_SCALES (weight_block_size)


def blocks(n: int) -> int:
    """How many ``BLOCK``-wide blocks cover ``n`` rows or columns (the last one may be partial)."""
    return -(-n // BLOCK)


class ScaleLayout(str, Enum):
    """How a drafter linear's per-tensor scale is stored (DESIGN §5)."""

    PER_CHANNEL = "per_channel"  # float32 [out]: ModelOpt FP8_PER_CHANNEL_PER_TOKEN
    BLOCK_128 = "block_128"  # float32 [ceil(out/128), ceil(in/128)] (per expert): FP8_PB_WO
    PER_CHANNEL_COLUMN = "per_channel_column"  # float32 [out, 1]: compressed-tensors channel

    def __str__(self) -> str:
        return self.value


def stored_scale_shape(
    layout: ScaleLayout, shape: tuple[int, ...], fused_halves: bool = False
) -> tuple[int, ...]:
    """The stored scale's shape for a weight of ``shape`` ([out, in] or [E, out, in]).

    ``fused_halves``: a fused ``gate_up_proj`` [E, 2I, H] whose block rows are counted
    per half (gate blocks, then up blocks), as vLLM's fused-MoE loader splits it.
    """
    *lead, out, inp = shape
    if layout is ScaleLayout.PER_CHANNEL:
        return (*lead, out)
    if layout is ScaleLayout.PER_CHANNEL_COLUMN:
        return (*lead, out, 1)
    if fused_halves:
        if out % 2:
            raise ValueError(f"a fused gate_up weight needs an even row count, got {out}")
        return (*lead, 2 * blocks(out // 2), blocks(inp))
    return (*lead, blocks(out), blocks(inp))
