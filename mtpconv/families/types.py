"""The type of an `mtpconv.families` row and the vocabularies it is written in (DESIGN §4).

`Family` says how to find one family's drafter and which of its linears can be FP8;
`DrafterAt` and `VllmNames` are the closed sets of where drafters live and how vLLM names them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class DrafterAt(str, Enum):
    """Where a family's checkpoint stores the drafter's tensors."""

    MTP = "mtp"  # ``mtp.*`` (under a VLM's text prefix): Qwen, Nemotron-H
    MODEL_MTP = "model_mtp"  # ``model.mtp.*``: MiMo-V2
    AFTER_TARGET = "after_target"  # ``model.layers.{num_hidden_layers + i}.*``: DeepSeek style
    MTP_LAYERS = "mtp_layers"  # ``model.mtp_layers.{i}.*``: MiMo
    # ``model.mtp_block.{i}.*`` + ``model.mtp_{emb_norm,hidden_norm,linear_proj}.{i}.*``: ERNIE-4.5
    MTP_PARTS = "mtp_parts"
    MTP_INDEXED = "mtp_indexed"  # ``mtp.{i}.*`` (no ``layers``): DeepSeek-V4

    def __str__(self) -> str:
        return self.value


class VllmNames(str, Enum):
    """How the name vLLM's quant config sees for a drafter module follows from its checkpoint name."""

    AS_STORED = "as_stored"  # the checkpoint name, a VLM prefix stripped
    MTP_LAYERS_AFTER_TARGET = "mtp_layers_after_target"  # MiMo: model.layers.{N + i}
    MTP_BLOCK = "mtp_block"  # model.layers.{k}.X -> model.layers.{k}.mtp_block.X (Step-3.5)
    # model.mtp.layers.{i}[.transformer_layer].X -> model.layers.{start + i}.X, and the step's
    # eh_proj -> plain ``eh_proj`` (LongCat-Flash builds it with prefix="eh_proj")
    MTP_AFTER_TARGET_BARE_EH = "mtp_after_target_bare_eh"
    # model.mtp_block.{i}.X -> model.layers.{N + i}.X, model.mtp_P.{i} -> model.layers.{N + i}.mtp_P
    MTP_PARTS_AFTER_TARGET = "mtp_parts_after_target"  # ERNIE-4.5's hf_to_vllm_mapper
    ATTENTION_AS_SELF_ATTN = "attention_as_self_attn"  # X.attention.Y -> X.self_attn.Y (Bailing-V3)
    # mtp.{i}.X -> model.layers.{N + i}.X, shared_experts.w2 -> shared_experts.down_proj (DeepSeek-V4:
    # its MTP layer builds the decoder block under the layer's own prefix, no mtp_block)
    MTP_INDEX_AFTER_TARGET = "mtp_index_after_target"

    def __str__(self) -> str:
        return self.value


# Why a drafter linear stays BF16: vLLM gives it no quant method, so FP8 weights would not load.
NN_LINEAR = "builds it as a plain nn.Linear (no FP8 possible)"
NO_QUANT = "builds it with quant_config=None (fused with a BF16 weight; no FP8 possible)"
ATTN_NO_QUANT = (
    "builds the drafter's attention with quant_config=None (BF16 in its checkpoints; no FP8 possible)"
)

# Modules of a layer-indexed drafter that belong to the MTP step, not to its decoder block.
STEP_MODULES = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head")

# Module leaves that name a linear in any checkpoint, before its family is known, beyond the
# ``*_proj`` names: the MTP step's ``fc`` (Qwen, EXAONE), ``fc_embedding`` / ``fc_hidden``
# (Qwen4-Exp), ``eh_proj`` (DeepSeek style), ``input_proj`` (MiMo) and Bailing-V3's attention
# output ``dense``. A row's own `Family.linear_leaves` add to them for that family only.
LINEAR_LEAVES = ("fc", "fc_embedding", "fc_hidden", "eh_proj", "input_proj", "dense")
# MoE router gates under an ``mlp``: the routed experts' ``gate`` and Qwen's
# ``shared_expert_gate``. vLLM builds them with no quant config; mtpconv leaves them BF16.
ROUTER_GATE_LEAVES = ("gate", "shared_expert_gate")


@dataclass(frozen=True)
class Family:
    """One MTP family: how to find its drafter and which of its linears can be FP8."""

    name: str
    vllm_mtp: tuple[str, ...]  # vLLM registry architectures this row covers
    source: str  # the vLLM file the row was read from
    model_types: frozenset[str] = frozenset()
    architectures: frozenset[str] = frozenset()  # target architectures (where model_type is ambiguous)
    layer_keys: tuple[str, ...] = ("num_nextn_predict_layers",)
    drafter_at: DrafterAt = DrafterAt.AFTER_TARGET
    vllm_names: VllmNames = VllmNames.AS_STORED
    plain: tuple[tuple[str, str], ...] = ()  # (module leaf, why vLLM gives it no quant method)
    experts: bool | None = None  # True: only MoE configs; None: either
    marker: str | None = None  # a tensor-name regex that identifies the family without its model_type
    config_marker: str | None = None  # a config key that identifies it likewise
    step_pattern_key: str | None = None  # config key whose length is the stored layers per MTP step
    start_key: str = "num_hidden_layers"  # config key: vLLM's first MTP layer index (x start_factor)
    start_factor: int = 1
    fixed_layers: int | None = None  # MTP layers vLLM builds when no layer key is set
    mla: bool = False  # multi-head latent attention (the KV-cache trap of DESIGN §5)
    ships_nvfp4: bool = False  # NVFP4 releases exist (the fixtures cover them)
    draft_vocab: bool = False  # the plugin's truncated draft head supports it
    fp8: tuple[str, ...] = ("attention and MLP linears",)  # what the variant stores FP8 (README)
    bf16: tuple[str, ...] = ()  # what stays BF16 besides the plain leaves, norms, routers, heads
    linear_leaves: tuple[str, ...] = ()  # module leaves vLLM builds as linears beyond the *_proj names
    # target modules (re.search) vLLM builds with no quant method: embeddings and heads under
    # the family's own names, quant_config=None layers; the audit does not ask them quantized
    target_plain: str | None = None
    _plain: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_plain", dict(self.plain))

    def vllm_quantizable(self, linears: Mapping[str, str]) -> dict[str, str]:
        """``linears`` (module -> storage) without the target modules vLLM never quantizes."""
        if self.target_plain is None:
            return dict(linears)
        pattern = re.compile(self.target_plain)
        return {m: s for m, s in linears.items() if not pattern.search(m)}

    def plain_reason(self, module: str) -> str | None:
        """Why vLLM builds this drafter module without a quant method, or None when it does not."""
        why = self._plain.get(module.rsplit(".", 1)[-1])
        return None if why is None else f"vLLM's {self.name} MTP class {why}"

    def matches_type(self, types: set[str], architectures: set[str], has_experts: bool) -> bool:
        """Whether the config's model types or architectures name this family."""
        if not (types & self.model_types or architectures & self.architectures):
            return False
        return self.experts is None or self.experts == has_experts

    def matches_marker(self, tcfg: Mapping[str, Any], names: list[str]) -> bool:
        """Whether the config or the tensor names identify this family without its model_type."""
        if self.config_marker is not None and self.config_marker in tcfg:
            return True
        if self.marker is None:
            return False
        pattern = re.compile(self.marker)
        return any(pattern.search(n) for n in names)
