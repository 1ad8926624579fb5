"""Tensor names and headers: which tensors are linear weights and how each is stored.

Header-only rules shared by the layout detection, the audit and inspect: the module a
tensor belongs to, whether a weight is a linear vLLM may quantize, and its storage
(NVFP4 in either dialect, FP8, plain float). A 397B-class checkpoint has ~400k
tensors, so these run per tensor and stay plain string operations.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mtpconv.checkpoint.safetensors_io import FLOAT_DTYPES, TensorInfo

# Last name component of 2-D modules vLLM never quantizes (lookups, routers; "embeddings": Nemotron-H's
# embed_tokens), and of those we keep out of the FP8 linears too (heads: the draft head is separate).
_NEVER_QUANTIZED = frozenset(
    {"embed_tokens", "embeddings", "gate", "shared_expert_gate", "e_score_correction_bias"}
)
NOT_LINEAR = _NEVER_QUANTIZED | {"head", "lm_head", "draft_lm_head"}
# ``kv_a_proj_with_mqa``: MLA, fused with ``q_a_proj`` in vLLM (both FP8 or neither)
# ``dense``: Bailing-V3's attention output projection
_LINEAR_NAME = re.compile(r"(_proj|_proj_with_mqa|^fc|^fc_embedding|^fc_hidden|^eh_proj|^input_proj|^dense)$")
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_EXPERT_W = re.compile(r"\.experts\.\d+\.w[123]$")  # per-expert w1/w2/w3 (Kimi-K3)
# compressed-tensors names: the packed NVFP4 weight and its float32 global scales.
CT_PACKED = ".weight_packed"
_CT_SUFFIXES = (CT_PACKED, ".weight_global_scale", ".input_global_scale")


_PARAM_LEAVES = frozenset(
    s.lstrip(".")
    for s in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale", ".bias", *_CT_SUFFIXES)
)


def module_of(tensor: str) -> str:
    """``a.b.weight`` -> ``a.b``; fused-expert tensors have no suffix to strip."""
    module, dot, leaf = tensor.rpartition(".")
    return module if dot and leaf in _PARAM_LEAVES else tensor


def classify_weight(name: str, tensors: Mapping[str, TensorInfo]) -> tuple[str, tuple[str, ...]]:
    """How a weight tensor is stored: ("nvfp4"|"fp8"|"plain"|"other", its scale tensors).

    NVFP4 covers both storages (ModelOpt ``weight``, compressed-tensors ``weight_packed``);
    a drafter `Linear.stored` tells them apart.
    """
    info = tensors[name]
    module = module_of(name)
    if info.dtype == "U8" and name.endswith(CT_PACKED) and f"{module}.weight_scale" in tensors:
        aux = tuple(
            f"{module}.{s}"
            for s in ("weight_scale", "weight_global_scale", "input_global_scale")
            if f"{module}.{s}" in tensors
        )
        return "nvfp4", aux
    if info.dtype == "U8" and f"{module}.weight_scale" in tensors:
        aux = tuple(
            f"{module}.{s}"
            for s in ("weight_scale", "weight_scale_2", "input_scale")
            if f"{module}.{s}" in tensors
        )
        return "nvfp4", aux
    if info.dtype in ("F8_E4M3", "F8_E5M2"):
        aux = tuple(
            n for n in (f"{module}.weight_scale", f"{module}.input_scale", f"{name}_scale") if n in tensors
        )
        return "fp8", aux
    if info.dtype in FLOAT_DTYPES:
        return "plain", ()
    return "other", ()


def is_linear_weight(name: str, info: TensorInfo, extra: Collection[str] = ()) -> bool:
    """Whether a tensor is the weight of a drafter linear (its name and its rank)."""
    if _FUSED_EXPERTS.search(name):
        return len(info.shape) == 3
    return name.endswith(".weight") and len(info.shape) == 2 and is_linear_module(module_of(name), extra)


def is_linear_module(module: str, extra: Collection[str] = ()) -> bool:
    """Whether a drafter module's name is one of the linears quantize-mtp makes FP8 (by name
    alone: callers without tensor headers; `detect_layout` also checks the shapes). ``extra``:
    the family row's `linear_leaves` (DeepSeek-V4's ``wq_a`` / ``w1`` ...)."""
    if _FUSED_EXPERTS.search(module) or _EXPERT_W.search(module):
        return True
    last = module.rsplit(".", 1)[-1]
    return last not in NOT_LINEAR and (last in extra or bool(_LINEAR_NAME.search(last)))


def linear_modules(tensors: Mapping[str, TensorInfo]) -> dict[str, str]:
    """Every linear-like module of a checkpoint -> how it is stored.

    Linear-like: a 2-D+ weight that vLLM builds as a (possibly quantized)
    linear layer. Embeddings, norms and routers are left out because vLLM never
    quantizes them, so a config need not exclude them.
    """
    out: dict[str, str] = {}
    for name, info in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale", "_scale")):
            continue
        is_weight = name.endswith((".weight", CT_PACKED)) or _FUSED_EXPERTS.search(name)
        if not is_weight or len(info.shape) < 2:
            continue
        last = module_of(name).rsplit(".", 1)[-1]
        if last in _NEVER_QUANTIZED:
            continue
        stored, _ = classify_weight(name, tensors)
        out[module_of(name)] = stored
    return out


@dataclass(frozen=True)
class CheckpointModules:
    """A checkpoint's modules and its linear-like ones (-> storage), computed once per command."""

    modules: frozenset[str]
    linears: dict[str, str]

    @classmethod
    def of(cls, tensors: Mapping[str, TensorInfo]) -> CheckpointModules:
        """From the checkpoint's tensor headers."""
        return cls(frozenset(module_of(n) for n in tensors), linear_modules(tensors))
