"""More tiny family checkpoints (issue 14), with the names the cited vLLM files load.

`family_checkpoints.BUILDERS` includes these; they are split out to keep each module small.
LongCat-Flash's paired target sub-layers and ``model.mtp.*`` MTP layer; Dots3-NOTE's gated
MLA; Bailing-MoE-V3's ``attention.*`` MLA with ``dense``; ERNIE-4.5's ``model.mtp_block.*``
parts; K-EXAONE's and EXAONE-4.5's ``mtp.*``; Intern-S2-Mobius's Qwen3.5-MoE layout;
Hunyuan-V3's ``shared_mlp``; GLM-OCR's ``model.language_model.layers.{N}`` drafter.
"""

from __future__ import annotations

from typing import Any

import torch

from mtpconv.testing import family_checkpoints as fc
from mtpconv.testing.checkpoints import Spec, build_tensors, make_config


def longcat_flash(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """LongCat-Flash: ``num_layers`` paired target layers, then the ``model.mtp`` layer."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS):
        p = f"model.layers.{i}."
        for k in range(2):
            t[f"{p}input_layernorm.{k}.weight"] = r.ones(fc.H)
            t[f"{p}post_attention_layernorm.{k}.weight"] = r.ones(fc.H)
            fc._mla(t, f"{p}self_attn.{k}.", r, indexer=False)
            fc._mlp(t, f"{p}mlps.{k}.", r)
        t[f"{p}mlp.router.classifier.weight"] = r.w(fc.EXPERTS, fc.H)
        t[f"{p}mlp.router.e_score_correction_bias"] = torch.zeros(fc.EXPERTS, dtype=torch.float32)
        for e in range(fc.EXPERTS):
            fc._mlp(t, f"{p}mlp.experts.{e}.", r)
    t["model.mtp.embed_tokens.weight"] = r.w(fc.VOCAB, fc.H, scale=1)
    t["model.mtp.norm.weight"] = r.ones(fc.H)
    p = "model.mtp.layers.0."
    t[f"{p}eh_proj.weight"] = r.w(fc.H, 2 * fc.H)
    t[f"{p}enorm.m.weight"] = r.ones(fc.H)
    t[f"{p}hnorm.m.weight"] = r.ones(fc.H)
    t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
    t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
    fc._mla(t, f"{p}self_attn.", r, indexer=False)
    fc._mlp(t, f"{p}transformer_layer.mlp.", r)
    cfg = fc._mla_config("longcat_flash", "LongcatFlashForCausalLM", num_layers=fc.LAYERS)
    del cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]  # LongCat's config has neither
    cfg.update(ffn_hidden_size=fc.INTER, expert_ffn_hidden_size=fc.INTER, moe_topk=2, zero_expert_num=0)
    return t, cfg


def dots3_note(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """dots3_note/nvidia/model.py / mtp.py: gated (``g_proj``) MLA layers, MoE in the target,
    a dense MLP in the MTP layer at ``model.layers.{num_hidden_layers}`` (sliding attention,
    vLLM's default ``mtp_layer_types``), its own ``model.mtp.embed_tokens``."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS + 1):
        p = f"model.layers.{i}."
        fc._deepseek_layer(t, p, r, indexer=i == 0, moe=i < fc.LAYERS)
        t[f"{p}self_attn.g_proj.weight"] = r.w(fc.HEADS, fc.H)
    fc._step_modules(t, f"model.layers.{fc.LAYERS}.", r, head=False)
    t[f"model.layers.{fc.LAYERS}.shared_head.norm.weight"] = r.ones(fc.H)
    t["model.mtp.embed_tokens.weight"] = r.w(fc.VOCAB, fc.H, scale=1)
    cfg = fc._mla_config("dots3_note", "Dots3NoteForCausalLM", index_n_heads=fc.INDEX_HEADS)
    cfg.update(
        layer_types=["full_attention"] + ["sliding_attention"] * (fc.LAYERS - 1),
        attention_gate_type="headwise",
        swa_attention_gate_type="headwise",
        index_head_dim=fc.INDEX_DIM,
        index_topk=8,
        **{
            f"swa_{k}": cfg[k]
            for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")
        },
        swa_v_head_dim=fc.V_DIM,
        swa_num_attention_heads=fc.HEADS,
    )
    return t, cfg


def _bailing_v3_layer(t: fc.Tensors, p: str, r: fc._Gen) -> None:
    """bailing_moe_v3.py's MLA under ``attention.`` (its hf_to_vllm_mapper renames it
    ``self_attn.``), a head-wise ``g_proj``, the output ``dense``, and the MoE."""
    t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
    t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
    a = f"{p}attention."
    fc._mla(t, a, r, indexer=False)
    t[f"{a}dense.weight"] = t.pop(f"{a}o_proj.weight")
    t[f"{a}g_proj.weight"] = r.w(fc.HEADS, fc.H)
    fc._deepseek_moe(t, f"{p}mlp.", r)


def bailing_moe_v3(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """Bailing-MoE-V3 (bailing_moe_v3_mtp.py): the MTP layer at ``model.layers.{N}`` with a
    quantizable eh_proj and ``final_layernorm``."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS + 1):
        _bailing_v3_layer(t, f"model.layers.{i}.", r)
    fc._step_modules(t, f"model.layers.{fc.LAYERS}.", r)
    t[f"model.layers.{fc.LAYERS}.final_layernorm.weight"] = r.ones(fc.H)
    cfg = fc._mla_config("bailing_hybrid", "BailingMoeV3ForCausalLM", num_experts=fc.EXPERTS)
    cfg.update(gated_attention_proj_granularity_type="head_wise", num_shared_experts=1)
    return t, cfg


def ernie4_5_moe(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """ERNIE-4.5-MoE (ernie_mtp.py): ``model.mtp_block.0.*`` (a Llama decoder layer) and the
    ``model.mtp_{emb_norm,hidden_norm,linear_proj}.0`` step tensors."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS):
        p = f"model.layers.{i}."
        t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
        t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
        fc._mha(t, f"{p}self_attn.", r)
        t[f"{p}mlp.gate.weight"] = r.w(fc.EXPERTS, fc.H)
        for e in range(fc.EXPERTS):
            fc._mlp(t, f"{p}mlp.experts.{e}.", r)
    t["model.mtp_emb_norm.0.weight"] = r.ones(fc.H)
    t["model.mtp_hidden_norm.0.weight"] = r.ones(fc.H)
    t["model.mtp_linear_proj.0.weight"] = r.w(fc.H, 2 * fc.H)
    p = "model.mtp_block.0."
    t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
    t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
    fc._mha(t, f"{p}self_attn.", r)
    fc._mlp(t, f"{p}mlp.", r)
    cfg = {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "model_type": "ernie4_5_moe",
        "hidden_size": fc.H,
        "intermediate_size": fc.INTER,
        "moe_intermediate_size": fc.INTER,
        "num_hidden_layers": fc.LAYERS,
        "num_attention_heads": fc.HEADS,
        "num_key_value_heads": 1,
        "head_dim": fc.HEAD_DIM,
        "moe_num_experts": fc.EXPERTS,
        "moe_k": 2,
        "num_nextn_predict_layers": 1,
        "vocab_size": fc.VOCAB,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    return t, cfg


def _exaone_block(t: fc.Tensors, p: str, r: fc._Gen) -> None:
    """An Exaone-4 style decoder layer: q/k norms, post-norms, a dense gated MLP."""
    for n in ("post_attention_layernorm", "post_feedforward_layernorm"):
        t[f"{p}{n}.weight"] = r.ones(fc.H)
    fc._mha(t, f"{p}self_attn.", r)
    t[f"{p}self_attn.q_norm.weight"] = r.ones(fc.HEAD_DIM)
    t[f"{p}self_attn.k_norm.weight"] = r.ones(fc.HEAD_DIM)
    fc._mlp(t, f"{p}mlp.", r)


def _exaone_mtp(t: fc.Tensors, r: fc._Gen) -> None:
    """The ``mtp.*`` drafter (exaone_moe_mtp.py / exaone4_5_mtp.py): fc, pre-fc norms, layers."""
    t["mtp.fc.weight"] = r.w(fc.H, 2 * fc.H)
    for n in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        t[f"mtp.{n}.weight"] = r.ones(fc.H)
    _exaone_block(t, "mtp.layers.0.", r)


def _exaone_cfg(model_type: str, arch: str) -> dict[str, Any]:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": fc.H,
        "intermediate_size": fc.INTER,
        "num_hidden_layers": fc.LAYERS,
        "num_attention_heads": fc.HEADS,
        "num_key_value_heads": 1,
        "head_dim": fc.HEAD_DIM,
        "vocab_size": fc.VOCAB,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }


def exaone_moe(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """K-EXAONE (exaone_moe.py): MoE target layers, a dense ``mtp.layers.0``."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS):
        p = f"model.layers.{i}."
        fc._mha(t, f"{p}self_attn.", r)
        t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
        fc._deepseek_moe(t, f"{p}mlp.", r)
    _exaone_mtp(t, r)
    cfg = _exaone_cfg("exaone_moe", "ExaoneMoEForCausalLM")
    cfg.update(
        num_experts=fc.EXPERTS,
        num_experts_per_tok=2,
        moe_intermediate_size=fc.INTER,
        mlp_layer_types=["sparse"] * fc.LAYERS,
        num_nextn_predict_layers=1,
    )
    return t, cfg


def exaone4_5(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """EXAONE-4.5 VLM (exaone4_5_mtp.py): the text model under ``model.language_model.``, the
    drafter at top-level ``mtp.*``, ``num_nextn_predict_layers`` read from the top level."""
    t: fc.Tensors = {}
    fc._head(t, r, base="model.language_model.")
    t["model.visual.merger.mlp.0.weight"] = r.w(fc.H, fc.H)
    for i in range(fc.LAYERS):
        _exaone_block(t, f"model.language_model.layers.{i}.", r)
    _exaone_mtp(t, r)
    text = _exaone_cfg("exaone4_5_text", "Exaone4ForCausalLM")
    del text["architectures"]
    cfg = {
        "architectures": ["Exaone4_5_ForConditionalGeneration"],
        "model_type": "exaone4_5",
        "text_config": text,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
    }
    return t, cfg


def interns2_mobius(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """Intern-S2-Mobius (interns2_mobius.py): a Qwen3.5-MoE VLM layout whose text_config gives
    the drafter's MoE its own ``mtp_num_experts`` / ``mtp_num_experts_per_tok``."""
    spec = Spec(family="qwen3_5_moe", vlm=True, seed=int(torch.randint(0, 1 << 16, (1,), generator=r.g)))
    tensors, _ = build_tensors(spec)
    cfg = make_config(spec)
    cfg.update(model_type="interns2_mobius", architectures=["InternS2MobiusForConditionalGeneration"])
    cfg["text_config"].update(mtp_num_experts=spec.experts, mtp_num_experts_per_tok=spec.experts_per_tok)
    return tensors, cfg


def hy_v3(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """Hunyuan-V3 (hy_v3.py / hy_v3_mtp.py): MoE layers with ``mlp.router.gate`` and a
    ``shared_mlp``; the MTP step at ``model.layers.{N}`` with eh_proj and final_layernorm."""
    t: fc.Tensors = {}
    fc._head(t, r)
    for i in range(fc.LAYERS + 1):
        p = f"model.layers.{i}."
        t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
        t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
        fc._mha(t, f"{p}self_attn.", r)
        t[f"{p}mlp.router.gate.weight"] = r.w(fc.EXPERTS, fc.H).float()
        for e in range(fc.EXPERTS):
            fc._mlp(t, f"{p}mlp.experts.{e}.", r)
        fc._mlp(t, f"{p}mlp.shared_mlp.", r)
    p = f"model.layers.{fc.LAYERS}."
    fc._step_modules(t, p, r, head=False)
    t[f"{p}final_layernorm.weight"] = r.ones(fc.H)
    cfg = _exaone_cfg("hy_v3", "HYV3ForCausalLM")
    cfg.update(
        num_experts=fc.EXPERTS,
        num_experts_per_tok=2,
        num_shared_experts=1,
        expert_hidden_dim=fc.INTER,
        first_k_dense_replace=0,
        num_nextn_predict_layers=1,
    )
    return t, cfg


def glm_ocr(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """GLM-OCR (glm_ocr_mtp.py): a VLM whose text layers, the MTP one at index N included, live
    under ``model.language_model.layers.*``; Glm4 decoder layers (q/k/v biases, four norms)."""
    t: fc.Tensors = {}
    fc._head(t, r, base="model.language_model.")
    t["model.visual.blocks.0.attn.qkv.weight"] = r.w(3 * fc.H, fc.H)
    for i in range(fc.LAYERS + 1):
        p = f"model.language_model.layers.{i}."
        for n in (
            "input_layernorm",
            "post_attention_layernorm",
            "post_self_attn_layernorm",
            "post_mlp_layernorm",
        ):
            t[f"{p}{n}.weight"] = r.ones(fc.H)
        fc._mha(t, f"{p}self_attn.", r)
        for n, width in (
            ("q_proj", fc.HEADS * fc.HEAD_DIM),
            ("k_proj", fc.HEAD_DIM),
            ("v_proj", fc.HEAD_DIM),
        ):
            t[f"{p}self_attn.{n}.bias"] = r.w(width)
        t[f"{p}mlp.gate_up_proj.weight"] = r.w(2 * fc.INTER, fc.H)
        t[f"{p}mlp.down_proj.weight"] = r.w(fc.H, fc.INTER)
    p = f"model.language_model.layers.{fc.LAYERS}."
    fc._step_modules(t, p, r, head=False)
    t[f"{p}shared_head.norm.weight"] = r.ones(fc.H)
    text = _exaone_cfg("glm_ocr_text", "unused")
    del text["architectures"]
    text["num_nextn_predict_layers"] = 1
    cfg = {
        "architectures": ["GlmOcrForConditionalGeneration"],
        "model_type": "glm_ocr",
        "text_config": text,
        "tie_word_embeddings": False,
    }
    return t, cfg


MORE_BUILDERS = {
    "longcat_flash": longcat_flash,
    "dots3_note": dots3_note,
    "bailing_moe_v3": bailing_moe_v3,
    "ernie4_5_moe": ernie4_5_moe,
    "exaone_moe": exaone_moe,
    "exaone4_5": exaone4_5,
    "interns2_mobius": interns2_mobius,
    "hy_v3": hy_v3,
    "glm_ocr": glm_ocr,
    # bailing_moe_mtp.py: DeepSeek-style MLA + MoE, nn.Linear eh_proj
    "bailing_moe_v2_5": fc._mla_family("bailing_hybrid", "BailingMoeV2_5ForCausalLM"),
}
MORE_DRAFTER_PREFIXES = {
    "longcat_flash": "model.mtp.",
    "ernie4_5_moe": "model.mtp_",
    "exaone_moe": "mtp.",
    "exaone4_5": "mtp.",
    "interns2_mobius": "mtp.",
    "glm_ocr": "model.language_model.layers.{layers}.",  # formatted by drafter_prefix
}
