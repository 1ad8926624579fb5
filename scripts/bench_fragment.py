"""The register-fragment FP16 MMA (``Config.mma`` 3 / 5) against the tuned skinny-GEMM
configuration, per dense linear of the drafters (CUDA; an experiment of issue 12).

    PYTHONPATH=$PWD python3 scripts/bench_fragment.py --tokens 1,4,16
    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section WarpStateStats --section Occupancy python3 scripts/bench_fragment.py --ncu

Prints, per (linear, tokens), the tuned configuration's time and the best three fragment
configurations (each timed as ``bench_draft.py --sweep`` times one). ``--ncu``: one launch
each of the tuned and a fragment configuration on 27B fc (4 tokens) and o (16 tokens),
between cudaProfilerStart / Stop.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402

from mtpconv.formats.fp8 import quantize_fp8  # noqa: E402
from mtpconv.kernels import triton_skinny as ts  # noqa: E402

TILES = [(64, 128, 4), (128, 128, 4), (128, 64, 4), (256, 64, 4), (64, 256, 4), (128, 256, 4)]
TILES += [(32, 256, 2), (64, 128, 2), (128, 128, 8), (256, 128, 8)]
LINEARS = {("Qwen3.5-27B", n) for n in ("fc", "qkv", "o", "gate_up", "down", "head32k")}
LINEARS |= {("Qwen3-Next-80B-A3B", "qkv"), ("Qwen3.5-397B-A17B", "qkv")}


def ncu_cases(dev: torch.device, sms: int) -> None:
    cases = [
        (5120, 10240, 4, ts.Config(True, 64, 128, 4, 3, 4 * sms, 5)),
        (5120, 10240, 4, None),
        (5120, 6144, 16, ts.Config(True, 128, 256, 4, 3, 2 * sms, 5)),
        (5120, 6144, 16, None),
    ]
    runs = []
    for n, k, t, cfg in cases:
        q = quantize_fp8((torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16))
        x = torch.randn(t, k, device=dev).to(torch.bfloat16)
        runs.append(lambda q=q, x=x, cfg=cfg: ts.skinny_linear(x, q.weight, q.scale, config=cfg))
    for r in runs:
        r()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for r in runs:
        r()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = ts.sm_count(0)
    if args.ncu:
        ncu_cases(dev, sms)
        return
    waves = (2, 4, 8)
    frag = [ts.Config(True, bn, bk, w, 3, p * sms, m) for bn, bk, w in TILES for p in waves for m in (3, 5)]
    gen = torch.Generator(device=dev).manual_seed(0)
    seen: set[tuple[int, int]] = set()
    for s in bd.SHAPES.values():
        for name, (n, k) in bd.dense_shapes(s).items():
            if (n, k) in seen or (s.name, name) not in LINEARS:
                continue
            seen.add((n, k))
            copies = max(2, math.ceil(bd.L2_SAFE_BYTES / (n * k)))
            ws = [bd.Linear.make(n, k, dev, gen) for _ in range(copies)]
            for t in [int(v) for v in args.tokens.split(",")]:
                x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
                res = []
                for cfg in [ts.default_config(t, n, k, sms), *frag]:

                    def f(cfg: Any = cfg, x: torch.Tensor = x, ws: list[bd.Linear] = ws) -> None:
                        for w in ws:
                            ts.skinny_linear(x, w.fp8, w.scale, config=cfg)

                    res.append((bd.time_graph(f, reps=1, replays=15) / copies, cfg))
                tuned, best = res[0], sorted(res[1:], key=lambda r: r[0])
                line = f"{s.name} {name} {n}x{k} T={t}: tuned {tuned[0]:.1f} us"
                line += f" ({n * k / tuned[0] / 1e6:.2f} TB/s)"
                for us, cfg in best[:3]:
                    line += f" | {us:.1f} ({n * k / us / 1e6:.2f}) {tuple(cfg)[:7]}"
                print(line, flush=True)
            del ws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
