"""The MoE drafters' shared expert alone (CUDA): one launch against three, and BF16.

    PYTHONPATH=$PWD python3 benchmarks/bench_mlp.py --out $OUT/mlp --tokens 1,2,4

For each MoE model of ``bench_draft.SHAPES`` and token count, times the shared expert
(gate_up, SiLU * up, down) as ``bench_draft.py --micro`` times a linear: a CUDA graph over
weight copies rotated past L2, median of the replays, PDL as the environment says (on by
default on Hopper). Forms:

* ``fused pP uN``: :func:`mtpconv.kernels.triton_mlp.fused_mlp`, one launch, P programs a
  SM, N gate / up K steps unrolled (``fused default``: the kernel's defaults);
* ``fused act_late``: the defaults, but each token's intermediate loaded just before its
  output (``act_first=False``, the kernel before the fifteenth session);
* ``split``: the same kernel as two launches (no grid barrier);
* ``three``: :func:`mtpconv.kernels.mlp.three_launches`, ``fp8_linear``, SiLU * up,
  ``fp8_linear`` (the step's form until the twelfth session);
* ``bf16``: cuBLAS, ``silu_mul``, cuBLAS on the BF16 weights.

TB/s counts the weights' bytes (FP8 or BF16).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.drafter_step import model, timing


def forms(
    unrolls: list[int], per_sms: list[int], warps: tuple[int, ...] = (4,), down_tiles: tuple[int, ...] = (16,)
) -> dict[str, Callable[..., torch.Tensor]]:
    from mtpconv.kernels import mlp, triton_glue, triton_mlp

    def fused(
        unroll: int | None, per_sm: int | None = None, w: int = 4, d: int = 16
    ) -> Callable[..., torch.Tensor]:
        return lambda x, gu, dn: triton_mlp.fused_mlp(
            x, gu.fp8, gu.scale, dn.fp8, dn.scale, unroll=unroll, per_sm=per_sm, warps=w,
            down_tile_bytes=d * 1024,
        )  # fmt: skip

    out = {"fused default": fused(None)}
    out |= {
        f"fused p{p} u{u}" + (f" w{w}" if w != 4 else "") + (f" d{d}" if d != 16 else ""): fused(u, p, w, d)
        for p in per_sms
        for u in unrolls
        for w in warps
        for d in down_tiles
    }
    out["fused act_late"] = lambda x, gu, dn: triton_mlp.fused_mlp(
        x, gu.fp8, gu.scale, dn.fp8, dn.scale, act_first=False
    )
    out["split"] = lambda x, gu, dn: triton_mlp.fused_mlp(x, gu.fp8, gu.scale, dn.fp8, dn.scale, split=True)
    out["three"] = lambda x, gu, dn: mlp.three_launches(x, gu.fp8, gu.scale, dn.fp8, dn.scale)
    out["bf16"] = lambda x, gu, dn: F.linear(triton_glue.silu_mul(F.linear(x, gu.bf16)), dn.bf16)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--unrolls", default="1,2,4")
    ap.add_argument("--per-sm", default="2,4", help="programs a SM of the fused forms")
    ap.add_argument("--warps", default="4", help="warps a program of the fused forms (4, 8)")
    ap.add_argument("--down-tiles", default="16", help="KiB of down rows a program of the fused forms holds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mlp needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for s in model.SHAPES.values():
        if not s.experts:
            continue
        h, i = s.hidden, s.shared_intermediate
        fp8_bytes = 3 * h * i
        copies = max(2, math.ceil(model.L2_SAFE_BYTES / (2 * fp8_bytes)))
        make = model.Linear.make
        ws = [(make(2 * i, h, dev, gen), make(h, i, dev, gen)) for _ in range(copies)]
        for t in [int(v) for v in args.tokens.split(",")]:
            x = torch.randn(t, h, device=dev, generator=gen).to(torch.bfloat16)
            per_sms = [int(p) for p in args.per_sm.split(",")]
            warps = tuple(int(w) for w in args.warps.split(","))
            tiles = tuple(int(d) for d in args.down_tiles.split(","))
            for name, fn in forms([int(u) for u in args.unrolls.split(",")], per_sms, warps, tiles).items():

                def run(fn: Callable[..., torch.Tensor] = fn, x: torch.Tensor = x, ws: list = ws) -> None:
                    for gu, dn in ws:
                        fn(x, gu, dn)

                us = timing.time_graph(run, reps=1) / copies
                nbytes = fp8_bytes * (2 if name == "bf16" else 1)
                rows.append({"model": s.name, "h": h, "i": i, "tokens": t, "form": name, "us": us,
                             "tbps": nbytes / (us * 1e-6) / 1e12})  # fmt: skip
                print(
                    f"{s.name} H={h} I={i} T={t} {name:<14} {us:7.2f} us {rows[-1]['tbps']:5.2f} TB/s",
                    flush=True,
                )
        del ws
        torch.cuda.empty_cache()
    (args.out / "bench_mlp.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
