"""Tiny DeepSeek-V4 checkpoints with the names vLLM 0.32 loads (issue 14).

The target is in DeepSeek's own names (``embed.weight``, ``layers.{i}.attn.wq_a.weight``,
``layers.{i}.ffn.experts.{e}.w1.weight``, ``head.weight``, ``hc_head_fn`` ...), which
``DeepseekV4ForCausalLM.hf_to_vllm_mapper`` (vllm/models/deepseek_v4/nvidia/model.py) maps to
``model.*``; the drafter is ``mtp.{i}.*``, which ``DeepSeekV4MTP.load_weights``
(vllm/models/deepseek_v4/nvidia/mtp.py) maps to ``model.layers.{N + i}.*``: ``e_proj`` /
``h_proj``, ``enorm`` / ``hnorm``, ``norm`` (its shared_head norm), ``hc_head_{fn,base,scale}``
and a decoder layer (``attn.{wq_a,wkv,wq_b,wo_a,wo_b,q_norm,kv_norm,attn_sink}``,
``ffn.{gate,experts.{e}.w1..w3,shared_experts.w1..w3}``, ``hc_{attn,ffn}_*``). An MTP layer's
compress ratio is 1 in vLLM, so it has no compressor and no indexer; target layer 1 has both.

`write_deepseek_v4_release` writes the form DeepSeek's and NVIDIA's releases ship in: every
linear, the drafter's included, already FP8 e4m3 in 128x128 blocks with a float32 ``.scale``
(``quant_method: fp8``, read by vLLM's ``DeepseekV4FP8Config``; the "Flash-Base" layout with
``expert_dtype: fp8``). mtpconv reads such a drafter as already converted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

import torch

from mtpconv.families import BY_NAME
from mtpconv.layouts import is_linear_module, module_of
from mtpconv.testing.checkpoints import _write_shards

# family_checkpoints' sizes (it imports this module to register the builder, so not from there)
H, VOCAB, LAYERS, EXPERTS = 64, 256, 2, 4
HEADS, HEAD_DIM, ROPE, Q_LORA, O_LORA, O_GROUPS = 2, 32, 16, 32, 16, 2
MOE_INTER, HC_MULT, INDEX_HEADS, INDEX_DIM = 32, 2, 2, 32
DRAFTER_PREFIX = "mtp."
_BLOCK = 128
Tensors = dict[str, torch.Tensor]


class _Rand(Protocol):
    """family_checkpoints._Gen: seeded bf16 weights and norms."""

    def w(self, *shape: int, scale: float = 0.05) -> torch.Tensor: ...

    def ones(self, *shape: int) -> torch.Tensor: ...


def _hyper(t: Tensors, p: str, names: tuple[str, ...]) -> None:
    """Hyper-connection parameters (float32, no ``.weight`` suffix: never linears)."""
    mix, dim = (2 + HC_MULT) * HC_MULT, HC_MULT * H
    for n in names:
        t[f"{p}hc_{n}_fn"] = torch.randn(mix, dim) * 0.01
        t[f"{p}hc_{n}_base"] = torch.zeros(mix)
        t[f"{p}hc_{n}_scale"] = torch.ones(3)


def _compressor(t: Tensors, p: str, r: _Rand, head_dim: int) -> None:
    """vLLM's DeepseekCompressor (overlapping, ratio 4): wkv + wgate fused with quant_config=None."""
    t[f"{p}wkv.weight"] = r.w(2 * head_dim, H)
    t[f"{p}wgate.weight"] = r.w(2 * head_dim, H)
    t[f"{p}ape"] = torch.zeros(4, 2 * head_dim)
    t[f"{p}norm.weight"] = r.ones(head_dim)


def _layer(t: Tensors, p: str, r: _Rand, *, compress: bool, hash_moe: bool) -> None:
    """One DeepseekV4DecoderLayer in checkpoint names."""
    t[f"{p}attn_norm.weight"] = r.ones(H)
    t[f"{p}ffn_norm.weight"] = r.ones(H)
    _hyper(t, p, ("attn", "ffn"))
    a = f"{p}attn."
    t[f"{a}wq_a.weight"] = r.w(Q_LORA, H)
    t[f"{a}q_norm.weight"] = r.ones(Q_LORA)
    t[f"{a}wq_b.weight"] = r.w(HEADS * HEAD_DIM, Q_LORA)
    t[f"{a}wkv.weight"] = r.w(HEAD_DIM, H)
    t[f"{a}kv_norm.weight"] = r.ones(HEAD_DIM)
    t[f"{a}wo_a.weight"] = r.w(O_GROUPS * O_LORA, HEADS * HEAD_DIM // O_GROUPS)
    t[f"{a}wo_b.weight"] = r.w(H, O_GROUPS * O_LORA)
    t[f"{a}attn_sink"] = torch.zeros(HEADS)
    if compress:
        _compressor(t, f"{a}compressor.", r, HEAD_DIM)
        t[f"{a}indexer.wq_b.weight"] = r.w(INDEX_HEADS * INDEX_DIM, Q_LORA)
        t[f"{a}indexer.weights_proj.weight"] = r.w(INDEX_HEADS, H)
        _compressor(t, f"{a}indexer.compressor.", r, INDEX_DIM)
    f = f"{p}ffn."
    t[f"{f}gate.weight"] = r.w(EXPERTS, H)
    if hash_moe:  # layers below num_hash_layers route by token id
        t[f"{f}gate.tid2eid"] = torch.randint(0, EXPERTS, (VOCAB, 2), dtype=torch.int32)
    else:
        t[f"{f}gate.bias"] = torch.zeros(EXPERTS)
    for e in (*(f"experts.{i}." for i in range(EXPERTS)), "shared_experts."):
        t[f"{f}{e}w1.weight"] = r.w(MOE_INTER, H)
        t[f"{f}{e}w3.weight"] = r.w(MOE_INTER, H)
        t[f"{f}{e}w2.weight"] = r.w(H, MOE_INTER)


def deepseek_v4(r: _Rand) -> tuple[Tensors, dict[str, Any]]:
    """A 2-layer DeepSeek-V4 target (layer 0 hash-routed, layer 1 compressed) and one MTP layer."""
    t: Tensors = {"embed.weight": r.w(VOCAB, H, scale=1)}
    for i in range(LAYERS):
        _layer(t, f"layers.{i}.", r, compress=i == 1, hash_moe=i == 0)
    t["norm.weight"] = r.ones(H)
    t["head.weight"] = r.w(VOCAB, H, scale=1)
    t["hc_head_fn"] = torch.randn(HC_MULT, HC_MULT * H) * 0.01
    t["hc_head_base"] = torch.zeros(HC_MULT)
    t["hc_head_scale"] = torch.ones(1)
    p = "mtp.0."
    t[f"{p}e_proj.weight"] = r.w(H, H)
    t[f"{p}h_proj.weight"] = r.w(H, H)
    for n in ("enorm", "hnorm", "norm"):
        t[f"{p}{n}.weight"] = r.ones(H)
    t[f"{p}hc_head_fn"] = torch.randn(HC_MULT, HC_MULT * H) * 0.01
    t[f"{p}hc_head_base"] = torch.zeros(HC_MULT)
    t[f"{p}hc_head_scale"] = torch.ones(1)
    _layer(t, p, r, compress=False, hash_moe=False)
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": H,
        "num_hidden_layers": LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": HEADS,
        "head_dim": HEAD_DIM,
        "qk_rope_head_dim": ROPE,
        "q_lora_rank": Q_LORA,
        "o_lora_rank": O_LORA,
        "o_groups": O_GROUPS,
        "compress_ratios": [1, 4],
        "sliding_window": 16,
        "index_n_heads": INDEX_HEADS,
        "index_head_dim": INDEX_DIM,
        "index_topk": 8,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": MOE_INTER,
        "num_hash_layers": 1,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "swiglu_limit": 10.0,
        "hc_mult": HC_MULT,
        "hc_sinkhorn_iters": 2,
        "hc_eps": 1e-6,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    return t, cfg


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` as e4m3 with one float32 scale per 128x128 block (DeepSeek's ``.scale``)."""
    rows, cols = math.ceil(w.shape[0] / _BLOCK), math.ceil(w.shape[1] / _BLOCK)
    scale = torch.empty(rows, cols)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * _BLOCK : (i + 1) * _BLOCK, j * _BLOCK : (j + 1) * _BLOCK].float()
            scale[i, j] = blk.abs().amax().clamp(min=1e-12) / 448.0
            q[i * _BLOCK : (i + 1) * _BLOCK, j * _BLOCK : (j + 1) * _BLOCK] = (blk / scale[i, j]).to(q.dtype)
    return q, scale


def _built_fp8(name: str, w: torch.Tensor, leaves: tuple[str, ...]) -> bool:
    """A linear vLLM builds with the quant config (its compressors' ``fused_wkv_wgate`` and the
    indexer's ``weights_proj`` get quant_config=None, so the release keeps them unquantized)."""
    plain = ".compressor." in name or ".weights_proj." in name
    return (
        name.endswith(".weight") and w.dim() == 2 and not plain and is_linear_module(module_of(name), leaves)
    )


def write_deepseek_v4_release(directory: str | Path, seed: int = 0) -> Path:
    """The tiny checkpoint in the released form: every linear FP8 with ``.scale``, MTP included."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    from mtpconv.testing.family_checkpoints import _Gen

    tensors, cfg = deepseek_v4(_Gen(torch.Generator().manual_seed(seed)))
    leaves = BY_NAME["deepseek_v4"].linear_leaves
    stored: Tensors = {}
    for name, w in tensors.items():
        if _built_fp8(name, w, leaves):
            stored[name], stored[f"{module_of(name)}.scale"] = _fp8_blocks(w)
        else:
            stored[name] = w
    cfg["expert_dtype"] = "fp8"
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [_BLOCK, _BLOCK],
    }
    cfg["torch_dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    _write_shards(directory, stored, {n for n in stored if n.startswith(DRAFTER_PREFIX)}, 2)
    return directory
