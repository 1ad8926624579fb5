#!/usr/bin/env python
"""Draft acceptance with windowed vs full draft attention in real vLLM (CPU).

Builds the planted model (fixtures.planted), optionally makes its drafter
lean on its attention (``--attn-gain G`` scales the drafter's ``o_proj``, see
fixtures.attention_drafter), converts it once with ``mtpconv
quantize-mtp`` (FP8 drafter; ``--draft-vocab`` adds the 384-id FP8 draft head),
then for each window runs ``mtpconv set-draft-window`` on that variant (0 = full
attention) and serves it with ``speculative_config={"method": "mtp",
"num_speculative_tokens": 2}``. Prints vLLM's own counters
(``vllm:spec_decode_num_accepted_tokens`` / ``vllm:spec_decode_num_draft_tokens``),
whether greedy output equals the non-speculative run, and the ``sliding_window``
the loaded drafter's and target's ``Attention`` modules carry. Prompts are
``--prompt-len`` consecutive ids, so they are longer than any small window.
Run it in the test environment (``scripts/setup_env.sh --vllm``):

    python scripts/vllm_window_acceptance.py --windows 0 64 16 8 4 2 --attn-gain 30
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fixtures.vllm_stub import use_in_this_environment

HEAD_IDS = 384  # the draft head keeps ids 0..383


def attention_windows(worker: Any) -> dict[str, set[int | None]]:
    """The distinct ``sliding_window`` values of the drafter's and the target's Attention modules."""
    from vllm.model_executor.layers.attention import Attention

    runner = worker.model_runner
    return {
        role: {m.sliding_window for m in model.modules() if isinstance(m, Attention)}
        for role, model in (("drafter", runner.drafter.model), ("target", runner.model))
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--windows", type=int, nargs="+", default=[0, 16, 4], help="0 = full attention")
    ap.add_argument(
        "--attn-gain", type=float, default=0.0, metavar="G", help="scale the drafter's o_proj by G"
    )
    ap.add_argument(
        "--drafter-noise", type=float, default=0.0, metavar="S", help="low-margin planted drafter"
    )
    ap.add_argument("--draft-vocab", action="store_true", help="add the 384-id FP8 draft head")
    ap.add_argument("--prompts", type=int, default=6, metavar="N")
    ap.add_argument("--prompt-len", type=int, default=48, metavar="L")
    ap.add_argument("--max-tokens", type=int, default=32, metavar="M")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args(argv)
    room = HEAD_IDS - a.prompt_len - a.max_tokens - 4
    if room < a.prompts:
        ap.error("--prompt-len + --max-tokens leave no room inside the 384-id draft head")
    use_in_this_environment()
    from fixtures.attention_drafter import amplify_drafter_attention
    from fixtures.planted import build_model
    from fixtures.vllm_run import quantize_mtp, run, write_ids
    from mtpconv.commands.set_draft_window import set_draft_window

    work = a.workdir or Path(tempfile.mkdtemp(prefix="mtpconv-window-"))
    src = build_model(work / "planted", drafter_noise=a.drafter_noise)
    if a.attn_gain:
        amplify_drafter_attention(src, a.attn_gain)
    extra = ["--draft-vocab", str(write_ids(work / "ids.pt", list(range(HEAD_IDS))))] if a.draft_vocab else []
    variant = work / "fp8"
    if variant.exists():
        shutil.rmtree(variant)
    quantize_mtp(src, variant, *extra)
    stride = room // a.prompts
    prompts = [[1 + i * stride + j for j in range(a.prompt_len)] for i in range(a.prompts)]
    kw: dict[str, Any] = {"prompts": prompts, "max_tokens": a.max_tokens}
    baseline = run(src, spec=False, **kw).outputs
    print(
        f"{a.prompts} prompts x {a.prompt_len} tokens, {a.max_tokens} generated; attn gain "
        f"{a.attn_gain}, drafter noise {a.drafter_noise}, draft head {'384 FP8' if a.draft_vocab else 'full'}"
    )
    print(
        f"{'draft attention':18} {'accepted/drafted':>17} {'rate':>7}  "
        "output == no-spec  drafter / target windows"
    )
    for window in a.windows:
        set_draft_window(variant, window or None)
        r = run(variant, probe=attention_windows, **kw)
        label = "full" if not window else f"window {window}"
        w = r.extra["probe"]
        print(
            f"{label:18} {f'{r.accepted}/{r.drafted}':>17} {r.acceptance:7.1%}  "
            f"{str(r.outputs == baseline):17}  "
            f"{sorted(w['drafter'], key=str)} / {sorted(w['target'], key=str)}"
        )


if __name__ == "__main__":
    main()
