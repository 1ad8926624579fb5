#!/usr/bin/env python
"""Draft acceptance of the planted model in real vLLM (CPU), per drafter format.

Builds the planted model (scripts/build_planted_model.py), converts it with
``mtpconv quantize-mtp`` (FP8; FP8 + a 384-id draft head in FP8 and in BF16; a
mis-converted source with swapped ``mtp.fc`` halves), serves each with
``speculative_config={"method": "mtp", "num_speculative_tokens": 2}`` and prints
vLLM's own counters (``vllm:spec_decode_num_accepted_tokens`` /
``vllm:spec_decode_num_draft_tokens``) and whether greedy output equals the
non-speculative run. Uses the test harness of tests/vllm (and its test-only
torchvision stub), so run it from the repository root in the test environment:

    python scripts/vllm_acceptance.py [--moe] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUB_SITE = REPO / "tests" / "vllm" / "_stub_site"


def _environment() -> None:
    for key, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                       "HF_HUB_OFFLINE": "1"}.items():  # fmt: skip
        os.environ.setdefault(key, value)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(STUB_SITE), str(REPO), os.environ.get("PYTHONPATH")) if p)
    sys.path[:0] = [str(STUB_SITE), str(REPO)]
    import _mtpconv_vllm_test_stub

    _mtpconv_vllm_test_stub.apply()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--moe", action="store_true", help="the Qwen3.5-MoE layout instead of dense")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args(argv)
    _environment()
    from tests.vllm._harness import planted_builder, quantize_mtp, run, write_ids

    work = a.workdir or Path(tempfile.mkdtemp(prefix="mtpconv-acceptance-"))
    build = planted_builder().build_model
    src = build(work / "planted", moe=a.moe)
    swapped = build(work / "swapped", moe=a.moe, swap_fc=True)
    ids = write_ids(work / "ids.pt", list(range(384)))
    variants = {
        "BF16 drafter (source, no manifest)": (src, {}),
        "FP8 drafter": (quantize_mtp(src, work / "fp8"), {}),
        "FP8 drafter + 384-id FP8 draft head": (
            quantize_mtp(src, work / "fp8_vocab", "--draft-vocab", str(ids)), {}),
        "FP8 drafter + 384-id BF16 draft head": (
            quantize_mtp(src, work / "fp8_vocab_bf16", "--draft-vocab", str(ids),
                         "--draft-head-dtype", "bf16"), {}),  # fmt: skip
        "FP8 drafter, head off (MTPCONV_DRAFT_VOCAB=0)": (work / "fp8_vocab",
                                                          {"MTPCONV_DRAFT_VOCAB": "0"}),  # fmt: skip
        "mis-converted (fc halves swapped), FP8": (quantize_mtp(swapped, work / "swapped_fp8"), {}),
    }
    baseline = run(src, spec=False).outputs
    rows = []
    for label, (path, env) in variants.items():
        r = run(path, env=env)
        rows.append((label, r.accepted, r.drafted, r.acceptance, r.outputs == baseline))
    print(f"\n{'drafter':50} {'accepted/drafted':>17} {'rate':>7}  output == no-spec")
    for label, acc, drafted, rate, same in rows:
        print(f"{label:50} {f'{acc}/{drafted}':>17} {rate:7.1%}  {same}")


if __name__ == "__main__":
    main()
