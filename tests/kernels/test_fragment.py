"""CPU checks of the register-fragment MMA kernel's host side (the kernel runs in
tests/kernels/test_fragment_cuda.py): its PTX operand numbering and when it applies."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from mtpconv.kernels import triton_fragment as tf  # noqa: E402


@pytest.mark.parametrize("groups", [1, 2])
def test_mma_asm_uses_every_operand_it_is_given(groups: int) -> None:
    text = tf._mma_asm(groups, 2)
    constraints = tf._constraints(groups, 2).split(",")
    used = {int(v) for v in re.findall(r"\$(\d+)", text)}
    # unused: each group's activations for the second row of a pair (the same values)
    unused = {4 * groups + 4 + 8 * g + i for g in range(groups) for i in (2, 3)}
    assert used == set(range(len(constraints))) - unused
    outs = [i for i, c in enumerate(constraints) if c.startswith("=")]
    assert outs == list(range(4 * groups))
    # two MMAs per token group (one per 4-byte word of a row)
    assert text.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 2 * groups
    assert "$" not in re.sub(r"\$\d+", "", text)


def _operands(k: int = 2048, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(4, k, dtype=dtype)
    w = torch.zeros(256, k, dtype=torch.float8_e4m3fn)
    return x, w


def test_usable_accepts_aligned_bf16_operands() -> None:
    x, w = _operands()
    assert tf.usable(x, w, 64, 128, 4)
    assert tf.usable(x, w, 256, 32, 4)


@pytest.mark.parametrize(
    ("why", "k", "dtype", "block_n", "block_k", "warps"),
    [
        ("fp16 activations", 2048, torch.float16, 64, 128, 4),
        ("K not a multiple of 8", 2044, torch.bfloat16, 64, 128, 4),
        ("one row group per warp", 2048, torch.bfloat16, 32, 128, 4),
        ("K step not whole 32-byte groups", 2048, torch.bfloat16, 64, 48, 4),
        ("rows not a multiple of 8 per warp", 2048, torch.bfloat16, 100, 128, 4),
    ],
)
def test_usable_refuses(why: str, k: int, dtype: torch.dtype, block_n: int, block_k: int, warps: int) -> None:
    x, w = _operands(k, dtype)
    assert not tf.usable(x, w, block_n, block_k, warps), why


def test_usable_refuses_rows_not_16_aligned() -> None:
    x, w = _operands(2056)
    assert not tf.usable(x[:, 8:], w, 64, 128, 4)
    assert not tf.usable(x, w[:, 8:], 64, 128, 4)


@pytest.mark.parametrize(("m", "want"), [(1, 8), (8, 8), (9, 16), (16, 16), (40, 16)])
def test_block_m(m: int, want: int) -> None:
    assert tf.block_m(m) == want
