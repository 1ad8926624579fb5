#!/usr/bin/env python
"""Train a tiny Qwen3.5 target and its MTP drafter on grammar text; write a checkpoint vLLM serves.

Uses fixtures.trained: a probabilistic grammar (number agreement, adjective/noun
collocations, Zipf-distributed words), a 512-id byte-level BPE tokenizer trained on it,
a dense Qwen3.5 target (every layer ``full_attention``) and its one-layer MTP block
trained together on 2 CPU cores within the time budget (default 540 s, so the whole
run stays under 10 minutes). Prints the drafter's own next-next-token accuracy on
held-out grammar text (and the target's next-token accuracy, the drafter's agreement
with the target's greedy choice, and the most-frequent-token baseline):

    python scripts/train_tiny_drafter.py DST [--fast] [--steps N] [--seconds S] [--seed N]

``--fast`` is the configuration the tests use (one layer, hidden 64, ~30 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from fixtures.trained import FAST, TrainConfig, build_trained_model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dst", type=Path, help="checkpoint directory to write")
    ap.add_argument("--fast", action="store_true", help="the small test configuration")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (upper bound)")
    ap.add_argument("--seconds", type=float, default=None, help="training wall-time budget")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args(argv)
    config = FAST if a.fast else TrainConfig()
    changes = {
        k: v for k, v in (("steps", a.steps), ("seconds", a.seconds), ("seed", a.seed)) if v is not None
    }
    config = dataclasses.replace(config, **changes)
    start = time.perf_counter()
    out, report = build_trained_model(a.dst, config, log=True)
    print(json.dumps(dataclasses.asdict(config)))
    print(
        f"\nwrote {out} in {time.perf_counter() - start:.0f} s ({report.steps} steps, "
        f"{report.seconds:.0f} s training), on {report.held_out_tokens:,} held-out tokens:\n"
        f"  drafter next-next-token accuracy   {report.drafter_next_next_token_accuracy:.1%}\n"
        f"  target next-token accuracy         {report.target_next_token_accuracy:.1%}\n"
        f"  drafter agrees with target's greedy {report.drafter_agrees_with_target:.1%}\n"
        f"  most-frequent-token baseline       {report.unigram_baseline:.1%}"
    )


if __name__ == "__main__":
    main()
