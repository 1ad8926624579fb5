"""Which FP8 linear kernel is fastest for each dense drafter linear at 2-16 tokens (CUDA).

    python -m benchmarks.bench_paths --tokens 2,4,8,16

For every dense FP8 linear of the benchmarked drafters (``model.dense_shapes``), times side
by side in one run, as ``draft_step --micro-only`` times one linear (a CUDA graph over weight
copies rotated past L2): the tuned skinny GEMM (``wo_skinny``), ``scaled_mm_fused`` with the
one-pass per-tensor quantization and with the two-pass one (``fused_two_pass``); then each
activation-quantization kernel alone. ``--per-row``: distinct per-row weight scales, as vLLM's
fused q/k/v and gate/up carry. The source of the tuning table's ``scaled_mm_fused`` shapes.

``--prepared``: activations quantized per token before the linear (as a producer of the
activation would), side by side with ``fp8_linear``'s own path on the BF16 activation:
the per-token quantization alone, the skinny GEMM on the FP8 activation
(``skinny_linear(x_scale=...)``) at its default configuration and at each of
:func:`prepared_configs`, and row-wise ``torch._scaled_mm`` on the same activation.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.drafter_step import model, timing
from benchmarks.kernels.prepared import prepared_linear
from mtpconv.kernels import fp8_linear, kernel_named, triton_quant, triton_quant_tensor
from mtpconv.kernels.linear import Fp8LinearKernel

QuantFn = Callable[[torch.Tensor], Any]
PATHS = ("wo_skinny", "scaled_mm_fused")


def time_linear(
    path: type[Fp8LinearKernel], x: torch.Tensor, ws: list[model.Linear], quant: QuantFn
) -> float:
    """us per linear on ``path``; ``quant``: the per-tensor quantization the fused path calls."""
    default = triton_quant_tensor.quant_per_tensor
    triton_quant_tensor.quant_per_tensor = quant

    def g() -> None:
        for w in ws:
            fp8_linear(x, w.fp8, w.scale, kernel=path)

    try:
        return timing.time_graph(g, reps=1) / len(ws)
    finally:
        triton_quant_tensor.quant_per_tensor = default


def time_quant(fn: QuantFn, x: torch.Tensor, reps: int = 20) -> float:
    return timing.time_graph(lambda: [fn(x) for _ in range(reps)], reps=1) / reps


def prepared_configs(sms: int, wide: bool = False, deep: bool = False, splits: bool = False) -> list[Any]:
    """The skinny GEMM's swept configurations on prepared FP8 activations (``wide``: 2-6
    resident programs an SM, where the first sweep tried 2 and 4; ``deep``: pipelines of 5, 6
    and 8 stages with 1-2 programs an SM, where the others try 3 and 4 stages; ``splits``: K
    cut into 1, 2 or 4 pieces whatever the waves, where the others let ``split_for`` choose)."""
    from mtpconv.kernels.triton_skinny import MMA_PREPARED, Config

    if splits:
        return [
            Config(True, bn, bk, 4, stages, sms, MMA_PREPARED, tma, split=pieces)
            for bn, bk in ((32, 256), (64, 128), (64, 256), (128, 128), (128, 256))
            for stages in (3, 4, 5, 6)
            for tma in (False, True)
            for pieces in (1, 2, 4)
            if stages * (bn + 16) * bk <= 200 * 1024
        ]
    if deep:
        return [
            Config(True, bn, bk, warps, stages, progs * sms, MMA_PREPARED, tma)
            for bn, bk, warps in ((64, 128, 4), (64, 256, 4), (128, 128, 4))
            for stages in (5, 6, 8)
            for progs in (1, 2)
            for tma in (False, True)
        ]
    if wide:
        tiles = [(bn, bk, w, p) for bn, bk, w in ((64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 256, 8))
                 for p in (2, 3, 4, 5, 6)]  # fmt: skip
    else:
        tiles = [(64, 128, 4, 4), (64, 256, 4, 2), (128, 128, 4, 2), (32, 256, 4, 4), (128, 256, 8, 2)]
    return [
        Config(True, bn, bk, warps, stages, progs * sms, MMA_PREPARED, tma)
        for bn, bk, warps, progs in tiles
        for stages in (3, 4)
        for tma in (False, True)
    ]


def prepared(
    tokens: list[int], models: list[str], wide: bool, deep: bool = False, splits: bool = False, only: str = ""
) -> None:
    """``--prepared``: see the module's docstring. One line per (linear, tokens)."""
    from mtpconv.kernels import triton_skinny

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    cfgs = prepared_configs(triton_skinny.sm_count(dev.index or 0), wide, deep, splits)
    seen: set[tuple[int, int]] = set()
    for s in (model.SHAPES[m] for m in models):
        for name, (n, k) in model.dense_shapes(s).items():
            if (n, k) not in seen and (not only or name in only.split(",")):
                seen.add((n, k))
                copies = max(2, math.ceil(model.L2_SAFE_BYTES / (n * k)))
                ws = [model.Linear.make(n, k, dev, gen) for _ in range(copies)]
                for t in tokens:
                    x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
                    line = prepared_line(x, ws, cfgs, show=8 if splits else 1)
                    print(f"{s.name} {name} {n}x{k} T={t}: " + line, flush=True)
                del ws
                torch.cuda.empty_cache()


def prepared_line(x: torch.Tensor, ws: list[model.Linear], cfgs: list[Any], show: int = 1) -> str:
    """One linear on ``x`` over the weight copies ``ws``, each way of ``--prepared`` (the
    ``show`` fastest configurations)."""
    from mtpconv.kernels import fp8_linear, reference, triton_skinny

    n, k = ws[0].fp8.shape
    q, sx = triton_quant.quant_per_token(x)
    ones = torch.ones((1, n), dtype=torch.float32, device=x.device)

    def auto() -> None:
        for w in ws:
            fp8_linear(x, w.fp8, w.scale)

    def skinny(cfg: Any) -> None:
        for w in ws:
            triton_skinny.skinny_linear(q, w.fp8, w.scale, config=cfg, x_scale=sx, out_dtype=x.dtype)

    def rowwise() -> None:
        for w in ws:
            reference.scaled_mm(q, w.fp8, sx, ones, None, x.dtype)

    qt, st = triton_quant_tensor.quant_per_tensor(x)

    def tensorwise() -> None:  # cuBLAS on per-tensor rows, the step's qkv and gate_up until the 14th session
        for w in ws:
            prepared_linear(qt, w.fp8, w.scale, None, x_scale=st, out_dtype=x.dtype)

    label = f"{n}x{k} T={x.shape[0]}"
    swept = sorted(timing.time_configs(cfgs, skinny, len(ws), label), key=lambda r: r[0])
    best_us, best_cfg = swept[0] if swept else (math.nan, None)
    us = {
        "auto": timing.time_graph(auto, reps=1) / len(ws),
        "prepared_default": timing.time_graph(functools.partial(skinny, None), reps=1) / len(ws),
        "prepared_best": best_us,
        "scaled_mm_rowwise": timing.time_graph(rowwise, reps=1) / len(ws),
        "scaled_mm_tensor": timing.time_graph(tensorwise, reps=1) / len(ws),
    }
    quant = time_quant(triton_quant.quant_per_token, x)
    return (
        " ".join(f"{p}={v:.1f}" for p, v in us.items())
        + f" quant_per_token={quant:.2f} | best {n * k / 1e6 / best_us:.2f} TB/s {best_cfg}"
        + "".join(f"\n    {us:.1f} us {cfg}" for us, cfg in swept[1:show])
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="2,4,8,16")
    ap.add_argument(
        "--per-row", action="store_true", help="distinct per-row weight scales, as fused shards carry"
    )
    ap.add_argument("--prepared", action="store_true", help="activations quantized per token beforehand")
    ap.add_argument("--wide", action="store_true", help="--prepared: sweep 2-6 programs an SM")
    ap.add_argument("--deep", action="store_true", help="--prepared: sweep pipelines of 5-8 stages")
    ap.add_argument("--splits", action="store_true", help="--prepared: sweep K cut into 1, 2 or 4 pieces")
    ap.add_argument("--linears", default="", help="--prepared: only these linears (e.g. qkv,gate_up)")
    ap.add_argument("--models", default=",".join(model.SHAPES), help="--prepared: these models' linears")
    args = ap.parse_args(argv)
    if args.prepared:
        tokens = [int(v) for v in args.tokens.split(",")]
        prepared(tokens, args.models.split(","), args.wide, args.deep, args.splits, args.linears)
        return 0
    paths = list(PATHS)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    one_pass = triton_quant_tensor.quant_per_tensor
    two_pass = functools.partial(triton_quant_tensor.quant_per_tensor, one_pass=False)
    seen: set[tuple[int, int]] = set()
    for s in model.SHAPES.values():
        for name, (n, k) in model.dense_shapes(s).items():
            if (n, k) in seen:
                continue
            seen.add((n, k))
            copies = max(2, math.ceil(model.L2_SAFE_BYTES / (n * k)))
            ws = [model.Linear.make(n, k, dev, gen) for _ in range(copies)]
            if args.per_row:
                for w in ws:
                    w.scale = w.scale * (1 + torch.rand(n, device=dev, generator=gen))
            for t in [int(v) for v in args.tokens.split(",")]:
                x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
                us = {p: time_linear(kernel_named(p), x, ws, one_pass) for p in paths}
                us["fused_two_pass"] = time_linear(kernel_named("scaled_mm_fused"), x, ws, two_pass)
                q = {
                    "one_pass": time_quant(one_pass, x),
                    "two_pass": time_quant(two_pass, x),
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
