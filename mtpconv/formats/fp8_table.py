"""FP8 quantization of 16-bit CPU weights through a 65,536-entry table.

For a fixed scale the FP8 code of an element depends only on its 16-bit pattern.
So the converter reads the patterns instead of doing float math per element:

1. amax and NaN/Inf: in BF16 and FP16 the magnitude bits (``code & 0x7FFF``)
   order like the magnitudes, and every pattern at or above the infinity pattern
   is non-finite; two integer maxima over the tensor give both.
2. One fused pass over cache-sized chunks, spread over the CPU's threads (numpy
   releases the GIL in both calls): the chunk's patterns are widened once, then
   counted (a histogram) and looked up in the FP8 table built with the very same
   float32 operations as :func:`mtpconv.formats.fp8.quantize_fp8`.
3. The error statistics follow exactly from the histogram.

The bytes are identical to the direct formula (tests/formats/test_fp8.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

_CHUNK = 1 << 18  # patterns per step: its widened copy (2 MiB) stays in cache
_PATTERNS = 1 << 16
_MAGNITUDE = np.uint16(0x7FFF)
# Smallest non-finite magnitude pattern: +Inf (NaNs lie above it).
_INF_PATTERN = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}
HALF_DTYPES = frozenset(_INF_PATTERN)


def _workers(n: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, n // _CHUNK))


def _spans(n: int, parts: int) -> list[tuple[int, int]]:
    step = -(-n // parts)
    step = -(-step // _CHUNK) * _CHUNK  # chunk-aligned spans
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def max_magnitude(codes: np.ndarray) -> int:
    """The largest magnitude pattern (``code & 0x7FFF``) in ``codes`` (0 when empty).

    Two plain reductions, no temporary: read as int16 the largest value is the
    largest positive pattern; read as uint16 it is the negative pattern of the
    largest magnitude (sign bit set) whenever there is a negative one.
    """
    if not codes.size:
        return 0
    best = max(int(codes.view(np.int16).max()), 0)
    top = int(codes.max())
    return max(best, top & 0x7FFF) if top & 0x8000 else best


def count_non_finite(codes: np.ndarray, dtype: torch.dtype) -> int:
    """How many patterns in ``codes`` are NaN or Inf in ``dtype``."""
    limit = _INF_PATTERN[dtype]
    chunks = (codes[lo : lo + _CHUNK] for lo in range(0, codes.size, _CHUNK))
    return sum(int(np.count_nonzero((part & _MAGNITUDE) >= limit)) for part in chunks)


def is_non_finite_magnitude(magnitude: int, dtype: torch.dtype) -> bool:
    """Whether a magnitude pattern of ``dtype`` is NaN or Inf."""
    return magnitude >= _INF_PATTERN[dtype]


def histogram_and_lookup(codes: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(histogram of codes, table[codes])`` in one pass, on the CPU's threads."""
    out = np.empty(codes.size, dtype=table.dtype)

    def span(bounds: tuple[int, int]) -> np.ndarray:
        lo, hi = bounds
        hist = np.zeros(_PATTERNS, dtype=np.int64)
        for i in range(lo, hi, _CHUNK):
            j = min(i + _CHUNK, hi)
            idx = codes[i:j].astype(np.intp)
            hist += np.bincount(idx, minlength=_PATTERNS)
            np.take(table, idx, out=out[i:j])
        return hist

    spans = _spans(codes.size, _workers(codes.size)) if codes.size else []
    if len(spans) <= 1:
        hists = [span(s) for s in spans]
    else:
        with ThreadPoolExecutor(len(spans), thread_name_prefix="mtpconv-fp8") as pool:
            hists = list(pool.map(span, spans))
    return sum(hists, np.zeros(_PATTERNS, dtype=np.int64)), out
