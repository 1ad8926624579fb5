"""What each row of ``mtpconv eval`` serves, and the job one row's process is given.

A row is a model (the source or the variant), with or without MTP speculation, with
or without mtpconv's vLLM plugin. Every row runs in a fresh process, so vLLM's state
(compiled graphs, the plugin registry, environment switches) never leaks between
them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

PLUGIN_NAME = "mtpconv"  # the entry point's name; VLLM_PLUGINS is an allowlist of these


class Row(str, Enum):
    """One served configuration, in the order the report lists them."""

    NO_SPEC = "no-spec"  # the source, no speculation: the reference output
    SOURCE_MTP = "source-mtp"  # the source's own (BF16) drafter, stock vLLM
    VARIANT_STOCK = "variant-stock"  # the variant, stock vLLM (plugin switched off)
    VARIANT_PLUGIN = "variant-plugin"  # the variant with mtpconv's plugin

    @property
    def serves_variant(self) -> bool:
        return self in (Row.VARIANT_STOCK, Row.VARIANT_PLUGIN)

    @property
    def speculative(self) -> bool:
        return self is not Row.NO_SPEC

    @property
    def plugin(self) -> bool:
        return self is Row.VARIANT_PLUGIN

    @property
    def description(self) -> str:
        return {
            Row.NO_SPEC: "source, no speculation",
            Row.SOURCE_MTP: "source, MTP with its own drafter (stock vLLM)",
            Row.VARIANT_STOCK: "variant, MTP, stock vLLM (plugin off)",
            Row.VARIANT_PLUGIN: "variant, MTP, mtpconv plugin",
        }[self]


ALL_ROWS: tuple[Row, ...] = tuple(Row)

# Used when no --prompts file is given: short, varied, plain text (no chat template needed).
BUILTIN_PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins",
    "def fibonacci(n):",
    "Explain why the sky is blue in three sentences.",
    "Translate to French: The weather is nice today, so we will walk to the station.",
    "A list of prime numbers: 2, 3, 5, 7,",
    "Write a short poem about a lighthouse keeper.",
    "SELECT name, COUNT(*) FROM orders",
    "The three laws of thermodynamics state that",
)


@dataclass(frozen=True)
class RowJob:
    """Everything one row's process needs; written as JSON for :mod:`mtpconv.evaluation.worker`."""

    row: Row
    model: str
    prompts: list[dict[str, Any]]  # {"prompt": str} or {"messages": [...]}
    batches: list[int]
    max_tokens: int
    num_speculative_tokens: int
    engine_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["row"] = self.row.value
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RowJob:
        return cls(**{**doc, "row": Row(doc["row"])})
