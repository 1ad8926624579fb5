"""What a quant config declares, per method, and the algorithm it declares for a module.

Methods read: ModelOpt (``hf_quant_config.json``'s ``quantization`` body, or config.json's
``quant_method: modelopt`` with ``ignore``; ``MIXED_PRECISION`` with ``quantized_layers``),
compressed-tensors (``config_groups`` + ``ignore``) and ``fp8`` (``ignored_layers`` /
``modules_to_not_convert``). Exclusions are matched by `match.ExclusionMatcher`.

vLLM also keeps layers whose prefix contains ``vision_tower``, ``vision_model`` or
``vit_large_projector`` unquantized whatever the config says. ``MIXED_PRECISION`` layers
not excluded are quantized only when ``quantized_layers`` lists them (or a parent).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpconv.errors import QuantConfigError
from mtpconv.names import VISION_MARKERS, drafter_alias
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.documents import HF_QUANT_JSON, QuantConfigs, quant_location
from mtpconv.quantconfig.match import ExclusionMatcher, ct_expert_name
from mtpconv.weight_names import StorageFormat as StorageFormat

_HEAD_LEAVES = frozenset({"lm_head", "draft_lm_head", "head"})
_CT_INT = re.compile(r"INT\d+")  # compressed-tensors integer weights (`_ct_algo`)
_NVFP4_ALGOS = frozenset({methods.NVFP4, methods.W4A16_NVFP4, "NVFP4_AWQ", "NVFP4_SVD", "W4A8_NVFP4_FP8"})


@dataclass
class DeclaredQuant:
    """What one quant config declares, normalised across the formats vLLM reads."""

    method: str  # "modelopt" | "compressed-tensors" | "fp8" | other quant_method | "none"
    algo: str | None  # "NVFP4" | "FP8" | "MIXED_PRECISION" | ... (upper case) or None
    exclude: list[str]
    quantized_layers: dict[str, str] | None  # MIXED_PRECISION: prefix -> algo
    kv_cache_algo: str | None
    source: str  # "config.json", "config.json (text_config)", "hf_quant_config.json", ""
    # compressed-tensors: (targets, algo) per config group, in file order.
    groups: list[tuple[list[str], str]] = field(default_factory=list)
    _matcher: ExclusionMatcher | None = field(default=None, init=False, repr=False, compare=False)

    def matcher(self) -> ExclusionMatcher:
        """The exclusion patterns compiled for this method's rule (built once)."""
        if self._matcher is None:
            self._matcher = ExclusionMatcher(self.method, self.exclude, self.source)
        return self._matcher


NO_QUANT = "none"


def _none() -> DeclaredQuant:
    return DeclaredQuant(NO_QUANT, None, [], None, None, "")


def _where(configs_source: str, key: str) -> str:
    return f"{configs_source} key {key!r}"


def _str_or_none(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    raise QuantConfigError(f"{where} must be a string, found {type(value).__name__}.")


def _str_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"{where} must be a list of strings; fix the file by hand.")
    return list(value)


def _quantized_layers(value: Any, where: str) -> dict[str, str]:
    if not value and (value is None or isinstance(value, dict)):
        # vLLM's ModelOptMixedPrecisionConfig refuses it outright ("MIXED_PRECISION quant_algo
        # requires a non-empty 'quantized_layers' mapping"): no engine loads this checkpoint.
        raise QuantConfigError(
            f"{where} is {'missing' if value is None else 'empty'}: a MIXED_PRECISION config needs "
            "a non-empty quantized_layers map, and vLLM refuses to load the checkpoint without one. "
            "List the quantized layers (or declare one quant_algo) and try again."
        )
    if not isinstance(value, dict):
        raise QuantConfigError(f"{where} must be an object of prefix -> settings.")
    out: dict[str, str] = {}
    for prefix, info in value.items():
        algo = info.get("quant_algo") if isinstance(info, dict) else None
        if not isinstance(algo, str):
            raise QuantConfigError(f"{where}[{prefix!r}] needs a string 'quant_algo'.")
        out[prefix] = algo.upper()
    return out


def _kv_from_scheme(scheme: Any) -> str | None:
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            return methods.FP8
        return None
    if isinstance(scheme, str):
        return scheme.upper()
    return None


def _modelopt_from_quantization(q: Any, source: str) -> DeclaredQuant:
    """The ``{"quant_algo", "exclude_modules", ...}`` body of hf_quant_config.json."""
    if not isinstance(q, dict):
        raise QuantConfigError(f"{_where(source, 'quantization')} must be an object.")
    algo = _str_or_none(q.get("quant_algo"), _where(source, "quant_algo"))
    kv_algo = _str_or_none(q.get("kv_cache_quant_algo"), _where(source, "kv_cache_quant_algo"))
    exclude = _str_list(q.get("exclude_modules"), _where(source, "exclude_modules"))
    algo_u = algo.upper() if algo else None
    layers = None
    if algo_u == methods.MIXED_PRECISION:
        layers = _quantized_layers(q.get("quantized_layers"), _where(source, "quantized_layers"))
    kv = kv_algo.upper() if kv_algo else None
    return DeclaredQuant(methods.MODELOPT, algo_u, exclude, layers, kv, source)


def flat_modelopt_exclusion_key(qc: dict[str, Any]) -> str:
    """Where a flat ModelOpt quantization_config lists its exclusions: ``ignore``, else
    ``exclude_modules``. ModelOpt exports write either; vLLM 0.33 reads ``ignore`` and falls back
    to ``exclude_modules`` (0.32 read ``ignore`` only, so a list written as ``ignore`` serves both)."""
    return "ignore" if "ignore" in qc or "exclude_modules" not in qc else "exclude_modules"


def _modelopt_from_qc(qc: dict[str, Any], source: str, hf_quant: dict[str, Any] | None) -> DeclaredQuant:
    if "quantization" in qc:
        return _modelopt_from_quantization(qc["quantization"], source)
    algo = _str_or_none(qc.get("quant_algo"), _where(source, "quant_algo"))
    key = flat_modelopt_exclusion_key(qc)
    exclude = _str_list(qc.get(key), _where(source, key))
    algo_u = algo.upper() if algo else None
    layers = None
    if algo_u == methods.MIXED_PRECISION:
        raw = qc.get("quantized_layers")
        if raw is None and hf_quant is not None and isinstance(hf_quant.get("quantization"), dict):
            # vLLM falls back to hf_quant_config.json for the per-layer map.
            raw = hf_quant["quantization"].get("quantized_layers")
        layers = _quantized_layers(raw, _where(source, "quantized_layers"))
    kv = _kv_from_scheme(qc.get("kv_cache_scheme"))
    return DeclaredQuant(methods.MODELOPT, algo_u, exclude, layers, kv, source)


def _ct_algo(scheme: Any) -> str | None:
    if not isinstance(scheme, dict):
        return None
    weights = scheme.get("weights")
    if not isinstance(weights, dict):
        return None
    bits, kind = weights.get("num_bits"), weights.get("type")
    if kind == "float" and bits == 4:  # vLLM tells them apart by group size (16 vs 32)
        return methods.MXFP4 if weights.get("group_size") == 32 else methods.NVFP4
    if kind == "float" and bits == 8:
        return methods.FP8
    if kind == "int" and isinstance(bits, int):
        return f"INT{bits}"
    return None


def _compressed_tensors(qc: dict[str, Any], source: str) -> DeclaredQuant:
    ignore = _str_list(qc.get("ignore"), _where(source, "ignore"))
    groups: list[tuple[list[str], str]] = []
    raw = qc.get("config_groups")
    if isinstance(raw, dict):
        for name, scheme in raw.items():
            algo = _ct_algo(scheme)
            targets = scheme.get("targets") if isinstance(scheme, dict) else None
            tlist = _str_list(targets, _where(source, f"config_groups.{name}.targets"))
            if algo is not None:
                groups.append((tlist, algo))
    algos = {a for _, a in groups}
    algo = next(iter(algos)) if len(algos) == 1 else ("MIXED" if algos else None)
    kv = _kv_from_scheme(qc.get("kv_cache_scheme"))
    return DeclaredQuant(methods.COMPRESSED_TENSORS, algo, ignore, None, kv, source, groups)


def _declared_from_qc(qc: dict[str, Any], source: str, hf_quant: dict[str, Any] | None) -> DeclaredQuant:
    method_raw = _str_or_none(qc.get("quant_method"), _where(source, "quant_method"))
    method = (method_raw or "").lower()
    if method.startswith(methods.MODELOPT) or (not method and "quantization" in qc):
        return _modelopt_from_qc(qc, source, hf_quant)
    if method == methods.COMPRESSED_TENSORS:
        return _compressed_tensors(qc, source)
    if method == methods.FP8_METHOD:
        ignored = _str_list(qc.get("ignored_layers"), _where(source, "ignored_layers"))
        if not ignored:
            ignored = _str_list(qc.get("modules_to_not_convert"), _where(source, "modules_to_not_convert"))
        return DeclaredQuant(methods.FP8_METHOD, methods.FP8, ignored, None, None, source)
    if not method:
        raise QuantConfigError(f"{source} has a quantization config without 'quant_method'.")
    return DeclaredQuant(method, None, [], None, None, source)


def _declared_from_hf_quant(hf_quant: dict[str, Any]) -> DeclaredQuant:
    if "quantization" not in hf_quant:
        raise QuantConfigError(f"{HF_QUANT_JSON} has no 'quantization' object; restore the original file.")
    return _modelopt_from_quantization(hf_quant["quantization"], HF_QUANT_JSON)


def all_declarations(configs: QuantConfigs) -> list[DeclaredQuant]:
    """Every declaration present: config.json's first (what vLLM reads), then the fallback."""
    out: list[DeclaredQuant] = []
    loc = quant_location(configs.config)
    if loc is not None:
        out.append(_declared_from_qc(loc.body, loc.source, configs.hf_quant))
    if configs.hf_quant is not None:
        out.append(_declared_from_hf_quant(configs.hf_quant))
    return out


def declared_quant(configs: QuantConfigs) -> DeclaredQuant:
    """What vLLM will read: config.json's quantization config, else hf_quant_config.json."""
    decls = all_declarations(configs)
    return decls[0] if decls else _none()


def _mixed_candidates(module: str) -> list[str]:
    """The names vLLM's ``_quantized_layer_prefix_candidates`` tries for a module."""
    base = drafter_alias(module) or module
    cands = [base]
    for prefix_a, prefix_b in (
        ("model.language_model.", "language_model.model."),
        ("language_model.model.", "model.language_model."),
    ):
        if base.startswith(prefix_a):
            cands.append(prefix_b + base[len(prefix_a) :])
    if base.endswith(".lm_head"):
        cands.append("lm_head")
    return cands


def mixed_keys(layers: Mapping[str, Any], module: str) -> list[str]:
    """Every ``quantized_layers`` key that applies to ``module``, most specific first: an
    entry for the module itself, then for a parent (``...mlp.experts`` covers
    ``...mlp.experts.3.up_proj``) — vLLM's ``_resolve_quant_algo`` in checkpoint names."""
    cands = _mixed_candidates(module)
    keys = [c for c in cands if c in layers]
    for cand in cands:
        parts = cand.split(".")
        keys += [p for k in range(len(parts) - 1, 0, -1) if (p := ".".join(parts[:k])) in layers]
    return keys


def first_mixed_key(layers: Mapping[str, Any], module: str) -> str | None:
    """The most specific ``quantized_layers`` key for ``module`` (``mixed_keys(...)[0]``),
    found without building the others: one or two lookups for a module listed itself."""
    cands = _mixed_candidates(module)
    for cand in cands:
        if cand in layers:
            return cand
    for cand in cands:
        parts = cand.split(".")
        for k in range(len(parts) - 1, 0, -1):
            if (parent := ".".join(parts[:k])) in layers:
                return parent
    return None


def _ct_name_matches(target: str, module: str) -> bool:
    """A layer-name target (exact or ``re:``) against the names vLLM may see for ``module``
    (a drafter module is built under ``mtp.``, whatever prefix it is stored with; a routed
    expert is looked up by its expert-0 name, `match.ct_expert_name`)."""
    names = {ct_expert_name(module), ct_expert_name(drafter_alias(module) or module)}
    if target.startswith("re:"):
        try:
            pattern = re.compile(target[3:])
        except re.error:
            return False
        return any(pattern.match(n) is not None for n in names)
    return target in names


def _ct_class_matches(target: str, module: str) -> bool:
    # class-name target: every layer whose vLLM class contains "Linear" (routers included),
    # not an LM head (ParallelLMHead), an embedding or a norm
    leaf = module.rsplit(".", 1)[-1]
    return target == "Linear" and leaf not in _HEAD_LEAVES and leaf != "embed_tokens" and "norm" not in leaf


def ct_group_algorithm(groups: list[tuple[list[str], str]], module: str) -> str | None:
    """The algorithm of the config group that claims ``module``, as vLLM's
    ``find_matched_target`` picks it: a layer-name or ``re:`` target of any group first, in
    file order, then a class-name target (``Linear``); None when no group claims it."""
    for targets, algo in groups:
        if any(_ct_name_matches(t, module) for t in targets):
            return algo
    for targets, algo in groups:
        if any(_ct_class_matches(t, module) for t in targets):
            return algo
    return None


def declared_algorithm(decl: DeclaredQuant, module: str) -> str | None:
    """The algorithm ``decl`` declares for ``module`` ("NVFP4", "FP8", ...); None = unquantized."""
    if decl.method == NO_QUANT:
        return None
    if decl.matcher().excludes(module):
        return None
    if decl.method == methods.MODELOPT:
        if any(marker in module for marker in VISION_MARKERS):
            return None
        if decl.algo == methods.MIXED_PRECISION:
            layers = decl.quantized_layers or {}
            key = first_mixed_key(layers, module)
            return None if key is None else layers[key]
        return decl.algo
    if decl.method == methods.COMPRESSED_TENSORS:
        return ct_group_algorithm(decl.groups, module)
    return decl.algo or decl.method.upper()


def storage_format_of_algorithm(algo: str | None) -> StorageFormat | None:
    """The storage format an algorithm implies (NVFP4, MXFP4, FP8, INT); None when unknown or
    unquantized."""
    if algo is None:
        return None
    a = algo.upper()
    if a in _NVFP4_ALGOS:
        return StorageFormat.NVFP4
    if a == methods.MXFP4:
        return StorageFormat.MXFP4
    if a.startswith(methods.FP8):
        return StorageFormat.FP8
    if _CT_INT.fullmatch(a):
        return StorageFormat.INT
    return None


def quantized_anywhere(decls: list[DeclaredQuant], module: str) -> bool:
    """Whether any of the declarations declares ``module`` quantized."""
    return any(declared_algorithm(d, module) is not None for d in decls)
