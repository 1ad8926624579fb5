"""How stock vLLM reads a drafter, module by module (what ``inspect`` shows).

For a source: what the declaration `standard.declare_drafter` would write (the same code
quantize-mtp runs); for a variant: what its own configs declare. Either way the declared
algorithm comes from `declarations.declared_algorithm` on the name vLLM's quant config
sees (`families.vllm_drafter_key`), and what vLLM builds for it from its dispatch sets
(`standard.VLLM_MIXED_LINEAR_ALGOS` / `VLLM_MIXED_MOE_ALGOS`). No rule is restated here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.errors import MtpconvError
from mtpconv.families import mtp_start_layer, vllm_drafter_key
from mtpconv.layouts import Linear, MtpLayout, text_config
from mtpconv.names import fold_expert_index
from mtpconv.quantconfig import compressed_tensors as ct
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.declarations import DeclaredQuant, declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import QuantConfigs
from mtpconv.quantconfig.standard import (
    VLLM_MIXED_LINEAR_ALGOS,
    VLLM_MIXED_MOE_ALGOS,
    DeclarationStyle,
    declare_drafter,
)
from mtpconv.weight_names import CheckpointModules

BF16 = "BF16"
REFUSED = "refuses to load"

_WHY = {
    methods.FP8_PER_CHANNEL_PER_TOKEN: "per-channel weight scales, dynamic per-token activations "
    "(ModelOptLinearMethod; no calibration needed)",
    methods.FP8_PB_WO: "128x128 weight blocks, dynamic activations (vLLM's block-FP8 method; its mixed "
    "config has no per-channel FP8 experts)",
    methods.FP8_BLOCK_SCALES: "128x128 weight blocks, dynamic activations (vLLM's block-FP8 MoE method)",
    methods.FP8: "static per-tensor FP8 (needs the stored input_scale)",
}


class ModuleKind(str, Enum):
    """What vLLM's MTP class builds for a drafter linear."""

    DENSE = "dense linear"
    EXPERTS = "routed experts"
    PLAIN = "plain nn.Linear"

    def __str__(self) -> str:
        return self.value


class ViewOf(str, Enum):
    """Whose configs the view reads."""

    SOURCE = "source"  # what quantize-mtp would declare
    VARIANT = "variant"  # what the variant's configs declare

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StockRow:
    """One drafter module (routed experts: one row per projection) and what stock vLLM gets."""

    module: str
    kind: ModuleKind
    gets: str  # an FP8 algorithm, BF16, or REFUSED
    why: str
    count: int = 1  # checkpoint modules behind the row (experts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "kind": self.kind.value,
            "gets": self.gets,
            "why": self.why,
            "modules": self.count,
        }


@dataclass
class StockView:
    """How stock vLLM reads every drafter linear of a source or a variant."""

    of: ViewOf
    style: str  # DeclarationStyle value, "" when no declaration could be made
    reason: str
    rows: list[StockRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "of": self.of.value,
            "declaration": self.style or None,
            "reason": self.reason,
            "modules": [r.to_dict() for r in self.rows],
        }


def _kind(module: str, linear: Linear | None, kept: Mapping[str, str]) -> ModuleKind:
    if module in kept:
        return ModuleKind.PLAIN
    if (linear is not None and linear.is_expert) or ".experts." in f".{module}.":
        return ModuleKind.EXPERTS
    return ModuleKind.DENSE


def _reading(decl: DeclaredQuant, kind: ModuleKind, algo: str | None, fp8: bool) -> tuple[str, str]:
    """(what stock vLLM gets, why) for one drafter module declared ``algo``."""
    if algo is None:
        if fp8:
            return REFUSED, (
                "declared unquantized but stored FP8 with a scale: stock vLLM stops at load "
                "(no parameter for the scale); the mtpconv plugin serves it"
            )
        return BF16, "declared unquantized"
    if decl.method == methods.COMPRESSED_TENSORS:
        return algo, f"compressed-tensors group {ct.DRAFTER_GROUP!r}: FP8 per channel, dynamic per token"
    allowed = VLLM_MIXED_MOE_ALGOS if kind is ModuleKind.EXPERTS else VLLM_MIXED_LINEAR_ALGOS
    if decl.algo == methods.MIXED_PRECISION and algo not in allowed:
        return BF16, f"vLLM's MIXED_PRECISION config builds no {kind} method for {algo}"
    return algo, _WHY.get(algo, f"declared {algo}")


def view_of_configs(
    configs: QuantConfigs,
    layout: MtpLayout,
    *,
    of: ViewOf,
    fp8_modules: Collection[str],
    kept_bf16: Mapping[str, str],
    style: str,
    reason: str,
) -> StockView:
    """Read ``configs`` (what vLLM reads) for every drafter linear of ``layout``."""
    decl = declared_quant(configs)
    num_layers = mtp_start_layer(layout.family, text_config(configs.config))
    by_module = {lin.module: lin for lin in layout.linears}
    rows: dict[tuple[str, ModuleKind, str, str], int] = {}
    for module in sorted({*fp8_modules, *kept_bf16, *by_module}):
        kind = _kind(module, by_module.get(module), kept_bf16)
        if kind is ModuleKind.PLAIN:
            gets, why = BF16, kept_bf16[module]
        else:
            key = vllm_drafter_key(module, layout.family, num_layers)
            gets, why = _reading(decl, kind, declared_algorithm(decl, key), module in fp8_modules)
        shown = fold_expert_index(module) if kind is ModuleKind.EXPERTS else module
        rows[(shown, kind, gets, why)] = rows.get((shown, kind, gets, why), 0) + 1
    view = StockView(of, style, reason)
    view.rows = [StockRow(m, k, g, w, n) for (m, k, g, w), n in rows.items()]
    return view


def source_view(
    configs: QuantConfigs,
    tensors: Mapping[str, TensorInfo],
    layout: MtpLayout,
    known: CheckpointModules | None = None,
) -> StockView:
    """What stock vLLM would get from the variant quantize-mtp writes for this source."""
    try:
        linears = ct.with_declared_layouts(configs, layout.linears)
        rewritten, declaration = declare_drafter(configs, tensors, layout, fp8_linears=linears, known=known)
    except MtpconvError as exc:
        return StockView(ViewOf.SOURCE, "", f"quantize-mtp would refuse: {exc}")
    return view_of_configs(
        rewritten.as_configs(),
        layout,
        of=ViewOf.SOURCE,
        fp8_modules={lin.module for lin in linears},
        kept_bf16=layout.kept_bf16,
        style=declaration.style.value,
        reason=declaration.reason,
    )


def variant_view(
    configs: QuantConfigs,
    layout: MtpLayout,
    *,
    fp8_linears: Collection[str],
    kept_bf16: Mapping[str, str],
    style: str,
    head_file: str | None = None,
) -> StockView:
    """What stock vLLM gets from a variant's own configs (its manifest names the FP8 linears;
    ``head_file``: where its truncated draft head is, if it has one)."""
    why = (
        "declared FP8 in the source's quant dialect"
        if style == DeclarationStyle.STANDARD.value
        else "excluded from the target's quant config: only the mtpconv plugin builds the drafter FP8, "
        "stock vLLM refuses it loudly"
    )
    if head_file is not None:
        why += (
            f"; the truncated draft head ({head_file}) is outside the index: stock vLLM drafts with "
            "the full target head, the plugin loads it"
        )
    return view_of_configs(
        configs,
        layout,
        of=ViewOf.VARIANT,
        fp8_modules=fp8_linears,
        kept_bf16={**layout.kept_bf16, **kept_bf16},
        style=style,
        reason=why,
    )
