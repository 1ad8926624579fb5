"""The vLLM MTP architectures mtpconv has no family row for, each with the reason (issue 14).

`mtpconv.families` re-exports `UNSUPPORTED`; the registry-walk test fails on any vLLM MTP
architecture that is neither a row nor listed here.
"""

from __future__ import annotations

VLLM_MODELS = "vllm/model_executor/models/"
VLLM_PKG = "vllm/models/"
_VLLM, _VLLM_PKG = VLLM_MODELS, VLLM_PKG

_LOOKED = "read (issue 14), deliberately unsupported: "
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
}
