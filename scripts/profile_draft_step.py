"""Where a drafter step's time goes (CUDA): the kernels of one ``bench_draft.py`` step.

    PYTHONPATH=$PWD python3 scripts/profile_draft_step.py --tokens 1,4,16

Captures one step (32k draft head) per model, token count and variant in a CUDA graph,
replays it under ``torch.profiler`` and sums the kernels' durations in two groups:
those that read weights (the skinny GEMM and GEMV, the grouped MoE kernel, cuBLAS
GEMMs) and the rest (concatenation, residual adds, router softmax / top-k, SiLU and
multiply, sums, casts), which cost the same in both precisions. The step's wall time
(``bench_draft.time_graph``) is printed beside the sums: the difference is the time
between kernels. Prints one line per step and the largest kernels of each group.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402

WEIGHT_KERNELS = ("skinny", "gemv", "moe", "gemm", "cutlass", "xmma", "nvjet", "sm90", "cublas")
REPLAYS = 20
TOP = 8  # kernels listed per group


def kernel_times(fn: Callable[[], object]) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Microseconds per replay of each kernel of ``fn`` captured in a CUDA graph, and the
    first replay's kernels in launch order with their microseconds."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(
        (ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda ev: ev.time_range.start,
    )
    if not kernels:
        raise RuntimeError("the profiler recorded no kernels of the graph replays")
    out: dict[str, float] = collections.defaultdict(float)
    for ev in kernels:
        out[ev.name] += ev.device_time_total / REPLAYS
    first = kernels[: len(kernels) // REPLAYS]
    return out, [(ev.name, ev.device_time_total) for ev in first]


def report(
    s: bd.Shape,
    ws: bd.WeightSet,
    t: int,
    variant: str,
    input_scale: torch.Tensor,
    show_sequence: bool,
    glue: str,
) -> None:
    dev = input_scale.device
    gen = torch.Generator(device=dev).manual_seed(t)
    emb = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
    hid = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
    lin = bd.linear_fn(variant, input_scale)
    moe = bd.moe_fn(variant, "grouped") if s.experts else None
    prep = bd.prepare_fn(variant)
    shared = bd.variant_parts(variant).shared and s.experts > 0
    side = bd.variant_parts(variant).side
    mlp = bd.mlp_fn(variant)
    mrows = bd.variant_parts(variant).moe_rows
    # the experts the BF16 step picks, as bench_draft.py's steps take them (+ownroute: its own)
    route = None if bd.variant_parts(variant).own_route else bd.bf16_routing(s, ws, emb, hid, glue)

    def run() -> None:
        bd.step(s, ws, emb, hid, lin, moe, False, shared, glue, prep, side, mlp, mrows, route)

    _, ids = bd.step(s, ws, emb, hid, lin, moe, False, shared, glue, prep, side, mlp, mrows, route)
    distinct = int(ids.unique().numel()) if ids is not None else 0
    nbytes = bd.step_bytes(s, ws, variant, False, distinct)

    wall = bd.time_graph(run, reps=1)
    times, sequence = kernel_times(run)
    weights = {k: v for k, v in times.items() if any(w in k.lower() for w in WEIGHT_KERNELS)}
    rest = {k: v for k, v in times.items() if k not in weights}
    w_us, r_us = sum(weights.values()), sum(rest.values())
    launches = sum(1 for name, _ in sequence if name in weights)
    print(
        f"{s.name} T={t} {variant}: wall {wall:.1f} us; weight kernels {w_us:.1f} us "
        f"({len(weights)} kinds, {launches} launches, {nbytes / 1e6:.1f} MB); other kernels "
        f"{r_us:.1f} us ({len(rest)} kinds, {len(sequence) - launches} launches); "
        f"between kernels {wall - w_us - r_us:.1f} us",
        flush=True,
    )
    for label, group in (("weights", weights), ("rest", rest)):
        top = sorted(group.items(), key=lambda kv: -kv[1])[:TOP]
        print(f"    {label}: " + "; ".join(f"{k[:60]} {v:.1f}" for k, v in top), flush=True)
    if show_sequence:
        print("    launches: " + "; ".join(f"{k[:40]} {v:.1f}" for k, v in sequence), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(bd.SHAPES))
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--variants", default="bf16,wo_skinny")
    ap.add_argument("--sequence", action="store_true", help="also print one replay's kernels in order")
    ap.add_argument("--glue", choices=bd.GLUES, default="fused", help="as bench_draft.py's --glue")
    args = ap.parse_args()
    input_scale = torch.tensor(4.0 / 448.0, device=torch.device("cuda"))
    print(f"copy bandwidth {bd.copy_bandwidth(input_scale.device):.2f} TB/s", flush=True)
    for key in args.models.split(","):
        s = bd.SHAPES[key]
        ws = bd.build_weights(s, input_scale.device, seed=1, head_full=None)
        for t in [int(v) for v in args.tokens.split(",")]:
            for variant in args.variants.split(","):
                with bd.variant_env(variant):  # its PDL mode while its graph is captured
                    report(s, ws, t, variant, input_scale, args.sequence, args.glue)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
