"""Tiny checkpoints of the MTP families beyond `checkpoints.Spec`'s, with vLLM's tensor names.

Each factory writes the names the family's vLLM MTP class and target model load (the file
its `mtpconv.families` row cites): Nemotron-H's ``backbone.*`` target and ``mtp.layers.*``
drafter with non-gated experts, DeepSeek-V3.2 / GLM-MoE-DSA MLA layers with the sparse
indexer, GLM-4.7-Flash's MLA drafter, MiMo-V2's ``model.mtp.layers.*``, Step-3.5's 3-D
``moe.*_proj`` experts. ``quant="nvfp4"`` stores the target's linears ModelOpt-NVFP4 (the
drafter too with ``drafter_quant="nvfp4"``), with NVIDIA-style exclusions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtpconv.testing.checkpoints import _write_shards, to_nvfp4

H, INTER, VOCAB, HEADS, HEAD_DIM, EXPERTS, LAYERS = 64, 128, 256, 2, 32, 4, 2
# MLA sizes (multiples of 16, so every linear can be NVFP4)
Q_LORA, KV_LORA, ROPE, NOPE, V_DIM = 32, 32, 16, 32, 32
INDEX_HEADS, INDEX_DIM = 4, 32

Tensors = dict[str, torch.Tensor]


@dataclass
class _Gen:
    g: torch.Generator

    def w(self, *shape: int, scale: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.g) * scale).to(torch.bfloat16)

    @staticmethod
    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(*shape, dtype=torch.bfloat16)


def _mlp(t: Tensors, p: str, r: _Gen, inter: int = INTER, gated: bool = True) -> None:
    if gated:
        t[f"{p}gate_proj.weight"] = r.w(inter, H)
    t[f"{p}up_proj.weight"] = r.w(inter, H)
    t[f"{p}down_proj.weight"] = r.w(H, inter)


def _mha(t: Tensors, p: str, r: _Gen) -> None:
    for n, shape in (("q_proj", (HEADS * HEAD_DIM, H)), ("k_proj", (HEAD_DIM, H)), ("v_proj", (HEAD_DIM, H))):
        t[f"{p}{n}.weight"] = r.w(*shape)
    t[f"{p}o_proj.weight"] = r.w(H, HEADS * HEAD_DIM)


def _mla(t: Tensors, p: str, r: _Gen, *, indexer: bool) -> None:
    """DeepSeek-V2/V3 multi-head latent attention (deepseek_v2.py), with the V3.2 indexer."""
    t[f"{p}q_a_proj.weight"] = r.w(Q_LORA, H)
    t[f"{p}q_a_layernorm.weight"] = r.ones(Q_LORA)
    t[f"{p}q_b_proj.weight"] = r.w(HEADS * (NOPE + ROPE), Q_LORA)
    t[f"{p}kv_a_proj_with_mqa.weight"] = r.w(KV_LORA + ROPE, H)
    t[f"{p}kv_a_layernorm.weight"] = r.ones(KV_LORA)
    t[f"{p}kv_b_proj.weight"] = r.w(HEADS * (NOPE + V_DIM), KV_LORA)
    t[f"{p}o_proj.weight"] = r.w(H, HEADS * V_DIM)
    if indexer:
        t[f"{p}indexer.wq_b.weight"] = r.w(INDEX_HEADS * INDEX_DIM, Q_LORA)
        t[f"{p}indexer.wk.weight"] = r.w(INDEX_DIM, H)
        t[f"{p}indexer.k_norm.weight"] = r.ones(INDEX_DIM)
        t[f"{p}indexer.k_norm.bias"] = torch.zeros(INDEX_DIM, dtype=torch.bfloat16)
        t[f"{p}indexer.weights_proj.weight"] = r.w(INDEX_HEADS, H)


def _deepseek_moe(t: Tensors, p: str, r: _Gen) -> None:
    t[f"{p}gate.weight"] = r.w(EXPERTS, H)
    t[f"{p}gate.e_score_correction_bias"] = torch.zeros(EXPERTS, dtype=torch.float32)
    for e in range(EXPERTS):
        _mlp(t, f"{p}experts.{e}.", r)
    _mlp(t, f"{p}shared_experts.", r)


def _deepseek_layer(t: Tensors, p: str, r: _Gen, *, indexer: bool, moe: bool = True) -> None:
    t[f"{p}input_layernorm.weight"] = r.ones(H)
    t[f"{p}post_attention_layernorm.weight"] = r.ones(H)
    _mla(t, f"{p}self_attn.", r, indexer=indexer)
    if moe:
        _deepseek_moe(t, f"{p}mlp.", r)
    else:
        _mlp(t, f"{p}mlp.", r)


def _step_modules(t: Tensors, p: str, r: _Gen, *, head: bool = True) -> None:
    """The per-step tensors of a DeepSeek-style MTP layer (deepseek_mtp.py)."""
    t[f"{p}eh_proj.weight"] = r.w(H, 2 * H)
    t[f"{p}enorm.weight"] = r.ones(H)
    t[f"{p}hnorm.weight"] = r.ones(H)
    if head:
        t[f"{p}shared_head.norm.weight"] = r.ones(H)
        t[f"{p}shared_head.head.weight"] = r.w(VOCAB, H, scale=1)
        t[f"{p}embed_tokens.weight"] = r.w(VOCAB, H, scale=1)


def _head(t: Tensors, r: _Gen, base: str = "model.") -> None:
    t[f"{base}embed_tokens.weight"] = r.w(VOCAB, H, scale=1)
    t[f"{base}norm.weight"] = r.ones(H)
    t["lm_head.weight"] = r.w(VOCAB, H, scale=1)


def _mla_config(model_type: str, arch: str, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": H,
        "intermediate_size": INTER,
        "moe_intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "vocab_size": VOCAB,
        "q_lora_rank": Q_LORA,
        "kv_lora_rank": KV_LORA,
        "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": NOPE,
        "v_head_dim": V_DIM,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 0,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        **extra,
    }


def _dsa(model_type: str, arch: str, **extra: Any) -> Callable[[_Gen], tuple[Tensors, dict[str, Any]]]:
    def build(r: _Gen) -> tuple[Tensors, dict[str, Any]]:
        t: Tensors = {}
        _head(t, r)
        for i in range(LAYERS + 1):  # the last one is the MTP layer
            _deepseek_layer(t, f"model.layers.{i}.", r, indexer=True)
        _step_modules(t, f"model.layers.{LAYERS}.", r)
        cfg = _mla_config(
            model_type, arch, index_n_heads=INDEX_HEADS, index_head_dim=INDEX_DIM, index_topk=8, **extra
        )
        return t, cfg

    return build


def _mla_family(model_type: str, arch: str) -> Callable[[_Gen], tuple[Tensors, dict[str, Any]]]:
    """GLM-4.7-Flash (glm4_moe_lite_mtp.py), Kimi-K2 (deepseek_mtp.py), openPangu-Ultra-MoE
    (openpangu_mtp.py): MLA without an indexer."""

    def build(r: _Gen) -> tuple[Tensors, dict[str, Any]]:
        t: Tensors = {}
        _head(t, r)
        for i in range(LAYERS + 1):
            _deepseek_layer(t, f"model.layers.{i}.", r, indexer=False)
        _step_modules(t, f"model.layers.{LAYERS}.", r)
        return t, _mla_config(model_type, arch)

    return build


def _nemotron_h(r: _Gen) -> tuple[Tensors, dict[str, Any]]:
    """nemotron_h.py / nemotron_h_mtp.py: ``backbone.*`` target (pattern ``M*E``), an
    attention + non-gated-MoE MTP step (``mtp_hybrid_override_pattern`` ``*E``)."""
    t: Tensors = {"backbone.embeddings.weight": r.w(VOCAB, H, scale=1)}
    pattern = "M*E"

    def mixer(p: str, kind: str) -> None:
        t[f"{p}norm.weight"] = r.ones(H)
        m = f"{p}mixer."
        if kind == "M":
            t[f"{m}in_proj.weight"] = r.w(2 * H + 2 * 16 + 2, H)
            t[f"{m}conv1d.weight"] = r.w(H + 32, 1, 4)
            t[f"{m}conv1d.bias"] = r.w(H + 32)
            for n in ("A_log", "D", "dt_bias"):
                t[f"{m}{n}"] = r.ones(2)
            t[f"{m}norm.weight"] = r.ones(H)
            t[f"{m}out_proj.weight"] = r.w(H, H)
        elif kind == "*":
            _mha(t, m, r)
        else:
            t[f"{m}gate.weight"] = r.w(EXPERTS, H)
            t[f"{m}gate.e_score_correction_bias"] = torch.zeros(EXPERTS, dtype=torch.float32)
            for e in range(EXPERTS):
                _mlp(t, f"{m}experts.{e}.", r, gated=False)
            _mlp(t, f"{m}shared_experts.", r, gated=False)

    for i, kind in enumerate(pattern):
        mixer(f"backbone.layers.{i}.", kind)
    t["backbone.norm_f.weight"] = r.ones(H)
    t["lm_head.weight"] = r.w(VOCAB, H, scale=1)
    t["mtp.layers.0.enorm.weight"] = r.ones(H)
    t["mtp.layers.0.hnorm.weight"] = r.ones(H)
    t["mtp.layers.0.eh_proj.weight"] = r.w(H, 2 * H)
    mixer("mtp.layers.0.", "*")
    mixer("mtp.layers.1.", "E")
    t["mtp.layers.1.final_layernorm.weight"] = r.ones(H)
    cfg = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": H,
        "intermediate_size": INTER,
        "moe_intermediate_size": INTER,
        "moe_shared_expert_intermediate_size": INTER,
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "mtp_hybrid_override_pattern": "*E",
        "num_nextn_predict_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "n_routed_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "vocab_size": VOCAB,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
    }
    return t, cfg


def _mimo_v2(r: _Gen) -> tuple[Tensors, dict[str, Any]]:
    """mimo_v2_mtp.py (Flash: separate q/k/v): ``model.mtp.layers.0.*``, dense MLP."""
    t: Tensors = {}
    _head(t, r)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[f"{p}input_layernorm.weight"] = r.ones(H)
        t[f"{p}post_attention_layernorm.weight"] = r.ones(H)
        _mha(t, f"{p}self_attn.", r)
        _mlp(t, f"{p}mlp.", r)
    p = "model.mtp.layers.0."
    for n in ("enorm", "hnorm", "input_layernorm", "pre_mlp_layernorm", "final_layernorm"):
        t[f"{p}{n}.weight"] = r.ones(H)
    t[f"{p}eh_proj.weight"] = r.w(H, 2 * H)
    _mha(t, f"{p}self_attn.", r)
    _mlp(t, f"{p}mlp.", r)
    cfg = {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "num_nextn_predict_layers": 1,
        "layernorm_epsilon": 1e-5,
        "tie_word_embeddings": False,
    }
    return t, cfg


def _step3p5(r: _Gen) -> tuple[Tensors, dict[str, Any]]:
    """step3p5.py / step3p5_mtp.py: 3-D ``moe.{gate,up,down}_proj.weight`` experts,
    ``share_expert``, the MTP step at ``model.layers.{num_hidden_layers}``."""
    t: Tensors = {}
    _head(t, r)
    for i in range(LAYERS + 1):
        p = f"model.layers.{i}."
        t[f"{p}input_layernorm.weight"] = r.ones(H)
        t[f"{p}post_attention_layernorm.weight"] = r.ones(H)
        _mha(t, f"{p}self_attn.", r)
        t[f"{p}self_attn.q_norm.weight"] = r.ones(HEAD_DIM)
        t[f"{p}self_attn.k_norm.weight"] = r.ones(HEAD_DIM)
        t[f"{p}moe.gate.weight"] = r.w(EXPERTS, H)
        t[f"{p}moe.gate_proj.weight"] = r.w(EXPERTS, INTER, H)
        t[f"{p}moe.up_proj.weight"] = r.w(EXPERTS, INTER, H)
        t[f"{p}moe.down_proj.weight"] = r.w(EXPERTS, H, INTER)
        _mlp(t, f"{p}share_expert.", r)
    _step_modules(t, f"model.layers.{LAYERS}.", r)
    cfg = {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "hidden_size": H,
        "intermediate_size": INTER,
        "moe_intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_attention_groups": 1,
        "head_dim": HEAD_DIM,
        "moe_num_experts": EXPERTS,
        "moe_top_k": 2,
        "vocab_size": VOCAB,
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    return t, cfg


BUILDERS: dict[str, Callable[[_Gen], tuple[Tensors, dict[str, Any]]]] = {
    "nemotron_h": _nemotron_h,
    "deepseek_v32": _dsa("deepseek_v32", "DeepseekV32ForCausalLM"),
    "glm_moe_dsa": _dsa("glm_moe_dsa", "GlmMoeDsaForCausalLM"),
    "glm5_next": _dsa("glm5_next_text", "Glm5NextForCausalLM", index_kpool=4),
    "glm4_moe_lite": _mla_family("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
    "kimi_k2": _mla_family("kimi_k2", "DeepseekV3ForCausalLM"),
    "openpangu": _mla_family("pangu_ultra_moe", "PanguUltraMoEForCausalLM"),
    "mimo_v2": _mimo_v2,
    "step3p5": _step3p5,
}
# Builders of later families live in family_builders_more (it reads the helpers above).
from mtpconv.testing.family_builders_more import MORE_BUILDERS, MORE_DRAFTER_PREFIXES  # noqa: E402

BUILDERS.update(MORE_BUILDERS)
from mtpconv.testing.family_kimi_k3 import KIMI_K3_BUILDERS, KIMI_K3_DRAFTER_PREFIXES  # noqa: E402

BUILDERS.update(KIMI_K3_BUILDERS)
from mtpconv.testing.family_deepseek_v4 import deepseek_v4  # noqa: E402

BUILDERS["deepseek_v4"] = deepseek_v4
# What is NVFP4 in these fixtures: 2-D ``*_proj`` linears, never the indexer (BF16 in
# NVIDIA's exports) nor the plain-nn.Linear ``eh_proj``.
_NVFP4_SKIP = (".indexer.", ".eh_proj.", "embed", "lm_head", "shared_head")


_FAMILY_EXCLUDES = {
    "nemotron_h": ["*conv1d*"],
    "step3p5": ["*.moe.*"],
}


def drafter_prefix(family: str) -> str:
    """Where the fixture's drafter tensors start (for exclusions and for tests)."""
    prefixes = {
        "nemotron_h": "mtp.",
        "mimo_v2": "model.mtp.",
        **MORE_DRAFTER_PREFIXES,
        "deepseek_v4": "mtp.",
        **KIMI_K3_DRAFTER_PREFIXES,
    }
    return prefixes.get(family, "model.layers.{layers}.").format(layers=LAYERS)


def _nvfp4_ok(name: str, w: torch.Tensor) -> bool:
    return (
        name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
        and w.dim() == 2
        and not any(s in name for s in _NVFP4_SKIP)
    )


def _nvfp4_configs(exclude: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": "FP8",
            "group_size": 16,
            "exclude_modules": exclude,
        },
    }
    flat = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
        "group_size": 16,
        "ignore": list(exclude),
        "producer": {"name": "modelopt", "version": "0.37.0"},
    }
    return hf_quant, flat


def write_family_checkpoint(
    directory: str | Path, family: str, *, quant: str = "bf16", drafter_quant: str = "bf16", seed: int = 0
) -> Path:
    """Write the tiny ``family`` checkpoint (``quant``/``drafter_quant``: "bf16" | "nvfp4")."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    r = _Gen(torch.Generator().manual_seed(seed))
    tensors, cfg = BUILDERS[family](r)
    prefix = drafter_prefix(family)
    g = torch.Generator().manual_seed(seed + 1)
    stored: Tensors = {}
    for name, w in tensors.items():
        mode = drafter_quant if name.startswith(prefix) else quant
        if mode == "nvfp4" and _nvfp4_ok(name, w):
            for k, v in to_nvfp4(w, g).items():
                stored[f"{name[: -len('.weight')]}.{k}"] = v
        else:
            stored[name] = w
    if "nvfp4" in (quant, drafter_quant):
        # what stays BF16 in these fixtures: heads, the nn.Linear eh_proj, the indexer, Mamba's
        # conv1d and Step-3.5's 3-D experts
        exclude = ["lm_head", "*eh_proj*", "*indexer*", "*shared_head*", *_FAMILY_EXCLUDES.get(family, [])]
        if drafter_quant != "nvfp4":
            exclude.append(f"{prefix}*")
        hf_quant, flat = _nvfp4_configs(exclude)
        cfg["quantization_config"] = flat
        (directory / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
    cfg["torch_dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}) + "\n")
    drafter = {n for n in stored if n.startswith(prefix)}
    _write_shards(directory, stored, drafter, 2)
    return directory
