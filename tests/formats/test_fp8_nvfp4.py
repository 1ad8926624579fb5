"""FP8 and NVFP4 math against hand-computed values and torch's own casts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtpconv.formats.fp8 import (
    FP8_MAX,
    dequantize_fp8,
    fp8_scale,
    quant_error,
    quantize_fp8,
)
from mtpconv.formats.fp8_table import replicate_scale
from mtpconv.formats.nvfp4 import dequantize_nvfp4, dequantize_nvfp4_ct, pack_e2m1_codes, unpack_e2m1_codes
from mtpconv.formats.scale_layout import ScaleLayout


def test_fp8_scale_is_amax_over_448() -> None:
    w = torch.tensor([[1.0, -896.0], [3.0, 0.5]])
    assert float(fp8_scale(w)) == 2.0
    q = quantize_fp8(w)
    assert q.scale.dtype == torch.float32 and q.scale.dim() == 0
    # 896/2 = 448 exactly, 1/2 = 0.5, 3/2 = 1.5, 0.5/2 = 0.25: all exact in e4m3
    assert q.weight.to(torch.float32).tolist() == [[0.5, -448.0], [1.5, 0.25]]


def test_fp8_matches_torch_cast() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=g).to(torch.bfloat16)
    q = quantize_fp8(w)
    scale = w.float().abs().max() / 448.0
    expected = (w.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.weight.view(torch.uint8), expected.view(torch.uint8))
    assert float(q.scale) == float(scale)


def test_fp8_rounds_to_nearest() -> None:
    # amax 448 -> scale 1; 17 lies between e4m3 values 16 and 18 (tie -> even mantissa: 16),
    # 17.5 rounds to 18, 0.3 to the nearest e4m3 value 0.3125.
    w = torch.tensor([[448.0, 17.0, 17.5, 0.3]])
    q = quantize_fp8(w).weight.to(torch.float32)
    assert q.tolist() == [[448.0, 16.0, 18.0, 0.3125]]


def test_fp8_fused_experts_one_scale_each() -> None:
    w = torch.stack([torch.full((2, 3), 4.48), torch.full((2, 3), 44.8)])
    q = quantize_fp8(w)
    assert q.scale.shape == (2,)
    assert torch.allclose(q.scale, torch.tensor([0.01, 0.1]))
    assert torch.allclose(dequantize_fp8(q.weight, q.scale), w, rtol=0.07)


def test_fp8_all_zero_is_finite() -> None:
    q = quantize_fp8(torch.zeros(4, 4))
    assert float(q.scale) > 0
    assert torch.equal(dequantize_fp8(q.weight, q.scale), torch.zeros(4, 4))


def test_fp8_error_stats() -> None:
    w = torch.tensor([[448.0, 17.0]])
    err = quant_error(w, quantize_fp8(w))
    assert err.max_abs == 1.0
    assert err.amax == 448.0
    assert err.rel_l2 == pytest.approx(1.0 / float(torch.linalg.vector_norm(w)))
    assert FP8_MAX == 448.0


def test_e2m1_nibble_order() -> None:
    # byte 0x21: element 0 = low nibble 1 (0.5), element 1 = high nibble 2 (1.0)
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)
    assert unpack_e2m1_codes(packed).tolist() == [[1, 2, 8, 15]]
    codes = torch.randint(0, 16, (3, 32), dtype=torch.uint8)
    assert torch.equal(unpack_e2m1_codes(pack_e2m1_codes(codes)), codes)


def test_nvfp4_dequant_hand_computed() -> None:
    # 32 inputs = 2 groups; codes 0..15 then 15..0
    codes = torch.cat([torch.arange(16), torch.arange(15, -1, -1)]).reshape(1, 32).to(torch.uint8)
    scales = torch.tensor([[2.0, 0.5]]).to(torch.float8_e4m3fn)
    w = dequantize_nvfp4(pack_e2m1_codes(codes), scales, torch.tensor(3.0))
    table = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    expected = [v * 2.0 * 3.0 for v in table] + [v * 0.5 * 3.0 for v in reversed(table)]
    assert w.tolist() == [expected]


def test_nvfp4_rejects_bad_groups() -> None:
    with pytest.raises(ValueError, match="groups"):
        dequantize_nvfp4(
            torch.zeros(1, 16, dtype=torch.uint8), torch.ones(1, 1).to(torch.float8_e4m3fn), torch.tensor(1.0)
        )


def test_nvfp4_ct_dequant_hand_computed() -> None:
    """compressed-tensors: the same nibbles and block scales, the global scale divides."""
    # byte 0x7A: element 0 = low nibble 0xA (-1.0), element 1 = high nibble 7 (6.0);
    # bytes 0x00 / 0x08 are +0 / -0 pairs; 16 inputs per row = one block each.
    packed = torch.tensor(
        [[0x7A, 0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], [0x08, 0xF3, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]],
        dtype=torch.uint8,
    )
    scales = torch.tensor([[2.0], [0.5]]).to(torch.float8_e4m3fn)
    w = dequantize_nvfp4_ct(packed, scales, torch.tensor([4.0]))  # stored [1], as llm-compressor does
    # row 0: -1 * 2 / 4 = -0.5, 6 * 2 / 4 = 3, 0.5 * 2 / 4 = 0.25, 1 * 2 / 4 = 0.5
    # row 1: codes 8 (-0), 0 (0), 3 (1.5) and 15 (-6): * 0.5 / 4 -> -0, 0, 0.1875, -0.75
    assert w[0, :4].tolist() == [-0.5, 3.0, 0.25, 0.5]
    assert w[1, :4].tolist() == [-0.0, 0.0, 0.1875, -0.75]
    assert torch.signbit(w[1, 0]) and w[:, 4:].abs().sum() == 0
    # the same codes under ModelOpt with weight_scale_2 = 1 / 4 give the same values
    assert torch.equal(dequantize_nvfp4(packed, scales, torch.tensor(0.25)), w)


def test_nvfp4_ct_divides_by_the_global_scale() -> None:
    # 6 * 1 / 3 = 2 exactly, and 1.5 * 1 / 3 = 0.5: a true division, not a rounded reciprocal
    packed = torch.tensor([[0x37] + [0] * 7], dtype=torch.uint8)  # codes 7 (6.0), 3 (1.5)
    w = dequantize_nvfp4_ct(packed, torch.ones(1, 1).to(torch.float8_e4m3fn), torch.tensor(3.0))
    assert w[0, :2].tolist() == [2.0, 0.5]


def test_nvfp4_ct_rejects_bad_global_scale() -> None:
    packed, scales = torch.zeros(1, 8, dtype=torch.uint8), torch.ones(1, 1).to(torch.float8_e4m3fn)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="weight_global_scale"):
            dequantize_nvfp4_ct(packed, scales, torch.tensor(bad))
    with pytest.raises(ValueError, match="one value"):
        dequantize_nvfp4_ct(packed, scales, torch.tensor([1.0, 2.0]))


def test_per_channel_column_layout() -> None:
    """compressed-tensors channel scales: [out, 1], the per-tensor value on every row."""
    col = ScaleLayout.PER_CHANNEL_COLUMN
    assert replicate_scale(np.float32(0.5), col, (3, 8)).tolist() == [[0.5], [0.5], [0.5]]
    per_expert = replicate_scale(np.array([1.0, 2.0], dtype=np.float32), col, (2, 3, 8))
    assert per_expert.shape == (2, 3, 1) and per_expert[:, :, 0].tolist() == [[1.0] * 3, [2.0] * 3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_checked_path_matches_reference(dtype: torch.dtype) -> None:
    """The 16-bit table path gives the reference bytes, scale and error statistics."""
    from mtpconv.formats.fp8 import quantize_fp8_checked

    g = torch.Generator().manual_seed(1)
    w = (torch.randn(96, 80, generator=g) * 0.05).to(dtype)
    w[0, :6] = torch.tensor([0.0, -0.0, 1e-7, -3.0, 2.5e-3, 7.0]).to(dtype)
    got, err = quantize_fp8_checked(w)
    ref = quantize_fp8(w)
    assert torch.equal(got.weight.view(torch.uint8), ref.weight.view(torch.uint8))
    assert torch.equal(got.scale, ref.scale)
    ref_err = quant_error(w, ref)
    assert err.max_abs == ref_err.max_abs and err.amax == ref_err.amax
    assert err.rel_l2 == pytest.approx(ref_err.rel_l2, rel=1e-4)
    w3 = torch.stack([w, w * 3])
    got3, err3 = quantize_fp8_checked(w3)
    ref3 = quantize_fp8(w3)
    assert torch.equal(got3.weight.view(torch.uint8), ref3.weight.view(torch.uint8))
    assert torch.equal(got3.scale, ref3.scale)
    assert err3.rel_l2 == pytest.approx(quant_error(w3, ref3).rel_l2, rel=1e-4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_checked_path_refuses_non_finite(bad: float) -> None:
    from mtpconv.formats.fp8 import NonFiniteWeightError, quantize_fp8_checked

    for dtype in (torch.bfloat16, torch.float32):
        w = torch.ones(4, 4, dtype=dtype)
        w[1, 2] = bad
        with pytest.raises(NonFiniteWeightError) as exc:
            quantize_fp8_checked(w)
        assert exc.value.count == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_checked_path_matches_reference_across_chunks(dtype: torch.dtype) -> None:
    """A tensor of several table chunks (split across threads) gives the reference bytes;
    the amax may come from a negative element."""
    from mtpconv.formats import fp8_table
    from mtpconv.formats.fp8 import quantize_fp8_checked

    g = torch.Generator().manual_seed(2)
    w = (torch.randn(701, 1001, generator=g) * 0.05).to(dtype)  # 2.7 chunks, not aligned
    w[650, 999] = -9.0
    assert w.numel() > 2 * fp8_table._CHUNK
    got, err = quantize_fp8_checked(w)
    ref = quantize_fp8(w)
    assert torch.equal(got.weight.view(torch.uint8), ref.weight.view(torch.uint8))
    assert torch.equal(got.scale, ref.scale)
    ref_err = quant_error(w, ref)
    assert err.amax == 9.0 and err.max_abs == ref_err.max_abs
    assert err.rel_l2 == pytest.approx(ref_err.rel_l2, rel=1e-4)
    codes = w.view(torch.uint16).reshape(-1).numpy()
    hist, looked_up = fp8_table.histogram_and_lookup(
        codes, (torch.arange(1 << 16) % 251).to(torch.uint8).numpy()
    )
    assert int(hist.sum()) == w.numel()
    assert (looked_up == (codes.astype("int64") % 251)).all()


def test_checked_path_counts_every_non_finite_value() -> None:
    from mtpconv.formats.fp8 import NonFiniteWeightError, quantize_fp8_checked

    w = torch.zeros(600, 1000, dtype=torch.float16)
    w.view(-1)[[3, 400_000, 599_999]] = torch.tensor(
        [float("nan"), float("-inf"), float("inf")], dtype=torch.float16
    )
    with pytest.raises(NonFiniteWeightError) as exc:
        quantize_fp8_checked(w)
    assert exc.value.count == 3


def test_max_magnitude_is_the_largest_magnitude_pattern() -> None:
    import numpy as np

    from mtpconv.formats.fp8_table import max_magnitude

    rng = np.random.default_rng(0)
    for trial in range(500):
        codes = rng.integers(0, 1 << 16, int(rng.integers(1, 20))).astype(np.uint16)
        if trial % 3 == 1:
            codes &= 0x7FFF  # all positive
        elif trial % 3 == 2:
            codes |= 0x8000  # all negative
        assert max_magnitude(codes) == int((codes & 0x7FFF).max())
    assert max_magnitude(np.zeros(0, dtype=np.uint16)) == 0
