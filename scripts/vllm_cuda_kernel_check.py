#!/usr/bin/env python
"""Check the plugin's CUDA FP8 paths against a dequantized reference (needs a GPU, not vLLM).

For drafter-like shapes and fused per-shard scales it compares
``mtpconv.vllm_plugin.kernels.PreparedFp8`` on CUDA (which calls
``mtpconv.kernels.fp8_linear`` when present) and the plugin's own fallback
``scaled_mm_per_token`` with ``x @ (w * row_scale).T`` in float32, and times
them against a BF16 ``F.linear``, eager and replayed from a CUDA graph. Prints one
line per case; exits 1 on a mismatch.

    python scripts/vllm_cuda_kernel_check.py
"""

from __future__ import annotations

import sys
import time

import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.vllm_plugin import kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _time(fn, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def _time_graph(fn, reps: int = 200) -> float:  # type: ignore[no-untyped-def]
    """Microseconds per call replayed from a CUDA graph (how vLLM runs decode on GPU)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * 10)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    dev = torch.device("cuda")
    print(torch.__version__, torch.cuda.get_device_name(0))
    g = torch.Generator().manual_seed(0)
    bad = 0
    # (tokens, shard widths, K): fc [H, 2H], fused qkv, gate_up, down, a draft head
    cases = [
        (1, [4096], 8192),
        (3, [8192, 1024, 1024], 4096),
        (8, [12288, 12288], 4096),
        (8, [4096], 12288),
        (4, [32768], 4096),
        (64, [4096], 4096),
    ]
    for m, widths, k in cases:
        shards = [quantize_fp8(torch.randn(n, k, generator=g)) for n in widths]
        w = torch.cat([s.weight for s in shards]).to(dev)
        rows = kernels.row_scales(torch.stack([s.scale * (i + 1) for i, s in enumerate(shards)]), widths).to(
            dev
        )
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(dev)
        ref = x.float() @ (w.float() * rows.reshape(-1, 1)).t()
        prepared = kernels.PreparedFp8(w, rows)
        assert prepared.kernel == kernels.CUDA and prepared.weight.dtype == torch.float8_e4m3fn
        out = prepared.apply(x)
        fallback = kernels.scaled_mm_per_token(x, w, rows)
        wb = (w.float() * rows.reshape(-1, 1)).to(torch.bfloat16)
        e1, e2 = _rel(out, ref), _rel(fallback, ref)
        t_fp8 = _time(lambda: prepared.apply(x))  # noqa: B023
        t_fb = _time(lambda: kernels.scaled_mm_per_token(x, w, rows))  # noqa: B023
        t_bf16 = _time(lambda: torch.nn.functional.linear(x, wb))  # noqa: B023
        g_fp8 = _time_graph(lambda: prepared.apply(x))  # noqa: B023
        g_bf16 = _time_graph(lambda: torch.nn.functional.linear(x, wb))  # noqa: B023
        ok = e1 < 0.03 and e2 < 0.05 and out.dtype == torch.bfloat16
        bad += not ok
        print(
            f"M={m:3d} N={sum(widths):6d} K={k:6d} shards={len(widths)}  rel_err plugin={e1:.4f} "
            f"scaled_mm_per_token={e2:.4f}  us: plugin={t_fp8:7.1f} fallback={t_fb:7.1f} "
            f"bf16={t_bf16:7.1f}  graph us: plugin={g_fp8:6.1f} bf16={g_bf16:6.1f} "
            f"ratio={g_fp8 / g_bf16:.2f}  {'ok' if ok else 'MISMATCH'}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
