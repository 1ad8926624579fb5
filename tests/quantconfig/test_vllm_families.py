"""Every family's variant against vLLM's own ModelOpt config classes (needs vLLM).

For each row's fixtures (BF16, and NVFP4 where the family ships it): vLLM's
``ModelOptMixedPrecisionConfig`` must resolve each drafter linear, under the name the
family's MTP class gives it (packed as its loader packs it), to an FP8 algorithm, and every
target linear as the source's config resolved it. MLA families with a quantized KV cache keep
the exclusion style: there the variant's NVFP4 config must exclude the drafter instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.family_checkpoints import BUILDERS, write_family_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.families import BY_NAME, mtp_start_layer, vllm_drafter_key
from mtpconv.layouts import linear_modules

_ORACLE = r"""
import importlib, json, sys
from vllm.model_executor.layers.quantization.modelopt import (
    LINEAR_ALGOS, ModelOptMixedPrecisionConfig, ModelOptNvFp4Config)
from vllm.model_executor.model_loader.utils import configure_quant_config
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
          "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"],
          "fused_qkv_a_g_proj": ["q_a_proj", "kv_a_proj_with_mqa", "g_proj"]}
def model_class(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
def load(qc, classes):
    if qc is None:
        return None
    cls = ModelOptMixedPrecisionConfig if qc.get("quant_algo") == "MIXED_PRECISION" else ModelOptNvFp4Config
    c = cls.from_config(qc)
    c.packed_modules_mapping = PACKED
    for path in classes:  # what vLLM does building the target, then the drafter, on one config
        configure_quant_config(c, model_class(path))
    return c
def algo(c, layer):
    if c is None or c.is_layer_excluded(layer):
        return None
    return c._resolve_quant_algo(layer) if isinstance(c, ModelOptMixedPrecisionConfig) else c.quant_method
out = []
for src_qc, var_qc, targets, drafter, classes in json.load(sys.stdin):
    src, var = load(src_qc, classes), load(var_qc, classes)
    mapper = getattr(model_class(classes[0]), "hf_to_vllm_mapper", None) if classes else None
    if mapper is not None:  # the target's checkpoint names as vLLM's model names them
        targets = [mapper.apply_list([t])[0] for t in targets]
    out.append({"mixed": isinstance(var, ModelOptMixedPrecisionConfig),
                "target": {t: [algo(src, t), algo(var, t)] for t in targets},
                "drafter": {d: algo(var, d) for d in drafter}, "linear_algos": sorted(LINEAR_ALGOS)})
json.dump(out, sys.stdout)
"""

_PACK = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
_PACK_MLA = {"q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj"}
# Kimi-K3's MLA (mla.py, mla_use_output_gate): q_a + kv_a + g_proj are one fused_qkv_a_g_proj, the
# name KimiLinearModel.packed_modules_mapping puts on the quant config its drafter shares
_GATED_QKV_A = {"kimi_k3": ("q_a_proj", "kv_a_proj_with_mqa", "g_proj")}
# DeepSeek-V4 (vllm/models/deepseek_v4/nvidia/model.py packed_modules_mapping): wq_a + wkv, w1 + w3
_PACK_V4 = {"wq_a": "fused_wqa_wkv", "wkv": "fused_wqa_wkv", "w1": "gate_up_proj", "w3": "gate_up_proj"}
# Families whose vLLM classes configure the quant config themselves (hf_to_vllm_mapper, their own
# packed_modules_mapping): the target's class, then the MTP class, as vLLM builds them.
_VLLM_CLASSES = {
    "deepseek_v4": [
        "vllm.models.deepseek_v4.nvidia.model:DeepseekV4ForCausalLM",
        "vllm.models.deepseek_v4.nvidia.mtp:DeepSeekV4MTP",
    ]
}


def vllm_layer(module: str, modules: set[str], family: str = "") -> str:
    """The layer name vLLM builds for a checkpoint module: experts fused, q/k/v and gate/up packed."""
    if ".experts." in module:
        return module.split(".experts.", 1)[0] + ".experts"
    base, _, leaf = module.rpartition(".")
    if leaf in _GATED_QKV_A.get(family, ()):
        return f"{base}.fused_qkv_a_g_proj"
    if family == "deepseek_v4" and leaf in _PACK_V4:
        return f"{base}.{_PACK_V4[leaf]}"
    if leaf in _PACK:
        return f"{base}.{_PACK[leaf]}"
    if leaf in _PACK_MLA:
        return f"{base}.{_PACK_MLA[leaf]}"
    if leaf in ("gate_proj", "up_proj") and {f"{base}.gate_proj", f"{base}.up_proj"} <= modules:
        return f"{base}.gate_up_proj"
    return module


CASES = [(n, q) for n in sorted(BUILDERS) for q in ("bf16", "nvfp4") if q == "bf16" or BY_NAME[n].ships_nvfp4]


def _case(tmp: Path, name: str, quant: str) -> tuple[Any, Any, list[str], list[str], list[str]]:
    src = write_family_checkpoint(tmp / "src", name, quant=quant, drafter_quant=quant)
    report = quantize_mtp(str(src), tmp / "dst", device="cpu", fp8_from_4bit=True)
    layout = report.plan.layout
    src_qc = json.loads((src / "config.json").read_text()).get("quantization_config")
    var_qc = json.loads((tmp / "dst" / "config.json").read_text()).get("quantization_config")
    drafter_set = set(layout.drafter_tensors)
    modules = set(linear_modules(load_checkpoint_files(src).tensors))
    targets = sorted(m for m in modules if not any(t.startswith(m + ".") for t in drafter_set))
    n = mtp_start_layer(name, json.loads((src / "config.json").read_text()))
    keys = {vllm_drafter_key(lin.module, name, n) for lin in report.plan.linears}
    drafter = sorted({vllm_layer(k, keys, name) for k in keys})
    return src_qc, var_qc, targets, drafter, _VLLM_CLASSES.get(name, [])


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reads_every_family_drafter_as_fp8_and_the_target_as_before(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    cases = {f"{n}-{q}": _case(tmp_path / f"{n}-{q}", n, q) for n, q in CASES}
    answers = run_with_vllm(_ORACLE, list(cases.values()), timeout=600)
    for case, res in zip(cases, answers, strict=True):
        name, quant = case.rsplit("-", 1)
        kv_trap = BY_NAME[name].mla and quant == "nvfp4"
        assert res["mixed"] is not kv_trap, case  # MLA + quantized KV: the exclusion style
        for layer, (before, after) in res["target"].items():
            assert after == before, f"{case}: target {layer} was {before}, now {after}"
        assert res["drafter"], case
        for layer, algo in res["drafter"].items():
            if kv_trap:
                assert algo is None, f"{case}: {layer} must be excluded, got {algo}"
            elif layer.endswith(".experts"):
                assert algo == "FP8_PB_WO", f"{case}: {layer} -> {algo}"
            else:
                assert algo == "FP8_PER_CHANNEL_PER_TOKEN", f"{case}: {layer} -> {algo}"
                assert algo in res["linear_algos"]


_KIMI_K3_ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig
from vllm.models.kimi_k3.nvidia.model import KimiLinearModel, get_spec_layer_idx_from_weight_name
from vllm.models.kimi_k3.nvidia.mtp import KimiK3MTP
from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig
text, modules, qc = json.load(sys.stdin)
config = KimiLinearConfig(**text)
packed = KimiLinearModel.packed_modules_mapping
shard_of = {s: fused for fused, shards in packed.items() if fused != "in_proj_qkvgfab" for s in shards}
if config.mla_use_output_gate:
    shard_of.update({s: "fused_qkv_a_g_proj" for s in packed["fused_qkv_a_g_proj"]})
c = ModelOptMixedPrecisionConfig.from_config(qc)
c.packed_modules_mapping = dict(packed)  # what the target (SupportsQuant) puts on the shared config
out = {}
for module in modules:
    # KimiK3MTP.load_weights: strip "language_model.", find the spec layer, rewrite the name
    name = module.removeprefix("language_model.") + ".weight"
    layer = get_spec_layer_idx_from_weight_name(config, name)
    param = KimiK3MTP._rewrite_spec_layer_name(None, layer, name).removesuffix(".weight")
    # the decoder block is KimiDecoderLayer(prefix="model.layers.{layer}"): mtp_block is a
    # parameter-path segment, not part of the prefix its linears are built with
    prefix = param.replace(f"model.layers.{layer}.mtp_block.", f"model.layers.{layer}.")
    if ".experts." in prefix:
        prefix = prefix.split(".experts.", 1)[0] + ".experts"
    base, _, leaf = prefix.rpartition(".")
    if leaf in shard_of:
        prefix = f"{base}.{shard_of[leaf]}"
    out[module] = [prefix, None if c.is_layer_excluded(prefix) else c._resolve_quant_algo(prefix)]
json.dump(out, sys.stdout)
"""


@pytest.mark.vllm
def test_kimi_k3_drafter_resolves_fp8_under_the_prefixes_vllm_builds(tmp_path: Path) -> None:
    """Kimi-K3's names from vLLM's own loader code (not mtpconv's rule): each FP8 drafter
    linear, renamed as ``KimiK3MTP.load_weights`` renames it and packed as the target's
    ``packed_modules_mapping`` packs it, resolves to FP8 under the variant's config."""
    pytest.importorskip("vllm")
    src = write_family_checkpoint(tmp_path / "src", "kimi_k3")
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu", fp8_from_4bit=True)
    config = json.loads((tmp_path / "dst" / "config.json").read_text())
    modules = sorted(lin.module for lin in report.plan.linears)
    assert any(m.endswith(".w1") for m in modules) and any(m.endswith(".g_proj") for m in modules)
    got = run_with_vllm(
        _KIMI_K3_ORACLE, [config["text_config"], modules, config["quantization_config"]], timeout=600
    )
    keys = {vllm_drafter_key(m, "kimi_k3", 2) for m in modules}
    for module, (prefix, algo) in got.items():
        assert vllm_layer(vllm_drafter_key(module, "kimi_k3", 2), keys, "kimi_k3") == prefix, module
        want = "FP8_PB_WO" if prefix.endswith(".experts") else "FP8_PER_CHANNEL_PER_TOKEN"
        assert algo == want, f"{module} -> {prefix}: {algo}"
    assert {p for p, _ in got.values()} >= {
        "model.layers.2.self_attn.fused_qkv_a_g_proj",
        "model.layers.2.block_sparse_moe.experts",
        "model.layers.2.block_sparse_moe.routed_expert_up_proj",
        "model.layers.2.block_sparse_moe.shared_experts.gate_up_proj",
    }
