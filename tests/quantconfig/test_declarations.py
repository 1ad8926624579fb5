"""quantconfig.declarations: what each method declares, per module."""

from __future__ import annotations

from typing import Any

import pytest

from mtpconv.errors import QuantConfigError
from mtpconv.quantconfig.declarations import (
    StorageFormat,
    declared_algorithm,
    declared_quant,
    storage_format_of_algorithm,
)
from mtpconv.quantconfig.documents import QuantConfigs
from tests.quantconfig.helpers import (
    nvfp4_gap,
)
from tests.quantconfig.samples import (
    VLM,
    compressed_tensors_nvfp4_config,
    fp8_block_config,
    modelopt_fp8_configs,
    modelopt_mixed_configs,
    modelopt_nvfp4_configs,
    qwen35_moe_config,
)

# ---------------------------------------------------------------------- declarations


def test_declared_nvfp4_reads_config_json_first() -> None:
    configs, *_ = nvfp4_gap()
    decl = declared_quant(configs)
    assert (decl.method, decl.algo, decl.kv_cache_algo, decl.source) == (
        "modelopt",
        "NVFP4",
        "FP8",
        "config.json",
    )
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
    assert declared_algorithm(decl, "model.language_model.layers.3.self_attn.q_proj") == "FP8"
    assert declared_algorithm(decl, "lm_head") is None


def test_declared_bf16_is_none() -> None:
    decl = declared_quant(QuantConfigs(qwen35_moe_config(None), None))
    assert decl.method == "none" and decl.algo is None
    assert declared_algorithm(decl, "mtp.fc") is None


def test_declared_mixed_precision() -> None:
    layers = {
        f"{VLM}layers.0.mlp.experts": "NVFP4",
        f"{VLM}layers.3.self_attn.q_proj": "FP8",
        "lm_head": "FP8",
    }
    hq, qc = modelopt_mixed_configs(layers, ["mtp*", "mtp.layers.0*"])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert decl.algo == "MIXED_PRECISION"
    assert decl.quantized_layers == layers
    assert declared_algorithm(decl, f"{VLM}layers.0.mlp.experts.3.up_proj") == "NVFP4"
    assert declared_algorithm(decl, f"{VLM}layers.3.self_attn.q_proj") == "FP8"
    assert declared_algorithm(decl, f"{VLM}layers.3.self_attn.k_proj") is None  # not listed
    assert declared_algorithm(decl, "mtp.fc") is None
    # vLLM's own prefix form of a listed layer resolves too
    assert declared_algorithm(decl, "language_model.model.layers.3.self_attn.q_proj") == "FP8"


def test_declared_mixed_quantized_layers_only_in_hf_quant() -> None:
    hq, qc = modelopt_mixed_configs({"lm_head": "FP8"})
    del qc["quantized_layers"]
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert decl.quantized_layers == {"lm_head": "FP8"}  # vLLM falls back to the file


def test_declared_compressed_tensors() -> None:
    qc = compressed_tensors_nvfp4_config()
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), None))
    assert (decl.method, decl.algo) == ("compressed-tensors", "NVFP4")
    assert declared_algorithm(decl, f"{VLM}layers.0.mlp.experts.1.up_proj") == "NVFP4"
    assert declared_algorithm(decl, f"{VLM}layers.0.mlp.gate") is None  # re:.*mlp.gate$
    assert declared_algorithm(decl, f"{VLM}layers.0.linear_attn.out_proj") is None
    assert declared_algorithm(decl, "lm_head") is None
    assert declared_algorithm(decl, "mtp.fc") is None  # re:^mtp.*
    no_ignore = declared_quant(QuantConfigs(qwen35_moe_config(compressed_tensors_nvfp4_config([])), None))
    assert declared_algorithm(no_ignore, "mtp.fc") == "NVFP4"
    assert declared_algorithm(no_ignore, "lm_head") is None  # "Linear" targets no LM head


def test_declared_fp8_method_matches_exactly() -> None:
    qc = fp8_block_config(["lm_head", "mtp.fc"])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc, vlm=False), None))
    assert (decl.method, decl.algo) == ("fp8", "FP8")
    assert declared_algorithm(decl, "mtp.fc") is None
    assert declared_algorithm(decl, "mtp.draft_lm_head") == "FP8"  # exact, no substring
    assert declared_algorithm(decl, "model.layers.0.mlp.experts.0.up_proj") == "FP8"


def test_declared_unknown_method() -> None:
    cfg = qwen35_moe_config({"quant_method": "gptq", "bits": 4})
    decl = declared_quant(QuantConfigs(cfg, None))
    assert decl.method == "gptq" and declared_algorithm(decl, "lm_head") == "GPTQ"


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


def test_vision_tower_is_never_quantized_for_modelopt() -> None:
    hq, qc = modelopt_nvfp4_configs([])
    decl = declared_quant(QuantConfigs(qwen35_moe_config(qc), hq))
    assert declared_algorithm(decl, "model.vision_tower.blocks.0.qkv") is None
    assert declared_algorithm(decl, "model.visual.blocks.0.attn.qkv") == "NVFP4"


def test_lm_head_exclusion_also_declares_draft_head_unquantized() -> None:
    configs, *_ = nvfp4_gap()
    decl = declared_quant(configs)
    assert declared_algorithm(decl, "mtp.draft_lm_head") is None
    assert declared_algorithm(decl, "mtp.fc") == "NVFP4"  # the gap


@pytest.mark.parametrize(
    ("algo", "expected"),
    [
        ("NVFP4", StorageFormat.NVFP4),
        ("w4a16_nvfp4", StorageFormat.NVFP4),
        ("FP8", StorageFormat.FP8),
        ("FP8_PB_WO", StorageFormat.FP8),
        ("INT4", StorageFormat.INT),  # compressed-tensors pack-quantized W4A16
        ("MXFP4", StorageFormat.MXFP4),
        ("INT4_AWQ", None),  # ModelOpt's: not a layout mtpconv reads
        ("MIXED_PRECISION", None),
        (None, None),
    ],
)
def test_storage_format_of_algorithm(algo: str | None, expected: StorageFormat | None) -> None:
    assert storage_format_of_algorithm(algo) is expected


def test_first_mixed_key_is_the_most_specific_of_mixed_keys() -> None:
    from mtpconv.quantconfig.declarations import first_mixed_key, mixed_keys

    layers = {
        "model.layers.0.mlp.experts": "NVFP4",
        "model.layers.0.mlp.experts.3.up_proj": "FP8",
        "model.language_model.layers.1.self_attn": "NVFP4",
        "lm_head": "FP8",
        "mtp.fc": "FP8",
    }
    modules = [
        "model.layers.0.mlp.experts.3.up_proj",  # itself before its parent
        "model.layers.0.mlp.experts.4.up_proj",  # the parent
        "language_model.model.layers.1.self_attn.q_proj",  # the other VLM prefix, a parent
        "model.language_model.lm_head",
        "model.language_model.mtp.fc",  # a drafter seen under mtp.
        "model.layers.9.mlp.down_proj",  # nothing
    ]
    for module in modules:
        keys = mixed_keys(layers, module)
        assert first_mixed_key(layers, module) == (keys[0] if keys else None), module


def test_exclusion_matcher_answers_alike_per_vllm_view() -> None:
    from mtpconv.quantconfig.match import ExclusionMatcher

    matcher = ExclusionMatcher("modelopt", ["model.layers.1.mlp.experts*", "*o_proj"], "test")
    experts = [f"model.layers.{layer}.mlp.experts.{e}.gate_proj" for layer in (0, 1) for e in range(4)]
    assert [matcher.excludes(m) for m in experts] == [False] * 4 + [True] * 4
    assert matcher.excludes("model.layers.0.self_attn.o_proj")
    assert not matcher.excludes("model.layers.0.self_attn.q_proj")
    again = ExclusionMatcher("modelopt", ["model.layers.1.mlp.experts*", "*o_proj"], "test")
    for m in [*experts, "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj"]:
        assert again.excludes(m) == matcher.excludes(m)  # the memo never changes an answer


def test_flat_modelopt_exclusions_read_ignore_else_exclude_modules() -> None:
    """ModelOpt exports list a flat config's exclusions as ``ignore`` or ``exclude_modules``;
    vLLM 0.33 reads ``ignore`` and falls back to ``exclude_modules``."""
    hq, qc = modelopt_nvfp4_configs()
    listed = list(qc.pop("ignore"))
    only_exclude = dict(qc, exclude_modules=listed)
    decl = declared_quant(QuantConfigs(qwen35_moe_config(only_exclude), None))
    assert decl.exclude == listed and declared_algorithm(decl, "lm_head") is None
    both = dict(qc, ignore=["lm_head"], exclude_modules=listed)
    assert declared_quant(QuantConfigs(qwen35_moe_config(both), None)).exclude == ["lm_head"]
