"""Which tensors form the MTP drafter, per model family (DESIGN §4).

Detection uses the config's keys and the tensor names together, never one
hard-coded list. The result says which tensors are the drafter, which of them
are linears to quantize (and how they are stored), and where the target's
embedding and LM head live.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mtpconv.checkpoint.safetensors_io import FLOAT_DTYPES, TensorInfo
from mtpconv.errors import LayoutError
from mtpconv.formats.scale_layout import ScaleLayout
from mtpconv.names import strip_text_prefix

QWEN35_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
DEEPSEEK_TYPES = {"deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "kimi_k2"}
MIMO_TYPES = {"mimo"}

# Last name component of 2-D modules vLLM never quantizes (lookups, routers), and of
# those we keep out of the drafter's FP8 linears too (heads: the draft head is separate).
_NEVER_QUANTIZED = frozenset({"embed_tokens", "gate", "shared_expert_gate", "e_score_correction_bias"})
_NOT_LINEAR = _NEVER_QUANTIZED | {"head", "lm_head", "draft_lm_head"}
_LINEAR_NAME = re.compile(r"(_proj|^fc|^fc_embedding|^fc_hidden|^eh_proj|^input_proj)$")
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
# Drafter linears a family's vLLM MTP class builds as a plain ``torch.nn.Linear`` (no quant
# config reaches it): stock vLLM cannot load FP8 there, so they stay BF16 (DESIGN §5).
PLAIN_NN_LINEAR: dict[str, frozenset[str]] = {
    "deepseek_v3": frozenset({"eh_proj"}),
    "deepseek_v32": frozenset({"eh_proj"}),
    "glm4_moe": frozenset({"eh_proj"}),
    "glm4_moe_lite": frozenset({"eh_proj"}),
    "kimi_k2": frozenset({"eh_proj"}),
    "mimo": frozenset({"input_proj"}),
}

# compressed-tensors names: the packed NVFP4 weight and its float32 global scales.
_CT_PACKED = ".weight_packed"
_CT_SUFFIXES = (_CT_PACKED, ".weight_global_scale", ".input_global_scale")


class Stored(str, Enum):
    """How a drafter linear's weight is stored in the source checkpoint."""

    PLAIN = "plain"  # a float tensor (BF16, F16, F32, F64)
    NVFP4 = "nvfp4"  # ModelOpt: packed U8 ``weight`` + ``weight_scale`` + ``weight_scale_2``
    # compressed-tensors: ``weight_packed`` + ``weight_scale`` + ``weight_global_scale``
    NVFP4_CT = "nvfp4_ct"
    FP8 = "fp8"  # already FP8: the checkpoint is a variant, not a source

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Linear:
    """A drafter linear: its weight tensor and how it is stored."""

    module: str  # checkpoint name without parameter suffix
    weight: str  # tensor name holding the weight
    stored: Stored
    shape: tuple[int, ...]  # logical [out, in] (or [E, a, b] for fused experts)
    aux: tuple[str, ...] = ()  # scale tensors that belong to the stored format
    declared_layout: ScaleLayout | None = None  # set where the source's dialect needs its own

    @property
    def is_expert(self) -> bool:
        """A routed expert (one per-expert module, or a fused 3-D expert tensor)."""
        return ".experts." in f".{self.module}."

    @property
    def scale_layout(self) -> ScaleLayout:
        """The stored scale's layout: what the source dialect's declaration chose
        (``declared_layout``), else ModelOpt's: routed experts in 128x128 blocks (vLLM's
        mixed config runs no per-channel FP8 experts), every other linear per channel."""
        if self.declared_layout is not None:
            return self.declared_layout
        return ScaleLayout.BLOCK_128 if self.is_expert else ScaleLayout.PER_CHANNEL

    @property
    def fused_halves(self) -> bool:
        """A fused ``experts.gate_up_proj``: its block rows count gate and up apart."""
        return self.weight.endswith(".experts.gate_up_proj")

    @property
    def fp8_weight_name(self) -> str:
        """Name of the FP8 weight in the variant (``P.weight``, also for a ``P.weight_packed``)."""
        if self.weight.endswith(_CT_PACKED):
            return self.module + ".weight"
        return self.weight

    @property
    def fp8_scale_name(self) -> str:
        """Name of the float32 scale the variant stores next to the FP8 weight.

        Block scales are ``weight_scale_inv``: the name vLLM's ``Fp8MoEMethod`` loads.
        """
        suffix = "_inv" if self.scale_layout is ScaleLayout.BLOCK_128 else ""
        weight = self.fp8_weight_name
        if weight.endswith(".weight"):
            return weight[: -len("weight")] + "weight_scale" + suffix
        return weight + "_scale" + suffix


@dataclass
class MtpLayout:
    """The drafter of one checkpoint."""

    family: str
    model_type: str
    drafter_prefixes: tuple[str, ...]
    drafter_tensors: list[str]
    linears: list[Linear]
    declared_layers: int | None
    found_layers: int
    embedding: str | None
    lm_head: str | None
    tie_word_embeddings: bool
    hidden_size: int | None
    vocab_size: int | None
    num_experts: int | None = None
    experts_per_token: int | None = None
    # drafter linears kept BF16, and why (a plain nn.Linear in the family's vLLM class)
    kept_bf16: dict[str, str] = field(default_factory=dict)

    @property
    def has_drafter(self) -> bool:
        return bool(self.drafter_tensors)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config (``text_config`` of a VLM, else the config)."""
    sub = config.get("text_config")
    return sub if isinstance(sub, Mapping) else config


def vocab_size_of(config: Mapping[str, Any]) -> int | None:
    """Rows of the model's LM head: the text model's ``vocab_size``, else the top level's.

    The one lookup order: quantize-mtp's layout and build-draft-vocab both use it, so
    an ids file one accepts the other accepts too.
    """
    return _int(text_config(config), "vocab_size") or _int(config, "vocab_size")


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def module_of(tensor: str) -> str:
    """``a.b.weight`` -> ``a.b``; fused-expert tensors have no suffix to strip."""
    for suffix in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale", ".bias", *_CT_SUFFIXES):
        if tensor.endswith(suffix):
            return tensor[: -len(suffix)]
    return tensor


def classify_weight(name: str, tensors: Mapping[str, TensorInfo]) -> tuple[str, tuple[str, ...]]:
    """How a weight tensor is stored: ("nvfp4"|"fp8"|"plain"|"other", its scale tensors).

    NVFP4 covers both storages (ModelOpt ``weight``, compressed-tensors ``weight_packed``);
    a drafter `Linear.stored` tells them apart.
    """
    info = tensors[name]
    module = module_of(name)
    if info.dtype == "U8" and name.endswith(_CT_PACKED) and f"{module}.weight_scale" in tensors:
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


def _is_linear_weight(name: str, info: TensorInfo) -> bool:
    if _FUSED_EXPERTS.search(name):
        return len(info.shape) == 3
    if not name.endswith(".weight") or len(info.shape) != 2:
        return False
    last = module_of(name).rsplit(".", 1)[-1]
    return last not in _NOT_LINEAR and bool(_LINEAR_NAME.search(last))


def is_linear_module(module: str) -> bool:
    """Whether a drafter module's name is one of the linears quantize-mtp makes FP8 (by name
    alone: callers without tensor headers; `detect_layout` also checks the shapes)."""
    if _FUSED_EXPERTS.search(module):
        return True
    last = module.rsplit(".", 1)[-1]
    return last not in _NOT_LINEAR and bool(_LINEAR_NAME.search(last))


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
        is_weight = name.endswith((".weight", _CT_PACKED)) or _FUSED_EXPERTS.search(name)
        if not is_weight or len(info.shape) < 2:
            continue
        last = module_of(name).rsplit(".", 1)[-1]
        if last in _NEVER_QUANTIZED:
            continue
        stored, _ = classify_weight(name, tensors)
        out[module_of(name)] = stored
    return out


def _find_head_and_embedding(names: list[str]) -> tuple[str | None, str | None]:
    embedding = next(
        (n for n in names if strip_text_prefix(n)[1] in ("embed_tokens.weight", "model.embed_tokens.weight")),
        None,
    )
    lm_head = next((n for n in names if n == "lm_head.weight"), None) or next(
        (n for n in names if n.endswith(".lm_head.weight") and "mtp" not in n), None
    )
    return embedding, lm_head


def detect_layout(config: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> MtpLayout:
    """The MTP layout of a checkpoint from its config and tensor headers."""
    tcfg = text_config(config)
    model_type = str(config.get("model_type") or tcfg.get("model_type") or "unknown")
    text_type = str(tcfg.get("model_type") or model_type)
    names = list(tensors)
    n_layers = _int(tcfg, "num_hidden_layers")
    embedding, lm_head = _find_head_and_embedding(names)
    tie = bool(tcfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))

    types = {model_type, text_type}
    mtp_names = [n for n in names if strip_text_prefix(n)[1].startswith("mtp.")]
    layered = _deepseek_drafter(names, n_layers)

    if types & MIMO_TYPES or any(n.startswith("model.mtp_layers.") for n in names):
        family = "mimo"
        prefixes: tuple[str, ...] = ("model.mtp_layers.",)
        declared = _int(tcfg, "num_nextn_predict_layers")
    elif types & DEEPSEEK_TYPES or layered:
        family = text_type if text_type in DEEPSEEK_TYPES else "deepseek_v3"
        declared = _int(tcfg, "num_nextn_predict_layers")
        start = n_layers or 0
        count = declared if declared is not None else len(layered)
        prefixes = tuple(f"model.layers.{start + i}." for i in range(count)) or ("\0",)
    else:
        declared = _int(tcfg, "mtp_num_hidden_layers", "num_nextn_predict_layers")
        text_prefix = strip_text_prefix(mtp_names[0])[0] if mtp_names else ""
        prefixes = (f"{text_prefix}mtp.",)
        if "hc_count" in tcfg or any(".mtp.fc_embedding" in f".{n}" for n in mtp_names):
            family = "qwen4exp"
        elif "qwen3_next" in types:
            family = "qwen3_next"
        elif types & QWEN35_TYPES:
            is_moe = "moe" in text_type or _int(tcfg, "num_experts") is not None
            family = "qwen3_5_moe" if is_moe else "qwen3_5"
        elif mtp_names:
            family = "generic_mtp"
        else:
            family = "unknown"

    drafter = [n for n in names if n.startswith(prefixes)]
    linears, kept = _split_plain(family, _drafter_linears(drafter, tensors))
    layout = MtpLayout(
        family=family,
        model_type=model_type,
        drafter_prefixes=prefixes,
        drafter_tensors=drafter,
        linears=linears,
        declared_layers=declared,
        found_layers=_count_layers(family, drafter, n_layers),
        embedding=embedding,
        lm_head=lm_head,
        tie_word_embeddings=tie,
        hidden_size=_int(tcfg, "hidden_size"),
        vocab_size=vocab_size_of(config),
        num_experts=_int(tcfg, "num_experts", "n_routed_experts"),
        experts_per_token=_int(tcfg, "num_experts_per_tok"),
        kept_bf16=kept,
    )
    return layout


def _split_plain(family: str, linears: list[Linear]) -> tuple[list[Linear], dict[str, str]]:
    """The FP8 linears, and those kept BF16 because vLLM builds them as plain nn.Linear."""
    plain = PLAIN_NN_LINEAR.get(family, frozenset())
    keep = [lin for lin in linears if lin.module.rsplit(".", 1)[-1] not in plain]
    kept = {
        lin.module: f"vLLM's {family} MTP class builds it as a plain nn.Linear (no FP8 possible)"
        for lin in linears
        if lin.module.rsplit(".", 1)[-1] in plain
    }
    return keep, kept


def _deepseek_drafter(names: list[str], n_layers: int | None) -> list[int]:
    if n_layers is None:
        return []
    found = set()
    for name in names:
        m = re.match(r"model\.layers\.(\d+)\.eh_proj\.", name)
        if m and int(m.group(1)) >= n_layers:
            found.add(int(m.group(1)))
    return sorted(found)


def _count_layers(family: str, drafter: list[str], n_layers: int | None) -> int:
    if family == "mimo":
        pattern = re.compile(r"model\.mtp_layers\.(\d+)\.")
    elif family in DEEPSEEK_TYPES or family == "deepseek_v3":
        pattern = re.compile(r"model\.layers\.(\d+)\.")
    else:
        pattern = re.compile(r"mtp\.layers\.(\d+)\.")
    return len({m.group(1) for n in drafter if (m := pattern.search(n))})


def _drafter_linears(drafter: list[str], tensors: Mapping[str, TensorInfo]) -> list[Linear]:
    linears = []
    for name in drafter:
        info = tensors[name]
        stored, aux = classify_weight(name, tensors)
        if stored == "nvfp4":
            if not name.endswith((".weight", _CT_PACKED)) or len(info.shape) != 2:
                raise LayoutError(
                    f"{name}: NVFP4 drafter weights must be 2-D packed [out, in/2]; got "
                    f"{list(info.shape)}. This layout is not supported yet."
                )
            shape: tuple[int, ...] = (info.shape[0], info.shape[1] * 2)
        elif stored in ("plain", "fp8") and _is_linear_weight(name, info):
            shape = info.shape
        else:
            continue
        last = module_of(name).rsplit(".", 1)[-1]
        if last in _NOT_LINEAR:
            continue
        kind = Stored.NVFP4_CT if stored == "nvfp4" and name.endswith(_CT_PACKED) else Stored(stored)
        linears.append(Linear(module=module_of(name), weight=name, stored=kind, shape=shape, aux=aux))
    return linears
