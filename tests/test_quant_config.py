"""quant_config: loading, declarations, vLLM's exclusion rule, audit findings, rewrites."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mtpconv.errors import QuantConfigError
from mtpconv.findings import Severity
from mtpconv.jsonio import dumps_json
from mtpconv.quant_config import (
    CODE_CONFIG_INVALID,
    CODE_CONFIGS_DISAGREE,
    CODE_FORMAT_MISMATCH,
    CODE_METHOD_UNSUPPORTED,
    CODE_PLAIN_DECLARED_QUANTIZED,
    CODE_QUANTIZED_DECLARED_PLAIN,
    CODE_UNUSED_EXCLUSION,
    QuantConfigs,
    audit_quant_configs,
    declared_format,
    declared_quant,
    fixed_exclusion_configs,
    load_quant_configs,
    pattern_matches,
    variant_configs,
)
from tests.quant_config_samples import (
    VLM,
    compressed_tensors_nvfp4_config,
    fp8_block_config,
    modelopt_fp8_configs,
    modelopt_mixed_configs,
    modelopt_nvfp4_configs,
    nvidia_qwen35_exclude,
    nvidia_stored_formats,
    qwen35_moe_config,
    qwen35_moe_drafter_modules,
    qwen35_moe_modules,
)

# --------------------------------------------------------------------------- helpers


def nvfp4_gap(*, vlm: bool = True, mtp_prefix: str = "", router_gates: bool = True) -> tuple[
        QuantConfigs, list[str], list[str], dict[str, str]]:  # fmt: skip
    """NVIDIA-shaped NVFP4 Qwen3.5-MoE configs with the mtp.fc gap, plus its modules."""
    prefix = VLM if vlm else "model."
    exclude = nvidia_qwen35_exclude(prefix, router_gates=router_gates, vision=vlm)
    hq, qc = modelopt_nvfp4_configs(exclude, prefix)
    configs = QuantConfigs(qwen35_moe_config(qc, vlm=vlm), hq)
    modules = qwen35_moe_modules(prefix, mtp_prefix=mtp_prefix, vision=vlm)
    drafter = qwen35_moe_drafter_modules(mtp_prefix)
    return configs, modules, drafter, nvidia_stored_formats(modules)


def excludes(hq: dict[str, Any] | None, cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    assert hq is not None
    return hq["quantization"]["exclude_modules"], cfg["quantization_config"]["ignore"]


def key_paths(doc: Any, path: str = "") -> list[str]:
    """Every key path of a JSON document, in order (lists by index)."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append(f"{path}/{k}")
            out += key_paths(v, f"{path}/{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += key_paths(v, f"{path}[{i}]")
    return out


def without(doc: dict[str, Any], *paths: tuple[str, ...]) -> dict[str, Any]:
    """A deep copy of ``doc`` with the values at ``paths`` removed (to compare the rest)."""
    out = copy.deepcopy(doc)
    for path in paths:
        node = out
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    return out


# --------------------------------------------------------------------------- loading


def test_load_both_files_keeps_key_order(tmp_path: Path) -> None:
    hq, qc = modelopt_nvfp4_configs()
    cfg = qwen35_moe_config(qc)
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hq))
    loaded = load_quant_configs(tmp_path)
    assert loaded.config == cfg and list(loaded.config) == list(cfg)
    assert key_paths(loaded.config) == key_paths(cfg)
    assert loaded.hf_quant == hq
    assert loaded.config_path == tmp_path / "config.json"
    assert loaded.hf_quant_path == tmp_path / "hf_quant_config.json"


def test_load_without_hf_quant(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(qwen35_moe_config()))
    loaded = load_quant_configs(tmp_path)
    assert loaded.hf_quant is None and loaded.hf_quant_path is None


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("config.json", "{not json", "not valid JSON"),
        ("config.json", "[1, 2]", "JSON object"),
        ("hf_quant_config.json", '{"a": ', "not valid JSON"),
        ("hf_quant_config.json", '"text"', "JSON object"),
    ],
)
def test_load_bad_json_names_the_file(tmp_path: Path, name: str, text: str, needle: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_text(text)
    with pytest.raises(QuantConfigError, match=needle) as info:
        load_quant_configs(tmp_path)
    assert name in str(info.value)


def test_load_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(QuantConfigError, match="config.json is missing"):
        load_quant_configs(tmp_path)


def test_load_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(QuantConfigError, match="config.json"):
        load_quant_configs(tmp_path)


def test_dumps_config_format() -> None:
    doc = {"b": 1, "a": {"z": [1, 2], "é": "ü"}}
    text = dumps_json(doc)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    assert list(json.loads(text)) == ["b", "a"]


# ---------------------------------------------------------------------- declarations


def test_declared_nvfp4_reads_config_json_first() -> None:
    configs, *_ = nvfp4_gap()
    decl = declared_quant(configs)
    assert (decl.method, decl.algo, decl.kv_cache_algo, decl.source) == (
        "modelopt", "NVFP4", "FP8", "config.json")  # fmt: skip
    assert decl.exclude[-1] == "mtp.layers.0*" and decl.quantized_layers is None


def test_declared_falls_back_to_hf_quant() -> None:
    hq, _ = modelopt_nvfp4_configs()
    decl = declared_quant(QuantConfigs(qwen35_moe_config(None), hq))
    assert (decl.method, decl.algo, decl.source) == ("modelopt", "NVFP4", "hf_quant_config.json")


def test_declared_in_text_config() -> None:
    _, qc = modelopt_fp8_configs()
    cfg = qwen35_moe_config(None)
    cfg["text_config"]["quantization_config"] = qc
    decl = declared_quant(QuantConfigs(cfg, None))
    assert (decl.algo, decl.source) == ("FP8", "config.json (text_config)")
    assert declared_format(decl, "model.language_model.layers.3.self_attn.q_proj") == "FP8"
    assert declared_format(decl, "lm_head") is None


def test_declared_bf16_is_none() -> None:
    decl = declared_quant(QuantConfigs(qwen35_moe_config(None), None))
    assert decl.method == "none" and decl.algo is None
    assert declared_format(decl, "mtp.fc") is None


def test_declared_mixed_precision() -> None:
    layers = {f"{VLM}layers.0.mlp.experts": "NVFP4", f"{VLM}layers.3.self_attn.q_proj": "FP8",
              "lm_head": "FP8"}  # fmt: skip
    hq, qc = modelopt_mixed_configs(layers, ["mtp*", "mtp.layers.0*"])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert decl.algo == "MIXED_PRECISION"
    assert decl.quantized_layers == layers
    assert declared_format(decl, f"{VLM}layers.0.mlp.experts.3.up_proj") == "NVFP4"
    assert declared_format(decl, f"{VLM}layers.3.self_attn.q_proj") == "FP8"
    assert declared_format(decl, f"{VLM}layers.3.self_attn.k_proj") is None  # not listed
    assert declared_format(decl, "mtp.fc") is None
    # vLLM's own prefix form of a listed layer resolves too
    assert declared_format(decl, "language_model.model.layers.3.self_attn.q_proj") == "FP8"


def test_declared_mixed_quantized_layers_only_in_hf_quant() -> None:
    hq, qc = modelopt_mixed_configs({"lm_head": "FP8"})
    del qc["quantized_layers"]
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert decl.quantized_layers == {"lm_head": "FP8"}  # vLLM falls back to the file


def test_declared_compressed_tensors() -> None:
    qc = compressed_tensors_nvfp4_config()
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), None))
    assert (decl.method, decl.algo) == ("compressed-tensors", "NVFP4")
    assert declared_format(decl, f"{VLM}layers.0.mlp.experts.1.up_proj") == "NVFP4"
    assert declared_format(decl, f"{VLM}layers.0.mlp.gate") is None  # re:.*mlp.gate$
    assert declared_format(decl, f"{VLM}layers.0.linear_attn.out_proj") is None
    assert declared_format(decl, "lm_head") is None
    assert declared_format(decl, "mtp.fc") is None  # re:^mtp.*
    no_ignore = declared_quant(QuantConfigs(qwen35_moe_config(
        compressed_tensors_nvfp4_config([])), None))  # fmt: skip
    assert declared_format(no_ignore, "mtp.fc") == "NVFP4"
    assert declared_format(no_ignore, "lm_head") is None  # "Linear" targets no LM head


def test_declared_fp8_method_matches_exactly() -> None:
    qc = fp8_block_config(["lm_head", "mtp.fc"])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc, vlm=False), None))
    assert (decl.method, decl.algo) == ("fp8", "FP8")
    assert declared_format(decl, "mtp.fc") is None
    assert declared_format(decl, "mtp.draft_lm_head") == "FP8"  # exact, no substring
    assert declared_format(decl, "model.layers.0.mlp.experts.0.up_proj") == "FP8"


def test_declared_unknown_method() -> None:
    cfg = qwen35_moe_config({"quant_method": "gptq", "bits": 4})
    decl = declared_quant(QuantConfigs(cfg, None))
    assert decl.method == "gptq" and declared_format(decl, "lm_head") == "GPTQ"


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": "lm_head"},
        {"quant_method": "modelopt", "quant_algo": 4},
        {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": []},
        {"quant_method": 3},
        {"bits": 4},
    ],
)
def test_declared_bad_shapes_raise_quant_config_error(qc: dict[str, Any]) -> None:
    with pytest.raises(QuantConfigError):
        declared_quant(QuantConfigs(qwen35_moe_config(qc), None))


def test_declared_quantization_config_not_object() -> None:
    cfg = qwen35_moe_config(None)
    cfg["quantization_config"] = ["x"]
    with pytest.raises(QuantConfigError, match="quantization_config"):
        declared_quant(QuantConfigs(cfg, None))


# -------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("pattern", "module", "expected"),
    [
        # x* means x and x.*  (and, through substring, anything containing x)
        ("mtp.layers.0*", "mtp.layers.0.self_attn.q_proj", True),
        ("mtp.layers.0*", "mtp.layers.0", True),
        ("mtp.layers.0*", "mtp.fc", False),
        ("mtp.layers.1*", "mtp.layers.10.mlp.gate", True),  # substring, as vLLM
        ("mtp.*", "mtp.fc", True),  # ends in ".*": not split, plain fnmatch
        ("mtp.*", "mtp", False),
        # substring
        ("self_attn", f"{VLM}layers.3.self_attn.o_proj", True),
        ("lm_head", "lm_head", True),
        ("lm_head", "mtp.draft_lm_head", True),  # the trap
        ("mtp.fc", "mtp.fc_hidden", True),  # substring again
        # fnmatch
        (f"{VLM}layers.*.mlp.gate", f"{VLM}layers.17.mlp.gate", True),
        (f"{VLM}layers.*.mlp.gate", f"{VLM}layers.17.mlp.gate_proj", False),
        ("*.mlp.gate", f"{VLM}layers.0.mlp.gate", True),
        ("model.visual*", "model.visual.blocks.0.attn.qkv", True),
        ("layers.?.mlp.gate", "layers.3.mlp.gate", True),
        # a VLM-prefixed drafter is matched as vLLM's drafter names it: mtp.<rest>
        ("mtp.*", f"{VLM}mtp.fc", True),
        ("mtp.fc", f"{VLM}mtp.fc", True),
        (f"{VLM}layers.*", f"{VLM}mtp.layers.0.self_attn.q_proj", False),
        (f"{VLM}mtp.fc", f"{VLM}mtp.fc", False),  # vLLM maps the pattern, not the drafter
        # fused layers: globs see qkv_proj, exact patterns see the shard
        ("*.q_proj", f"{VLM}layers.3.self_attn.q_proj", False),
        (f"{VLM}layers.3.self_attn.q_proj", f"{VLM}layers.3.self_attn.q_proj", True),
        (f"{VLM}layers.3.self_attn.q_proj*", f"{VLM}layers.3.self_attn.q_proj", True),
        ("*.qkv_proj", f"{VLM}layers.3.self_attn.k_proj", True),
        ("in_proj_ba", f"{VLM}layers.0.linear_attn.in_proj_a", True),
        # routed experts are one vLLM layer
        # (vLLM's exact stage: an "experts" layer is skipped when its name is a substring
        # of any pattern containing "experts": one per-expert entry excludes all experts)
        ("mtp.layers.0.mlp.experts.0.up_proj", "mtp.layers.0.mlp.experts.1.up_proj", True),
        ("*.experts.0.up_proj", "mtp.layers.0.mlp.experts.1.up_proj", False),
        ("mtp.layers.0.mlp.experts", "mtp.layers.0.mlp.experts.0.up_proj", True),
        ("*.experts", "mtp.layers.0.mlp.experts.gate_up_proj", True),
    ],
)
def test_modelopt_matching(pattern: str, module: str, expected: bool) -> None:
    assert pattern_matches(pattern, module) is expected


@pytest.mark.parametrize(
    ("pattern", "module", "method", "expected"),
    [
        ("re:.*mlp.gate$", "model.layers.0.mlp.gate", "compressed-tensors", True),
        ("re:.*mlp.gate$", "model.layers.0.mlp.gate_proj", "compressed-tensors", False),
        ("lm_head", "mtp.draft_lm_head", "compressed-tensors", False),  # exact only
        ("lm_head", "lm_head", "compressed-tensors", True),
        ("mtp*", "mtp.fc", "compressed-tensors", False),  # no globbing
        ("lm_head", "mtp.draft_lm_head", "fp8", False),
    ],
)
def test_other_methods_matching(pattern: str, module: str, method: str, expected: bool) -> None:
    assert pattern_matches(pattern, module, method=method) is expected


def test_vision_tower_is_never_quantized_for_modelopt() -> None:
    hq, qc = modelopt_nvfp4_configs([])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert declared_format(decl, "model.vision_tower.blocks.0.qkv") is None
    assert declared_format(decl, "model.visual.blocks.0.attn.qkv") == "NVFP4"


def test_lm_head_exclusion_also_declares_draft_head_unquantized() -> None:
    configs, *_ = nvfp4_gap()
    decl = declared_quant(configs)
    assert declared_format(decl, "mtp.draft_lm_head") is None
    assert declared_format(decl, "mtp.fc") == "NVFP4"  # the gap


# ----------------------------------------------------------------------------- audit


@pytest.mark.parametrize(("vlm", "mtp_prefix"), [(True, ""), (False, ""), (True, VLM)])
def test_audit_finds_the_mtp_fc_gap(vlm: bool, mtp_prefix: str) -> None:
    configs, modules, drafter, stored = nvfp4_gap(vlm=vlm, mtp_prefix=mtp_prefix)
    findings = audit_quant_configs(configs, stored, drafter, all_modules=modules)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert [f.module for f in errors] == [f"{mtp_prefix}mtp.fc"]
    (gap,) = errors
    assert gap.code == CODE_PLAIN_DECLARED_QUANTIZED
    assert "NVFP4" in gap.message and "mtpconv fix-exclusions" in gap.message
    assert "hard-coded exception" in gap.message
    assert "vLLM will build an NVFP4 layer" in gap.message
    assert not [f for f in findings if f.code == CODE_CONFIGS_DISAGREE]


def test_audit_router_gates_are_warnings() -> None:
    configs, modules, drafter, stored = nvfp4_gap(router_gates=False)
    findings = audit_quant_configs(configs, stored, drafter)
    gates = [f for f in findings if f.module.endswith(".mlp.gate")]
    assert gates and all(f.severity is Severity.WARNING for f in gates)
    assert all(f.code == CODE_PLAIN_DECLARED_QUANTIZED for f in gates)


def test_audit_quantized_but_excluded() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    stored = dict(stored)
    stored["lm_head"] = "nvfp4"
    findings = audit_quant_configs(configs, stored, drafter)
    (f,) = [f for f in findings if f.code == CODE_QUANTIZED_DECLARED_PLAIN]
    assert f.module == "lm_head" and f.severity is Severity.ERROR
    assert "'lm_head'" in f.message  # names the pattern that excludes it


def test_audit_fp8_drafter_of_a_variant() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    hq, cfg = variant_configs(configs, drafter, modules)
    variant = QuantConfigs(cfg, hq)
    stored = {m: ("fp8" if m in drafter else k) for m, k in stored.items()}
    stock = audit_quant_configs(variant, stored, drafter)
    assert {f.module for f in stock if f.code == CODE_QUANTIZED_DECLARED_PLAIN} == set(drafter)
    assert all("mtpconv vLLM plugin" in f.message for f in stock
               if f.code == CODE_QUANTIZED_DECLARED_PLAIN)  # fmt: skip
    served = audit_quant_configs(variant, stored, drafter, plugin_drafter=True)
    assert not [f for f in served if f.severity is Severity.ERROR]


def test_audit_format_mismatch() -> None:
    hq, qc = modelopt_fp8_configs()
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    stored = {f"{VLM}layers.3.self_attn.q_proj": "nvfp4", f"{VLM}layers.3.self_attn.o_proj": "fp8"}
    findings = audit_quant_configs(configs, stored, [])
    (f,) = [f for f in findings if f.code != CODE_UNUSED_EXCLUSION]
    assert (f.code, f.module, f.severity) == (
        CODE_FORMAT_MISMATCH, f"{VLM}layers.3.self_attn.q_proj", Severity.ERROR)  # fmt: skip


def test_audit_files_disagree() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    assert configs.hf_quant is not None
    configs.hf_quant["quantization"]["exclude_modules"].append("mtp*")
    configs.hf_quant["quantization"]["kv_cache_quant_algo"] = None
    findings = audit_quant_configs(configs, stored, drafter)
    (f,) = [f for f in findings if f.code == CODE_CONFIGS_DISAGREE]
    assert f.severity is Severity.WARNING
    assert "exclude_modules" in f.message and "kv_cache" in f.message
    assert "quant_algo," not in f.message


def test_audit_unused_exclusions() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    assert configs.hf_quant is not None
    qc = configs.config["quantization_config"]
    qc["ignore"].append("model.language_model.layers.99*")
    findings = audit_quant_configs(configs, stored, drafter)
    unused = [f for f in findings if f.code == CODE_UNUSED_EXCLUSION]
    assert all(f.severity is Severity.INFO for f in unused)
    assert any("layers.99*" in f.message for f in unused)
    # conv1d is not in `stored` (not a linear) but is a module of the checkpoint
    assert any("conv1d" in f.message for f in unused)
    conv = [f"{VLM}layers.{i}.linear_attn.conv1d" for i in range(3)]
    findings = audit_quant_configs(configs, stored, drafter, all_modules=[*modules, *conv])
    assert not any("conv1d" in f.message for f in findings)


def test_audit_bf16_clean_and_stray_quantized() -> None:
    configs = QuantConfigs(qwen35_moe_config(None), None)
    modules = qwen35_moe_modules()
    stored = dict.fromkeys(modules, "plain")
    assert audit_quant_configs(configs, stored, qwen35_moe_drafter_modules()) == []
    stored["mtp.fc"] = "fp8"
    (f,) = audit_quant_configs(configs, stored, qwen35_moe_drafter_modules())
    assert (f.code, f.module) == (CODE_QUANTIZED_DECLARED_PLAIN, "mtp.fc")


def test_audit_compressed_tensors_and_unsupported() -> None:
    qc = compressed_tensors_nvfp4_config(["lm_head", "re:.*mlp.gate$"])
    configs = QuantConfigs(qwen35_moe_config(qc), None)
    stored = {"mtp.fc": "plain", "lm_head": "plain", f"{VLM}layers.0.mlp.gate": "plain"}
    findings = audit_quant_configs(configs, stored, ["mtp.fc"])
    assert [(f.code, f.module) for f in findings] == [(CODE_PLAIN_DECLARED_QUANTIZED, "mtp.fc")]
    gptq = QuantConfigs(qwen35_moe_config({"quant_method": "gptq"}), None)
    (f,) = audit_quant_configs(gptq, stored, [])
    assert f.code == CODE_METHOD_UNSUPPORTED


def test_audit_invalid_config_is_a_finding() -> None:
    cfg = qwen35_moe_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": 5})
    (f,) = audit_quant_configs(QuantConfigs(cfg, None), {"mtp.fc": "plain"}, [])
    assert (f.code, f.severity) == (CODE_CONFIG_INVALID, Severity.ERROR)


# ------------------------------------------------------------------------- rewriting


def assert_only_exclusions_changed(before: QuantConfigs, hq: dict[str, Any] | None,
                                   cfg: dict[str, Any]) -> None:  # fmt: skip
    """Every key and value outside the two exclusion lists is unchanged, in order."""
    assert before.hf_quant is not None and hq is not None
    assert key_paths(without(hq, ("quantization", "exclude_modules"))) == key_paths(
        without(before.hf_quant, ("quantization", "exclude_modules")))  # fmt: skip
    assert without(hq, ("quantization", "exclude_modules")) == without(
        before.hf_quant, ("quantization", "exclude_modules"))  # fmt: skip
    assert list(hq) == list(before.hf_quant) and list(hq["quantization"]) == list(
        before.hf_quant["quantization"])  # fmt: skip
    path = ("quantization_config", "ignore")
    assert key_paths(without(cfg, path)) == key_paths(without(before.config, path))
    assert without(cfg, path) == without(before.config, path)
    assert list(cfg["quantization_config"]) == list(before.config["quantization_config"])
    old_hq, old_cfg = excludes(before.hf_quant, before.config)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq[: len(old_hq)] == old_hq and new_cfg[: len(old_cfg)] == old_cfg  # appended


@pytest.mark.parametrize(("vlm", "mtp_prefix"), [(True, ""), (False, ""), (True, VLM)])
def test_variant_excludes_whole_drafter_minimally(vlm: bool, mtp_prefix: str) -> None:
    configs, modules, drafter, stored = nvfp4_gap(vlm=vlm, mtp_prefix=mtp_prefix)
    original = copy.deepcopy(configs)
    hq, cfg = variant_configs(configs, drafter, modules)
    assert configs.config == original.config and configs.hf_quant == original.hf_quant
    assert_only_exclusions_changed(configs, hq, cfg)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq == new_cfg  # both files say the same
    assert new_hq[len(excludes(original.hf_quant, original.config)[0]) :] == ["mtp.fc"]
    for decl in (declared_quant(QuantConfigs(cfg, hq)), declared_quant(QuantConfigs(cfg, None)),
                 declared_quant(QuantConfigs(qwen35_moe_config(None), hq))):  # fmt: skip
        assert all(declared_format(decl, m) is None for m in drafter)
        old = declared_quant(configs)
        for m in modules:
            if m not in drafter:
                assert declared_format(decl, m) == declared_format(old, m), m


def test_variant_without_existing_mtp_exclusion_uses_one_pattern() -> None:
    exclude = nvidia_qwen35_exclude(mtp=())
    hq, qc = modelopt_nvfp4_configs(exclude)
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    modules, drafter = qwen35_moe_modules(), qwen35_moe_drafter_modules()
    hq2, cfg2 = variant_configs(configs, drafter, modules)
    assert excludes(hq2, cfg2)[0][len(exclude) :] == ["mtp*"]


def test_variant_avoids_patterns_that_hit_target_modules() -> None:
    # a target module whose name contains "mtp" forbids the short "mtp*"
    exclude = ["lm_head"]
    hq, qc = modelopt_nvfp4_configs(exclude)
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    drafter = qwen35_moe_drafter_modules()
    modules = [*drafter, "model.language_model.layers.0.mlp.mtp_proj", "lm_head"]
    hq2, cfg2 = variant_configs(configs, drafter, modules)
    added = excludes(hq2, cfg2)[0][1:]
    assert "mtp*" not in added and added
    decl = declared_quant(QuantConfigs(cfg2, hq2))
    assert declared_format(decl, "model.language_model.layers.0.mlp.mtp_proj") == "NVFP4"
    assert all(declared_format(decl, m) is None for m in drafter)


def test_variant_is_idempotent_and_no_op_when_already_excluded() -> None:
    configs, modules, drafter, _ = nvfp4_gap()
    hq, cfg = variant_configs(configs, drafter, modules)
    again = variant_configs(QuantConfigs(cfg, hq), drafter, modules)
    assert again == (hq, cfg)
    assert dumps_json(again[1]) == dumps_json(cfg)


def test_variant_bf16_source_unchanged() -> None:
    cfg = qwen35_moe_config(None)
    hq, cfg2 = variant_configs(QuantConfigs(cfg, None), qwen35_moe_drafter_modules(),
                               qwen35_moe_modules())  # fmt: skip
    assert hq is None and cfg2 == cfg and "quantization_config" not in cfg2
    assert key_paths(cfg2) == key_paths(cfg)


def test_variant_mixed_precision_drops_drafter_layers() -> None:
    drafter = qwen35_moe_drafter_modules()
    layers = {f"{VLM}layers.0.mlp.experts": "NVFP4", f"{VLM}layers.3.self_attn.q_proj": "FP8",
              "mtp.layers.0.mlp.experts": "NVFP4", "mtp.fc": "FP8", "lm_head": "FP8"}  # fmt: skip
    hq, qc = modelopt_mixed_configs(layers, ["model.visual*"])
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    modules = qwen35_moe_modules()
    hq2, cfg2 = variant_configs(configs, drafter, modules)
    assert hq2 is not None
    kept = [k for k in layers if not k.startswith("mtp.")]
    assert list(hq2["quantization"]["quantized_layers"]) == kept
    assert list(cfg2["quantization_config"]["quantized_layers"]) == kept
    targets = [t for g in cfg2["quantization_config"]["config_groups"].values()
               for t in g["targets"]]  # fmt: skip
    assert sorted(targets) == sorted(kept)
    # nothing else needed: exclusions untouched
    assert excludes(hq2, cfg2) == (["model.visual*"], ["model.visual*"])
    decl = declared_quant(QuantConfigs(cfg2, hq2))
    assert all(declared_format(decl, m) is None for m in drafter)
    assert declared_format(decl, f"{VLM}layers.0.mlp.experts.2.down_proj") == "NVFP4"
    assert variant_configs(QuantConfigs(cfg2, hq2), drafter, modules) == (hq2, cfg2)


def test_variant_compressed_tensors_adds_exact_names() -> None:
    qc = compressed_tensors_nvfp4_config(["lm_head"])
    configs = QuantConfigs(qwen35_moe_config(qc), None)
    drafter, modules = qwen35_moe_drafter_modules(), qwen35_moe_modules()
    hq, cfg = variant_configs(configs, drafter, modules)
    assert hq is None
    ignore = cfg["quantization_config"]["ignore"]
    assert ignore[0] == "lm_head" and "mtp.fc" in ignore
    assert "mtp.layers.0.mlp.experts" in ignore  # one vLLM layer for the routed experts
    decl = declared_quant(QuantConfigs(cfg, None))
    assert all(declared_format(decl, m) is None for m in drafter)


def test_fix_exclusions_only_adds_what_is_stored_plain() -> None:
    configs, modules, drafter, stored = nvfp4_gap(router_gates=False)
    original = copy.deepcopy(configs)
    hq, cfg = fixed_exclusion_configs(configs, stored)
    assert configs.config == original.config
    assert_only_exclusions_changed(configs, hq, cfg)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq == new_cfg
    added = new_hq[len(excludes(original.hf_quant, original.config)[0]) :]
    assert added == [f"{VLM}layers.*.mlp.gate", f"{VLM}layers.*.mlp.shared_expert_gate", "mtp.fc"]
    fixed = QuantConfigs(cfg, hq)
    assert not [f for f in audit_quant_configs(fixed, stored, drafter)
                if f.code == CODE_PLAIN_DECLARED_QUANTIZED]  # fmt: skip
    old, new = declared_quant(configs), declared_quant(fixed)
    for m, kind in stored.items():
        if kind != "plain":
            assert declared_format(new, m) == declared_format(old, m)
    assert fixed_exclusion_configs(fixed, stored) == (hq, cfg)  # idempotent


def test_fix_exclusions_nothing_to_do_returns_copies() -> None:
    configs = QuantConfigs(qwen35_moe_config(None), None)
    hq, cfg = fixed_exclusion_configs(configs, {"mtp.fc": "plain"})
    assert hq is None and cfg == configs.config and cfg is not configs.config


def test_fix_exclusions_single_module_gets_its_own_name() -> None:
    configs, modules, drafter, stored = nvfp4_gap(mtp_prefix=VLM)
    hq, cfg = fixed_exclusion_configs(configs, stored)
    assert excludes(hq, cfg)[0][-1] == "mtp.fc"  # vLLM's name, matches both spellings


def test_fix_exclusions_refuses_when_no_safe_pattern() -> None:
    # plain module whose exact name is a substring of a quantized module's name
    hq, qc = modelopt_nvfp4_configs(["lm_head"])
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    stored = {"mtp.fc": "plain", "mtp.fc_hidden": "nvfp4", "mtp.fc.x": "nvfp4"}
    with pytest.raises(QuantConfigError, match="mtp.fc"):
        fixed_exclusion_configs(configs, stored)


def test_rewrite_keeps_hf_quant_only_source() -> None:
    hq, _ = modelopt_nvfp4_configs()
    cfg = qwen35_moe_config(None)
    configs = QuantConfigs(cfg, hq)
    modules, drafter = qwen35_moe_modules(), qwen35_moe_drafter_modules()
    hq2, cfg2 = variant_configs(configs, drafter, modules)
    assert cfg2 == cfg and "quantization_config" not in cfg2  # nothing added to config.json
    assert hq2 is not None and hq2["quantization"]["exclude_modules"][-1] == "mtp.fc"


def test_rewrite_of_inconsistent_files_makes_both_exclude_the_drafter() -> None:
    configs, modules, drafter, _ = nvfp4_gap()
    assert configs.hf_quant is not None
    configs.hf_quant["quantization"]["exclude_modules"].remove("mtp.layers.0*")
    hq, cfg = variant_configs(configs, drafter, modules)
    for decl in (declared_quant(QuantConfigs(cfg, None)),
                 declared_quant(QuantConfigs(qwen35_moe_config(None), hq))):  # fmt: skip
        assert all(declared_format(decl, m) is None for m in drafter)


# ----------------------------------------------------------------- property: errors


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=8), st.sampled_from(["mtp*", "lm_head", "re:(", "*",
                                                             "NVFP4", "MIXED_PRECISION",
                                                             "modelopt", "fp8",
                                                             "compressed-tensors"]))  # fmt: skip
_json = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["quant_method", "quant_algo", "ignore", "exclude_modules",
                                     "quantization", "quantized_layers", "config_groups",
                                     "targets", "weights", "num_bits", "type",
                                     "kv_cache_scheme", "ignored_layers",
                                     "modules_to_not_convert", "x"]), inner, max_size=5),
), max_leaves=12)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(qc=_json, hq=st.one_of(st.none(), _json), text_qc=st.booleans())
def test_rewriters_raise_only_quant_config_error(qc: Any, hq: Any, text_qc: bool) -> None:
    cfg: dict[str, Any] = {"model_type": "qwen3_5_moe"}
    if text_qc:
        cfg["text_config"] = {"quantization_config": qc}
    else:
        cfg["quantization_config"] = qc
    hq_doc = hq if isinstance(hq, dict) else ({"quantization": hq} if hq is not None else None)
    configs = QuantConfigs(cfg, hq_doc)
    drafter = ["mtp.fc", "mtp.layers.0.mlp.experts.0.up_proj"]
    modules = [*drafter, "lm_head", "model.layers.0.mlp.gate"]
    stored = {"mtp.fc": "plain", "lm_head": "nvfp4", "model.layers.0.mlp.gate": "plain",
              "mtp.layers.0.mlp.experts.0.up_proj": "fp8"}  # fmt: skip
    snapshot = copy.deepcopy(configs)
    for call in (lambda: variant_configs(configs, drafter, modules),
                 lambda: fixed_exclusion_configs(configs, stored),
                 lambda: declared_quant(configs)):  # fmt: skip
        with contextlib.suppress(QuantConfigError):
            call()
    audit_quant_configs(configs, stored, drafter)  # never raises: errors become findings
    assert configs.config == snapshot.config and configs.hf_quant == snapshot.hf_quant


# ------------------------------------------------------------ oracle: vLLM's own code

_ORACLE = r"""
import json, sys, types
for n in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules[n] = types.ModuleType(n)
for n in ("torchaudio", "torchcodec"):
    sys.modules[n] = None
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig)
from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer
from vllm.model_executor.layers.quantization.modelopt import (
    ModelOptMixedPrecisionConfig, ModelOptNvFp4Config)
from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration as M
mapper = M.hf_to_vllm_mapper.get_rename_mapper()
out = []
for kind, doc, layers in json.load(sys.stdin):
    cls = {"nvfp4": ModelOptNvFp4Config, "mixed": ModelOptMixedPrecisionConfig,
           "ct": CompressedTensorsConfig}[kind]
    cfg = cls.from_config(doc)
    cfg.apply_vllm_mapper(mapper)
    cfg.packed_modules_mapping = M.packed_modules_mapping
    res = {}
    for layer in layers:
        try:
            if kind == "ct":
                ignored = should_ignore_layer(layer, cfg.ignore, M.packed_modules_mapping)
                res[layer] = None if ignored else "NVFP4"
            elif cfg.is_layer_excluded(layer):
                res[layer] = None
            elif kind == "mixed":
                res[layer] = cfg._resolve_quant_algo(layer)
            else:
                res[layer] = "NVFP4"
        except ValueError:
            res[layer] = "inconsistent"
    out.append(res)
json.dump(out, sys.stdout)
"""

_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
          "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz",
          "in_proj_a": "in_proj_ba", "in_proj_b": "in_proj_ba"}  # fmt: skip


def vllm_layer(module: str) -> str:
    """The vLLM layer prefix a checkpoint module of Qwen3_5MoeForConditionalGeneration (or
    its MTP drafter, built with prefix "mtp") is matched under."""
    parts = module.split(".")
    if "experts" in parts[:-1]:
        parts = parts[: parts.index("experts") + 1]
    elif parts[-1] in _FUSED:
        parts[-1] = _FUSED[parts[-1]]
    name = ".".join(parts)
    for old, new in (("model.language_model.mtp.", "mtp."), ("model.language_model.",
                     "language_model.model."), ("model.visual.", "visual.")):  # fmt: skip
        if name.startswith(old):
            return new + name[len(old) :]
    return "language_model.lm_head" if name == "lm_head" else name


@pytest.mark.vllm
@pytest.mark.slow
def test_matching_agrees_with_vllm() -> None:
    """Our per-module answer equals vLLM's per-layer answer (ModelOpt NVFP4 exclusions,
    MIXED_PRECISION resolution, compressed-tensors ``ignore``), including on our rewrites."""
    pytest.importorskip("vllm")
    cases: list[tuple[str, dict[str, Any], list[str]]] = []
    for mtp_prefix in ("", VLM):
        configs, modules, drafter, stored = nvfp4_gap(mtp_prefix=mtp_prefix, router_gates=False)
        docs = [configs.hf_quant,
                variant_configs(configs, drafter, modules)[0],
                fixed_exclusion_configs(configs, stored)[0]]  # fmt: skip
        for extra in (["lm_head", "mtp.layers.1*", "*.mlp.gate"], ["self_attn", "mtp.fc"],
                      ["*.q_proj", "mtp.layers.0.mlp.experts.1.up_proj", f"{VLM}mtp.fc"],
                      [f"{VLM}layers.0.self_attn.q_proj", "*experts*"]):  # fmt: skip
            hq = copy.deepcopy(configs.hf_quant)
            assert hq is not None
            hq["quantization"]["exclude_modules"] = extra
            docs.append(hq)
        cases += [("nvfp4", doc, modules) for doc in docs if doc is not None]
        layers = {f"{VLM}layers.0.mlp.experts": "NVFP4", f"{VLM}layers.3.self_attn.q_proj": "FP8",
                  f"{VLM}layers.3.self_attn.k_proj": "FP8", f"{VLM}layers.3.self_attn.v_proj":
                  "FP8", "mtp.layers.0.mlp.experts": "NVFP4", "mtp.fc": "FP8",
                  "lm_head": "FP8"}  # fmt: skip
        hq, qc = modelopt_mixed_configs(layers, ["model.visual*"])
        mixed = QuantConfigs(qwen35_moe_config(qc), hq)
        cases.append(("mixed", qc, modules))
        cases.append(("mixed", variant_configs(mixed, drafter, modules)[1]["quantization_config"],
                      modules))  # fmt: skip
        ct = QuantConfigs(qwen35_moe_config(compressed_tensors_nvfp4_config(["lm_head"])), None)
        cases.append(("ct", ct.config["quantization_config"], modules))
        cases.append(("ct", variant_configs(ct, drafter, modules)[1]["quantization_config"],
                      modules))  # fmt: skip
        cases.append(("ct", compressed_tensors_nvfp4_config(), modules))
    job = [(kind, doc, sorted({vllm_layer(m) for m in mods})) for kind, doc, mods in cases]
    proc = subprocess.run([sys.executable, "-c", _ORACLE], input=json.dumps(job),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout)
    for (kind, doc, mods), vllm_says in zip(cases, answers, strict=True):
        if kind == "nvfp4":
            decl = declared_quant(QuantConfigs(qwen35_moe_config(None), doc))
        else:
            decl = declared_quant(QuantConfigs(qwen35_moe_config(doc), None))
        by_layer: dict[str, set[str | None]] = {}
        for m in mods:
            by_layer.setdefault(vllm_layer(m), set()).add(declared_format(decl, m))
        for layer, ours in by_layer.items():
            if kind == "ct" and layer.endswith("lm_head"):
                continue  # compressed-tensors never quantizes ParallelLMHead in vLLM
            if vllm_says[layer] == "inconsistent":
                assert len(ours) > 1, (kind, layer)
                continue
            assert ours == {vllm_says[layer]}, (kind, decl.exclude, layer)


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value most of the time, arbitrary JSON otherwise."""
    return st.integers(0, 7).flatmap(lambda i: valid if i else _json)


_module = st.sampled_from(["mtp.fc", "mtp.layers.0.mlp.experts", "lm_head", "mtp*", "model.*",
                           f"{VLM}layers.0.mlp.gate", "mtp.layers.0*", "re:.*fc$", "", "*"])  # fmt: skip
_algo = st.sampled_from(["NVFP4", "FP8", "MIXED_PRECISION", "nvfp4", "W4A16_NVFP4", "INT4"])
_layers = st.dictionaries(_module, _maybe(st.fixed_dictionaries({"quant_algo": _algo})),
                          max_size=4)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=_maybe(st.sampled_from(["modelopt", "compressed-tensors", "fp8", "gptq"])),
    algo=_maybe(_algo),
    ignore=_maybe(st.lists(_module, max_size=4)),
    layers=_maybe(_layers),
    groups=_maybe(st.dictionaries(st.sampled_from(["group_0", "group_1"]), st.fixed_dictionaries(
        {"targets": _maybe(st.lists(_module, max_size=3)),
         "weights": _maybe(st.fixed_dictionaries({"num_bits": st.sampled_from([4, 8]),
                                                  "type": st.sampled_from(["float", "int"])}))}),
        max_size=2)),
    hq_layers=_maybe(_layers),
    hq_exclude=_maybe(st.lists(_module, max_size=4)),
    nested=st.booleans(),
)  # fmt: skip
def test_rewriters_on_near_valid_configs(method: Any, algo: Any, ignore: Any, layers: Any,
                                         groups: Any, hq_layers: Any, hq_exclude: Any,
                                         nested: bool) -> None:  # fmt: skip
    qc: dict[str, Any] = {"config_groups": groups, "quantized_layers": layers, "ignore": ignore,
                          "quant_algo": algo, "quant_method": method,
                          "ignored_layers": ignore}  # fmt: skip
    if nested:
        qc = {"quant_method": method, "quantization": {
            "quant_algo": algo, "exclude_modules": ignore, "quantized_layers": layers}}  # fmt: skip
    hq = {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": algo, "exclude_modules": hq_exclude, "quantized_layers": hq_layers}}  # fmt: skip
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    drafter = qwen35_moe_drafter_modules(num_experts=2)
    modules = qwen35_moe_modules(num_layers=1, num_experts=2, full_attention_interval=1)
    stored = nvidia_stored_formats(modules)
    snapshot = copy.deepcopy(configs)
    rewriters = (
        lambda c: variant_configs(c, drafter, modules),
        lambda c: fixed_exclusion_configs(c, stored),
    )
    for rewrite in rewriters:
        try:
            hq2, cfg2 = rewrite(configs)
        except QuantConfigError:
            event("refused")
            continue
        event("unchanged" if (hq2, cfg2) == (configs.hf_quant, configs.config) else "rewritten")
        assert json.loads(dumps_json(cfg2)) == cfg2
        assert rewrite(QuantConfigs(cfg2, hq2)) == (hq2, cfg2)  # a fixed point
    audit_quant_configs(configs, stored, drafter)
    assert configs.config == snapshot.config and configs.hf_quant == snapshot.hf_quant
