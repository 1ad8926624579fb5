"""The rows compared: output against no speculation, acceptance, decode speed, kernels.

Acceptance is given twice. vLLM's counters score every draft it verifies, including
drafts past a request's end (``max_tokens`` reached mid-step): ``counter_*``. The
served figures count only the tokens the requests received: each verify step serves
its accepted drafts plus one token, and the first token of a request comes from the
prefill, so ``served mean acceptance length = (generated - requests) / drafts``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtpconv.evaluation.rows import Row
from mtpconv.evaluation.runner import RowOutcome
from mtpconv.quantconfig.standard import stock_vllm_since
from mtpconv.versions import release


@dataclass
class BatchFigures:
    """One row at one batch size."""

    batch: int
    requests: int
    generated: int
    identical: bool | None  # None where no-spec was not run or this row is no-spec
    first_difference: str | None  # "request i, token j" where not identical
    drafts: int
    draft_tokens: int
    accepted: int
    decode_tokens_per_second: float | None
    output_tokens_per_second: float
    speedup_vs_source_mtp: float | None = None
    speedup_vs_no_spec: float | None = None

    @property
    def counter_acceptance(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def counter_mean_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def served_mean_length(self) -> float | None:
        return (self.generated - self.requests) / self.drafts if self.drafts else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "requests": self.requests,
            "generated": self.generated,
            "identical_to_no_spec": self.identical,
            "first_difference": self.first_difference,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "counter_acceptance": self.counter_acceptance,
            "counter_mean_acceptance_length": self.counter_mean_length,
            "served_mean_acceptance_length": self.served_mean_length,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "output_tokens_per_second": self.output_tokens_per_second,
            "speedup_vs_source_mtp": self.speedup_vs_source_mtp,
            "speedup_vs_no_spec": self.speedup_vs_no_spec,
        }


@dataclass
class RowReport:
    row: Row
    error: str | None
    log: str
    seconds: float
    model_runner: str | None = None
    load_seconds: float | None = None
    drafter_class: str | None = None
    drafter_modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    probe_error: str | None = None
    batches: list[BatchFigures] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "row": self.row.value,
            "description": self.row.description,
            "error": self.error,
            "log": self.log,
            "seconds": self.seconds,
            "model_runner": self.model_runner,
            "load_seconds": self.load_seconds,
            "drafter_class": self.drafter_class,
            "drafter_modules": self.drafter_modules,
            "probe_error": self.probe_error,
            "batches": [b.to_dict() for b in self.batches],
        }


@dataclass
class EvalReport:
    source: str
    variant: str
    num_speculative_tokens: int
    max_tokens: int
    prompts: str  # the prompts file, or "built-in"
    vllm_version: str | None
    device: str | None
    command: str
    rows: list[RowReport]

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "variant": self.variant,
            "num_speculative_tokens": self.num_speculative_tokens,
            "max_tokens": self.max_tokens,
            "prompts": self.prompts,
            "vllm_version": self.vllm_version,
            "device": self.device,
            "command": self.command,
            "rows": [r.to_dict() for r in self.rows],
        }


def _first_difference(got: list[list[int]], want: list[list[int]]) -> str | None:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"request {i}, token {j}"
    return None if len(got) == len(want) else "request count"


def _figures(doc: dict[str, Any], reference: dict[int, list[list[int]]] | None) -> BatchFigures:
    outputs = doc["outputs"]
    want = reference.get(doc["batch"]) if reference is not None else None
    difference = _first_difference(outputs, want) if want is not None else None
    decode = doc["decode_seconds"]
    decoded = doc["generated"] - doc["requests"]
    return BatchFigures(
        batch=doc["batch"],
        requests=doc["requests"],
        generated=doc["generated"],
        identical=None if want is None else difference is None,
        first_difference=difference,
        drafts=doc["drafts"],
        draft_tokens=doc["draft_tokens"],
        accepted=doc["accepted"],
        decode_tokens_per_second=decoded / decode if decode else None,
        output_tokens_per_second=doc["generated"] / doc["wall_seconds"] if doc["wall_seconds"] else 0.0,
    )


def _speed(b: BatchFigures) -> float:
    return b.decode_tokens_per_second or b.output_tokens_per_second


def build_report(
    outcomes: Sequence[RowOutcome],
    *,
    source: str,
    variant: str,
    num_speculative_tokens: int,
    max_tokens: int,
    prompts: str,
    command: str,
) -> EvalReport:
    by_row = {o.row: o for o in outcomes}
    no_spec = by_row.get(Row.NO_SPEC)
    reference = (
        {b["batch"]: b["outputs"] for b in no_spec.result["batches"]}
        if no_spec is not None and no_spec.result is not None
        else None
    )
    rows: list[RowReport] = []
    first_result: dict[str, Any] | None = None
    for o in outcomes:
        report = RowReport(o.row, o.error, str(o.log), o.seconds)
        if o.result is not None:
            first_result = first_result or o.result
            drafter = o.result.get("drafter") or {}
            report.model_runner = o.result.get("model_runner")
            report.load_seconds = o.result.get("load_seconds")
            report.drafter_class = drafter.get("class")
            report.drafter_modules = drafter.get("modules", {})
            report.probe_error = drafter.get("error")
            ref = None if o.row is Row.NO_SPEC else reference
            report.batches = [_figures(b, ref) for b in o.result["batches"]]
        rows.append(report)
    _add_speedups(rows)
    return EvalReport(
        source=source,
        variant=variant,
        num_speculative_tokens=num_speculative_tokens,
        max_tokens=max_tokens,
        prompts=prompts,
        vllm_version=first_result.get("vllm_version") if first_result else None,
        device=first_result.get("device") if first_result else None,
        command=command,
        rows=rows,
    )


def _add_speedups(rows: list[RowReport]) -> None:
    def speeds(row: Row) -> dict[int, float]:
        found = next((r for r in rows if r.row is row), None)
        return {b.batch: _speed(b) for b in found.batches} if found is not None else {}

    source_mtp, no_spec = speeds(Row.SOURCE_MTP), speeds(Row.NO_SPEC)
    for r in rows:
        for b in r.batches:
            if r.row is not Row.SOURCE_MTP and source_mtp.get(b.batch):
                b.speedup_vs_source_mtp = _speed(b) / source_mtp[b.batch]
            if r.row is not Row.NO_SPEC and no_spec.get(b.batch):
                b.speedup_vs_no_spec = _speed(b) / no_spec[b.batch]


def explain_stock_refusal(report: EvalReport, declared: Collection[str]) -> None:
    """Say why the stock row failed where the vLLM that served the other rows predates the first
    release that builds the variant's declared FP8 drafter (vLLM's own error names a missing
    ``weight_scale`` parameter, not the cause)."""
    since = stock_vllm_since(declared)
    stock = next((r for r in report.rows if r.row is Row.VARIANT_STOCK), None)
    if since is None or stock is None or stock.error is None or report.vllm_version is None:
        return
    ran, first = release(report.vllm_version), release(since)
    if ran is None or first is None or ran >= first:
        return
    algos = ", ".join(sorted(set(declared)))
    stock.error += (
        f" (expected: vLLM {report.vllm_version} predates {since}, the first release whose ModelOpt "
        f"MIXED_PRECISION config builds this variant's FP8 drafter ({algos}); serve it with a newer "
        "vLLM or with the mtpconv plugin)"
    )
