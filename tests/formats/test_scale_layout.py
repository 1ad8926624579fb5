"""The stored FP8 scale shapes (`mtpconv.formats.scale_layout`): one rule for the converter and the plugin."""

from __future__ import annotations

import pytest

from mtpconv.formats.scale_layout import BLOCK, ScaleLayout, blocks, stored_scale_shape


@pytest.mark.parametrize(("edge", "count"), [(1, 1), (BLOCK, 1), (BLOCK + 1, 2), (3 * BLOCK, 3), (0, 0)])
def test_blocks_counts_the_last_partial_block(edge: int, count: int) -> None:
    assert blocks(edge) == count


def test_block_scales_of_a_fused_gate_up_count_each_half() -> None:
    # [E, 2I, H] with I = 64: one block row per half (gate, then up), where the 128 rows as one
    # weight would need only one
    assert stored_scale_shape(ScaleLayout.BLOCK_128, (3, 128, 300), fused_halves=True) == (3, 2, 3)
    assert stored_scale_shape(ScaleLayout.BLOCK_128, (3, 128, 300)) == (3, 1, 3)
    assert stored_scale_shape(ScaleLayout.BLOCK_128, (3, 300, 200)) == (3, 3, 2)
    assert stored_scale_shape(ScaleLayout.PER_CHANNEL, (300, 200)) == (300,)
    assert stored_scale_shape(ScaleLayout.PER_CHANNEL_COLUMN, (300, 200)) == (300, 1)
