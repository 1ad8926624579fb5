"""The matcher and the rewrites against vLLM's own is_layer_excluded (needs vLLM)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fixtures.vllm_stub import run_with_vllm
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import QuantConfigs
from mtpconv.quantconfig.rewrite import fixed_exclusion_configs, variant_configs
from tests.quantconfig.helpers import (
    nvfp4_gap,
)
from tests.quantconfig.samples import (
    VLM,
    compressed_tensors_nvfp4_config,
    modelopt_mixed_configs,
    qwen35_moe_config,
)

# ------------------------------------------------------------ oracle: vLLM's own code

_ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig)
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
                # vLLM's own scheme lookup; a routed-experts layer is looked up through
                # its expert 0 projections, as CompressedTensorsMoEMethod does.
                cls_name = "RoutedExperts" if layer.endswith(".experts") else "ColumnParallelLinear"
                names = [f"{layer}.0.{p}_proj" for p in ("gate", "up", "down")] if cls_name == "RoutedExperts" else [layer]
                if cls_name == "RoutedExperts":
                    cfg._add_fused_moe_to_target_scheme_map()
                dicts = [cfg.get_scheme_dict(type(cls_name, (), {})(), n) for n in names]
                algos = {None if d is None else {4: "NVFP4", 8: "FP8"}[d["weights"].num_bits] for d in dicts}
                res[layer] = algos.pop() if len(algos) == 1 else "inconsistent"
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

_FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "in_proj_qkv": "in_proj_qkvz",
    "in_proj_z": "in_proj_qkvz",
    "in_proj_a": "in_proj_ba",
    "in_proj_b": "in_proj_ba",
}


def vllm_layer(module: str) -> str:
    """The vLLM layer prefix a checkpoint module of Qwen3_5MoeForConditionalGeneration (or
    its MTP drafter, built with prefix "mtp") is matched under."""
    parts = module.split(".")
    if "experts" in parts[:-1]:
        parts = parts[: parts.index("experts") + 1]
    elif parts[-1] in _FUSED:
        parts[-1] = _FUSED[parts[-1]]
    name = ".".join(parts)
    for old, new in (
        ("model.language_model.mtp.", "mtp."),
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
    ):
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
        docs = [
            configs.hf_quant,
            variant_configs(configs, drafter, modules).documents[0],
            fixed_exclusion_configs(configs, stored).documents[0],
        ]
        for extra in (
            ["lm_head", "mtp.layers.1*", "*.mlp.gate"],
            ["self_attn", "mtp.fc"],
            ["*.q_proj", "mtp.layers.0.mlp.experts.1.up_proj", f"{VLM}mtp.fc"],
            [f"{VLM}layers.0.self_attn.q_proj", "*experts*"],
        ):
            hq = copy.deepcopy(configs.hf_quant)
            assert hq is not None
            hq["quantization"]["exclude_modules"] = extra
            docs.append(hq)
        cases += [("nvfp4", doc, modules) for doc in docs if doc is not None]
        layers = {
            f"{VLM}layers.0.mlp.experts": "NVFP4",
            f"{VLM}layers.3.self_attn.q_proj": "FP8",
            f"{VLM}layers.3.self_attn.k_proj": "FP8",
            f"{VLM}layers.3.self_attn.v_proj": "FP8",
            "mtp.layers.0.mlp.experts": "NVFP4",
            "mtp.fc": "FP8",
            "lm_head": "FP8",
        }
        hq, qc = modelopt_mixed_configs(layers, ["model.visual*"])
        mixed = QuantConfigs(qwen35_moe_config(qc), hq)
        cases.append(("mixed", qc, modules))
        cases.append(
            ("mixed", variant_configs(mixed, drafter, modules).documents[1]["quantization_config"], modules)
        )
        ct = QuantConfigs(qwen35_moe_config(compressed_tensors_nvfp4_config(["lm_head"])), None)
        cases.append(("ct", ct.config["quantization_config"], modules))
        cases.append(
            ("ct", variant_configs(ct, drafter, modules).documents[1]["quantization_config"], modules)
        )
        cases.append(("ct", compressed_tensors_nvfp4_config(), modules))
    job = [(kind, doc, sorted({vllm_layer(m) for m in mods})) for kind, doc, mods in cases]
    answers = run_with_vllm(_ORACLE, job, timeout=300)
    for (kind, doc, mods), vllm_says in zip(cases, answers, strict=True):
        if kind == "nvfp4":
            decl = declared_quant(QuantConfigs(qwen35_moe_config(None), doc))
        else:
            decl = declared_quant(QuantConfigs(qwen35_moe_config(doc), None))
        by_layer: dict[str, set[str | None]] = {}
        for m in mods:
            by_layer.setdefault(vllm_layer(m), set()).add(declared_algorithm(decl, m))
        for layer, ours in by_layer.items():
            if kind == "ct" and layer.endswith("lm_head"):
                continue  # compressed-tensors never quantizes ParallelLMHead in vLLM
            if vllm_says[layer] == "inconsistent":
                assert len(ours) > 1, (kind, layer)
                continue
            assert ours == {vllm_says[layer]}, (kind, decl.exclude, layer)
