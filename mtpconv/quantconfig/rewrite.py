"""Rewrite both quant-config documents, and say what the rewrite added.

Generated patterns are exact names of non-expert modules or subtree patterns ``P*`` on a
parent path (``.layers.*.`` wildcards only where no fused shard is singled out), each
verified against every module that must keep its declaration. Both files are always
changed consistently; every other key, value and order is kept.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from mtpconv.errors import QuantConfigError
from mtpconv.jsonio import copy_json
from mtpconv.layouts import is_linear_module
from mtpconv.names import drafter_alias
from mtpconv.quantconfig import compressed_tensors as ct
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.declarations import (
    DeclaredQuant,
    StorageFormat,
    all_declarations,
    declared_algorithm,
    flat_modelopt_exclusion_key,
    mixed_keys,
    quantized_anywhere,
)
from mtpconv.quantconfig.documents import CONFIG_JSON, HF_QUANT_JSON, QuantConfigs, quant_location
from mtpconv.quantconfig.match import FUSED_INTO, ExclusionPattern, ModuleSet, vllm_view


@dataclass(frozen=True)
class ExclusionEdit:
    """Patterns appended to one exclusion list."""

    document: str  # "config.json" | "hf_quant_config.json"
    key: str  # the list's key path in that document, e.g. "text_config.quantization_config.ignore"
    added: tuple[str, ...]


@dataclass
class RewrittenConfigs:
    """The new documents and what the rewrite changed in them (so no caller diffs JSON)."""

    hf_quant: dict[str, Any] | None
    config: dict[str, Any]
    excluded_modules: list[str] = field(default_factory=list)  # declared quantized before, not now
    patterns: list[str] = field(default_factory=list)  # every pattern appended, in order
    edits: list[ExclusionEdit] = field(default_factory=list)  # where each was appended
    dropped_layers: list[str] = field(default_factory=list)  # MIXED_PRECISION keys removed
    drafter_group: ct.DrafterDeclaration | None = None  # compressed-tensors: the FP8 drafter group

    @property
    def documents(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """``(hf_quant_config, config)``."""
        return self.hf_quant, self.config

    @property
    def changed(self) -> bool:
        """Whether either document differs from its input."""
        return bool(self.edits or self.dropped_layers or self.drafter_group)

    def as_configs(self) -> QuantConfigs:
        """The new documents as a `QuantConfigs` (no paths: not written yet)."""
        return QuantConfigs(self.config, self.hf_quant)


def _candidates(module: str, method: str) -> list[str]:
    """Patterns that could exclude ``module`` safely in vLLM, most general first."""
    name = drafter_alias(module) or module
    parts = name.split(".")
    leaf = parts[-1]
    expert_at = parts.index("experts") if "experts" in parts[:-1] else None
    if method == methods.COMPRESSED_TENSORS:
        # Exact names only. vLLM's compressed-tensors MoE method decides a routed-experts
        # layer by expert 0's projections (`match.vllm_view`): one entry per projection.
        return [vllm_view(module, method)[0]]
    if method == methods.FP8_METHOD:
        # Exact names only; routed experts are one vLLM layer named "...experts".
        if expert_at is not None:
            return [".".join(parts[: expert_at + 1])]
        return [name]
    out: list[str] = []
    deepest = len(parts) - 1 if expert_at is None else expert_at + 1
    for k in range(1, deepest + 1):
        prefix = ".".join(parts[:k])
        out.append(prefix + "*")
        generic = re.sub(r"\.layers\.\d+(?=\.|$)", ".layers.*", prefix)
        if generic != prefix:
            out.append(generic + "*")
    if expert_at is None:
        out.append(name)  # exact: vLLM expands fused layers to their shards for these
        generic = re.sub(r"\.layers\.\d+\.", ".layers.*.", name)
        if generic != name and leaf not in FUSED_INTO:  # a glob never sees shard names
            out.append(generic)
    return out


def _minimal_patterns(targets: Collection[str], forbidden: Collection[str], method: str) -> list[str]:
    """A small set of patterns that together match every target and no forbidden module.

    Greedy set cover over the candidates of `_candidates`, each verified against every
    forbidden module with the matcher's own rule (`ExclusionPattern.matches_any`).
    """
    todo = list(dict.fromkeys(targets))
    if not todo:
        return []
    compiled: dict[str, ExclusionPattern] = {}
    for module in todo:
        for cand in _candidates(module, method):
            compiled.setdefault(cand, ExclusionPattern(cand, method, "generated"))
    cover = {c: {m for m in todo if pat.matches(m)} for c, pat in compiled.items()}
    forbidden_set = ModuleSet(forbidden)
    unsafe: set[str] = set()
    chosen: list[str] = []
    left = set(todo)
    while left:
        ranked = sorted(
            (c for c in cover if c not in unsafe and cover[c] & left),
            # Most targets first; among equals the most specific pattern (deepest path,
            # exact before subtree), so a single module gets its own name, not a subtree.
            key=lambda c: (-len(cover[c] & left), -c.count("."), c.endswith("*"), len(c), c),
        )
        pick = None
        for cand in ranked:
            if compiled[cand].matches_any(forbidden_set):
                unsafe.add(cand)
                continue
            pick = cand
            break
        if pick is None:
            stuck = sorted(left)[0]
            raise QuantConfigError(
                f"no exclusion pattern excludes {stuck} without also excluding a module that "
                "must stay quantized; fix the exclusion list by hand."
            )
        chosen.append(pick)
        left -= cover[pick]
    return chosen


@dataclass
class _ExclusionList:
    document: str
    keys: tuple[str, ...]
    items: list[str]  # the list inside the document (edited in place)


def _ensure_list(container: dict[str, Any], key: str, where: str) -> list[str]:
    value = container.get(key)
    if value is None:
        value = []
        container[key] = value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"{where} key {key!r} must be a list of strings.")
    return value


def _exclusion_lists(
    hf_quant: dict[str, Any] | None, config: dict[str, Any], method: str
) -> list[_ExclusionList]:
    """The (mutable) exclusion lists of both documents, created where missing."""
    lists: list[_ExclusionList] = []
    loc = quant_location(config)
    if loc is not None:
        qc, source = loc.body, loc.source
        if method == methods.MODELOPT and isinstance(qc.get("quantization"), dict):
            lists.append(
                _ExclusionList(
                    CONFIG_JSON,
                    (*loc.keys, "quantization", "exclude_modules"),
                    _ensure_list(qc["quantization"], "exclude_modules", source),
                )
            )
        else:
            key = "ignore"
            if method == methods.FP8_METHOD:
                keep = qc.get("ignored_layers") or not qc.get("modules_to_not_convert")
                key = "ignored_layers" if keep else "modules_to_not_convert"
            elif method == methods.MODELOPT and (listed := flat_modelopt_exclusion_key(qc)) != key:
                # The export listed them as exclude_modules: carry them into ignore, which every
                # vLLM reads first (a new ignore list alone would hide them from vLLM 0.33).
                qc[key] = list(_ensure_list(qc, listed, source))
            lists.append(_ExclusionList(CONFIG_JSON, (*loc.keys, key), _ensure_list(qc, key, source)))
    if hf_quant is not None:
        q = hf_quant.get("quantization")
        if not isinstance(q, dict):
            raise QuantConfigError(f"{HF_QUANT_JSON} has no 'quantization' object.")
        lists.append(
            _ExclusionList(
                HF_QUANT_JSON,
                ("quantization", "exclude_modules"),
                _ensure_list(q, "exclude_modules", HF_QUANT_JSON),
            )
        )
    return lists


def _decls_of(hf_quant: dict[str, Any] | None, config: dict[str, Any]) -> list[DeclaredQuant]:
    return all_declarations(QuantConfigs(config=config, hf_quant=hf_quant))


def _add_exclusions(out: RewrittenConfigs, targets: Collection[str], forbidden: Collection[str]) -> None:
    """Append minimal patterns excluding ``targets`` (and no ``forbidden``) to both files,
    recording each appended pattern in ``out``."""
    decls = _decls_of(out.hf_quant, out.config)
    need = [m for m in targets if quantized_anywhere(decls, m)]
    if not need:
        return
    in_play = {d.method for d in decls}
    if not in_play <= {methods.MODELOPT, methods.COMPRESSED_TENSORS, methods.FP8_METHOD}:
        raise QuantConfigError(
            f"cannot rewrite exclusions of quant_method {sorted(in_play)}; only ModelOpt, "
            "compressed-tensors and fp8 configs are supported."
        )
    # Generate for the strictest rule in play (exact-only beats glob).
    method = methods.MODELOPT if in_play == {methods.MODELOPT} else sorted(in_play - {methods.MODELOPT})[0]
    patterns = _minimal_patterns(need, forbidden, method)
    for lst in _exclusion_lists(out.hf_quant, out.config, decls[0].method):
        added = [p for p in patterns if p not in lst.items]
        lst.items.extend(added)
        if added:
            out.edits.append(ExclusionEdit(lst.document, ".".join(lst.keys), tuple(added)))
            out.patterns += [p for p in added if p not in out.patterns]
    after = _decls_of(out.hf_quant, out.config)
    still = [m for m in need if quantized_anywhere(after, m)]
    if still:
        raise QuantConfigError(
            f"could not exclude {still[0]} with the generated patterns {patterns}; "
            "fix the exclusion list by hand."
        )


def _copy_docs(configs: QuantConfigs) -> RewrittenConfigs:
    if not isinstance(configs.config, dict):
        raise QuantConfigError("config.json must hold a JSON object.")
    if configs.hf_quant is not None and not isinstance(configs.hf_quant, dict):
        raise QuantConfigError(f"{HF_QUANT_JSON} must hold a JSON object.")
    return RewrittenConfigs(copy_json(configs.hf_quant), copy_json(configs.config))


def _drop_drafter_layers(out: RewrittenConfigs, drafter: set[str], others: set[str]) -> None:
    """MIXED_PRECISION: remove quantized_layers entries that cover only drafter modules."""

    def prune(layers: Any) -> list[str]:
        if not isinstance(layers, dict):
            return []
        mine = {k for m in drafter for k in mixed_keys(layers, m)}
        theirs = {k for m in others for k in mixed_keys(layers, m)}
        gone = [k for k in layers if k in mine and k not in theirs]
        for k in gone:
            del layers[k]
        out.dropped_layers += [k for k in gone if k not in out.dropped_layers]
        return gone

    loc = quant_location(out.config)
    if loc is not None:
        qc = loc.body
        body = qc["quantization"] if isinstance(qc.get("quantization"), dict) else qc
        gone = set(prune(body.get("quantized_layers")))
        groups = qc.get("config_groups")
        if gone and isinstance(groups, dict):
            for name in list(groups):
                group = groups[name]
                targets = group.get("targets") if isinstance(group, dict) else None
                if isinstance(targets, list) and any(t in gone for t in targets):
                    group["targets"] = [t for t in targets if t not in gone]
                    if not group["targets"]:
                        del groups[name]
    if out.hf_quant is not None and isinstance(out.hf_quant.get("quantization"), dict):
        prune(out.hf_quant["quantization"].get("quantized_layers"))


def variant_configs(
    configs: QuantConfigs,
    drafter_modules: Collection[str],
    all_modules: Collection[str],
    *,
    fp8_linears: Collection[str] | None = None,
) -> RewrittenConfigs:
    """New documents for the -mtpfp8 variant, and what changed.

    The whole drafter is declared unquantized by the target's config (MIXED_PRECISION:
    drafter entries leave ``quantized_layers``; otherwise minimal exclusion patterns are
    appended to both files), no other module changes declaration, every other key, value
    and order is kept. ``all_modules`` is every module of the checkpoint (target and
    drafter); generated patterns are verified against it. A source without a quant config
    comes back unchanged (no ``quantization_config`` is added). A compressed-tensors source
    instead gets a config group declaring ``fp8_linears`` (default: the drafter modules
    named like linears) FP8 (`compressed_tensors.declare_drafter_fp8`).
    """
    out = _copy_docs(configs)
    decls = _decls_of(out.hf_quant, out.config)
    if not decls:
        return out
    if ct.declares_compressed_tensors(out.as_configs()):
        fp8 = sorted(fp8_linears if fp8_linears is not None else filter(is_linear_module, drafter_modules))
        if fp8:
            out.drafter_group = ct.declare_drafter_fp8(out.config, fp8, {*all_modules, *drafter_modules})
        return out
    drafter = set(drafter_modules)
    others = {m for m in all_modules if m not in drafter}
    before = {m: [declared_algorithm(d, m) for d in decls] for m in others}
    if any(d.algo == methods.MIXED_PRECISION for d in decls):
        _drop_drafter_layers(out, drafter, others)
    pruned = _decls_of(out.hf_quant, out.config)
    forbidden = {m for m in others if quantized_anywhere(pruned, m)}
    _add_exclusions(out, sorted(drafter), forbidden)
    after_decls = _decls_of(out.hf_quant, out.config)
    for m in sorted(others):
        if [declared_algorithm(d, m) for d in after_decls] != before[m]:
            raise QuantConfigError(
                f"rewriting the exclusions would change how {m} is declared; fix the exclusion list by hand."
            )
    out.excluded_modules = sorted(m for m in drafter if quantized_anywhere(decls, m))
    return out


def fixed_exclusion_configs(configs: QuantConfigs, stored: Mapping[str, str]) -> RewrittenConfigs:
    """Only the exclusion fix, and what it added.

    Every module stored plain but declared quantized becomes excluded in both files
    (minimal patterns verified against ``stored``); nothing else changes.
    """
    out = _copy_docs(configs)
    decls = _decls_of(out.hf_quant, out.config)
    if not decls:
        return out
    targets = [
        m for m, kind in stored.items() if kind == StorageFormat.PLAIN and quantized_anywhere(decls, m)
    ]
    if not targets:
        return out
    tset = set(targets)
    forbidden = {m for m in stored if m not in tset and quantized_anywhere(decls, m)}
    _add_exclusions(out, targets, forbidden)
    out.excluded_modules = sorted(targets)
    return out
