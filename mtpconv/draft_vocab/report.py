"""What build-draft-vocab selected and wrote, and its JSON sidecar (``IDS.pt.json``).

The sidecar is the report without this run's paths and timing: it says what was
counted (corpus and tokenizer by sha256) and how well the ids cover it, so
quantize-mtp can copy that into ``mtpconv.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mtpconv import __version__
from mtpconv.draft_vocab.counting import CorpusStats
from mtpconv.draft_vocab.selection import CoveragePoint

SIDECAR_FORMAT_VERSION = 1


@dataclass
class EvalCoverage:
    """Coverage of a held-out corpus by the ids chosen on the training corpus."""

    corpus: CorpusStats
    coverage: float
    coverage_table: list[CoveragePoint]


@dataclass
class GeneratedText:
    """What the target generated for a prompts file and how well the ids cover it."""

    prompts_file: str
    prompts_sha256: str
    prompts: int
    tokens: int
    distinct_ids: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    coverage: float
    coverage_table: list[CoveragePoint]
    # Share of the ranking's counts that came from this text (1.0 alone; None: held out).
    weight: float | None = None


@dataclass
class DraftVocabReport:
    """What ``build_draft_vocab`` selected and wrote; ``to_dict()`` for ``--json``."""

    output: str
    sidecar: str
    size: int
    vocab_size: int
    coverage: float
    coverage_table: list[CoveragePoint]
    corpus: CorpusStats
    tokenizer: dict[str, str]
    special_ids: list[int]
    eos_ids: list[int]
    source: dict[str, str | None]
    ids_sha256: str
    balance_tp: int | None = None
    eval: EvalCoverage | None = None
    generated: GeneratedText | None = None
    eval_generated: GeneratedText | None = None
    plot: str | None = None
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    generation_seconds: float = 0.0
    generation_tokens_per_second: float = 0.0
    ids: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, without the ids themselves."""
        doc = asdict(self)
        doc.pop("ids")
        return doc

    def sidecar_dict(self) -> dict[str, Any]:
        """The JSON sidecar: this report without paths of this run and timing.

        Generated text is recorded under ``corpus`` (``generated``, ``eval_generated``):
        it is part of what was counted, and quantize-mtp copies ``corpus`` into
        ``mtpconv.json``, where the model card finds the coverage of generated text.
        """
        doc = self.to_dict()
        for key in (
            "output",
            "sidecar",
            "plot",
            "seconds",
            "tokens_per_second",
            "generation_seconds",
            "generation_tokens_per_second",
        ):
            doc.pop(key)
        for key in ("generated", "eval_generated"):
            value = doc.pop(key)
            if value is not None:
                doc["corpus"][key] = value
        return {
            "format_version": SIDECAR_FORMAT_VERSION,
            "tool": {"name": "mtpconv", "version": __version__},
            "ids_file": Path(self.output).name,
            **doc,
        }
