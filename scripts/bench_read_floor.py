"""How fast can one kernel that only reads B bytes run on this GPU (CUDA, Triton)?

The floor under every per-linear figure of issue 12: a linear at decode sizes is one
kernel that must read its weight bytes once, so no linear can beat the best pure-read
kernel of the same bytes, timed the same way (a CUDA graph of launches back to back on
buffer copies rotated past L2, as ``bench_draft.py --micro-only`` times one linear).

For every weight size of the benchmarked drafters (FP8 bytes and BF16 bytes), the script
sweeps a pure-read Triton kernel (each program sums its share of the buffer as int32
words and writes one value; contiguous shares or a grid stride; block, warps, stages
and programs per SM varied) and reports the best time, its TB/s, and a least-squares
fit ``t = t0 + B / bw`` over the sizes (the fixed cost per kernel and the streaming rate).

Usage (repo root, CUDA machine)::

    PYTHONPATH=$PWD python3 scripts/bench_read_floor.py --out OUTDIR

Writes OUTDIR/read_floor.json and OUTDIR/read_floor.md; prints the table.
"""

# Triton kernels are untyped by nature.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_draft import L2_SAFE_BYTES, SHAPES, copy_bandwidth, dense_shapes, time_graph  # noqa: E402


@triton.jit
def _read_kernel(src, out, n_words, per_prog, BLOCK: tl.constexpr, STRIDED: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    if STRIDED:  # program p reads blocks p, p + P, p + 2P, ...
        step = tl.num_programs(0) * BLOCK
        for start in range(pid * BLOCK, n_words, step):
            idx = start + offs
            acc += tl.load(src + idx, mask=idx < n_words, other=0, eviction_policy="evict_first")
    else:  # program p reads one contiguous share
        base = pid * per_prog
        for start in range(base, base + per_prog, BLOCK):
            idx = start + offs
            acc += tl.load(src + idx, mask=idx < n_words, other=0, eviction_policy="evict_first")
    tl.store(out + pid, tl.sum(acc, axis=0))


def read_once(src: torch.Tensor, out: torch.Tensor, cfg: tuple[int, int, int, int, bool]) -> None:
    block, warps, stages, programs, strided = cfg
    n = src.numel()
    per_prog = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = programs if strided else triton.cdiv(n, per_prog)
    _read_kernel[(grid,)](
        src, out, n, per_prog, BLOCK=block, STRIDED=strided, num_warps=warps, num_stages=stages
    )


def weight_sizes() -> dict[int, list[str]]:
    """Weight bytes of every benchmarked FP8 linear and of its BF16 original -> names."""
    sizes: dict[int, list[str]] = {}
    for s in SHAPES.values():
        for name, (n, k) in dense_shapes(s).items():
            for width, label in ((1, "fp8"), (2, "bf16")):
                sizes.setdefault(n * k * width, []).append(f"{s.name} {name} {label}")
    return dict(sorted(sizes.items()))


def configs(sms: int) -> list[tuple[int, int, int, int, bool]]:
    return [
        (block, warps, stages, waves * sms, strided)
        for block, warps, stages, waves, strided in itertools.product(
            (512, 1024, 2048, 4096), (4, 8), (1, 3), (1, 2, 4, 8), (False, True)
        )
    ]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``us = t0 + bytes / bw``: returns (t0 in us, bw in TB/s)."""
    xs = [b for b, _ in points]
    ys = [t for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, 1e-6 / slope


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_read_floor needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy_tbps = copy_bandwidth(dev)
    print(f"copy bandwidth {copy_tbps:.2f} TB/s, {sms} SMs", flush=True)
    rows: list[dict[str, Any]] = []
    for nbytes, names in weight_sizes().items():
        copies = max(2, math.ceil(L2_SAFE_BYTES / nbytes))
        words = nbytes // 4
        bufs = [torch.empty(words, dtype=torch.int32, device=dev).random_() for _ in range(copies)]
        out = torch.empty(8 * sms * 64, dtype=torch.int32, device=dev)
        best: tuple[float, Any] = (math.inf, None)
        for cfg in configs(sms):

            def g(
                cfg: tuple[int, int, int, int, bool] = cfg,
                bufs: list[torch.Tensor] = bufs,
                out: torch.Tensor = out,
            ) -> None:
                for b in bufs:
                    read_once(b, out, cfg)

            us = time_graph(g, reps=1, replays=15) / copies
            if us < best[0]:
                best = (us, cfg)
        us, cfg = best
        tbps = nbytes / (us * 1e-6) / 1e12
        rows.append({"bytes": nbytes, "names": names, "us": us, "tbps": tbps, "config": list(cfg)})
        print(f"  {nbytes / 1e6:8.1f} MB {us:7.1f} us {tbps:5.2f} TB/s {cfg} {', '.join(names)}", flush=True)
        del bufs
        torch.cuda.empty_cache()
    t0, bw = fit([(r["bytes"], r["us"]) for r in rows])
    md = [
        f"Pure-read floor (copy bandwidth {copy_tbps:.2f} TB/s; fit t = {t0:.2f} us + B / {bw:.2f} TB/s)",
        "",
        "| MB | best us | TB/s | fit us | config (block, warps, stages, programs, strided) | weights |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        fit_us = t0 + r["bytes"] / (bw * 1e12) * 1e6
        md.append(
            f"| {r['bytes'] / 1e6:.1f} | {r['us']:.1f} | {r['tbps']:.2f} | {fit_us:.1f} | "
            f"{tuple(r['config'])} | {', '.join(r['names'])} |"
        )
    text = "\n".join(md) + "\n"
    (args.out / "read_floor.md").write_text(text)
    result = {"copy_tbps": copy_tbps, "t0_us": t0, "bw_tbps": bw, "rows": rows, "command": " ".join(sys.argv)}
    (args.out / "read_floor.json").write_text(json.dumps(result, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
