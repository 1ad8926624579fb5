"""Shared helpers of the quantconfig tests: the mtp.fc-gap configs, key paths, JSON strategies."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from mtpconv.quantconfig.documents import QuantConfigs
from tests.quantconfig.samples import (
    VLM,
    modelopt_nvfp4_configs,
    nvidia_qwen35_exclude,
    nvidia_stored_formats,
    qwen35_moe_config,
    qwen35_moe_drafter_modules,
    qwen35_moe_modules,
)

# --------------------------------------------------------------------------- helpers


def nvfp4_gap(
    *, vlm: bool = True, mtp_prefix: str = "", router_gates: bool = True
) -> tuple[QuantConfigs, list[str], list[str], dict[str, str]]:
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


def assert_only_exclusions_changed(
    before: QuantConfigs, hq: dict[str, Any] | None, cfg: dict[str, Any]
) -> None:
    """Every key and value outside the two exclusion lists is unchanged, in order."""
    assert before.hf_quant is not None and hq is not None
    assert key_paths(without(hq, ("quantization", "exclude_modules"))) == key_paths(
        without(before.hf_quant, ("quantization", "exclude_modules"))
    )
    assert without(hq, ("quantization", "exclude_modules")) == without(
        before.hf_quant, ("quantization", "exclude_modules")
    )
    assert list(hq) == list(before.hf_quant) and list(hq["quantization"]) == list(
        before.hf_quant["quantization"]
    )
    path = ("quantization_config", "ignore")
    assert key_paths(without(cfg, path)) == key_paths(without(before.config, path))
    assert without(cfg, path) == without(before.config, path)
    assert list(cfg["quantization_config"]) == list(before.config["quantization_config"])
    old_hq, old_cfg = excludes(before.hf_quant, before.config)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq[: len(old_hq)] == old_hq and new_cfg[: len(old_cfg)] == old_cfg  # appended


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(
        ["mtp*", "lm_head", "re:(", "*", "NVFP4", "MIXED_PRECISION", "modelopt", "fp8", "compressed-tensors"]
    ),
)
json_values = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "quant_method",
                    "quant_algo",
                    "ignore",
                    "exclude_modules",
                    "quantization",
                    "quantized_layers",
                    "config_groups",
                    "targets",
                    "weights",
                    "num_bits",
                    "type",
                    "kv_cache_scheme",
                    "ignored_layers",
                    "modules_to_not_convert",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=12,
)
