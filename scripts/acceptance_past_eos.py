#!/usr/bin/env python
"""Where a truncated head loses drafts in vLLM's counters: the token after an EOS.

Run after ``scripts/acceptance_study.py`` on the same ``--workdir``. Serves the
generation-built FP8 head of ``--size`` ids with the plugin, wrapping the drafter's
``compute_logits`` to record every row whose full-head choice (the drafter's own
``lm_head``) lies outside the truncated head. Then adds those ids to the head (in
place of ids never served, so K stays the same), converts again and serves all three
(generation-built, generation-built + those ids, full head) at k = 2 and 3. Prints
vLLM's accepted / drafted counters and whether each output equals no-spec.

    python scripts/acceptance_past_eos.py /tmp/trained --workdir DIR [--size 128]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import acceptance_study as study  # noqa: E402

from mtpconv.testing.vllm_stub import use_in_this_environment  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("model", type=Path)
    ap.add_argument("--workdir", type=Path, required=True, help="the acceptance study's workdir")
    ap.add_argument("--size", type=int, default=128)
    a = ap.parse_args(argv)
    use_in_this_environment()
    import torch
    from tokenizers import Tokenizer

    from mtpconv.testing.vllm_run import quantize_mtp
    from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin

    tok = Tokenizer.from_file(str(a.model / "tokenizer.json"))
    texts = study._prefixes(study.SERVED_PROMPTS, 101)
    prompts = [tok.encode(p, add_special_tokens=False).ids for p in texts]
    outside: Counter[int] = Counter()
    original = MtpconvDrafterMixin.compute_logits

    def recording(self: object, hidden: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        out = original(self, hidden, spec_step_idx)  # type: ignore[arg-type]
        if out is not None and getattr(self, "draft_logits_processor", None) is not None:
            full = self.logits_processor(self.lm_head, hidden)  # type: ignore[attr-defined]
            best = full.argmax(-1)
            ids = self.model.draft_vocab_ids  # type: ignore[attr-defined]
            outside.update(best[~torch.isin(best, ids)].tolist())
        return out

    MtpconvDrafterMixin.compute_logits = recording  # type: ignore[method-assign]
    head = a.workdir / f"fp8_generated_{a.size}"
    nospec = study._serve(a.model, prompts, None)[0]
    study._serve(head, prompts, 2)
    MtpconvDrafterMixin.compute_logits = original  # type: ignore[method-assign]
    served = {t for o in nospec for t in o}
    named = {i: tok.id_to_token(i) for i in outside}
    print(
        f"full-head drafts outside the head: {dict(outside)} {named}; served: {sorted(set(outside) & served)}"
    )
    ids = torch.load(a.workdir / f"generated_{a.size}.pt").tolist()
    spare = [i for i in reversed(ids) if i not in served][: len(outside)]
    patched = sorted((set(ids) - set(spare)) | set(outside))
    ids_file = a.workdir / f"generated_{a.size}_plus.pt"
    torch.save(torch.tensor(patched, dtype=torch.int64), ids_file)
    out = a.workdir / f"fp8_generated_{a.size}_plus"
    shutil.rmtree(out, ignore_errors=True)
    plus = quantize_mtp(a.model, out, "--draft-vocab", str(ids_file))
    for label, path in (
        (f"generated-built {a.size}", head),
        (f"generated-built {a.size} + those ids", plus),
        ("full head", a.workdir / "fp8"),
    ):
        for k in (2, 3):
            outputs, accepted, drafted = study._serve(path, prompts, k)
            print(
                f"| {label} | k={k} | {accepted}/{drafted} | {'yes' if outputs == nospec else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
