"""mtpconv's compressed-tensors ``ignore`` rule against vLLM's own (needs vLLM).

For every linear module of the compressed-tensors fixtures and many ``ignore`` lists
(the sources', the variants', fix-exclusions' output, hand-written ones with the
patterns that differ between dialects), `ExclusionMatcher("compressed-tensors", ...)`
must answer exactly what vLLM's ``should_ignore_layer`` answers for the name vLLM asks
about: the fused layer for dense linears, ``{layer}.0.{proj}`` for a routed expert
(``CompressedTensorsMoEMethod.get_moe_method`` looks the whole layer up that way), with
the model's mapper applied to the config and the names, and its packed-module mapping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.fix_exclusions import fix_exclusions
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.layouts import linear_modules
from mtpconv.names import drafter_alias
from mtpconv.quantconfig.match import FUSED_INTO, ExclusionMatcher

_ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig)
from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration)
out = []
for vlm, qc, names in json.load(sys.stdin):
    M = Qwen3_5MoeForConditionalGeneration if vlm else Qwen3_5MoeForCausalLM
    mapper = M.hf_to_vllm_mapper.get_rename_mapper()
    cfg = CompressedTensorsConfig.from_config(qc)
    cfg.apply_vllm_mapper(mapper)
    res = {}
    for name in names:
        mapped = mapper._map_name(name) or name
        try:
            res[name] = should_ignore_layer(mapped, ignore=cfg.ignore, fused_mapping=M.packed_modules_mapping)
        except ValueError:
            res[name] = "shards disagree"
    out.append(res)
json.dump(out, sys.stdout)
"""


def _vllm_name(module: str) -> str:
    """The layer name vLLM asks ``should_ignore_layer`` about for a checkpoint module."""
    name = drafter_alias(module) or module
    parts = name.split(".")
    if "experts" in parts[:-1]:
        at = parts.index("experts")
        return ".".join([*parts[: at + 1], "0", parts[-1]])  # get_moe_method's f"{layer}.0.{proj}"
    if parts[-1] in FUSED_INTO:
        parts[-1] = FUSED_INTO[parts[-1]]
    return ".".join(parts)


def _qc(directory: Path) -> dict[str, Any]:
    cfg = json.loads((directory / "config.json").read_text())
    qc: dict[str, Any] = cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]
    return qc


HAND = [
    ["model.layers.0.mlp.experts"],  # what the old fix-exclusions wrote: vLLM applies it to nothing
    ["model.layers.1.mlp.experts.0.up_proj", "model.layers.1.mlp.experts.0.gate_proj"],
    ["re:.*experts\\.2\\.down_proj$", "mtp.layers.0.mlp.experts.3.up_proj"],
    ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
    ["model.layers.0.self_attn.qkv_proj", "re:.*self_attn\\.(q|k|v)_proj$"],
    ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"],
    ["re:^mtp\\.fc$", "mtp.layers.0.self_attn.o_proj", "lm_head", "re:.*mlp.gate$"],
    ["model.layers.0.mlp.shared_expert.gate_up_proj", "re:.*shared_expert\\.down_proj"],
]


@pytest.mark.vllm
def test_ct_ignore_rule_agrees_with_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    jobs: list[tuple[bool, dict[str, Any], list[str]]] = []
    specs = {
        "ct": Spec(family="qwen3_5_moe", quant="ct_nvfp4"),
        "ct-fp4-drafter": Spec(family="qwen3_5_moe", quant="ct_nvfp4", drafter_quant="ct_nvfp4"),
        "ct-vlm": Spec(family="qwen3_5_moe", quant="ct_nvfp4", vlm=True),
        # The mtp.fc gap, compressed-tensors style: a BF16 drafter the ignore list misses.
        "ct-gap": Spec(
            family="qwen3_5_moe",
            quant="ct_nvfp4",
            exclude=["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"],
        ),
    }
    for name, spec in specs.items():
        src = write_checkpoint(tmp_path / name, spec)
        modules = sorted(linear_modules(load_checkpoint_files(src).tensors))
        docs = [_qc(src)]
        quantize_mtp(str(src), tmp_path / f"{name}-variant", device="cpu", fp8_from_4bit=True)
        docs.append(_qc(tmp_path / f"{name}-variant"))
        if name == "ct-gap":
            report = fix_exclusions(str(src), tmp_path / f"{name}-fixed")
            assert report.excluded  # the drafter linears, experts included
            docs.append(_qc(tmp_path / f"{name}-fixed"))
        if not spec.vlm:
            docs += [{**docs[0], "ignore": hand} for hand in HAND]
        for doc in docs:
            jobs.append((spec.vlm, doc, modules))
    names_job = [(vlm, doc, sorted({_vllm_name(m) for m in mods})) for vlm, doc, mods in jobs]
    answers = run_with_vllm(_ORACLE, names_job, timeout=300)
    checked = 0
    for (_, doc, mods), vllm_says in zip(jobs, answers, strict=True):
        ours = ExclusionMatcher("compressed-tensors", doc["ignore"], "config.json")
        by_name: dict[str, set[bool]] = {}
        for m in mods:
            by_name.setdefault(_vllm_name(m), set()).add(ours.excludes(m))
        for name, answers in by_name.items():
            if vllm_says[name] == "shards disagree":
                assert answers == {True, False}, (doc["ignore"], name)  # vLLM raises: loud
            else:
                assert answers == {vllm_says[name]}, (doc["ignore"], name, answers, vllm_says[name])
            checked += 1
    assert checked > 500
