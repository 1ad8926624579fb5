"""Drafter-step benchmark at real model shapes (CUDA): BF16 and FP8 variants side by side.

Each variant's step (:mod:`benchmarks.drafter_step.model`, variants in
:mod:`benchmarks.drafter_step.variants`) is captured in a CUDA graph (several weight sets per
graph so that nothing stays in L2) and timed over replays; the median is reported with the
bytes the step must read and the achieved bandwidth against a measured device-to-device copy.
Every variant's routed experts are those the BF16 step picks for the same weights and tokens.

Usage (repository root, CUDA machine)::

    python -m benchmarks.draft_step --out OUTDIR --tokens 1,4,16 --micro --variants bf16,auto

Writes OUTDIR/draft_step.json and OUTDIR/draft_step.md; prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.drafter_step import timing
from benchmarks.drafter_step.model import (
    GLUES,
    L2_SAFE_BYTES,
    SHAPES,
    Linear,
    Routing,
    WeightSet,
    build_weights,
    dense_shapes,
    step,
    step_bytes,
)
from benchmarks.drafter_step.report import Row, markdown, micro_markdown
from benchmarks.drafter_step.timing import chosen, copy_bandwidth, graph_times
from benchmarks.drafter_step.variants import (
    LinearFn,
    MlpFn,
    PrepareFn,
    bf16_routing,
    is_bf16,
    linear_fn,
    mlp_fn,
    moe_fn,
    prepare_fn,
    variant_parts,
    variant_settings,
)
from mtpconv.kernels import triton_available, tuning


def bench_model(
    key: str,
    tokens_list: list[int],
    variants: list[str],
    copy_tbps: float,
    dev: torch.device,
    moe_kind: str = "grouped",
    glue: str = "fused",
) -> list[Row]:
    s = SHAPES[key]
    t0 = time.time()
    sets = [build_weights(s, dev, seed=1, head_full=None)]
    one = step_bytes(s, sets[0], True, full_head=False, distinct=s.top_k)
    n_sets = max(1, min(3, math.ceil(L2_SAFE_BYTES / one)))
    for i in range(1, n_sets):
        # Extra sets share the full head (2.5 GB BF16 alone is far past L2).
        sets.append(build_weights(s, dev, seed=1 + i, head_full=sets[0].head_full))
    torch.cuda.synchronize()
    print(f"[{s.name}] {n_sets} weight set(s) built in {time.time() - t0:.1f}s", flush=True)
    rows: list[Row] = []
    for t in tokens_list:
        gen = torch.Generator(device=dev).manual_seed(t)
        emb = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
        hid = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
        shared_routes = [bf16_routing(s, ws, emb, hid, glue) for ws in sets]
        for variant in variants:
            own_route = variant_parts(variant).own_route
            routes: list[Routing | None] = [None] * n_sets if own_route else shared_routes
            lin = linear_fn(variant)
            moe = moe_fn(variant, moe_kind) if s.experts else None
            shared = variant_parts(variant).shared and s.experts > 0
            side = variant_parts(variant).side
            prep = prepare_fn(variant)
            mlp = mlp_fn(variant)
            mrows = variant_parts(variant).moe_rows
            for full_head in (True, False):
                with variant_settings(variant):
                    _, ids = step(s, sets[0], emb, hid, lin, moe, full_head, shared, glue, prep, side, mlp,
                                  mrows, routes[0])  # fmt: skip
                distinct = int(ids.unique().numel()) if ids is not None else 0

                def run(
                    lin: LinearFn = lin,
                    moe: Any = moe,
                    full_head: bool = full_head,
                    emb: torch.Tensor = emb,
                    hid: torch.Tensor = hid,
                    sets: list[WeightSet] = sets,
                    shared: bool = shared,
                    prep: PrepareFn | None = prep,
                    side: bool = side,
                    mlp: MlpFn | None = mlp,
                    mrows: bool = mrows,
                    routes: list[Routing | None] = routes,
                ) -> None:
                    for ws, route in zip(sets, routes, strict=True):
                        step(s, ws, emb, hid, lin, moe, full_head, shared, glue, prep, side, mlp, mrows,
                             route)  # fmt: skip

                try:
                    with variant_settings(variant):
                        queued, single = graph_times(run, reps=1)
                    us = chosen((queued, single)) / n_sets
                except Exception as exc:  # report and go on: one failing path must not end the run
                    print(f"  {s.name} T={t} {variant} FAILED: {exc!r}"[:400], flush=True)
                    continue
                nbytes = step_bytes(s, sets[0], not is_bf16(variant), full_head, distinct)
                tbps = nbytes / (us * 1e-6) / 1e12
                head = f"{s.vocab // 1000}k" if full_head else "32k"
                rows.append(
                    Row(s.name, t, variant, head, us, nbytes, tbps, 100 * tbps / copy_tbps, distinct,
                        {"us_single": single / n_sets, "us_queued": queued / n_sets})
                )  # fmt: skip
                print(
                    f"  {s.name} T={t:<3} {variant:<22} head={head:<5} {us:8.1f} us "
                    f"{nbytes / 1e6:8.1f} MB {tbps:5.2f} TB/s "
                    f"({100 * tbps / copy_tbps:4.0f}% copy)",
                    flush=True,
                )
    del sets
    torch.cuda.empty_cache()
    return rows


def micro(
    shape_key: str,
    tokens_list: list[int],
    variants: list[str],
    dev: torch.device,
    per_row: bool = False,
) -> list[dict[str, Any]]:
    """Per-linear times at one model's shapes, weight copies rotated past L2."""
    shapes = dense_shapes(SHAPES[shape_key])
    out: list[dict[str, Any]] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, (n, k) in shapes.items():
        copies = max(2, math.ceil(L2_SAFE_BYTES / (n * k)))
        ws = [Linear.make(n, k, dev, gen) for _ in range(copies)]
        if per_row:  # distinct per-row scales, as fused shards with their own scales give
            for w in ws:
                w.scale = w.scale * (1 + torch.rand(n, device=dev, generator=gen))
        for t in tokens_list:
            x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
            for variant in variants:
                lin = linear_fn(variant)

                def g(lin: LinearFn = lin, x: torch.Tensor = x, ws: list[Linear] = ws) -> None:
                    for w in ws:
                        lin(x, w)

                try:
                    with variant_settings(variant):
                        queued, single = graph_times(g, reps=1)
                except Exception as exc:  # report and go on
                    print(f"  micro {name} T={t} {variant} FAILED: {exc!r}"[:400], flush=True)
                    continue
                queued, single = queued / copies, single / copies
                us = chosen((queued, single))
                nbytes = n * k * (2 if is_bf16(variant) else 1)
                out.append(
                    {
                        "linear": name,
                        "n": n,
                        "k": k,
                        "tokens": t,
                        "variant": variant,
                        "per_row": per_row,
                        "us": us,
                        "tbps": nbytes / (us * 1e-6) / 1e12,
                        "us_single": single,
                        "us_queued": queued,
                        "tbps_queued": nbytes / (queued * 1e-6) / 1e12,
                    }
                )
        del ws
        torch.cuda.empty_cache()
        print(f"  micro {name} done", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,4,16,64")
    ap.add_argument("--variants", default="bf16,auto", help="comma-separated (variants.variant_parts)")
    ap.add_argument("--micro", action="store_true", help="also time each linear alone (27B shapes)")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument(
        "--tuning", type=Path, help="a tuning table (JSON, as sweep_skinny writes it) for every device"
    )
    ap.add_argument(
        "--moe",
        choices=("grouped", "pair"),
        default="grouped",
        help="routed-expert kernel of the step (the same for both precisions)",
    )
    ap.add_argument(
        "--glue",
        choices=GLUES,
        default="fused",
        help="routing, SiLU * up and sums of the step: one kernel each, or torch ops (both precisions)",
    )
    ap.add_argument(
        "--timing",
        choices=timing.TIMINGS,
        default="single",
        help="how graph replays are timed (the step and per-linear rows record both: us_single, us_queued)",
    )
    ap.add_argument(
        "--per-row",
        action="store_true",
        help="with --micro: per-output-row weight scales (fused q/k/v, gate/up shards)",
    )
    args = ap.parse_args(argv)
    timing.TIMING = args.timing
    variants = args.variants.split(",")
    for v in variants:  # fail early on a typo, before any output
        try:
            variant_parts(v)
        except ValueError as exc:
            ap.error(f"--variants: {exc}")
    if not torch.cuda.is_available():
        print("draft_step needs a CUDA device", file=sys.stderr)
        return 2
    table = tuning.parse(args.tuning.read_text()) if args.tuning else tuning.for_device(torch.device("cuda"))
    with tuning.replaced(table):
        return _run(args, variants)


def _run(args: argparse.Namespace, variants: list[str]) -> int:
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    meta = {
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__ if triton_available() else None,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "glue": args.glue,
        "timing": args.timing,
        "tuning": tuning.for_device(dev).device,
    }
    copy_tbps = copy_bandwidth(dev)
    print(f"{meta}\ncopy bandwidth {copy_tbps:.2f} TB/s", flush=True)
    result: dict[str, Any] = {"meta": meta, "copy_tbps": copy_tbps}
    md = ""
    if args.micro or args.micro_only:
        mrows = micro("qwen3.5-27b", tokens, variants, dev, args.per_row)
        result["micro"] = mrows
        md += "### Per-linear (Qwen3.5-27B shapes)\n\n" + micro_markdown(mrows) + "\n\n"
        (args.out / "draft_step.json").write_text(json.dumps(result, indent=1))
    if not args.micro_only:
        rows: list[Row] = []
        for key in args.models.split(","):
            rows += bench_model(key, tokens, variants, copy_tbps, dev, args.moe, args.glue)
            result["steps"] = [r.__dict__ for r in rows]
            (args.out / "draft_step.json").write_text(json.dumps(result, indent=1))
        md = f"### Drafter step (glue: {args.glue})\n\n" + markdown(rows, copy_tbps, variants) + "\n" + md
    (args.out / "draft_step.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
