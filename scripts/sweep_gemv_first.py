"""Sweep of the narrow-load GEMV's configurations on one shape at one token, with and
without the first weight tile loaded before the PDL wait, under PDL ``late`` and ``early``
(CUDA; timed as ``bench_draft.py --micro`` times a linear).

    PYTHONPATH=$PWD python3 scripts/sweep_gemv_first.py --n 5120 --k 6144 [--tokens 1]
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from bench_draft import L2_SAFE_BYTES, Linear, narrow_configs, time_graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--modes", default="late,early")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    from mtpconv.kernels.triton_skinny import default_config, skinny_linear, sm_count

    dev = torch.device("cuda")
    sms = sm_count(0)
    gen = torch.Generator(device=dev).manual_seed(0)
    n, k, t = args.n, args.k, args.tokens
    copies = max(2, math.ceil(L2_SAFE_BYTES / (n * k)))
    ws = [Linear.make(n, k, dev, gen) for _ in range(copies)]
    x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
    base = default_config(t, n, k, sms)
    cfgs = [base] + [c for c in narrow_configs(t, sms) if c.block_n in (4, 8) and c.block_k >= 1024]
    res = []
    for mode in args.modes.split(","):
        os.environ["MTPCONV_PDL"] = mode
        for cfg in cfgs:
            for first in (0, 1, 2):
                c = cfg._replace(first_ahead=first)

                def g(c=c) -> None:  # type: ignore[no-untyped-def]
                    for w in ws:
                        skinny_linear(x, w.fp8, w.scale, config=c)

                try:
                    us = time_graph(g, reps=1, replays=15) / copies
                except Exception as exc:  # report and go on
                    print(f"FAILED {c}: {exc!r}"[:200])
                    continue
                res.append((us, mode, c))
        print(f"  {mode}: default {[r[0] for r in res if r[1] == mode and r[2][:9] == base[:9]]}", flush=True)
    res.sort(key=lambda r: r[0])
    for us, mode, c in res[: args.top]:
        print(f"{us:7.2f} us {n * k / us / 1e6:5.2f} TB/s {mode:5s} {tuple(c)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
