"""The numpy e4m3 codec and FP8 table agree with torch byte for byte.

The CPU conversion of a 16-bit drafter uses them instead of torch, so every BF16 and
FP16 bit pattern is checked under several scales, with torch as the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtpconv.formats.e4m3 import FP8_MAX, decode_e4m3, encode_e4m3
from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.formats.fp8_table import pattern_values, quantize_codes, quantize_experts

_TORCH_HALF = {"BF16": torch.bfloat16, "F16": torch.float16}


def test_decode_matches_torch_for_every_byte() -> None:
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    got = decode_e4m3(codes)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and int(np.isnan(got).sum()) == 2
    finite = ~np.isnan(ref)
    assert np.array_equal(got[finite].view(np.uint32), ref[finite].view(np.uint32))  # -0.0 too


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_pattern_values_are_the_dtype_values(dtype: str) -> None:
    ref = torch.arange(1 << 16, dtype=torch.int32).to(torch.uint16).view(_TORCH_HALF[dtype]).float()
    got, ref_np = pattern_values(dtype), ref.numpy()
    nan = np.isnan(ref_np)  # NaN payloads may differ; the table treats every NaN as 0
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref_np[~nan].view(np.uint32))


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_encode_matches_torch_for_every_pattern_and_scale(dtype: str) -> None:
    values = pattern_values(dtype)
    safe = np.where(np.isfinite(values), values, np.float32(0))
    rng = np.random.default_rng(7)
    amaxes = [*rng.uniform(1e-6, 60.0, 12), 1.0, 448.0, 3e-5, 65504.0, 1e-30, 2.0**-6]
    for amax in amaxes:
        scale = np.float32(amax) / np.float32(FP8_MAX)
        with np.errstate(over="ignore"):
            x = np.clip(safe / scale, -FP8_MAX, FP8_MAX).astype(np.float32)
        ref = torch.clamp(torch.from_numpy(safe) / torch.tensor(scale), -FP8_MAX, FP8_MAX)
        expected = ref.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        assert np.array_equal(encode_e4m3(x), expected), f"scale {scale}"


def test_encode_rounds_ties_to_even_and_keeps_the_sign() -> None:
    # 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): even wins; 1.1875 -> 1.25 (0x3A)
    # 2**-10 is halfway between 0 and the smallest subnormal 2**-9: even (0) wins.
    x = np.array([1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, 448.0, -0.0], dtype=np.float32)
    assert encode_e4m3(x).tolist() == [0x38, 0x3A, 0xB8, 0x00, 0x02, 0x7E, 0x80]


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_table_quantization_matches_torch(dtype: str) -> None:
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(3, 70, 90, generator=g) * 0.05).to(_TORCH_HALF[dtype])
    w[1, 0, :3] = torch.tensor([-7.0, 0.0, -0.0]).to(w.dtype)
    ref = quantize_fp8(w[1])
    one = quantize_codes(w[1].view(torch.uint16).numpy(), dtype)
    assert np.array_equal(one.codes, ref.weight.view(torch.uint8).numpy())
    assert one.scale == ref.scale.item() and one.error.amax == 7.0
    q, scales, error = quantize_experts(w.view(torch.uint16).numpy(), dtype)
    ref3 = quantize_fp8(w)
    assert np.array_equal(q, ref3.weight.view(torch.uint8).numpy())
    assert np.array_equal(scales, ref3.scale.numpy())
    assert error.amax == 7.0 and 0 < error.rel_l2 < 0.1
