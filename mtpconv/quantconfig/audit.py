"""The audit: what the quant configs declare against how each module is stored.

Stable finding codes of `audit_quant_configs`:

- ``plain-declared-quantized``: stored plain, declared quantized (the mtp.fc gap): error;
  warning for Qwen MoE router gates, which vLLM never quantizes
- ``quantized-declared-plain``: stored NVFP4/MXFP4/INT/FP8, excluded or not declared quantized: error
- ``quant-format-mismatch``: stored in one format but declared another (NVFP4 vs FP8 ...): error
- ``quant-configs-disagree``: config.json vs hf_quant_config.json differ (names the keys): warning
- ``unused-exclusion``: an exclusion pattern matches no module: info
- ``quant-config-invalid``: a config cannot be read (malformed keys): error
- ``quant-method-unsupported``: a quant_method whose exclusions mtpconv cannot audit: warning
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from mtpconv.errors import QuantConfigError
from mtpconv.families.types import ROUTER_GATE_LEAVES
from mtpconv.findings import Finding, Severity
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.declarations import (
    NO_QUANT,
    DeclaredQuant,
    StorageFormat,
    all_declarations,
    declared_algorithm,
    storage_format_of_algorithm,
)
from mtpconv.quantconfig.documents import HF_QUANT_JSON, QuantConfigs
from mtpconv.quantconfig.match import ModuleSet

CODE_PLAIN_DECLARED_QUANTIZED = "plain-declared-quantized"
CODE_QUANTIZED_DECLARED_PLAIN = "quantized-declared-plain"
CODE_FORMAT_MISMATCH = "quant-format-mismatch"
CODE_CONFIGS_DISAGREE = "quant-configs-disagree"
CODE_UNUSED_EXCLUSION = "unused-exclusion"
CODE_CONFIG_INVALID = "quant-config-invalid"
CODE_METHOD_UNSUPPORTED = "quant-method-unsupported"

# Router gates: vLLM's Qwen3-Next / Qwen3.5 MoE blocks build them with no quant config.
_ROUTER_GATES = tuple(f".mlp.{leaf}" for leaf in ROUTER_GATE_LEAVES)
_SUPPORTED_METHODS = (methods.MODELOPT, methods.COMPRESSED_TENSORS, methods.FP8_METHOD, NO_QUANT)
_QUANTIZED = (StorageFormat.NVFP4, StorageFormat.MXFP4, StorageFormat.INT, StorageFormat.FP8)


def _disagreements(a: DeclaredQuant, b: DeclaredQuant) -> list[str]:
    keys: list[str] = []
    if a.method != b.method:
        keys.append("quant_method")
    if a.algo != b.algo:
        keys.append("quant_algo")
    if set(a.exclude) != set(b.exclude):
        keys.append("ignore / exclude_modules")
    if a.kv_cache_algo != b.kv_cache_algo:
        keys.append("kv_cache_scheme / kv_cache_quant_algo")
    if (a.quantized_layers or {}) != (b.quantized_layers or {}):
        keys.append("quantized_layers")
    return keys


def _vllm_consequence_plain(module: str, algo: str) -> str:
    fails = (
        f"vLLM will build an {algo} layer for it and fail to load the unquantized weight "
        "(shape/dtype mismatch)"
    )
    if module.endswith("mtp.fc") and storage_format_of_algorithm(algo) is StorageFormat.NVFP4:
        return (
            "vLLM 0.32 loads it only through a hard-coded exception for Qwen3.5/Qwen3-Next "
            f"mtp.fc under NVFP4; without that exception (other versions, runtimes or quant "
            f"algos) {fails}"
        )
    return fails


def _plain_declared(module: str, algo: str, where: str) -> Finding:
    router = module.endswith(_ROUTER_GATES)
    consequence = (
        "vLLM 0.32 builds Qwen MoE router gates without quantization, so it loads, "
        "but other runtimes follow the config"
        if router
        else _vllm_consequence_plain(module, algo)
    )
    return Finding(
        Severity.WARNING if router else Severity.ERROR,
        CODE_PLAIN_DECLARED_QUANTIZED,
        module,
        f"{module} is stored unquantized but {where} declares it {algo}: "
        f"{consequence}. Run `mtpconv fix-exclusions` to exclude it in both config files.",
    )


def _quantized_declared_plain(
    decl: DeclaredQuant, module: str, kind: str, where: str, drafter: set[str]
) -> Finding:
    matched = decl.matcher().matching(module) if decl.method != NO_QUANT else []
    why = f"excluded by {', '.join(repr(p) for p in matched)}" if matched else "not declared quantized"
    extra = (
        " An mtpconv -mtpfp8 drafter needs the mtpconv vLLM plugin."
        if module in drafter and kind == StorageFormat.FP8
        else ""
    )
    return Finding(
        Severity.ERROR,
        CODE_QUANTIZED_DECLARED_PLAIN,
        module,
        f"{module} is stored {kind.upper()} but {where} has it {why}: stock vLLM will "
        f"build an unquantized layer and fail to load (or misread) the packed weight.{extra}",
    )


def audit_quant_configs(
    configs: QuantConfigs,
    stored: Mapping[str, str],
    drafter_modules: Collection[str],
    *,
    all_modules: Collection[str] = (),
    plugin_drafter: bool = False,
) -> list[Finding]:
    """Compare what the configs declare with what the tensors are.

    ``stored`` maps every linear-ish module to a `StorageFormat` value ("nvfp4" | "mxfp4" |
    "int" | "fp8" | "plain"). ``all_modules`` (optional) widens the set used to decide whether an exclusion
    pattern matches anything. ``plugin_drafter``: the checkpoint is an mtpconv variant whose
    FP8 drafter is served by the mtpconv plugin, so drafter modules stored FP8 and excluded
    are expected. A config that cannot be read becomes a finding, never an exception.
    """
    try:
        decls = all_declarations(configs)
    except QuantConfigError as exc:
        return [Finding(Severity.ERROR, CODE_CONFIG_INVALID, "", str(exc))]
    decl = decls[0] if decls else DeclaredQuant(NO_QUANT, None, [], None, None, "")
    if decl.method not in _SUPPORTED_METHODS:
        return [
            Finding(
                Severity.WARNING,
                CODE_METHOD_UNSUPPORTED,
                "",
                f"{decl.source} declares quant_method {decl.method!r}; mtpconv cannot audit its "
                "exclusions, so no per-module check was made.",
            )
        ]
    findings: list[Finding] = []
    drafter = set(drafter_modules)
    where = decl.source or "no quantization config"
    for module in sorted(stored):
        kind = stored[module]
        try:
            algo = declared_algorithm(decl, module)
        except QuantConfigError as exc:
            return [Finding(Severity.ERROR, CODE_CONFIG_INVALID, "", str(exc))]
        fmt = storage_format_of_algorithm(algo)
        if kind == StorageFormat.PLAIN and algo is not None:
            findings.append(_plain_declared(module, algo, where))
        elif kind in _QUANTIZED and algo is None:
            if plugin_drafter and module in drafter and kind == StorageFormat.FP8:
                continue
            findings.append(_quantized_declared_plain(decl, module, kind, where, drafter))
        elif kind in _QUANTIZED and fmt is not None and fmt != kind:
            findings.append(
                Finding(
                    Severity.ERROR,
                    CODE_FORMAT_MISMATCH,
                    module,
                    f"{module} is stored {kind.upper()} but {where} declares it {algo}: vLLM will "
                    "create the wrong weight layout and fail to load it.",
                )
            )
    if len(decls) == 2:
        keys = _disagreements(decls[0], decls[1])
        if keys:
            findings.append(
                Finding(
                    Severity.WARNING,
                    CODE_CONFIGS_DISAGREE,
                    "",
                    f"{decls[0].source} and {HF_QUANT_JSON} disagree on {', '.join(keys)}; vLLM "
                    f"reads {decls[0].source}, other tools may read {HF_QUANT_JSON}.",
                )
            )
    if decl.method != NO_QUANT:
        universe = ModuleSet(dict.fromkeys([*stored, *all_modules]))
        for pattern in decl.matcher().unused(universe):
            findings.append(
                Finding(
                    Severity.INFO,
                    CODE_UNUSED_EXCLUSION,
                    "",
                    f"exclusion {pattern!r} in {decl.source} matches no module of this checkpoint.",
                )
            )
    return findings
