"""Which FP8 path is fastest for each dense drafter linear at 2-16 tokens (CUDA).

    PYTHONPATH=$PWD python3 scripts/bench_paths.py --tokens 2,4,8,16

For every dense FP8 linear of the benchmarked drafters (``bench_draft.dense_shapes``),
times side by side in one run, as ``bench_draft.py --micro-only`` times one linear (a
CUDA graph over weight copies rotated past L2): the tuned skinny GEMM (``wo_skinny``),
``scaled_mm_fused`` with the one-pass per-tensor quantization and with the two-pass
one it replaced (``fused_two_pass``), and ``scaled_mm_static`` (a calibrated scale: the
bound for any dynamic scale); then each activation-quantization kernel alone.
``--per-row``: distinct per-row weight scales, as vLLM's fused q/k/v and gate/up carry
(no static path then). The source of ``mtpconv.kernels.linear.SCALED_MM_SHAPES``.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402

from mtpconv.kernels import Fp8Path, run_path, triton_fp8, triton_quant  # noqa: E402

QuantFn = Callable[[torch.Tensor], Any]
PATHS = ("wo_skinny", "scaled_mm_fused", "scaled_mm_static")


def time_linear(
    path: Fp8Path, x: torch.Tensor, ws: list[bd.Linear], s_in: torch.Tensor, quant: QuantFn
) -> float:
    """us per linear on ``path``; ``quant``: the per-tensor quantization the fused path calls."""
    default = triton_fp8.quant_per_tensor
    triton_fp8.quant_per_tensor = quant

    def g() -> None:
        for w in ws:
            run_path(path, x, w.fp8, w.scale, input_scale=s_in)

    try:
        return bd.time_graph(g, reps=1) / len(ws)
    finally:
        triton_fp8.quant_per_tensor = default


def time_quant(fn: QuantFn, x: torch.Tensor, reps: int = 20) -> float:
    return bd.time_graph(lambda: [fn(x) for _ in range(reps)], reps=1) / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="2,4,8,16")
    ap.add_argument(
        "--per-row", action="store_true", help="distinct per-row weight scales, as fused shards carry"
    )
    args = ap.parse_args(argv)
    paths = [p for p in PATHS if not (args.per_row and p == "scaled_mm_static")]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    s_in = torch.tensor(4.0 / 448.0, device=dev)
    one_pass = triton_fp8.quant_per_tensor
    two_pass = functools.partial(triton_quant.quant_per_tensor, one_pass=False)
    seen: set[tuple[int, int]] = set()
    for s in bd.SHAPES.values():
        for name, (n, k) in bd.dense_shapes(s).items():
            if (n, k) in seen:
                continue
            seen.add((n, k))
            copies = max(2, math.ceil(bd.L2_SAFE_BYTES / (n * k)))
            ws = [bd.Linear.make(n, k, dev, gen) for _ in range(copies)]
            if args.per_row:
                for w in ws:
                    w.scale = w.scale * (1 + torch.rand(n, device=dev, generator=gen))
            for t in [int(v) for v in args.tokens.split(",")]:
                x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
                us = {p: time_linear(Fp8Path(p), x, ws, s_in, one_pass) for p in paths}
                us["fused_two_pass"] = time_linear(Fp8Path.SCALED_MM_FUSED, x, ws, s_in, two_pass)
                q = {
                    "one_pass": time_quant(one_pass, x),
                    "two_pass": time_quant(two_pass, x),
                    "static": time_quant(lambda v: triton_quant.quant_static(v, s_in), x),
                }
                print(
                    f"{s.name} {name} {n}x{k} T={t}: "
                    + " ".join(f"{p}={v:.1f}" for p, v in us.items())
                    + " | quant alone: "
                    + " ".join(f"{p}={v:.2f}" for p, v in q.items())
                    + f" | best {min(us, key=lambda p: us[p])}",
                    flush=True,
                )
            del ws
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
