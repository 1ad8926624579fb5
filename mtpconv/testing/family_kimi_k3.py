"""The tiny Kimi-K3 checkpoint (issue 14), with the names vLLM 0.32's Kimi-K3 files load.

``vllm/models/kimi_k3/nvidia/model.py`` (``KimiK3ForConditionalGeneration`` over a
``KimiLinearForCausalLM``: KDA and MLA decoder layers, the latent MoE) and ``mtp.py``
(``KimiK3MTP.load_weights``): the target's text weights under ``language_model.model.*``
and ``language_model.lm_head``, the MTP layer at ``language_model.model.layers.{N}.*``
(MLA with the ``g_proj`` output gate, a latent MoE with ``experts.{e}.w1/w2/w3``, the step's
``eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head`` / ``embed_tokens``, and the
attention-residual tensors the MTP loader skips).
"""

from __future__ import annotations

from typing import Any

import torch

from mtpconv.testing import family_checkpoints as fc

LATENT = 32  # routed_expert_hidden_size: the routed experts run in this latent width
_TEXT = "language_model.model."


def _attn_res(t: fc.Tensors, p: str, r: fc._Gen) -> None:
    """AttnRes (attn_res_block_size): quant_config=None [1, H] projections and their norms."""
    for n in ("self_attention_res", "mlp_res"):
        t[f"{p}{n}_norm.weight"] = r.ones(fc.H)
        t[f"{p}{n}_proj.weight"] = r.w(1, fc.H)


def _kda(t: fc.Tensors, p: str, r: fc._Gen) -> None:
    """kda.py's Kimi delta attention with the full-rank gate (a target-only layer)."""
    dim = fc.HEADS * fc.HEAD_DIM
    for n in ("q_proj", "k_proj", "v_proj", "g_proj"):
        t[f"{p}{n}.weight"] = r.w(dim, fc.H)
    t[f"{p}b_proj.weight"] = r.w(fc.HEADS, fc.H)
    t[f"{p}f_a_proj.weight"] = r.w(fc.HEAD_DIM, fc.H)
    t[f"{p}f_b_proj.weight"] = r.w(dim, fc.HEAD_DIM)
    for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
        t[f"{p}{n}.weight"] = r.w(dim, 1, 4)
    t[f"{p}dt_bias"] = r.w(dim)
    t[f"{p}A_log"] = r.ones(1, 1, fc.HEADS, 1)
    t[f"{p}o_norm.weight"] = r.ones(fc.HEAD_DIM)
    t[f"{p}o_proj.weight"] = r.w(fc.H, dim)


def _latent_moe(t: fc.Tensors, p: str, r: fc._Gen) -> None:
    """KimiMoE with routed_expert_hidden_size: down to the latent width, w1/w2/w3 experts there."""
    t[f"{p}gate.weight"] = r.w(fc.EXPERTS, fc.H)
    t[f"{p}gate.e_score_correction_bias"] = torch.zeros(fc.EXPERTS, dtype=torch.float32)
    for e in range(fc.EXPERTS):
        t[f"{p}experts.{e}.w1.weight"] = r.w(fc.INTER, LATENT)
        t[f"{p}experts.{e}.w3.weight"] = r.w(fc.INTER, LATENT)
        t[f"{p}experts.{e}.w2.weight"] = r.w(LATENT, fc.INTER)
    fc._mlp(t, f"{p}shared_experts.", r)
    t[f"{p}routed_expert_down_proj.weight"] = r.w(LATENT, fc.H)
    t[f"{p}routed_expert_norm.weight"] = r.ones(LATENT)
    t[f"{p}routed_expert_up_proj.weight"] = r.w(fc.H, LATENT)


def _layer(t: fc.Tensors, p: str, r: fc._Gen, *, kda: bool, moe: bool) -> None:
    t[f"{p}input_layernorm.weight"] = r.ones(fc.H)
    t[f"{p}post_attention_layernorm.weight"] = r.ones(fc.H)
    if kda:
        _kda(t, f"{p}self_attn.", r)
    else:  # mla.py: q-LoRA MLA with the output gate (packed into fused_qkv_a_g_proj)
        fc._mla(t, f"{p}self_attn.", r, indexer=False)
        t[f"{p}self_attn.g_proj.weight"] = r.w(fc.HEADS * fc.V_DIM, fc.H)
    if moe:
        _latent_moe(t, f"{p}block_sparse_moe.", r)
    else:
        fc._mlp(t, f"{p}mlp.", r)
    _attn_res(t, p, r)


def kimi_k3(r: fc._Gen) -> tuple[fc.Tensors, dict[str, Any]]:
    """Kimi-K3: a KDA + dense layer, an MLA + latent-MoE layer, then the MTP layer (MLA + MoE)."""
    t: fc.Tensors = {}
    t[f"{_TEXT}embed_tokens.weight"] = r.w(fc.VOCAB, fc.H, scale=1)
    t[f"{_TEXT}norm.weight"] = r.ones(fc.H)
    t["language_model.lm_head.weight"] = r.w(fc.VOCAB, fc.H, scale=1)
    for i in range(fc.LAYERS + 1):  # the last one is the MTP layer
        _layer(t, f"{_TEXT}layers.{i}.", r, kda=i == 0, moe=i > 0)
    fc._step_modules(t, f"{_TEXT}layers.{fc.LAYERS}.", r)
    text = {
        "model_type": "kimi_linear",
        "hidden_size": fc.H,
        "intermediate_size": fc.INTER,
        "moe_intermediate_size": fc.INTER,
        "num_hidden_layers": fc.LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": fc.HEADS,
        "num_key_value_heads": fc.HEADS,
        "vocab_size": fc.VOCAB,
        "q_lora_rank": fc.Q_LORA,
        "kv_lora_rank": fc.KV_LORA,
        "qk_rope_head_dim": fc.ROPE,
        "qk_nope_head_dim": fc.NOPE,
        "v_head_dim": fc.V_DIM,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "num_experts": fc.EXPERTS,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "routed_expert_hidden_size": LATENT,
        "latent_moe_use_norm": True,
        "attn_res_block_size": 1,
        "linear_attn_config": {
            "kda_layers": [1],  # 1-based, as KimiLinearConfig.is_kda_layer reads them
            "full_attn_layers": [2, 3],
            "head_dim": fc.HEAD_DIM,
            "num_heads": fc.HEADS,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
        },
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    cfg = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": text,
        "tie_word_embeddings": False,
    }
    return t, cfg


KIMI_K3_BUILDERS = {"kimi_k3": kimi_k3}
KIMI_K3_DRAFTER_PREFIXES = {"kimi_k3": _TEXT + "layers.{layers}."}  # formatted by drafter_prefix
