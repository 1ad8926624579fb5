"""A draft vocabulary from the model's own outputs (``build-draft-vocab --generate``),
measured in real vLLM on the planted model (issue 11).

The same prompts build the vocabulary and are served; a corpus-built vocabulary of
the same K (from examples/corpus.jsonl) is the baseline it must beat.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.vllm_run import CPU_ENGINE, Run, planted_continuation, quantize_mtp, run
from mtpconv.commands.build_draft_vocab import build_draft_vocab
from mtpconv.draft_vocab.generate import SamplingSettings

CORPUS = Path(__file__).parents[2] / "examples" / "corpus.jsonl"
K = 128  # a quarter of the planted model's 512 ids
MAX_TOKENS = 24
# The build generates a little past what is served: the drafts of the last step look ahead.
BUILD_TOKENS = MAX_TOKENS + 4


def _prompts() -> list[str]:
    """The first words of the corpus's first six plain-text lines."""
    texts = [json.loads(line).get("text") for line in CORPUS.read_text().splitlines()]
    return [" ".join(t.split()[:4]) for t in texts if t][:6]


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from tokenizers import Tokenizer

    src = models["planted"]
    root = tmp_path_factory.mktemp("generated_vocab")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts()))
    greedy = SamplingSettings(max_new_tokens=BUILD_TOKENS, temperature=0.0, top_p=1.0, seed=0)
    gen = build_draft_vocab(
        src,
        [],
        K,
        root / "gen.pt",
        generate=prompts,
        eval_prompts=prompts,
        sampling=greedy,
        engine_args=CPU_ENGINE,
    )
    corpus = build_draft_vocab(src, [CORPUS], K, root / "corpus.pt")
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    ids = [tok.encode(p, add_special_tokens=False).ids for p in _prompts()]
    runs: dict[str, Run] = {}
    for name in ("gen", "corpus"):
        variant = quantize_mtp(src, root / f"fp8_{name}", "--draft-vocab", str(root / f"{name}.pt"))
        runs[name] = run(variant, prompts=ids, max_tokens=MAX_TOKENS)
    return {"gen": gen, "corpus": corpus, "runs": runs, "ids": ids, "root": root}


def test_generation_built_head_keeps_acceptance(built: dict[str, object]) -> None:
    runs: dict[str, Run] = built["runs"]  # type: ignore[assignment]
    gen, corpus = runs["gen"], runs["corpus"]
    assert gen.drafted > 0 and corpus.drafted > 0
    print(
        f"\nK={K}: generation-built {gen.accepted}/{gen.drafted}, corpus-built {corpus.accepted}/{corpus.drafted}"
    )
    assert gen.acceptance >= 0.95, f"generation-built: {gen.accepted}/{gen.drafted}"
    assert gen.acceptance > corpus.acceptance, (
        f"generation-built {gen.accepted}/{gen.drafted} vs corpus-built {corpus.accepted}/{corpus.drafted}"
    )
    for r in (gen, corpus):  # the head changes only the drafts, never the output
        assert r.outputs == [planted_continuation(p, n=MAX_TOKENS) for p in built["ids"]]  # type: ignore[attr-defined]


def test_sidecar_records_what_was_generated(built: dict[str, object]) -> None:
    root: Path = built["root"]  # type: ignore[assignment]
    side = json.loads((root / "gen.pt.json").read_text())
    g = side["corpus"]["generated"]
    n = len(_prompts())
    # greedy t+1 chains far from the EOS id: every prompt generates all its tokens
    assert (g["prompts"], g["tokens"], g["max_new_tokens"], g["temperature"]) == (
        n,
        n * BUILD_TOKENS,
        BUILD_TOKENS,
        0.0,
    )
    assert g["weight"] == 1.0 and g["coverage"] == 1.0 and side["corpus"]["files"] == []
    assert side["corpus"]["eval_generated"]["coverage"] == 1.0  # the same prompts held out
    # quantize-mtp copies it into mtpconv.json, where the model card reads it
    manifest = json.loads((root / "fp8_gen" / "mtpconv.json").read_text())
    assert manifest["draft_vocab"]["corpus"]["generated"]["coverage"] == 1.0
