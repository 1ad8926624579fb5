"""FP8 quantization of 16-bit CPU weights through a 65,536-entry table, in numpy alone.

For a fixed scale the FP8 code of an element depends only on its 16-bit pattern.
So the converter reads the patterns instead of doing float math per element:

1. amax and NaN/Inf: in BF16 and FP16 the magnitude bits (``code & 0x7FFF``)
   order like the magnitudes, and every pattern at or above the infinity pattern
   is non-finite; two integer maxima over the tensor give both.
2. The table: every pattern's value divided by the scale, clamped and rounded to
   e4m3 (:mod:`mtpconv.formats.e4m3`), the very float32 operations of
   :func:`mtpconv.formats.fp8.quantize_fp8`, applied once per pattern.
3. One fused pass over cache-sized chunks, spread over the CPU's threads (numpy
   releases the GIL in both calls): the chunk's patterns are widened once, then
   counted (a histogram) and looked up in the table.
4. The error statistics follow exactly from the histogram.

No torch: ``quantize-mtp --device cpu`` of a 16-bit drafter never imports it (a
second or more of start-up on a small machine). The bytes are identical to the
direct formula (tests/formats/test_fp8_nvfp4.py, tests/formats/test_e4m3.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from mtpconv.checkpoint.safetensors_io import BF16, F16
from mtpconv.formats.e4m3 import FP8_MAX, decode_e4m3, encode_e4m3
from mtpconv.formats.scale_layout import ScaleLayout, stored_scale_shape

_CHUNK = 1 << 18  # patterns per step: its widened copy (2 MiB) stays in cache
_PATTERNS = 1 << 16
_MAGNITUDE = np.uint16(0x7FFF)
# Smallest non-finite magnitude pattern: +Inf (NaNs lie above it); safetensors dtype names.
_INF_PATTERN = {BF16: 0x7F80, F16: 0x7C00}
HALF_DTYPES = frozenset(_INF_PATTERN)
# Smallest positive normal float32: keeps an all-zero weight finite (scale > 0).
TINY = np.finfo(np.float32).tiny


@dataclass(frozen=True)
class QuantError:
    """How far a dequantized FP8 tensor is from the original."""

    rel_l2: float
    max_abs: float
    amax: float


class NonFiniteWeightError(ValueError):
    """The weight holds NaN or Inf: no FP8 scale can represent it."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} NaN/Inf values")
        self.count = count


@dataclass(frozen=True)
class TableResult:
    """One 16-bit tensor quantized by the table: FP8 bytes, its float32 scale, the error,
    and the L2 norm of the source (to combine the errors of fused experts)."""

    codes: np.ndarray  # uint8 e4m3 bytes, the source's shape
    scale: np.float32
    error: QuantError
    norm: float


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


def count_non_finite(codes: np.ndarray, dtype: str) -> int:
    """How many patterns in ``codes`` are NaN or Inf in ``dtype`` (``"BF16"`` or ``"F16"``)."""
    limit = _INF_PATTERN[dtype]
    chunks = (codes[lo : lo + _CHUNK] for lo in range(0, codes.size, _CHUNK))
    return sum(int(np.count_nonzero((part & _MAGNITUDE) >= limit)) for part in chunks)


def is_non_finite_magnitude(magnitude: int, dtype: str) -> bool:
    """Whether a magnitude pattern of ``dtype`` is NaN or Inf."""
    return magnitude >= _INF_PATTERN[dtype]


def pattern_values(dtype: str) -> np.ndarray:
    """Every 16-bit pattern of ``dtype`` as float32 (index = bit pattern), exactly."""
    patterns = np.arange(_PATTERNS, dtype=np.uint32)
    if dtype == BF16:
        return (patterns << 16).view(np.float32)
    return patterns.astype(np.uint16).view(np.float16).astype(np.float32)


def histogram_and_lookup(
    codes: np.ndarray, table: np.ndarray, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(histogram of codes, table[codes])`` in one pass, on the CPU's threads; the
    lookup goes into ``out`` (1-D, ``codes.size`` elements of the table's dtype) if given."""
    if out is None:
        out = np.empty(codes.size, dtype=table.dtype)

    def span(bounds: tuple[int, int]) -> np.ndarray:
        lo, hi = bounds
        hist = np.zeros(_PATTERNS, dtype=np.int64)
        for i in range(lo, hi, _CHUNK):
            j = min(i + _CHUNK, hi)
            idx = codes[i:j].astype(np.intp)
            hist += np.bincount(idx, minlength=_PATTERNS)
            # "clip" never clips here (a uint16 pattern indexes a 65,536-entry table) but,
            # unlike the default "raise", writes straight into ``out`` (no bounce buffer).
            np.take(table, idx, out=out[i:j], mode="clip")
        return hist

    spans = _spans(codes.size, _workers(codes.size)) if codes.size else []
    if len(spans) <= 1:
        hists = [span(s) for s in spans]
    else:
        with ThreadPoolExecutor(len(spans), thread_name_prefix="mtpconv-fp8") as pool:
            hists = list(pool.map(span, spans))
    return sum(hists, np.zeros(_PATTERNS, dtype=np.int64)), out


def quantize_codes(codes: np.ndarray, dtype: str, out: np.ndarray | None = None) -> TableResult:
    """FP8 quantization (per-tensor scale) of 16-bit patterns ``codes`` of ``dtype``.

    The bytes and scale are those of :func:`mtpconv.formats.fp8.quantize_fp8`; raises
    :class:`NonFiniteWeightError` when a pattern is NaN or Inf. The bytes go into ``out``
    (uint8, ``codes.size`` of them: one expert's slice of a fused tensor) when given.
    """
    flat = np.ascontiguousarray(codes).reshape(-1).view(np.uint16)
    magnitude = max_magnitude(flat)
    if is_non_finite_magnitude(magnitude, dtype):
        raise NonFiniteWeightError(count_non_finite(flat, dtype))
    values = pattern_values(dtype)
    amax = values[magnitude]
    scale = np.float32(max(amax, TINY)) / np.float32(FP8_MAX)
    safe = np.where(np.isfinite(values), values, np.float32(0))
    with np.errstate(over="ignore"):  # beyond 448 * scale: clamped, as torch does silently
        table = encode_e4m3(np.clip(safe / scale, -FP8_MAX, FP8_MAX).astype(np.float32))
    hist, q = histogram_and_lookup(flat, table, None if out is None else out.reshape(-1))
    present = hist > 0
    diff = (decode_e4m3(table) * scale - safe).astype(np.float64)
    counts = hist.astype(np.float64)
    # Plain sums, not np.dot: a BLAS call wakes OpenBLAS's threads, which then spin on
    # the cores the table pass needs (measured: 16% of a conversion's CPU time).
    norm = float(np.sqrt((counts * safe.astype(np.float64) ** 2).sum()))
    err_norm = float(np.sqrt((counts * diff**2).sum()))
    error = QuantError(
        rel_l2=err_norm / norm if norm > 0 else 0.0,
        max_abs=float(np.abs(diff[present]).max()) if flat.size else 0.0,
        amax=float(amax),
    )
    return TableResult(codes=q.reshape(codes.shape), scale=scale, error=error, norm=norm)


def quantize_experts(codes: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, QuantError]:
    """Fused experts ``[E, out, in]`` of 16-bit patterns: one table and scale per expert.

    Returns the FP8 bytes (each expert's written into its slice), the ``[E]`` float32
    scales and the error over all experts.
    """
    q = np.empty(codes.shape, np.uint8)
    parts = [quantize_codes(codes[e], dtype, q[e]) for e in range(codes.shape[0])]
    total = sum(p.norm**2 for p in parts) ** 0.5
    rel = (sum((p.error.rel_l2 * p.norm) ** 2 for p in parts) ** 0.5 / total) if total > 0 else 0.0
    error = QuantError(
        rel_l2=rel,
        max_abs=max((p.error.max_abs for p in parts), default=0.0),
        amax=max((p.error.amax for p in parts), default=0.0),
    )
    return q, np.array([p.scale for p in parts], dtype=np.float32), error


def quantize_table(codes: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, QuantError]:
    """A 2-D weight (one 0-d scale) or fused 3-D experts (one scale each) of 16-bit
    patterns: ``(FP8 bytes, float32 scale, error)``."""
    if codes.ndim == 3:
        return quantize_experts(codes, dtype)
    r = quantize_codes(codes, dtype)
    return r.codes, np.asarray(r.scale, dtype=np.float32), r.error


def replicate_scale(
    scale: np.ndarray, layout: ScaleLayout, shape: tuple[int, ...], fused_halves: bool = False
) -> np.ndarray:
    """The per-tensor (0-d) or per-expert ([E]) float32 ``scale`` replicated into ``layout``
    for a weight of ``shape``: what the variant stores (DESIGN §5)."""
    target = stored_scale_shape(layout, shape, fused_halves)
    s = np.asarray(scale, dtype=np.float32)
    lead = len(shape) - 2
    s = s.reshape(*s.shape[:lead], *([1] * (len(target) - lead)))
    return np.ascontiguousarray(np.broadcast_to(s, target))
