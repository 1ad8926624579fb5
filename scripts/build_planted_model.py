#!/usr/bin/env python
"""Write a tiny planted (or random) Qwen3.5-family checkpoint for vLLM (see fixtures.planted)."""

from __future__ import annotations

import argparse

from fixtures.planted import build_model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dst")
    ap.add_argument("--kind", choices=["planted", "random"], default="planted")
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--next", action="store_true", help="Qwen3-Next layout (MoE, Qwen3NextMTP)")
    ap.add_argument("--swap-fc", action="store_true", help="mis-converted drafter (fc halves swapped)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--drafter-noise",
        type=float,
        default=0.0,
        metavar="S",
        help="low-margin drafter: std of seeded noise on mtp.fc's embedding half (planted)",
    )
    a = ap.parse_args(argv)
    path = build_model(
        a.dst,
        kind=a.kind,
        moe=a.moe,
        next=a.next,
        swap_fc=a.swap_fc,
        seed=a.seed,
        drafter_noise=a.drafter_noise,
    )
    print(path)


if __name__ == "__main__":
    main()
