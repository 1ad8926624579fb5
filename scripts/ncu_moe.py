"""One launch of the grouped MoE kernel per case, both precisions, for Nsight Compute (CUDA).

Runs every case once to warm up (compile), then once more between
``cudaProfilerStart`` / ``cudaProfilerStop``, so that::

    ncu --clock-control none --profile-from-start off --set full --import-source yes \
        -o REPORT python3 scripts/ncu_moe.py --cases 397b:down:4,397b:gate_up:4

profiles exactly one launch per (case, precision): ``triton_moe.moe_grouped`` with its
default configuration on the routed experts of ``bench_draft.SHAPES`` (``397b``: Qwen3.5-
397B-A17B, ``next``: Qwen3-Next-80B-A3B), the down projection with its fused SiLU * up
and routing weight, as the drafter step runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402
from ncu_linears import profile_once  # noqa: E402

from mtpconv.kernels import triton_moe  # noqa: E402

MODELS = {"397b": "qwen3.5-397b-a17b", "next": "qwen3-next-80b-a3b"}
DEFAULT_CASES = "397b:down:4,397b:gate_up:4,next:down:4"


def cases(spec: str, precisions: list[bool]) -> list[tuple[str, Callable[[], object]]]:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    out: list[tuple[str, Callable[[], object]]] = []
    experts: dict[tuple[str, str], bd.Experts] = {}
    for item in spec.split(","):
        model, proj, tokens = item.split(":")
        s = bd.SHAPES[MODELS[model]]
        t = int(tokens)
        if (model, proj) not in experts:
            n, k = (2 * s.moe_intermediate, s.hidden) if proj == "gate_up" else (s.hidden, s.moe_intermediate)
            experts[(model, proj)] = bd.Experts.make(s.experts, n, k, dev, gen)
        ex = experts[(model, proj)]
        ids = bd.routing_sets(s, t, dev, gen, 1)[0]
        act = proj == "down"
        width = 2 * s.moe_intermediate if act else s.hidden
        x = torch.randn(t * s.top_k if act else t, width, device=dev, generator=gen).to(torch.bfloat16)
        rw = torch.rand(t, s.top_k, device=dev, generator=gen) if act else None
        for fp8 in precisions:
            w, sc = (ex.fp8, ex.scale) if fp8 else (ex.bf16, None)
            name = f"moe {model} {proj} T={t} {'fp8' if fp8 else 'bf16'}"
            out.append(
                (
                    name,
                    lambda x=x, w=w, sc=sc, ids=ids, act=act, rw=rw: triton_moe.moe_grouped(
                        x, w, sc, ids, x_per_pair=act, act=act, route_w=rw
                    ),
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="model:projection:tokens, comma-separated")
    ap.add_argument("--precisions", default="fp8,bf16")
    args = ap.parse_args(argv)
    profile_once(cases(args.cases, [p == "fp8" for p in args.precisions.split(",")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
