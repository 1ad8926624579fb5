#!/usr/bin/env python
"""Draft acceptance of a trained tiny drafter in real vLLM (CPU), k = 1..4, per drafter format
and draft vocabulary; prints a Markdown table.

Variants of the model written by ``scripts/train_tiny_drafter.py``: the BF16 drafter
(the source), the FP8 drafter (``mtpconv quantize-mtp``), and FP8 + a truncated FP8
head at K = 12.5 / 25 / 50% of the vocabulary, each built two ways with
``build-draft-vocab``: from a corpus (held-out grammar text: the right domain, but
not the model's own words) and from the model's own generations (``--generate``, 64
build prompts sampled at temperature 0.8). Each variant is served with
``speculative_config={"method": "mtp", "num_speculative_tokens": k}`` on held-out
prompts (greedy, up to 48 tokens, stopping at EOS as a deployment does); acceptance is vLLM's own counters
(``vllm:spec_decode_num_accepted_tokens`` / ``vllm:spec_decode_num_draft_tokens``).
"coverage" is the share of the greedy served tokens (no speculation) inside the
head; "held-out gen." the sidecar's coverage of what the model samples for the
served prompts (``--eval-prompts``).

    python scripts/train_tiny_drafter.py /tmp/trained
    python scripts/acceptance_study.py /tmp/trained [--workdir DIR] [--ks 1 2 3 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fixtures.vllm_stub import use_in_this_environment

FRACTIONS = (0.125, 0.25, 0.5)
BUILD_PROMPTS, SERVED_PROMPTS, MAX_TOKENS = 256, 64, 48


def _prefixes(n: int, seed: int) -> list[str]:
    """The first 3-6 words of ``n`` held-out grammar documents."""
    import random

    from fixtures.trained import grammar_text

    rng = random.Random(seed)
    return [" ".join(t.split()[: rng.randint(3, 6)]) for t in grammar_text(n, seed=seed)]


def _jsonl(path: Path, key: str, values: list[str]) -> Path:
    path.write_text("".join(json.dumps({key: v}) + "\n" for v in values))
    return path


def _serve(path: Path, prompts: list[list[int]], k: int | None) -> tuple[list[list[int]], int, int]:
    """Greedy outputs (stopping at EOS) and vLLM's (accepted, drafted) counters; k None: no spec."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from fixtures.vllm_run import serve

    extra = {"num_speculative_tokens": k} if k else None
    with serve(path, spec=k is not None, spec_extra=extra) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        if k is None:
            return outputs, 0, 0
        metrics = llm.get_metrics()

        def total(name: str) -> int:
            return int(sum(getattr(m, "value", 0) for m in metrics if m.name == name))

        return (
            outputs,
            total("vllm:spec_decode_num_accepted_tokens"),
            total("vllm:spec_decode_num_draft_tokens"),
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("model", type=Path, help="a checkpoint from scripts/train_tiny_drafter.py")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4], help="num_speculative_tokens")
    a = ap.parse_args(argv)
    use_in_this_environment()
    from tokenizers import Tokenizer

    from fixtures.trained import grammar_text
    from fixtures.vllm_run import CPU_ENGINE, quantize_mtp
    from mtpconv.commands.build_draft_vocab import build_draft_vocab
    from mtpconv.draft_vocab.generate import SamplingSettings

    work = a.workdir or Path(tempfile.mkdtemp(prefix="mtpconv-study-"))
    work.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((a.model / "config.json").read_text())["vocab_size"]
    build = _jsonl(work / "build_prompts.jsonl", "prompt", _prefixes(BUILD_PROMPTS, 100))
    served_text = _prefixes(SERVED_PROMPTS, 101)
    held = _jsonl(work / "served_prompts.jsonl", "prompt", served_text)
    corpus = _jsonl(work / "corpus.jsonl", "text", grammar_text(2000, seed=102))
    tok = Tokenizer.from_file(str(a.model / "tokenizer.json"))
    prompts = [tok.encode(p, add_special_tokens=False).ids for p in served_text]
    sampling = SamplingSettings(max_new_tokens=64, temperature=0.8, top_p=0.95, seed=0)

    variants: dict[str, tuple[Path, set[int] | None, float | None]] = {
        "BF16 drafter, full head": (a.model, None, None),
        "FP8 drafter, full head": (quantize_mtp(a.model, work / "fp8"), None, None),
    }
    for frac in FRACTIONS:
        k_ids = int(vocab * frac)
        for how in ("corpus", "generated"):
            ids_file = work / f"{how}_{k_ids}.pt"
            if how == "corpus":
                r = build_draft_vocab(a.model, [corpus], k_ids, ids_file)
                held_cov = None
            else:
                r = build_draft_vocab(
                    a.model,
                    [],
                    k_ids,
                    ids_file,
                    generate=build,
                    eval_prompts=held,
                    sampling=sampling,
                    engine_args=CPU_ENGINE,
                )
                held_cov = r.eval_generated.coverage if r.eval_generated else None
            path = quantize_mtp(a.model, work / f"fp8_{how}_{k_ids}", "--draft-vocab", str(ids_file))
            label = f"FP8 + {k_ids}-id head ({frac:.1%}), {how}-built"
            variants[label] = (path, set(r.ids), held_cov)

    nospec = _serve(a.model, prompts, None)[0]
    served = [t for o in nospec for t in o]
    rows = []
    for label, (path, ids, held_cov) in variants.items():
        cells, same = [], True
        for k in a.ks:
            outputs, accepted, drafted = _serve(path, prompts, k)
            cells.append(f"{accepted / max(drafted, 1):.1%} ({accepted}/{drafted})")
            same = same and outputs == nospec
            print(f"{label}, k={k}: {accepted}/{drafted}", flush=True)
        cov = 1.0 if ids is None else sum(t in ids for t in served) / len(served)
        held_s = "-" if held_cov is None else f"{held_cov:.1%}"
        rows.append(
            f"| {label} | {cov:.1%} | {held_s} | " + " | ".join(cells) + f" | {'yes' if same else 'no'} |"
        )
    head = "| drafter | coverage (served) | held-out gen. | " + " | ".join(f"k={k}" for k in a.ks)
    print(
        f"\n{SERVED_PROMPTS} served prompts, greedy, <= {MAX_TOKENS} tokens ({len(served)} in all), "
        f"vocabulary {vocab}\n"
    )
    print(head + " | output == no-spec |")
    print("|---|---:|---:|" + "---:|" * len(a.ks) + "---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
