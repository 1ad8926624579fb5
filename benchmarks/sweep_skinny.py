"""Sweep the skinny GEMM's (and the grouped MoE kernel's) launch configurations on every
benchmarked drafter's shapes (CUDA), and write the tuning table its bests make.

Usage (repository root, CUDA machine)::

    python -m benchmarks.sweep_skinny --out OUTDIR --tokens 1,4,16 [--narrow-only]

Writes OUTDIR/sweep.json (every configuration's best three per shape), OUTDIR/sweep.md and
OUTDIR/tuning.json: the device's table with the sweep's bests in place, to time in the step
(``python -m benchmarks.draft_step --tuning OUTDIR/tuning.json``) and, where it wins, to copy
to ``mtpconv/kernels/tuned/<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.drafter_step.model import SHAPES
from benchmarks.drafter_step.report import srows_markdown
from benchmarks.drafter_step.sweep import retuned, sweep, table_json
from mtpconv.kernels import tuning


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument(
        "--narrow-only",
        action="store_true",
        help="dense linears only, the narrow-load GEMV's configurations (1-4 tokens) against the "
        "configuration each shape takes now",
    )
    args = ap.parse_args(argv)
    models = args.models.split(",")
    for m in models:
        if m not in SHAPES:
            ap.error(f"--models: {m!r} is not one of {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        print("sweep_skinny needs a CUDA device", file=sys.stderr)
        return 2
    from mtpconv.kernels.triton_skinny import sm_count

    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    srows = sweep(tokens, dev, [SHAPES[m].name for m in models], args.narrow_only)
    (args.out / "sweep.json").write_text(json.dumps(srows, indent=1))
    md = "### Sweep (best per shape)\n\n" + srows_markdown(srows) + "\n"
    (args.out / "sweep.md").write_text(md)
    table = retuned(srows, sm_count(dev.index or 0), tuning.for_device(dev))
    (args.out / "tuning.json").write_text(table_json(table))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
