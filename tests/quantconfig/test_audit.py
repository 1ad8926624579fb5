"""quantconfig.audit: findings comparing declarations with the stored tensors."""

from __future__ import annotations

import pytest

from mtpconv.findings import Severity
from mtpconv.quantconfig.audit import (
    CODE_CONFIG_INVALID,
    CODE_CONFIGS_DISAGREE,
    CODE_FORMAT_MISMATCH,
    CODE_METHOD_UNSUPPORTED,
    CODE_PLAIN_DECLARED_QUANTIZED,
    CODE_QUANTIZED_DECLARED_PLAIN,
    CODE_UNUSED_EXCLUSION,
    audit_quant_configs,
)
from mtpconv.quantconfig.documents import QuantConfigs
from mtpconv.quantconfig.rewrite import variant_configs
from tests.quantconfig.helpers import (
    nvfp4_gap,
)
from tests.quantconfig.samples import (
    VLM,
    compressed_tensors_nvfp4_config,
    modelopt_fp8_configs,
    qwen35_moe_config,
    qwen35_moe_drafter_modules,
    qwen35_moe_modules,
)

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
    hq, cfg = variant_configs(configs, drafter, modules).documents
    variant = QuantConfigs(cfg, hq)
    stored = {m: ("fp8" if m in drafter else k) for m, k in stored.items()}
    stock = audit_quant_configs(variant, stored, drafter)
    assert {f.module for f in stock if f.code == CODE_QUANTIZED_DECLARED_PLAIN} == set(drafter)
    assert all("mtpconv vLLM plugin" in f.message for f in stock if f.code == CODE_QUANTIZED_DECLARED_PLAIN)
    served = audit_quant_configs(variant, stored, drafter, plugin_drafter=True)
    assert not [f for f in served if f.severity is Severity.ERROR]


def test_audit_format_mismatch() -> None:
    hq, qc = modelopt_fp8_configs()
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    stored = {f"{VLM}layers.3.self_attn.q_proj": "nvfp4", f"{VLM}layers.3.self_attn.o_proj": "fp8"}
    findings = audit_quant_configs(configs, stored, [])
    (f,) = [f for f in findings if f.code != CODE_UNUSED_EXCLUSION]
    assert (f.code, f.module, f.severity) == (
        CODE_FORMAT_MISMATCH,
        f"{VLM}layers.3.self_attn.q_proj",
        Severity.ERROR,
    )


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
