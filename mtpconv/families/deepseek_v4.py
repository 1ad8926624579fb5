"""The DeepSeek-V4 row of `mtpconv.families`.

Read from vLLM 0.32's ``vllm/models/deepseek_v4/nvidia/mtp.py`` (``DeepSeekV4MTP``: its
``__init__``, ``load_weights``, ``_to_spec_layer_name`` and ``_rewrite_spec_layer_name``),
``model.py`` (the decoder layer, ``hf_to_vllm_mapper``, ``packed_modules_mapping``) and
``attention.py`` (MTP layers have compress ratio 1: no compressor or indexer).
"""

from __future__ import annotations

from mtpconv.families.types import DrafterAt, Family, VllmNames
from mtpconv.families.unsupported import VLLM_PKG

# The checkpoint keeps DeepSeek's own names (layers.{i}.attn.wq_a, ffn.experts.{e}.w1) and the
# drafter at mtp.{i}.*; vLLM names it model.layers.{N + i}.* and packs wq_a + wkv and the
# shared experts' w1 + w3 as the target's packed_modules_mapping does.
DEEPSEEK_V4 = Family(
    "deepseek_v4",
    ("DeepSeekV4MTPModel",),
    VLLM_PKG + "deepseek_v4/nvidia/mtp.py",
    model_types=frozenset({"deepseek_v4"}),
    drafter_at=DrafterAt.MTP_INDEXED,
    vllm_names=VllmNames.MTP_INDEX_AFTER_TARGET,
    mla=True,  # vLLM's is_deepseek_mla (head_dim + compress_ratios); no kv_lora_rank
    fp8=("e_proj, h_proj", "attention wq_a/wkv/wq_b/wo_a/wo_b", "routed experts (blocks)", "shared experts"),
    bf16=("hc_* hyper-connection parameters", "shared_head (mtp.{i}.norm)"),
    linear_leaves=("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "w1", "w2", "w3"),
    # model.py: embed is a VocabParallelEmbedding and head a ParallelLMHead; compressor.py builds
    # fused_wkv_wgate and attention.py the indexer's weights_proj with quant_config=None
    target_plain=r"^(embed|head)$|\.compressor\.(wkv|wgate)$|\.indexer\.weights_proj$",
)
