"""Declare the FP8 drafter in the source's own dialect, so that stock vLLM loads it.

ModelOpt sources (NVFP4, FP8, MIXED_PRECISION) and BF16 sources get a ModelOpt
``MIXED_PRECISION`` declaration (DESIGN §5): config.json in vLLM's *flat* form
(a nested ``quantization`` block with a ``producer`` makes vLLM 0.32 raise
"Unknown ModelOpt quant algo: MIXED_PRECISION"), hf_quant_config.json in
ModelOpt's nested form. Every target linear is listed with exactly the algorithm
(and group size) the source resolves it to; the source's exclusions stay, except
those that would exclude an FP8 drafter linear (vLLM checks exclusions first);
the KV-cache setting is copied. Drafter linears get an FP8 algorithm vLLM runs
without calibration: dense linears ``FP8_PER_CHANNEL_PER_TOKEN``, routed experts
``FP8_PB_WO`` (128x128 blocks; vLLM's mixed config has no per-channel FP8 experts).

Where no MIXED declaration keeps the target exactly as it was, the drafter stays
on the exclusion-style declaration (only the plugin builds it FP8):
MLA targets with a quantized KV cache (vLLM's mixed config gives ``MLAAttention``
no KV-cache method), a KV cache other than FP8 (the flat form keeps only FP8),
and non-ModelOpt quant methods.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mtpconv import __version__
from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.errors import QuantConfigError
from mtpconv.families import mtp_start_layer, vllm_drafter_key
from mtpconv.formats.scale_layout import BLOCK, ScaleLayout
from mtpconv.jsonio import copy_json
from mtpconv.layouts import Linear, MtpLayout, module_of, text_config
from mtpconv.quantconfig import compressed_tensors as ct
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.declarations import (
    DeclaredQuant,
    all_declarations,
    declared_algorithm,
    declared_quant,
)
from mtpconv.quantconfig.documents import HF_QUANT_JSON, QuantConfigs, quant_location
from mtpconv.quantconfig.match import ExclusionPattern
from mtpconv.quantconfig.rewrite import RewrittenConfigs, variant_configs
from mtpconv.weight_names import CheckpointModules

DENSE_ALGO = methods.FP8_PER_CHANNEL_PER_TOKEN  # the drafter's dense linears: weight_scale f32 [out]
EXPERT_ALGO = methods.FP8_PB_WO  # its routed experts: weight_scale_inv f32 128x128 blocks
# The first vLLM release whose mixed config builds both (read from the releases' modelopt.py:
# 0.29 builds FP8_PB_WO linears only, 0.26-0.28 neither). An older one leaves such a layer BF16,
# and loading its FP8 scales fails: "There is no module or parameter named '...weight_scale'"
# (measured on 0.26, README "What each engine gets").
VLLM_MIXED_DRAFTER_SINCE = "0.30"
# vLLM 0.32's ModelOptMixedPrecisionConfig.get_quant_method: the algorithms it builds a
# method for, per layer kind; any other algorithm leaves that layer BF16, silently.
VLLM_MIXED_LINEAR_ALGOS = frozenset(
    {
        methods.FP8,
        methods.FP8_PER_CHANNEL_PER_TOKEN,
        methods.FP8_PB_WO,
        methods.NVFP4,
        methods.W4A16_NVFP4,
        methods.MXFP8,
    }
)
VLLM_MIXED_MOE_ALGOS = frozenset(
    {
        methods.FP8,
        methods.FP8_PB_WO,
        methods.FP8_BLOCK_SCALES,
        methods.NVFP4,
        methods.W4A16_NVFP4,
        methods.MXFP8,
    }
)


def stock_vllm_since(declared: Collection[str]) -> str | None:
    """The oldest stock vLLM that builds every drafter algorithm declared (None: no FP8 declared here)."""
    return VLLM_MIXED_DRAFTER_SINCE if {DENSE_ALGO, EXPERT_ALGO} & set(declared) else None


_FLAT_REPLACED = frozenset(
    {"quant_algo", "quantization", "config_groups", "ignore", "exclude_modules", "quantized_layers"}
)
_KV_FP8_SCHEME = {"num_bits": 8, "type": "float", "dynamic": False}


class DeclarationStyle(str, Enum):
    """How the variant's quant config speaks about the FP8 drafter."""

    STANDARD = "standard"  # declared FP8 in the source's dialect: stock engines load it
    EXCLUSION = "exclusion"  # excluded from the target's config: only the plugin builds it FP8

    def __str__(self) -> str:
        return self.value


@dataclass
class DrafterDeclaration:
    """What the variant declares for the drafter, and why."""

    style: DeclarationStyle
    reason: str
    algos: dict[str, str] = field(default_factory=dict)  # drafter checkpoint module -> FP8 algo


def drafter_algorithm(linear: Linear) -> str:
    """The ModelOpt algorithm declared for an FP8 drafter linear (by its scale layout)."""
    return EXPERT_ALGO if linear.scale_layout is ScaleLayout.BLOCK_128 else DENSE_ALGO


def _resolved_target_algo(decl: DeclaredQuant, algo: str, body: Mapping[str, Any] | None) -> str:
    """The algorithm vLLM resolves a target module to: ModelOptNvFp4Config turns NVFP4 into
    W4A16_NVFP4 when every config group has no input_activations."""
    if algo != methods.NVFP4 or decl.algo != methods.NVFP4 or body is None:
        return algo
    groups = body.get("config_groups")
    if (
        isinstance(groups, dict)
        and groups
        and all(isinstance(g, dict) and g.get("input_activations") is None for g in groups.values())
    ):
        return methods.W4A16_NVFP4
    return algo


def _source_body(configs: QuantConfigs) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(config.json's quant body, hf_quant_config.json's ``quantization``), either may be None."""
    loc = quant_location(configs.config)
    nested = configs.hf_quant.get("quantization") if isinstance(configs.hf_quant, dict) else None
    return (loc.body if loc else None), (nested if isinstance(nested, dict) else None)


def _group_size(body: Mapping[str, Any] | None, nested: Mapping[str, Any] | None) -> int | None:
    for src in (nested, body):
        if src is not None and isinstance(src.get("group_size"), int):
            return int(src["group_size"])
    if body is not None and isinstance(body.get("quantization"), dict):
        gs = body["quantization"].get("group_size")
        if isinstance(gs, int):
            return gs
    groups = body.get("config_groups") if body else None
    if isinstance(groups, dict):
        for g in groups.values():
            gs = g.get("weights", {}).get("group_size") if isinstance(g, dict) else None
            if isinstance(gs, int):
                return gs
    return None


def _source_layer_entry(
    configs: QuantConfigs, decl: DeclaredQuant, module: str, algo: str, group_size: int | None
) -> dict[str, Any]:
    """The source's own ``quantized_layers`` entry (MIXED sources) or one built from its algo."""
    if decl.algo == methods.MIXED_PRECISION:
        body, nested = _source_body(configs)
        for src in (body, (body or {}).get("quantization"), nested):
            layers = src.get("quantized_layers") if isinstance(src, dict) else None
            if isinstance(layers, dict) and isinstance(layers.get(module), dict):
                return dict(layers[module])
        return {"quant_algo": algo}
    entry: dict[str, Any] = {"quant_algo": algo}
    if methods.NVFP4 in algo and group_size is not None:
        entry["group_size"] = group_size
    return entry


def is_mla(tcfg: Mapping[str, Any]) -> bool:
    """Whether vLLM builds the target's attention as MLA, by its own rule
    (``model_arch_config_convertor.is_deepseek_mla``): DeepSeek-V4-style configs (with
    ``compress_ratios``) by ``head_dim``, the others by ``kv_lora_rank``."""
    if "compress_ratios" in tcfg:
        return tcfg.get("head_dim") is not None
    return tcfg.get("kv_lora_rank") is not None


def declare_drafter(
    configs: QuantConfigs,
    tensors: Mapping[str, TensorInfo],
    layout: MtpLayout,
    *,
    fp8_linears: Sequence[Linear],
    extra_drafter_modules: Collection[str] = (),
    known: CheckpointModules | None = None,
) -> tuple[RewrittenConfigs, DrafterDeclaration]:
    """`standard_configs` for a checkpoint: its targets, modules and family from its
    headers and config (``extra_drafter_modules``: e.g. the draft head the variant adds;
    ``known``: the checkpoint's modules when the caller has them already)."""
    drafter = {module_of(n) for n in layout.drafter_tensors} | set(extra_drafter_modules)
    tcfg = text_config(configs.config)
    known = known or CheckpointModules.of(tensors)
    return standard_configs(
        configs,
        fp8_linears=fp8_linears,
        drafter_modules=sorted(drafter),
        target_linears=[m for m in known.linears if m not in drafter],
        all_modules=known.modules | drafter,
        family=layout.family,
        num_layers=mtp_start_layer(layout.family, tcfg),
        mla=is_mla(tcfg),
    )


def standard_configs(
    configs: QuantConfigs,
    *,
    fp8_linears: Sequence[Linear],
    drafter_modules: Collection[str],
    target_linears: Collection[str],
    all_modules: Collection[str],
    family: str,
    num_layers: int | None,
    mla: bool,
) -> tuple[RewrittenConfigs, DrafterDeclaration]:
    """The variant's two quant-config documents and what they declare for the drafter.

    ``target_linears``: every linear-like target module of the checkpoint (checkpoint
    names); ``drafter_modules``: every drafter module (its FP8 linears among them).
    """
    if ct.declares_compressed_tensors(configs):
        fp8 = [lin.module for lin in fp8_linears]
        rewritten = variant_configs(configs, drafter_modules, all_modules, fp8_linears=fp8)
        why = f"compressed-tensors config group {ct.DRAFTER_GROUP!r} (FP8 per channel, dynamic per token)"
        return rewritten, DrafterDeclaration(DeclarationStyle.STANDARD, why)
    decls = all_declarations(configs)
    in_play = {d.method for d in decls}
    kv = {d.kv_cache_algo for d in decls if d.kv_cache_algo is not None}
    reason = ""
    if in_play and in_play != {methods.MODELOPT}:
        reason = f"quant_method {sorted(in_play)} has no per-layer FP8 declaration here yet"
    elif mla and kv:
        reason = (
            "an MLA target with a quantized KV cache: vLLM's MIXED_PRECISION config gives "
            "MLAAttention no KV-cache method, so its k/v scales would be dropped silently"
        )
    elif kv - {methods.FP8}:
        reason = f"KV cache {sorted(kv)}: vLLM's flat MIXED_PRECISION form keeps only an FP8 KV cache"
    if reason:
        excluded = variant_configs(configs, drafter_modules, all_modules)
        return excluded, DrafterDeclaration(DeclarationStyle.EXCLUSION, reason)
    return _mixed(configs, decls, fp8_linears, target_linears, family, num_layers)


def _mixed(
    configs: QuantConfigs,
    decls: list[DeclaredQuant],
    fp8_linears: Sequence[Linear],
    target_linears: Collection[str],
    family: str,
    num_layers: int | None,
) -> tuple[RewrittenConfigs, DrafterDeclaration]:
    decl = declared_quant(configs) if decls else None
    body, nested = _source_body(configs)
    group_size = _group_size(body, nested)
    layers: dict[str, dict[str, Any]] = {}
    before: dict[str, str | None] = {}
    for module in sorted(target_linears):
        algo = declared_algorithm(decl, module) if decl is not None else None
        if algo is not None and decl is not None:
            algo = _resolved_target_algo(decl, algo, body)
            layers[module] = _source_layer_entry(configs, decl, module, algo, group_size)
        before[module] = algo
    drafter = {lin.module: drafter_algorithm(lin) for lin in fp8_linears}
    for module, algo in drafter.items():
        entry: dict[str, Any] = {"quant_algo": algo}
        if algo == EXPERT_ALGO:
            entry["group_size"] = BLOCK
        layers[vllm_drafter_key(module, family, num_layers)] = entry
    keys = {vllm_drafter_key(m, family, num_layers) for m in drafter}
    exclude = [
        p
        for p in (decl.exclude if decl is not None else [])
        if not any(ExclusionPattern(p, methods.MODELOPT, "source").matches(k) for k in keys)
    ]
    kv_algo = decl.kv_cache_algo if decl is not None else None
    out = RewrittenConfigs(_hf_quant_doc(configs, layers, exclude, kv_algo), copy_json(configs.config))
    _put_flat(out.config, configs, layers, exclude, kv_algo, body)
    out.excluded_modules = []
    _verify(out, before, {vllm_drafter_key(m, family, num_layers): a for m, a in drafter.items()})
    reason = "ModelOpt MIXED_PRECISION: the drafter's FP8 linears are declared, the target as it was"
    return out, DrafterDeclaration(DeclarationStyle.STANDARD, reason, drafter)


def _producer(configs: QuantConfigs) -> dict[str, Any]:
    for doc in (configs.hf_quant, quant_location(configs.config)):
        src = doc.body if doc is not None and not isinstance(doc, dict) else doc
        if isinstance(src, dict) and isinstance(src.get("producer"), dict):
            return dict(src["producer"])
    # A BF16 source: the dialect is ModelOpt's, the producer is us.
    return {"name": methods.MODELOPT, "version": f"mtpconv {__version__}"}


def _hf_quant_doc(
    configs: QuantConfigs, layers: dict[str, dict[str, Any]], exclude: list[str], kv_algo: str | None
) -> dict[str, Any]:
    """hf_quant_config.json, nested form (ModelOpt's file; vLLM reads it only as a fallback)."""
    doc = copy_json(configs.hf_quant) if isinstance(configs.hf_quant, dict) else {}
    doc["producer"] = _producer(configs)
    old: dict[str, Any] = doc["quantization"] if isinstance(doc.get("quantization"), dict) else {}
    q = {k: v for k, v in old.items() if k not in _FLAT_REPLACED | {"kv_cache_quant_algo", "group_size"}}
    doc["quantization"] = {
        "quant_algo": methods.MIXED_PRECISION,
        "kv_cache_quant_algo": kv_algo,
        "quantized_layers": copy_json(layers),
        "exclude_modules": list(exclude),
        **q,
    }
    return doc


def _put_flat(
    config: dict[str, Any],
    configs: QuantConfigs,
    layers: dict[str, dict[str, Any]],
    exclude: list[str],
    kv_algo: str | None,
    body: Mapping[str, Any] | None,
) -> None:
    """config.json's quantization_config in vLLM's flat form, where the source had one."""
    loc = quant_location(config)
    flat: dict[str, Any] = {"quant_method": methods.MODELOPT, "quant_algo": methods.MIXED_PRECISION}
    if body is not None:
        flat.update({k: v for k, v in body.items() if k not in _FLAT_REPLACED | {"group_size"}})
        flat["quant_method"] = methods.MODELOPT
    flat["producer"] = _producer(configs)
    if kv_algo == methods.FP8:
        flat["kv_cache_scheme"] = copy_json(
            (body or {}).get("kv_cache_scheme")
            if isinstance((body or {}).get("kv_cache_scheme"), dict)
            else None
        ) or dict(_KV_FP8_SCHEME)
    else:
        flat.pop("kv_cache_scheme", None)
    flat["quantized_layers"] = copy_json(layers)
    flat["ignore"] = list(exclude)
    if loc is None:
        config["quantization_config"] = flat
        return
    node: Any = config
    for key in loc.keys[:-1]:
        node = node[key]
    node[loc.keys[-1]] = flat


def _verify(out: RewrittenConfigs, before: Mapping[str, str | None], drafter: Mapping[str, str]) -> None:
    """Every target linear declared as it was, every drafter linear FP8, in both files."""
    docs = [QuantConfigs(out.config, None)]
    if out.hf_quant is not None:
        docs.append(QuantConfigs({}, out.hf_quant))
    checked: list[tuple[Any, ...]] = []
    for doc in docs:
        new = declared_quant(doc)
        where = "config.json" if doc.hf_quant is None else HF_QUANT_JSON
        # both files normally declare the same thing: resolving ~100k modules once is enough
        same = (new.method, new.algo, list(new.exclude), new.quantized_layers)
        if same in checked:
            continue
        checked.append(same)
        for module, algo in before.items():
            got = declared_algorithm(new, module)
            if got != algo:
                raise QuantConfigError(
                    f"{where}: declaring the FP8 drafter would change {module} from {algo} to {got}; "
                    "fix the source's exclusion list by hand."
                )
        for module, algo in drafter.items():
            got = declared_algorithm(new, module)
            if got != algo:
                raise QuantConfigError(
                    f"{where}: {module} resolves to {got}, not {algo}; an exclusion pattern of the "
                    "source covers it and the target; fix the exclusion list by hand."
                )
