"""quantconfig.rewrite: the variant and exclusion-fix rewrites, and what they report."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mtpconv.errors import QuantConfigError
from mtpconv.jsonio import dumps_json
from mtpconv.quantconfig.audit import (
    CODE_PLAIN_DECLARED_QUANTIZED,
    audit_quant_configs,
)
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import QuantConfigs
from mtpconv.quantconfig.rewrite import fixed_exclusion_configs, variant_configs
from tests.quantconfig.helpers import (
    assert_only_exclusions_changed,
    excludes,
    json_values,
    key_paths,
    nvfp4_gap,
)
from tests.quantconfig.samples import (
    VLM,
    compressed_tensors_nvfp4_config,
    modelopt_mixed_configs,
    modelopt_nvfp4_configs,
    nvidia_qwen35_exclude,
    nvidia_stored_formats,
    qwen35_moe_config,
    qwen35_moe_drafter_modules,
    qwen35_moe_modules,
)

# ------------------------------------------------------------------------- rewriting


@pytest.mark.parametrize(("vlm", "mtp_prefix"), [(True, ""), (False, ""), (True, VLM)])
def test_variant_excludes_whole_drafter_minimally(vlm: bool, mtp_prefix: str) -> None:
    configs, modules, drafter, stored = nvfp4_gap(vlm=vlm, mtp_prefix=mtp_prefix)
    original = copy.deepcopy(configs)
    hq, cfg = variant_configs(configs, drafter, modules).documents
    assert configs.config == original.config and configs.hf_quant == original.hf_quant
    assert_only_exclusions_changed(configs, hq, cfg)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq == new_cfg  # both files say the same
    assert new_hq[len(excludes(original.hf_quant, original.config)[0]) :] == ["mtp.fc"]
    for decl in (
        declared_quant(QuantConfigs(cfg, hq)),
        declared_quant(QuantConfigs(cfg, None)),
        declared_quant(QuantConfigs(qwen35_moe_config(None), hq)),
    ):
        assert all(declared_algorithm(decl, m) is None for m in drafter)
        old = declared_quant(configs)
        for m in modules:
            if m not in drafter:
                assert declared_algorithm(decl, m) == declared_algorithm(old, m), m


def test_variant_without_existing_mtp_exclusion_uses_one_pattern() -> None:
    exclude = nvidia_qwen35_exclude(mtp=())
    hq, qc = modelopt_nvfp4_configs(exclude)
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    modules, drafter = qwen35_moe_modules(), qwen35_moe_drafter_modules()
    hq2, cfg2 = variant_configs(configs, drafter, modules).documents
    assert excludes(hq2, cfg2)[0][len(exclude) :] == ["mtp*"]


def test_variant_avoids_patterns_that_hit_target_modules() -> None:
    # a target module whose name contains "mtp" forbids the short "mtp*"
    exclude = ["lm_head"]
    hq, qc = modelopt_nvfp4_configs(exclude)
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    drafter = qwen35_moe_drafter_modules()
    modules = [*drafter, "model.language_model.layers.0.mlp.mtp_proj", "lm_head"]
    hq2, cfg2 = variant_configs(configs, drafter, modules).documents
    added = excludes(hq2, cfg2)[0][1:]
    assert "mtp*" not in added and added
    decl = declared_quant(QuantConfigs(cfg2, hq2))
    assert declared_algorithm(decl, "model.language_model.layers.0.mlp.mtp_proj") == "NVFP4"
    assert all(declared_algorithm(decl, m) is None for m in drafter)


def test_variant_is_idempotent_and_no_op_when_already_excluded() -> None:
    configs, modules, drafter, _ = nvfp4_gap()
    hq, cfg = variant_configs(configs, drafter, modules).documents
    again = variant_configs(QuantConfigs(cfg, hq), drafter, modules).documents
    assert again == (hq, cfg)
    assert dumps_json(again[1]) == dumps_json(cfg)


def test_variant_bf16_source_unchanged() -> None:
    cfg = qwen35_moe_config(None)
    hq, cfg2 = variant_configs(
        QuantConfigs(cfg, None), qwen35_moe_drafter_modules(), qwen35_moe_modules()
    ).documents
    assert hq is None and cfg2 == cfg and "quantization_config" not in cfg2
    assert key_paths(cfg2) == key_paths(cfg)


def test_variant_mixed_precision_drops_drafter_layers() -> None:
    drafter = qwen35_moe_drafter_modules()
    layers = {
        f"{VLM}layers.0.mlp.experts": "NVFP4",
        f"{VLM}layers.3.self_attn.q_proj": "FP8",
        "mtp.layers.0.mlp.experts": "NVFP4",
        "mtp.fc": "FP8",
        "lm_head": "FP8",
    }
    hq, qc = modelopt_mixed_configs(layers, ["model.visual*"])
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    modules = qwen35_moe_modules()
    hq2, cfg2 = variant_configs(configs, drafter, modules).documents
    assert hq2 is not None
    kept = [k for k in layers if not k.startswith("mtp.")]
    assert list(hq2["quantization"]["quantized_layers"]) == kept
    assert list(cfg2["quantization_config"]["quantized_layers"]) == kept
    targets = [t for g in cfg2["quantization_config"]["config_groups"].values() for t in g["targets"]]
    assert sorted(targets) == sorted(kept)
    # nothing else needed: exclusions untouched
    assert excludes(hq2, cfg2) == (["model.visual*"], ["model.visual*"])
    decl = declared_quant(QuantConfigs(cfg2, hq2))
    assert all(declared_algorithm(decl, m) is None for m in drafter)
    assert declared_algorithm(decl, f"{VLM}layers.0.mlp.experts.2.down_proj") == "NVFP4"
    assert variant_configs(QuantConfigs(cfg2, hq2), drafter, modules).documents == (hq2, cfg2)


def test_variant_compressed_tensors_adds_a_drafter_group() -> None:
    """Issue 13: the drafter linears get their own FP8 group; ignore entries that skipped
    them go, every other module keeps its declaration, every other key is kept."""
    qc = compressed_tensors_nvfp4_config()  # ignores lm_head, routers, linear_attn, re:^mtp.*
    configs = QuantConfigs(qwen35_moe_config(qc), None)
    drafter, modules = qwen35_moe_drafter_modules(), qwen35_moe_modules()
    result = variant_configs(configs, drafter, modules)
    hq, cfg = result.documents
    assert hq is None and result.changed
    new = cfg["quantization_config"]
    assert new["config_groups"]["group_0"] == qc["config_groups"]["group_0"]
    group = new["config_groups"]["mtpconv_fp8_drafter"]
    assert group["format"] == "float-quantized"
    assert group["weights"] == {
        "num_bits": 8,
        "type": "float",
        "strategy": "channel",
        "symmetric": True,
        "dynamic": False,
    }
    assert group["input_activations"]["dynamic"] is True and group["input_activations"]["strategy"] == "token"
    assert "re:^mtp\\.fc$" in group["targets"]
    assert "re:^mtp\\.layers\\.0\\.mlp\\.experts\\.\\d+\\.up_proj$" in group["targets"]
    assert new["ignore"] == [*qc["ignore"][:3], "re:^mtp\\.layers\\.0\\.mlp\\.shared_expert_gate$"]
    assert result.drafter_group is not None and result.drafter_group.removed_ignore == ["re:^mtp.*"]
    assert {k: v for k, v in new.items() if k not in ("config_groups", "ignore")} == {
        k: v for k, v in qc.items() if k not in ("config_groups", "ignore")
    }
    before, after = declared_quant(configs), declared_quant(QuantConfigs(cfg, None))
    linears = [m for m in drafter if m.endswith("_proj") or m.endswith(".fc")]
    assert all(declared_algorithm(after, m) == "FP8" for m in linears)
    assert all(
        declared_algorithm(after, m) == declared_algorithm(before, m) for m in modules if m not in linears
    )
    assert variant_configs(QuantConfigs(cfg, None), drafter, modules).documents == (hq, cfg)  # a fixed point


def test_variant_compressed_tensors_reignores_what_a_removed_entry_skipped() -> None:
    """An ignore entry skipping drafter and target linears alike is replaced by exact
    entries for the target modules, so they stay unquantized."""
    qc = compressed_tensors_nvfp4_config(["lm_head", "re:.*self_attn.*"])
    configs = QuantConfigs(qwen35_moe_config(qc), None)
    drafter, modules = qwen35_moe_drafter_modules(), qwen35_moe_modules()
    result = variant_configs(configs, drafter, modules, fp8_linears=["mtp.layers.0.self_attn.q_proj"])
    ignore = result.config["quantization_config"]["ignore"]
    assert "re:.*self_attn.*" not in ignore
    assert f"{VLM}layers.3.self_attn.k_proj" in ignore
    assert "re:^mtp\\.layers\\.0\\.self_attn\\.k_proj$" in ignore
    before, after = declared_quant(configs), declared_quant(result.as_configs())
    assert declared_algorithm(after, "mtp.layers.0.self_attn.q_proj") == "FP8"
    for m in modules:
        if m != "mtp.layers.0.self_attn.q_proj":
            assert declared_algorithm(after, m) == declared_algorithm(before, m), m


def test_fix_exclusions_only_adds_what_is_stored_plain() -> None:
    configs, modules, drafter, stored = nvfp4_gap(router_gates=False)
    original = copy.deepcopy(configs)
    hq, cfg = fixed_exclusion_configs(configs, stored).documents
    assert configs.config == original.config
    assert_only_exclusions_changed(configs, hq, cfg)
    new_hq, new_cfg = excludes(hq, cfg)
    assert new_hq == new_cfg
    added = new_hq[len(excludes(original.hf_quant, original.config)[0]) :]
    assert added == [f"{VLM}layers.*.mlp.gate", f"{VLM}layers.*.mlp.shared_expert_gate", "mtp.fc"]
    fixed = QuantConfigs(cfg, hq)
    assert not [
        f for f in audit_quant_configs(fixed, stored, drafter) if f.code == CODE_PLAIN_DECLARED_QUANTIZED
    ]
    old, new = declared_quant(configs), declared_quant(fixed)
    for m, kind in stored.items():
        if kind != "plain":
            assert declared_algorithm(new, m) == declared_algorithm(old, m)
    assert fixed_exclusion_configs(fixed, stored).documents == (hq, cfg)  # idempotent


def test_fix_exclusions_nothing_to_do_returns_copies() -> None:
    configs = QuantConfigs(qwen35_moe_config(None), None)
    hq, cfg = fixed_exclusion_configs(configs, {"mtp.fc": "plain"}).documents
    assert hq is None and cfg == configs.config and cfg is not configs.config


def test_fix_exclusions_single_module_gets_its_own_name() -> None:
    configs, modules, drafter, stored = nvfp4_gap(mtp_prefix=VLM)
    hq, cfg = fixed_exclusion_configs(configs, stored).documents
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
    hq2, cfg2 = variant_configs(configs, drafter, modules).documents
    assert cfg2 == cfg and "quantization_config" not in cfg2  # nothing added to config.json
    assert hq2 is not None and hq2["quantization"]["exclude_modules"][-1] == "mtp.fc"


def test_rewrite_of_inconsistent_files_makes_both_exclude_the_drafter() -> None:
    configs, modules, drafter, _ = nvfp4_gap()
    assert configs.hf_quant is not None
    configs.hf_quant["quantization"]["exclude_modules"].remove("mtp.layers.0*")
    hq, cfg = variant_configs(configs, drafter, modules).documents
    for decl in (
        declared_quant(QuantConfigs(cfg, None)),
        declared_quant(QuantConfigs(qwen35_moe_config(None), hq)),
    ):
        assert all(declared_algorithm(decl, m) is None for m in drafter)


# ----------------------------------------------------------------- property: errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(qc=json_values, hq=st.one_of(st.none(), json_values), text_qc=st.booleans())
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
    stored = {
        "mtp.fc": "plain",
        "lm_head": "nvfp4",
        "model.layers.0.mlp.gate": "plain",
        "mtp.layers.0.mlp.experts.0.up_proj": "fp8",
    }
    snapshot = copy.deepcopy(configs)
    for call in (
        lambda: variant_configs(configs, drafter, modules).documents,
        lambda: fixed_exclusion_configs(configs, stored).documents,
        lambda: declared_quant(configs),
    ):
        with contextlib.suppress(QuantConfigError):
            call()
    audit_quant_configs(configs, stored, drafter)  # never raises: errors become findings
    assert configs.config == snapshot.config and configs.hf_quant == snapshot.hf_quant


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value most of the time, arbitrary JSON otherwise."""
    return st.integers(0, 7).flatmap(lambda i: valid if i else json_values)


_module = st.sampled_from(
    [
        "mtp.fc",
        "mtp.layers.0.mlp.experts",
        "lm_head",
        "mtp*",
        "model.*",
        f"{VLM}layers.0.mlp.gate",
        "mtp.layers.0*",
        "re:.*fc$",
        "",
        "*",
    ]
)
_algo = st.sampled_from(["NVFP4", "FP8", "MIXED_PRECISION", "nvfp4", "W4A16_NVFP4", "INT4"])
_layers = st.dictionaries(_module, _maybe(st.fixed_dictionaries({"quant_algo": _algo})), max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=_maybe(st.sampled_from(["modelopt", "compressed-tensors", "fp8", "gptq"])),
    algo=_maybe(_algo),
    ignore=_maybe(st.lists(_module, max_size=4)),
    layers=_maybe(_layers),
    groups=_maybe(
        st.dictionaries(
            st.sampled_from(["group_0", "group_1"]),
            st.fixed_dictionaries(
                {
                    "targets": _maybe(st.lists(_module, max_size=3)),
                    "weights": _maybe(
                        st.fixed_dictionaries(
                            {"num_bits": st.sampled_from([4, 8]), "type": st.sampled_from(["float", "int"])}
                        )
                    ),
                }
            ),
            max_size=2,
        )
    ),
    hq_layers=_maybe(_layers),
    hq_exclude=_maybe(st.lists(_module, max_size=4)),
    nested=st.booleans(),
)
def test_rewriters_on_near_valid_configs(
    method: Any,
    algo: Any,
    ignore: Any,
    layers: Any,
    groups: Any,
    hq_layers: Any,
    hq_exclude: Any,
    nested: bool,
) -> None:
    qc: dict[str, Any] = {
        "config_groups": groups,
        "quantized_layers": layers,
        "ignore": ignore,
        "quant_algo": algo,
        "quant_method": method,
        "ignored_layers": ignore,
    }
    if nested:
        qc = {
            "quant_method": method,
            "quantization": {"quant_algo": algo, "exclude_modules": ignore, "quantized_layers": layers},
        }
    hq = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": algo, "exclude_modules": hq_exclude, "quantized_layers": hq_layers},
    }
    configs = QuantConfigs(qwen35_moe_config(qc), hq)
    drafter = qwen35_moe_drafter_modules(num_experts=2)
    modules = qwen35_moe_modules(num_layers=1, num_experts=2, full_attention_interval=1)
    stored = nvidia_stored_formats(modules)
    snapshot = copy.deepcopy(configs)
    rewriters = (
        lambda c: variant_configs(c, drafter, modules).documents,
        lambda c: fixed_exclusion_configs(c, stored).documents,
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


# ------------------------------------------------------ the record of what was added


def test_fix_record_lists_patterns_modules_and_where() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    fixed = fixed_exclusion_configs(configs, stored)
    assert fixed.changed and fixed.patterns == ["mtp.fc"] and fixed.excluded_modules == ["mtp.fc"]
    assert [(e.document, e.key, e.added) for e in fixed.edits] == [
        ("config.json", "quantization_config.ignore", ("mtp.fc",)),
        ("hf_quant_config.json", "quantization.exclude_modules", ("mtp.fc",)),
    ]
    assert fixed.as_configs().config == fixed.config and fixed.as_configs().hf_quant == fixed.hf_quant


def test_fix_record_of_a_text_config_declaration() -> None:
    """A VLM config declaring its quantization only under text_config, no hf_quant_config.json."""
    configs, modules, drafter, stored = nvfp4_gap()
    cfg = copy.deepcopy(configs.config)
    cfg["text_config"]["quantization_config"] = cfg.pop("quantization_config")
    fixed = fixed_exclusion_configs(QuantConfigs(cfg, None), stored)
    assert fixed.hf_quant is None and "quantization_config" not in fixed.config
    assert fixed.patterns == ["mtp.fc"] and fixed.excluded_modules == ["mtp.fc"]
    ((edit),) = fixed.edits
    assert (edit.document, edit.key, edit.added) == (
        "config.json",
        "text_config.quantization_config.ignore",
        ("mtp.fc",),
    )
    assert fixed.config["text_config"]["quantization_config"]["ignore"][-1] == "mtp.fc"
    assert declared_algorithm(declared_quant(fixed.as_configs()), "mtp.fc") is None


def test_nothing_to_do_records_nothing() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    fixed = fixed_exclusion_configs(configs, stored)
    again = fixed_exclusion_configs(fixed.as_configs(), stored)
    assert not again.changed and again.patterns == [] and again.edits == [] and again.excluded_modules == []


def test_variant_record_lists_the_drafter() -> None:
    configs, modules, drafter, stored = nvfp4_gap()
    variant = variant_configs(configs, drafter, modules)
    assert variant.patterns == ["mtp.fc"]
    # mtp.fc was the only drafter module still declared quantized (mtp.layers.0* covered the rest)
    assert variant.excluded_modules == ["mtp.fc"]
    assert {e.document for e in variant.edits} == {"config.json", "hf_quant_config.json"}


def test_variant_record_of_mixed_precision_lists_dropped_layers() -> None:
    drafter = qwen35_moe_drafter_modules()
    layers = {f"{VLM}layers.0.mlp.experts": "NVFP4", "mtp.layers.0.mlp.experts": "NVFP4", "mtp.fc": "FP8"}
    hq, qc = modelopt_mixed_configs(layers, ["model.visual*"])
    variant = variant_configs(QuantConfigs(qwen35_moe_config(qc), hq), drafter, qwen35_moe_modules())
    assert variant.dropped_layers == ["mtp.layers.0.mlp.experts", "mtp.fc"]
    assert variant.patterns == [] and variant.edits == [] and variant.changed
    assert variant.excluded_modules == sorted(
        m for m in drafter if m == "mtp.fc" or m.startswith("mtp.layers.0.mlp.experts.")
    )


def test_fix_exclusions_of_a_flat_exclude_modules_list_writes_ignore_with_its_entries() -> None:
    """A flat ModelOpt config listing its exclusions as ``exclude_modules``: the fix goes into
    ``ignore`` (which vLLM reads first) together with every entry listed before, so that vLLM
    0.32 and 0.33 read the same exclusions; ``exclude_modules`` stays as it was."""
    configs, _modules, _drafter, stored = nvfp4_gap(router_gates=False)
    qc = configs.config["quantization_config"]
    before = list(qc.pop("ignore"))
    qc["exclude_modules"] = before
    assert declared_quant(configs).exclude == before
    _, cfg = fixed_exclusion_configs(configs, stored).documents
    new_qc = cfg["quantization_config"]
    assert new_qc["exclude_modules"] == before
    assert new_qc["ignore"][: len(before)] == before and "mtp.fc" in new_qc["ignore"][len(before) :]
