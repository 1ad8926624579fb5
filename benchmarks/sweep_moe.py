"""The grouped MoE kernel's configurations, FP8 and BF16 experts (CUDA).

    PYTHONPATH=$PWD python3 benchmarks/sweep_moe.py --out OUTDIR --tokens 1,4,16

``bench_draft.py --sweep`` tunes the FP8 experts over 12 configurations a mode and
leaves the BF16 baseline's experts at 2+ tokens on ``triton_moe.default_config``'s
untuned choice. This times a wider space (tile width and depth, warps, stages; at one
token also the CUDA-core modes with 2-8 warps) for both precisions on the routed
experts of every MoE model of ``bench_draft.SHAPES``, each
configuration timed as the sweep times one (a CUDA graph over 8 id sets so that the
experts do not stay in L2), and prints per (model, projection, precision, tokens) the
default configuration's time, the best and the best's gain. Writes OUTDIR/sweep_moe.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from benchmarks.drafter_step import model, sweep
from benchmarks.kernels import moe as triton_moe

ID_SETS = 8


MODES = {"dot": triton_moe.DOT, "dot_fp8": triton_moe.DOT_FP8}
# --modes: the seventh session's 2-16-token best, and tiles as deep as the down
# projections' K (one K step a tile)
MODE_TILES = [(128, 128, 8, 3), (64, 512, 4, 2), (64, 512, 8, 2), (128, 512, 8, 2), (32, 512, 4, 2)]
MODE_TILES += [(64, 256, 8, 3), (128, 256, 8, 2), (32, 1024, 4, 2)]


def configs(
    fp8: bool, tokens: int, k: int, modes: list[int] | None = None
) -> list[tuple[int, int, int, int, int]]:
    """The swept configurations of experts ``[E, N, k]`` at ``tokens`` tokens: at one token
    :func:`bench_draft.moe_one_token_configs`; at 2+ the precision's MMA mode over a wide
    tile space, or ``MODE_TILES`` in each of ``modes`` (``DOT_FP8``: FP8 experts only)."""
    if tokens == 1:
        return sweep.moe_one_token_configs(fp8, k)
    modes = [m for m in modes or [] if fp8 or m != triton_moe.DOT_FP8]
    if modes:
        return [(bn, bk, warps, stages, m) for m in modes for bn, bk, warps, stages in MODE_TILES]
    mode = triton_moe.DOT_FP8 if fp8 else triton_moe.DOT
    return [
        (bn, bk, warps, stages, mode)
        for bn in (32, 64, 128, 256)
        for bk in (64, 128, 256)
        for warps in (4, 8)
        for stages in (3, 4)
        if bn * bk <= 128 * 256
    ]


def split_configs(deep: bool = False) -> list[tuple[int, int, int, int, int]]:
    """The tiles swept with ``--split``: the MMA (``DOT``) on inputs prepared by a launch of
    their own, FP8 or BF16, up to 32 KB of weights a stage (``deep``: pipelines of 5, 6 and 8
    stages instead of 3 and 4, and 32 KB FP8 tiles in 3-5)."""
    if deep:
        return [
            (bn, bk, warps, stages, triton_moe.DOT)
            for bn, bk, warps in ((64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 128, 8))
            for stages in (5, 6, 8)
        ] + [
            (bn, bk, warps, stages, triton_moe.DOT)
            for bn, bk, warps in ((64, 512, 4), (128, 256, 4), (128, 256, 8))
            for stages in (3, 4, 5)
        ]
    return [
        (bn, bk, warps, stages, triton_moe.DOT)
        for bn in (64, 128, 256)
        for bk in (64, 128, 256)
        for warps in (4, 8)
        for stages in (3, 4)
        if bn * bk <= 256 * 128
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="4,16")
    ap.add_argument("--models", default=",".join(k for k, s in model.SHAPES.items() if s.experts))
    ap.add_argument("--precisions", default="fp8,bf16")
    ap.add_argument(
        "--modes",
        default="",
        help=f"at 2+ tokens: these modes over MODE_TILES ({','.join(MODES)})",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="each input prepared by a launch of its own first (FP8 at 2+ tokens: quantized per "
        "token; else the down projection's SiLU * up), over the MMA tile space (one token: its "
        "CUDA-core modes), beside the fused default",
    )
    ap.add_argument("--deep", action="store_true", help="with --split: pipelines of 5-8 stages")
    args = ap.parse_args()
    unknown = [m for m in args.modes.split(",") if m and m not in MODES]
    unknown += [p for p in args.precisions.split(",") if p not in ("fp8", "bf16")]
    if unknown:
        ap.error(f"unknown mode or precision: {', '.join(unknown)}")
    modes = [MODES[m] for m in args.modes.split(",") if m]
    precisions = [p == "fp8" for p in args.precisions.split(",")]
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for key in args.models.split(","):
        s = model.SHAPES[key]
        ex_gu = model.Experts.make(s.experts, 2 * s.moe_intermediate, s.hidden, dev, gen)
        ex_dn = model.Experts.make(s.experts, s.hidden, s.moe_intermediate, dev, gen)
        for t in [int(v) for v in args.tokens.split(",")]:
            id_sets = model.routing_sets(s, t, dev, gen, ID_SETS)
            distinct = sum(int(i.unique().numel()) for i in id_sets) / ID_SETS
            h = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
            y = torch.randn(t * s.top_k, 2 * s.moe_intermediate, device=dev, generator=gen).to(torch.bfloat16)
            for proj, ex, x, act in (("gate_up", ex_gu, h, False), ("down", ex_dn, y, True)):
                for fp8 in precisions:
                    n, k = ex.fp8.shape[1:]
                    label = f"{s.name} {proj} T={t}"
                    default = triton_moe.default_config(t, n, k, fp8)
                    fused_us = None
                    if args.split and not act and (t == 1 or not fp8):
                        continue  # nothing to prepare: a gate_up projection in BF16 or at one token
                    if args.split:
                        fused_us = sweep.time_grouped(x, ex, fp8, act, id_sets, [default], label)[0][0]
                        if t == 1:  # SiLU * up alone: the FMA modes read the experts' own precision
                            cfgs = sweep.moe_one_token_configs(fp8, k)
                            default = triton_moe.default_config(t, n, k, fp8)
                        else:
                            default = triton_moe.default_config(t, n, k, fp8, fp8_x=fp8)
                            cfgs = split_configs(args.deep)
                        cfgs = [default] + [c for c in cfgs if c != default]
                        res = sweep.time_grouped(x, ex, fp8, act, id_sets, cfgs, label + " split", split=True)
                    else:
                        cfgs = [default] + [c for c in configs(fp8, t, k, modes) if c != default]
                        res = sweep.time_grouped(x, ex, fp8, act, id_sets, cfgs, label)
                    nbytes = distinct * n * k * (1 if fp8 else 2)
                    base = next((us for us, c in res if c == default), math.nan)  # nan: it failed
                    best_us, best = min(res, key=lambda r: r[0])
                    row = {
                        "model": s.name,
                        "projection": proj,
                        "precision": "fp8" if fp8 else "bf16",
                        "tokens": t,
                        "distinct_experts": distinct,
                        "split": fused_us is not None,
                        "fused_default_us": fused_us,
                        "default": list(default),
                        "default_us": base,
                        "best": list(best),
                        "best_us": best_us,
                        "best_tbps": nbytes / (best_us * 1e-6) / 1e12,
                        "all": [[us, list(c)] for us, c in sorted(res, key=lambda r: r[0])],
                    }
                    rows.append(row)
                    print(
                        f"{s.name} {proj} {row['precision']} T={t} ({distinct:.0f} experts): default "
                        f"{default} {base:.1f} us; best {best} {best_us:.1f} us "
                        f"({row['best_tbps']:.2f} TB/s, {100 * (1 - best_us / base):.0f}% faster)"
                        + (f"; fused default {fused_us:.1f} us" if fused_us is not None else ""),
                        flush=True,
                    )
                    (args.out / "sweep_moe.json").write_text(json.dumps(rows, indent=1))
        del ex_gu, ex_dn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
