"""The ``inspect`` report: what a checkpoint is and what its drafter costs.

Reads configs and safetensors headers only, never tensor data (a Hub repo id
is inspected remotely through range requests).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.source import open_checkpoint
from mtpconv.draft_cost import DraftCost, draft_cost
from mtpconv.errors import UnknownFamilyError
from mtpconv.families import vllm_quantizable
from mtpconv.findings import Finding, Severity
from mtpconv.gc_pause import paused_gc
from mtpconv.layouts import MtpLayout, Stored, classify_weight, detect_layout, module_of
from mtpconv.low_bit_drafter import (
    CODE_LOW_BIT_DRAFTER,
    CODE_UNREADABLE_DRAFTER,
    low_bit_drafter,
    unreadable_drafter,
)
from mtpconv.manifest import DRAFT_VOCAB_IDS_NAME, Manifest, read_manifest
from mtpconv.quantconfig.audit import audit_quant_configs
from mtpconv.quantconfig.compressed_tensors import with_declared_layouts
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import QuantConfigs, load_quant_configs
from mtpconv.quantconfig.standard import stock_vllm_since
from mtpconv.quantconfig.stock_view import StockView, source_view, variant_view
from mtpconv.weight_names import CheckpointModules


@dataclass(frozen=True)
class TensorRow:
    name: str
    dtype: str
    shape: tuple[int, ...]
    format: str  # "plain" | "nvfp4" | "fp8" | "scale" | "other"
    role: str  # "linear" | "norm" | "embedding" | "head" | "router" | "scale" | "other"
    declared: str | None  # what the quant config declares for this module

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "format": self.format,
            "role": self.role,
            "declared": self.declared,
        }


@dataclass
class InspectReport:
    """Everything ``mtpconv inspect`` knows about a checkpoint."""

    source: str
    family: str
    model_type: str
    quant_method: str
    quant_algo: str | None
    exclude_modules: list[str]
    kv_cache_algo: str | None
    mtp_layers_declared: int | None
    mtp_layers_found: int
    drafter: list[TensorRow]
    findings: list[Finding]
    cost: DraftCost | None
    shards: int
    total_bytes: int
    draft_vocab: dict[str, Any] | None
    variant: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    layout_error: str | None = None  # no family row matched its drafter (the CLI exits 1 after the report)
    stock_vllm: StockView | None = None  # how stock vLLM reads (or would read) the drafter

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "family": self.family,
            "model_type": self.model_type,
            "quant": {
                "method": self.quant_method,
                "algo": self.quant_algo,
                "exclude_modules": self.exclude_modules,
                "kv_cache_algo": self.kv_cache_algo,
            },
            "mtp_layers": {"declared": self.mtp_layers_declared, "found": self.mtp_layers_found},
            "drafter_tensors": [r.to_dict() for r in self.drafter],
            "findings": [f.to_dict() for f in self.findings],
            "draft_bytes_per_step": None if self.cost is None else self.cost.to_dict(),
            "shards": self.shards,
            "total_bytes": self.total_bytes,
            "draft_vocab": self.draft_vocab,
            "variant": self.variant,
            "stock_vllm": None if self.stock_vllm is None else self.stock_vllm.to_dict(),
        }


def _role(name: str, fmt: str, linear_weights: Collection[str]) -> str:
    if fmt == "scale":
        return "scale"
    if name in linear_weights:
        return "linear"
    last = module_of(name).rsplit(".", 1)[-1]
    if "norm" in last:
        return "norm"
    if last == "embed_tokens":
        return "embedding"
    if last in ("head", "lm_head", "draft_lm_head"):
        return "head"
    if last in ("gate", "shared_expert_gate"):
        return "router"
    return "other"


def _rows(layout: MtpLayout, files: CheckpointFiles, configs: QuantConfigs) -> list[TensorRow]:
    decl = declared_quant(configs)
    linear_weights = {lin.weight for lin in layout.linears}
    rows = []
    for name in layout.drafter_tensors:
        info = files.tensors[name]
        if name.endswith(("_scale", "_scale_2")):
            fmt = "scale"
        else:
            fmt, _ = classify_weight(name, files.tensors)
        role = _role(name, fmt, linear_weights)
        declared = declared_algorithm(decl, module_of(name)) if role in ("linear", "head") else None
        rows.append(TensorRow(name, info.dtype, info.shape, fmt, role, declared))
    return rows


def _layout_findings(layout: MtpLayout) -> list[Finding]:
    out = []
    declared, found = layout.declared_layers, layout.found_layers
    if declared and not layout.has_drafter:
        out.append(
            Finding(
                Severity.ERROR,
                "mtp-declared-missing",
                "mtp",
                f"config declares {declared} MTP layer(s) but the checkpoint holds no "
                "MTP tensors; vLLM's MTP speculative decoding will fail to load them. "
                "Re-export the checkpoint with its MTP weights.",
            )
        )
    elif layout.has_drafter and not declared:
        out.append(
            Finding(
                Severity.WARNING,
                "mtp-undeclared",
                "mtp",
                f"the checkpoint holds {found} MTP layer(s) but config.json declares "
                "none (mtp_num_hidden_layers / num_nextn_predict_layers); vLLM will "
                "not build the drafter.",
            )
        )
    elif layout.has_drafter and declared != found:
        out.append(
            Finding(
                Severity.WARNING,
                "mtp-layer-count",
                "mtp",
                f"config declares {declared} MTP layer(s) but {found} are stored.",
            )
        )
    if not layout.has_drafter and not declared:
        out.append(
            Finding(
                Severity.INFO,
                "no-mtp",
                "mtp",
                "this checkpoint has no MTP drafter; there is nothing to convert.",
            )
        )
    return out


def _drafter_declared_finding(layout: MtpLayout, configs: QuantConfigs) -> Finding | None:
    """The source declares its drafter's linears quantized like the target (Step-3.5, DeepSeek-V4,
    Nemotron-H NVFP4 releases): say so, since quantize-mtp re-declares them FP8."""
    decl = declared_quant(configs)
    declared = {lin.module: declared_algorithm(decl, lin.module) for lin in layout.linears}
    quantized = {m: a for m, a in declared.items() if a is not None}
    if not quantized:
        return None
    algos = ", ".join(sorted(set(quantized.values())))
    if all(lin.stored is Stored.FP8 for lin in layout.linears):  # e.g. DeepSeek-V4 releases
        return Finding(
            Severity.INFO,
            "drafter-stored-fp8",
            "mtp",
            f"all {len(layout.linears)} drafter linears are stored FP8 already and declared "
            f"({algos}) in the source's quant config: vLLM serves this drafter as it is; "
            "quantize-mtp has nothing to convert.",
        )
    return Finding(
        Severity.INFO,
        "drafter-declared-quantized",
        "mtp",
        f"{len(quantized)} of {len(layout.linears)} drafter linears are declared with the target's "
        f"quantization ({algos}) in the source's quant config; quantize-mtp re-declares them FP8.",
    )


def _variant_finding(manifest: Manifest) -> Finding:
    """How stock vLLM and the plugin read a variant's FP8 drafter (from its manifest)."""
    fp8 = len(manifest.drafter.fp8_linears)
    if manifest.draft_vocab is not None and manifest.draft_vocab.head_dtype == "fp8":
        fp8 += 1
    if manifest.drafter.declaration == "standard":
        algos = sorted(set(manifest.drafter.declared_algorithms.values()))
        how = (
            "declared FP8 in the source's quant dialect"
            + (f" ({', '.join(algos)})" if algos else "")
            + ": stock vLLM loads them with its own FP8 methods; the mtpconv plugin adds "
            "its kernels and the truncated draft head"
        )
        since = stock_vllm_since(algos)
        if since is not None:
            how += (
                f" (stock vLLM older than {since} refuses them at load: its mixed config builds "
                "no such layer)"
            )
    else:
        how = (
            "excluded from the target's quant config: only the mtpconv vLLM plugin builds "
            "them FP8 (stock vLLM refuses them loudly at load, never reads them wrong)"
        )
    kept = manifest.drafter.kept_bf16
    tail = f"; kept BF16: {', '.join(sorted(kept))} ({'; '.join(sorted(set(kept.values())))})" if kept else ""
    return Finding(
        Severity.INFO,
        "mtpconv-fp8-drafter",
        "mtp",
        f"{fp8} drafter tensors are FP8 as recorded in mtpconv.json, {how}{tail}.",
    )


def _variant_info(manifest: Manifest | None) -> dict[str, Any] | None:
    if manifest is None:
        return None
    return {
        "tool": manifest.tool,
        "source": {k: v for k, v in manifest.source.items() if k != "files"},
        "fp8_linears": len(manifest.drafter.fp8_linears),
        "draft_window": manifest.draft_window,  # None: full draft attention
    }


def _draft_vocab_info(directory: Path, manifest: Manifest | None) -> dict[str, Any] | None:
    if manifest is not None and manifest.draft_vocab is not None:
        dv = manifest.draft_vocab
        return {"file": dv.file, "size": dv.size, "head_dtype": dv.head_dtype, "coverage": dv.coverage}
    if (directory / DRAFT_VOCAB_IDS_NAME).is_file():
        return {"file": DRAFT_VOCAB_IDS_NAME, "size": None, "head_dtype": None, "coverage": None}
    return None


def inspect_checkpoint(
    spec: str, *, revision: str | None = None, draft_vocab_size: int = 32768
) -> InspectReport:
    """Build the inspect report for a local directory or a Hub repo id (headers only)."""
    with paused_gc():  # millions of acyclic records for a large checkpoint (mtpconv.gc_pause)
        return _inspect(spec, revision, draft_vocab_size)


def _inspect(spec: str, revision: str | None, draft_vocab_size: int) -> InspectReport:
    source, files = open_checkpoint(spec, revision, headers_only=True)
    configs = load_quant_configs(source.directory)
    layout_error: str | None = None
    try:
        layout = detect_layout(configs.config, files.tensors)
    except UnknownFamilyError as exc:
        # Report everything else inspect knows; the error is its one finding about the drafter.
        layout, layout_error = detect_layout(configs.config, files.tensors, strict=False), str(exc)
    decl = declared_quant(configs)
    drafter_modules = {module_of(n) for n in layout.drafter_tensors}
    findings = _layout_findings(layout) if layout_error is None else []
    if layout_error is not None:
        findings.append(Finding(Severity.ERROR, "mtp-unknown-family", "mtp", layout_error))
    manifest = read_manifest(source.directory)
    declared_finding = _drafter_declared_finding(layout, configs) if manifest is None else None
    if declared_finding is not None:
        findings.append(declared_finding)
    # sized with the scales quantize-mtp would store for this dialect
    declared = replace(layout, linears=with_declared_layouts(configs, layout.linears))
    low_bit = low_bit_drafter(declared, files.tensors) if manifest is None else None
    unreadable = unreadable_drafter(declared) if manifest is None else None
    if low_bit is not None:
        refusal = "quantize-mtp refuses it unless FP8 is asked for explicitly"
        findings.append(
            Finding(
                Severity.WARNING,
                CODE_LOW_BIT_DRAFTER,
                "mtp",
                f"{low_bit.describe()}: {refusal if unreadable is None else unreadable}.",
            )
        )
    elif unreadable is not None:
        findings.append(Finding(Severity.WARNING, CODE_UNREADABLE_DRAFTER, "mtp", f"{unreadable}."))
    known = CheckpointModules.of(files.tensors)
    findings += audit_quant_configs(
        configs,
        vllm_quantizable(known.linears, layout.family),
        drafter_modules,
        all_modules=known.modules,
        plugin_drafter=manifest is not None,
    )
    if manifest is not None:
        findings.append(_variant_finding(manifest))
    cost = draft_cost(layout, files.tensors, draft_vocab_size) if layout.has_drafter else None
    stock = None
    if layout.has_drafter and layout.linears and manifest is not None:
        d = manifest.drafter
        dv = manifest.draft_vocab
        stock = variant_view(
            configs,
            layout,
            fp8_linears=d.fp8_linears,
            kept_bf16=d.kept_bf16,
            style=d.declaration,
            head_file=None if dv is None else dv.head_file,  # None: pre-0.2, head in the weights
        )
    elif layout.has_drafter and layout.linears:
        stock = source_view(configs, files.tensors, layout, known)
    return InspectReport(
        source=spec,
        family=layout.family,
        model_type=layout.model_type,
        quant_method=decl.method,
        quant_algo=decl.algo,
        exclude_modules=list(decl.exclude),
        kv_cache_algo=decl.kv_cache_algo,
        mtp_layers_declared=layout.declared_layers,
        mtp_layers_found=layout.found_layers,
        drafter=_rows(layout, files, configs),
        findings=findings,
        cost=cost,
        shards=len(files.shards),
        total_bytes=files.total_tensor_bytes,
        draft_vocab=_draft_vocab_info(source.directory, manifest),
        variant=_variant_info(manifest),
        layout_error=layout_error,
        stock_vllm=stock,
    )
