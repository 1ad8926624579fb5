"""The narrow-load GEMV with its first weight tile loaded before the PDL wait, or not (CUDA).

For every dense FP8 linear of the benchmarked drafters on which ``fp8_linear`` takes the
narrow-load GEMV (``mtpconv.kernels.triton_skinny.default_config``), this times the chosen
configuration four ways, side by side in one process: under PDL ``late`` (the default) and
``early``, each with ``first_ahead`` 0 and 1 (``+first``). CUDA graphs over weight copies
rotated past L2, as ``bench_draft.py --micro`` times a linear, the forms interleaved over
``--rounds``. It first checks that the forms give the same output bit for bit.

Usage (repo root, CUDA machine)::

    PYTHONPATH=$PWD python3 scripts/bench_gemv_ahead.py --out OUTDIR [--tokens 1,2,4]

Writes OUTDIR/bench_gemv_ahead.json and .md; prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from bench_draft import L2_SAFE_BYTES, SHAPES, Linear, dense_shapes, time_graph

FORMS = ("late", "late+first", "early+first", "early")


def form(cfg: Any, name: str) -> Any:
    return cfg._replace(first_ahead=int(name.endswith("+first")))


def narrow_shapes(tokens: int, sms: int) -> list[tuple[str, int, int, Any]]:
    """``(label, N, K, config)`` of the drafters' linears that take the narrow GEMV."""
    from mtpconv.kernels.triton_skinny import default_config

    out = []
    for key, s in SHAPES.items():
        for name, (n, k) in dense_shapes(s).items():
            cfg = default_config(tokens, n, k, sms)
            if cfg.narrow and not cfg.dot:
                out.append((f"{key} {name}", n, k, cfg))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="1", help="comma-separated token counts (1-4)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from mtpconv.kernels.triton_skinny import skinny_linear, sm_count

    dev = torch.device("cuda")
    sms = sm_count(0)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for t in (int(v) for v in args.tokens.split(",")):
        for label, n, k, cfg in narrow_shapes(t, sms):
            copies = max(2, math.ceil(L2_SAFE_BYTES / (n * k)))
            ws = [Linear.make(n, k, dev, gen) for _ in range(copies)]
            x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
            outs = [skinny_linear(x, ws[0].fp8, ws[0].scale, config=form(cfg, a)) for a in FORMS]
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            times: dict[str, list[float]] = {a: [] for a in FORMS}
            for _ in range(args.rounds):
                for a in FORMS:
                    c = form(cfg, a)
                    os.environ["MTPCONV_PDL"] = a.split("+")[0]

                    def g(c: Any = c, x: torch.Tensor = x, ws: list[Linear] = ws) -> None:
                        for w in ws:
                            skinny_linear(x, w.fp8, w.scale, config=c)

                    times[a].append(time_graph(g, reps=1) / copies)
                    os.environ.pop("MTPCONV_PDL")
            med = {a: statistics.median(v) for a, v in times.items()}
            row = {"linear": label, "n": n, "k": k, "tokens": t, "config": list(cfg), "same": same}
            row |= {f"us{a}": med[a] for a in FORMS} | {f"tbps{a}": n * k / med[a] / 1e6 for a in FORMS}
            rows.append(row)
            print(
                f"{label} T={t} same={same} "
                + " ".join(f"{a} {med[a]:.2f} us ({row[f'tbps{a}']:.2f} TB/s)" for a in FORMS),
                flush=True,
            )
            del ws
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_gemv_ahead.json").write_text(json.dumps(rows, indent=1))
    lines = ["| linear | N x K | tokens | same | " + " | ".join(f"{a} us (TB/s)" for a in FORMS) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(FORMS))
    for r in rows:
        cells = " | ".join(f"{r[f'us{a}']:.2f} ({r[f'tbps{a}']:.2f})" for a in FORMS)
        lines.append(f"| {r['linear']} | {r['n']} x {r['k']} | {r['tokens']} | {r['same']} | {cells} |")
    (args.out / "bench_gemv_ahead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
