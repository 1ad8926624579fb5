"""The Kimi-K3 row of `mtpconv.families`, and its per-expert linear names.

Read from vLLM 0.32's ``vllm/models/kimi_k3/nvidia/mtp.py`` (``KimiK3MTP``: its
``__init__``, ``load_weights`` and ``_rewrite_spec_layer_name``), ``model.py``
(``KimiDecoderLayer``, ``KimiMoE``, ``KimiLinearModel.packed_modules_mapping``) and
``mla.py`` (``MultiHeadLatentAttention``), and ``vllm/config/speculative.py`` (a
``kimi_k3`` config becomes ``KimiK3MTPModel``).
"""

from __future__ import annotations

import re

from mtpconv.families.types import Family
from mtpconv.families.unsupported import VLLM_PKG

# Kimi-K3 (vllm/models/kimi_k3/nvidia/mtp.py, model.py): why its drafter linears stay BF16.
REPLICATED_NO_QUANT = "builds it as a ReplicatedLinear with quant_config=None (no FP8 possible)"
NOT_IN_MTP_BLOCK = (
    "does not build it in the MTP block (attn_res_block_size=None; the loader skips the "
    "stored quant_config=None weight, kept as stored)"
)
# Kimi-K3 stores its routed experts one per expert as w1/w2/w3 (``...experts.{e}.w1``): linears
# by name though no ``_proj`` says so (`weight_names.is_linear_module`).
PER_EXPERT_W = re.compile(r"\.experts\.\d+\.w[123]$")

# KimiK3ForConditionalGeneration (text_config: kimi_linear). The drafter is stored at
# language_model.model.layers.{N + i}.* (the loader strips "language_model."); its decoder
# block is built with prefix model.layers.{N + i} (mtp_block is in the parameter names
# only), so vLLM's quant config sees the stored name without "language_model.". The MLA
# front end packs q_a_proj + kv_a_proj_with_mqa + g_proj into fused_qkv_a_g_proj (the
# target's packed_modules_mapping, on the quant config the drafter shares).
KIMI_K3 = Family(
    "kimi_k3",
    ("KimiK3MTPModel",),
    VLLM_PKG + "kimi_k3/nvidia/mtp.py",
    model_types=frozenset({"kimi_k3", "kimi_k3_mtp"}),
    architectures=frozenset({"KimiK3ForConditionalGeneration"}),
    plain=(
        ("eh_proj", REPLICATED_NO_QUANT),
        ("self_attention_res_proj", NOT_IN_MTP_BLOCK),
        ("mlp_res_proj", NOT_IN_MTP_BLOCK),
    ),
    mla=True,
    fp8=(
        "MLA q_a/kv_a/g (packed fused_qkv_a_g_proj, per-member scales), q_b/kv_b/o",
        "latent MoE routed_expert_down/up_proj",
        "routed experts w1/w2/w3 (blocks)",
        "shared experts",
    ),
    bf16=("shared_head",),
)
