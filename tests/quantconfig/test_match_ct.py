"""The compressed-tensors exclusion rule beside ModelOpt's (`match`), and what
fix-exclusions writes for a compressed-tensors source's routed experts."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.fix_exclusions import fix_exclusions
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import load_quant_configs
from mtpconv.quantconfig.match import ExclusionMatcher, ExclusionPattern, ModuleSet, ct_expert_name, vllm_view

CT = "compressed-tensors"
EXPERTS = [f"model.layers.0.mlp.experts.{e}.{p}_proj" for e in range(4) for p in ("gate", "up", "down")]


def test_views_differ_by_dialect() -> None:
    module = "model.layers.0.mlp.experts.3.up_proj"
    assert vllm_view(module) == ("model.layers.0.mlp.experts",) * 2
    assert vllm_view(module, CT) == ("model.layers.0.mlp.experts.0.up_proj",) * 2
    assert (
        vllm_view("model.layers.0.mlp.experts.0.up_proj", CT) == ("model.layers.0.mlp.experts.0.up_proj",) * 2
    )
    assert ct_expert_name("model.layers.0.self_attn.q_proj") == "model.layers.0.self_attn.q_proj"
    assert vllm_view("model.layers.0.self_attn.q_proj", CT) == vllm_view("model.layers.0.self_attn.q_proj")


def test_expert_layer_entry_excludes_in_modelopt_only() -> None:
    for module in EXPERTS:
        assert ExclusionPattern("model.layers.0.mlp.experts", "modelopt").matches(module)
        assert not ExclusionPattern("model.layers.0.mlp.experts", CT).matches(module)


def test_expert_zero_decides_for_every_expert() -> None:
    matcher = ExclusionMatcher(CT, ["model.layers.0.mlp.experts.0.up_proj"], "config.json")
    assert {m for m in EXPERTS if matcher.excludes(m)} == {m for m in EXPERTS if m.endswith("up_proj")}
    # An entry naming another expert is never looked at by vLLM: it excludes nothing.
    other = ExclusionPattern("model.layers.0.mlp.experts.3.up_proj", CT)
    assert not any(other.matches(m) for m in EXPERTS)
    assert not other.matches_any(ModuleSet(EXPERTS))
    assert ExclusionPattern("re:.*experts\\.0\\.", CT).matches_any(ModuleSet(EXPERTS))


def test_fix_exclusions_writes_entries_vllm_applies(tmp_path: Path) -> None:
    spec = Spec(
        family="qwen3_5_moe",
        quant="ct_nvfp4",
        exclude=["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"],
    )
    src = write_checkpoint(tmp_path / "src", spec)
    report = fix_exclusions(str(src), tmp_path / "fixed")
    ignore = json.loads((tmp_path / "fixed" / "config.json").read_text())["quantization_config"]["ignore"]
    assert "mtp.layers.0.mlp.experts" not in ignore
    for proj in ("gate", "up", "down"):
        assert f"mtp.layers.0.mlp.experts.0.{proj}_proj" in ignore
    decl = declared_quant(load_quant_configs(tmp_path / "fixed"))
    assert any(".experts.3." in m for m in report.modules)  # every expert, not only expert 0
    for module in report.modules:
        assert declared_algorithm(decl, module) is None, module
