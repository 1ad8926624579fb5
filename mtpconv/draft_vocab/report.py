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
    plot: str | None = None
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    ids: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, without the ids themselves."""
        doc = asdict(self)
        doc.pop("ids")
        return doc

    def sidecar_dict(self) -> dict[str, Any]:
        """The JSON sidecar: this report without paths of this run and timing."""
        doc = self.to_dict()
        for key in ("output", "sidecar", "plot", "seconds", "tokens_per_second"):
            doc.pop(key)
        return {
            "format_version": SIDECAR_FORMAT_VERSION,
            "tool": {"name": "mtpconv", "version": __version__},
            "ids_file": Path(self.output).name,
            **doc,
        }
