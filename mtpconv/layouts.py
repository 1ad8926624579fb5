"""Which tensors form the MTP drafter, per model family (DESIGN §4).

Detection uses the config's keys and the tensor names together, never one
hard-coded list. The result says which tensors are the drafter, which of them
are linears to quantize (and how they are stored), and where the target's
embedding and LM head live.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.errors import LayoutError, UnknownFamilyError
from mtpconv.families import (
    LAYER_INDEX,
    LAYER_KEYS,
    Family,
    drafter_prefixes,
    find_family,
    layers_after_target,
)
from mtpconv.formats.scale_layout import ScaleLayout
from mtpconv.names import strip_text_prefix

# the tensor-name rules live in weight_names; re-exported for the callers
from mtpconv.weight_names import CT_PACKED as _CT_PACKED
from mtpconv.weight_names import NOT_LINEAR as _NOT_LINEAR
from mtpconv.weight_names import STORAGE as _STORAGE
from mtpconv.weight_names import Stored as Stored
from mtpconv.weight_names import classify_weight as classify_weight
from mtpconv.weight_names import is_linear_module as is_linear_module
from mtpconv.weight_names import is_linear_weight as _is_linear_weight
from mtpconv.weight_names import linear_modules as linear_modules
from mtpconv.weight_names import module_of as module_of
from mtpconv.weight_names import storage_of as _storage_of

# Tensor names that look like a drafter's, for the error on a family no row matches.
_CANDIDATE = re.compile(r"(^|\.)(mtp|mtp_layers|nextn|eh_proj|enorm|hnorm|shared_head)(\.|$)")


@dataclass(frozen=True)
class Linear:
    """A drafter linear: its weight tensor and how it is stored."""

    module: str  # checkpoint name without parameter suffix
    weight: str  # tensor name holding the weight
    stored: Stored
    # logical [out, in] (or [E, a, b] for fused experts); the stored shape while `bits` is None
    shape: tuple[int, ...]
    aux: tuple[str, ...] = ()  # scale tensors that belong to the stored format
    declared_layout: ScaleLayout | None = None  # set where the source's dialect needs its own
    bits: int | None = None  # bits a weight as stored; None where only the quant config says it

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


def _find_head_and_embedding(names: list[str]) -> tuple[str | None, str | None]:
    # ``embed.weight`` / ``head.weight``: DeepSeek-V4's own names (vLLM's hf_to_vllm_mapper renames them)
    embeds = ("embed_tokens.weight", "model.embed_tokens.weight", "embed.weight")
    embedding = next((n for n in names if strip_text_prefix(n)[1] in embeds), None)
    lm_head = next((n for n in names if n in ("lm_head.weight", "head.weight")), None) or next(
        (n for n in names if n.endswith(".lm_head.weight") and "mtp" not in n), None
    )
    return embedding, lm_head


def detect_layout(
    config: Mapping[str, Any], tensors: Mapping[str, TensorInfo], *, strict: bool = True
) -> MtpLayout:
    """The MTP layout of a checkpoint from its config and tensor headers (the rows of
    `mtpconv.families`); `UnknownFamilyError` when it declares or holds a drafter no row knows
    (``strict=False``: an ``unknown`` layout without a drafter instead, for inspect's report)."""
    tcfg = text_config(config)
    model_type = str(config.get("model_type") or tcfg.get("model_type") or "unknown")
    names = list(tensors)
    n_layers = _int(tcfg, "num_hidden_layers")
    embedding, lm_head = _find_head_and_embedding(names)
    tie = bool(tcfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    row = find_family(config, tcfg, names)
    if row is None and strict:
        _no_row(config, tcfg, names, n_layers)
    if row is None:
        prefixes: tuple[str, ...] = ()
        declared = None
    else:
        declared = _int(tcfg, *row.layer_keys)
        if declared is None:  # a VLM's MTP class may read the key from the top level (Exaone-4.5)
            declared = _int(config, *row.layer_keys)
        if declared is None:  # a family whose vLLM class builds a fixed number of MTP layers
            declared = row.fixed_layers
        prefixes = drafter_prefixes(row, names, n_layers, declared)
    drafter = [n for n in names if n.startswith(prefixes)] if prefixes else []
    extra = row.linear_leaves if row is not None else ()
    linears, kept = _split_plain(row, _drafter_linears(drafter, tensors, extra))
    return MtpLayout(
        family=row.name if row is not None else "unknown",
        model_type=model_type,
        drafter_prefixes=prefixes or ("\0",),
        drafter_tensors=drafter,
        linears=linears,
        declared_layers=declared,
        found_layers=_count_layers(row, tcfg, drafter),
        embedding=embedding,
        lm_head=lm_head,
        tie_word_embeddings=tie,
        hidden_size=_int(tcfg, "hidden_size"),
        vocab_size=vocab_size_of(config),
        num_experts=_int(tcfg, "num_experts", "n_routed_experts"),
        experts_per_token=_int(tcfg, "num_experts_per_tok", "num_experts_per_token"),
        kept_bf16=kept,
    )


def _no_row(
    config: Mapping[str, Any], tcfg: Mapping[str, Any], names: list[str], n_layers: int | None
) -> None:
    """Raise `UnknownFamilyError` when the checkpoint declares or holds a drafter no row knows."""
    keys = {k: tcfg.get(k, config.get(k)) for k in LAYER_KEYS if k in tcfg or k in config}
    declared = {k: v for k, v in keys.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    candidates = [n for n in names if _CANDIDATE.search(n)]
    candidates += [f"model.layers.{i}.*" for i in layers_after_target(names, n_layers, any_module=True)]
    if not declared and not candidates:
        return
    types = sorted({str(t) for t in (config.get("model_type"), tcfg.get("model_type")) if t})
    archs = sorted(str(a) for a in config.get("architectures") or [])
    shown = ", ".join(candidates[:6]) + (f" and {len(candidates) - 6} more" if len(candidates) > 6 else "")
    raise UnknownFamilyError(
        f"config.json declares MTP layers ({declared or 'no layer-count key'}; model_type {types or '?'}, "
        f"architectures {archs or '?'}) with candidate drafter tensors [{shown or 'none'}], but no "
        "mtpconv family row matches it: missing a row in mtpconv/families/rows.py for this model_type "
        "(read its vLLM *_mtp.py); open an issue with this message."
    )


def _split_plain(row: Family | None, linears: list[Linear]) -> tuple[list[Linear], dict[str, str]]:
    """The FP8 linears, and those kept BF16 because vLLM gives them no quant method."""
    keep: list[Linear] = []
    kept: dict[str, str] = {}
    for lin in linears:
        why = row.plain_reason(lin.module) if row is not None else None
        if why is None:
            keep.append(lin)
        else:
            kept[lin.module] = why
    return keep, kept


def _count_layers(row: Family | None, tcfg: Mapping[str, Any], drafter: list[str]) -> int:
    """MTP layers (steps) stored: distinct layer indices, per step where a step spans several."""
    if row is None:
        return 0
    pattern = LAYER_INDEX[row.drafter_at]
    stored = len({m.group(1) for n in drafter if (m := pattern.search(n))})
    step = tcfg.get(row.step_pattern_key) if row.step_pattern_key else None
    if isinstance(step, str) and step:
        return -(-stored // len(step))
    return stored


def _drafter_linears(
    drafter: list[str], tensors: Mapping[str, TensorInfo], extra: Collection[str]
) -> list[Linear]:
    linears = []
    for name in drafter:
        info = tensors[name]
        found = _storage_of(name, tensors)
        if found is None:
            continue
        module = module_of(name)
        # a packed storage: the producer packs only linears (its name and siblings say it is one)
        if found.stored in (Stored.NVFP4, Stored.NVFP4_CT) and len(info.shape) != 2:
            raise LayoutError(
                f"{name}: NVFP4 drafter weights must be 2-D packed [out, in/2]; got "
                f"{list(info.shape)}. This layout is not supported yet."
            )
        if found.stored not in _STORAGE and not _is_linear_weight(name, info, extra):
            continue
        if module.rsplit(".", 1)[-1] in _NOT_LINEAR:
            continue
        linears.append(
            Linear(
                module=module,
                weight=name,
                stored=found.stored,
                shape=found.logical or info.shape,
                aux=found.aux,
                bits=found.bits,
            )
        )
    return linears
