"""Quant-config JSON as NVIDIA / llm-compressor / Qwen ship it, in miniature.

Plain functions returning fresh dicts, for tests and the tiny-checkpoint factories.

Shapes mirrored:
- ModelOpt ``hf_quant_config.json``: ``{"producer": {"name": "modelopt", "version": ...},
  "quantization": {"quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"}}``;
  NVIDIA's Qwen3.5 / Qwen3-Next NVFP4 exports exclude ``lm_head``, the vision tower
  (``model.visual*``), each layer's ``linear_attn`` projections, router ``mlp.gate`` /
  ``shared_expert_gate``, and of the MTP branch only ``mtp.layers.0*`` — so ``mtp.fc``
  (stored BF16) is declared NVFP4: the gap. Later exports add ``mtp*``.
- config.json ``quantization_config`` as ModelOpt's ``convert_hf_quant_config_format``
  writes it, key order included: ``config_groups``, (``quantized_layers``), ``ignore``,
  ``quant_algo``, ``kv_cache_scheme``, ``producer``, ``quant_method: "modelopt"``.
"""

from __future__ import annotations

from typing import Any

VLM = "model.language_model."
PRODUCER = {"name": "modelopt", "version": "0.42.0"}


def nvidia_qwen35_exclude(
    prefix: str = VLM,
    *,
    num_layers: int = 4,
    full_attention_interval: int = 4,
    router_gates: bool = False,
    vision: bool = True,
    mtp: tuple[str, ...] = ("mtp.layers.0*",),
) -> list[str]:
    """An exclude list shaped like NVIDIA's Qwen3.5 NVFP4 export (with the mtp.fc gap).

    The first Qwen3.5-397B NVFP4 export did not exclude the router ``mlp.gate`` either
    (users added it by hand before vLLM hard-coded it); ``router_gates`` adds them."""
    out = ["lm_head"]
    for i in range(num_layers):
        layer = f"{prefix}layers.{i}"
        if (i + 1) % full_attention_interval != 0:
            out += [
                f"{layer}.linear_attn.conv1d",
                f"{layer}.linear_attn.in_proj_a",
                f"{layer}.linear_attn.in_proj_b",
            ]
        if router_gates:
            out += [f"{layer}.mlp.gate", f"{layer}.mlp.shared_expert_gate"]
    if vision:
        out.append("model.visual*")
    out += list(mtp)
    return out


def modelopt_hf_quant(
    quant_algo: str = "NVFP4",
    exclude: list[str] | None = None,
    *,
    kv_cache_quant_algo: str | None = "FP8",
    group_size: int | None = 16,
    quantized_layers: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """hf_quant_config.json as ModelOpt writes it."""
    q: dict[str, Any] = {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_quant_algo}
    if group_size is not None:
        q["group_size"] = group_size
    if quantized_layers is not None:
        q["quantized_layers"] = quantized_layers
    q["exclude_modules"] = list(exclude) if exclude is not None else nvidia_qwen35_exclude()
    return {"producer": dict(PRODUCER), "quantization": q}


def _group(algo: str, group_size: int | None) -> dict[str, Any]:
    if algo == "FP8":
        return {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
        }
    gs = group_size or 16
    return {
        "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs},
        "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs},
    }


def modelopt_quantization_config(hf_quant: dict[str, Any]) -> dict[str, Any]:
    """config.json's ``quantization_config`` derived from hf_quant_config.json the way
    ModelOpt's exporter does (same key order)."""
    q = hf_quant["quantization"]
    algo = q["quant_algo"]
    out: dict[str, Any] = {}
    if algo == "MIXED_PRECISION":
        groups: dict[str, Any] = {}
        by_algo: dict[tuple[str, Any], list[str]] = {}
        for name, info in q["quantized_layers"].items():
            by_algo.setdefault((info["quant_algo"], info.get("group_size")), []).append(name)
        for i, ((a, gs), names) in enumerate(by_algo.items()):
            groups[f"group_{i}"] = {**_group(a, gs), "targets": sorted(names)}
        out["config_groups"] = groups
        out["quantized_layers"] = q["quantized_layers"]
    else:
        out["config_groups"] = {"group_0": {**_group(algo, q.get("group_size")), "targets": ["Linear"]}}
    out["ignore"] = list(q.get("exclude_modules") or [])
    out["quant_algo"] = algo
    if q.get("kv_cache_quant_algo") == "FP8":
        out["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
    out["producer"] = dict(hf_quant["producer"])
    out["quant_method"] = "modelopt"
    return out


def modelopt_nvfp4_configs(
    exclude: list[str] | None = None,
    prefix: str = VLM,
    *,
    num_layers: int = 4,
    kv_cache_quant_algo: str | None = "FP8",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hf_quant_config.json, config.json quantization_config) for an NVFP4 export.

    Default exclusions are NVIDIA's Qwen3.5 shape, with the ``mtp.fc`` gap."""
    if exclude is None:
        exclude = nvidia_qwen35_exclude(prefix, num_layers=num_layers)
    hq = modelopt_hf_quant("NVFP4", exclude, kv_cache_quant_algo=kv_cache_quant_algo)
    return hq, modelopt_quantization_config(hq)


def modelopt_fp8_configs(
    exclude: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hf_quant_config.json, quantization_config) for a ModelOpt FP8 export."""
    hq = modelopt_hf_quant("FP8", exclude if exclude is not None else ["lm_head"], group_size=None)
    return hq, modelopt_quantization_config(hq)


def modelopt_mixed_configs(
    quantized_layers: dict[str, str],
    exclude: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """MIXED_PRECISION (NVIDIA's Qwen3.6 style): ``quantized_layers`` prefix -> algo."""
    layers: dict[str, dict[str, Any]] = {}
    for name, algo in quantized_layers.items():
        layers[name] = {"quant_algo": algo, "group_size": 16} if "NVFP4" in algo else {"quant_algo": algo}
    hq = modelopt_hf_quant("MIXED_PRECISION", exclude if exclude is not None else [], quantized_layers=layers)
    return hq, modelopt_quantization_config(hq)


def compressed_tensors_nvfp4_config(ignore: list[str] | None = None) -> dict[str, Any]:
    """llm-compressor ``nvfp4-pack-quantized`` quantization_config (no hf_quant_config.json)."""
    return {
        "config_groups": {
            "group_0": {
                "input_activations": {
                    "dynamic": "local",
                    "group_size": 16,
                    "num_bits": 4,
                    "strategy": "tensor_group",
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "dynamic": False,
                    "group_size": 16,
                    "num_bits": 4,
                    "strategy": "tensor_group",
                    "symmetric": True,
                    "type": "float",
                },
            }
        },
        "format": "nvfp4-pack-quantized",
        "ignore": list(ignore)
        if ignore is not None
        else ["lm_head", "re:.*mlp.gate$", "re:.*linear_attn.*", "re:^mtp.*"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def fp8_block_config(modules_to_not_convert: list[str] | None = None) -> dict[str, Any]:
    """Qwen's own block-FP8 quantization_config (quant_method "fp8")."""
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": list(modules_to_not_convert or ["lm_head"]),
    }


def qwen35_moe_config(
    quantization_config: dict[str, Any] | None = None,
    *,
    vlm: bool = True,
    num_layers: int = 4,
    mtp_layers: int = 1,
) -> dict[str, Any]:
    """A tiny config.json of the Qwen3.5-MoE family (VLM wrapper or text-only)."""
    text: dict[str, Any] = {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 64,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "full_attention_interval": 4,
        "mtp_num_hidden_layers": mtp_layers,
        "vocab_size": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    if not vlm:
        doc = {"architectures": ["Qwen3_5MoeForCausalLM"], **text, "model_type": "qwen3_5_moe"}
        if quantization_config is not None:
            doc["quantization_config"] = quantization_config
        doc["torch_dtype"] = "bfloat16"
        doc["transformers_version"] = "4.57.0"
        return doc
    doc = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "image_token_id": 248056,
        "model_type": "qwen3_5_moe",
    }
    if quantization_config is not None:
        doc["quantization_config"] = quantization_config
    doc["text_config"] = text
    doc["tie_word_embeddings"] = False
    doc["transformers_version"] = "4.57.0"
    doc["vision_config"] = {"depth": 2, "hidden_size": 32, "out_hidden_size": 64}
    return doc


def qwen35_moe_modules(
    prefix: str = VLM,
    *,
    num_layers: int = 4,
    num_experts: int = 4,
    mtp_prefix: str = "",
    full_attention_interval: int = 4,
    vision: bool = True,
) -> list[str]:
    """Every linear-ish module name of a tiny Qwen3.5-MoE checkpoint (target + drafter)."""
    out: list[str] = []
    for i in range(num_layers):
        layer = f"{prefix}layers.{i}"
        if (i + 1) % full_attention_interval == 0:
            out += [f"{layer}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        else:
            out += [
                f"{layer}.linear_attn.{p}"
                for p in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj")
            ]
        out += [f"{layer}.mlp.gate", f"{layer}.mlp.shared_expert_gate"]
        out += [f"{layer}.mlp.shared_expert.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
        out += [
            f"{layer}.mlp.experts.{e}.{p}"
            for e in range(num_experts)
            for p in ("gate_proj", "up_proj", "down_proj")
        ]
    out.append("lm_head")
    if vision:
        out += [
            "model.visual.blocks.0.attn.qkv",
            "model.visual.blocks.0.mlp.linear_fc1",
            "model.visual.merger.linear_fc2",
        ]
    out += qwen35_moe_drafter_modules(mtp_prefix, num_experts=num_experts)
    return out


def qwen35_moe_drafter_modules(mtp_prefix: str = "", *, num_experts: int = 4) -> list[str]:
    """The drafter's linear-ish modules (``mtp_prefix`` e.g. "model.language_model.")."""
    m = f"{mtp_prefix}mtp"
    out = [f"{m}.fc"]
    out += [f"{m}.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    out += [f"{m}.layers.0.mlp.gate", f"{m}.layers.0.mlp.shared_expert_gate"]
    out += [f"{m}.layers.0.mlp.shared_expert.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    out += [
        f"{m}.layers.0.mlp.experts.{e}.{p}"
        for e in range(num_experts)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    return out


def nvidia_stored_formats(modules: list[str], exclude_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """What NVIDIA's NVFP4 export really stores: NVFP4 except lm_head, vision, linear_attn
    in/conv, router gates and the whole MTP branch (BF16), and modules in
    ``exclude_prefixes``."""
    out: dict[str, str] = {}
    for m in modules:
        plain = (
            m == "lm_head"
            or ".visual." in m
            or "linear_attn.in_proj_a" in m
            or "linear_attn.in_proj_b" in m
            or m.endswith((".mlp.gate", ".shared_expert_gate"))
            or m.startswith("mtp.")
            or ".mtp." in m
            or m.startswith(exclude_prefixes)
        )
        out[m] = "plain" if plain else "nvfp4"
    return out
