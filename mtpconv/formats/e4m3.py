"""The FP8 e4m3 (``float8_e4m3fn``) encoding in numpy: float32 to byte and back.

e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; the
largest finite value is 448 and ``0x7F``/``0xFF`` are NaN. The encoder rounds to
nearest, ties to even, as torch's ``.to(torch.float8_e4m3fn)`` does, for the inputs
the converter gives it: finite float32 already clamped to [-448, 448]. The bytes
equal torch's for every such value (tests/formats/test_e4m3.py checks every BF16
and FP16 pattern under several scales).
"""

from __future__ import annotations

import numpy as np

FP8_MAX = 448.0
_MIN_NORMAL = np.float32(2.0**-6)  # smallest normal e4m3; below it the step is 2**-9
_SUBNORMAL_STEPS = np.float32(2.0**9)
_EXP_SHIFT = np.uint32(23 - 3)  # float32 mantissa bits dropped to keep e4m3's three
_REBIAS = np.uint32((127 - 7) << 3)  # float32 exponent bias to e4m3's, in code units


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """The e4m3fn bytes (uint8) of finite float32 values in [-448, 448], rounded to
    nearest even; a larger magnitude is a caller's error (clamp first)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    sign = ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    mag = np.abs(x)
    mbits = mag.view(np.uint32)
    # Normal range: round the float32 bits to three mantissa bits (ties to even);
    # a carry out of the mantissa moves the exponent up, as it should.
    odd = (mbits >> _EXP_SHIFT) & np.uint32(1)
    rounded = (mbits + np.uint32((1 << 19) - 1) + odd) >> _EXP_SHIFT
    normal = rounded - np.minimum(rounded, _REBIAS)
    # Subnormal range (and zero): multiples of 2**-9; the scaling is exact, rint is ties
    # to even, and 2**-6 itself comes out as 8, the code of the smallest normal.
    sub = np.rint(mag * _SUBNORMAL_STEPS).astype(np.uint32)
    code = np.where(mag < _MIN_NORMAL, sub, normal)
    return (code.astype(np.uint8) | sign).reshape(x.shape)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """The float32 values of e4m3fn bytes (``0x7F``/``0xFF`` decode to NaN)."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int32)
    exp = (c >> 3) & 0xF
    man = (c & 0x7).astype(np.float32)
    value = np.where(
        exp == 0,
        man * np.float32(2.0**-9),
        (np.float32(1) + man / np.float32(8)) * np.exp2(exp - 7).astype(np.float32),
    ).astype(np.float32)
    value = np.where((c & 0x7F) == 0x7F, np.float32(np.nan), value)
    return np.where(c & 0x80, -value, value).astype(np.float32)
