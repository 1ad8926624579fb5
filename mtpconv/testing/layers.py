"""The tensors of one Qwen/DeepSeek-style decoder layer, for every tiny-model builder.

Names, shapes and creation order are fixed here; the values come from a ``fill``
callback, so the random-weight checkpoints and the planted vLLM models share one
layout (and a seeded generator draws its values in the same order as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# fill(leaf, shape) -> tensor: ``leaf`` is the module leaf name ("q_proj", "input_layernorm",
# "gate" for the router, ...), so a builder can give each kind of tensor its own scale.
Fill = Callable[[str, tuple[int, ...]], torch.Tensor]


@dataclass(frozen=True)
class LayerDims:
    """The sizes a decoder layer's tensors are made of."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP
    experts: int = 0  # 0: dense MLP
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    gated_q: bool = True  # Qwen3.5 / Qwen3-Next: q_proj also produces the output gate
    shared_name: str = "shared_expert"  # DeepSeek / GLM: "shared_experts" (no gate)
    fused_experts: bool = False  # 3-D gate_up_proj / down_proj instead of one module per expert


def _attention(p: str, d: LayerDims, fill: Fill) -> dict[str, torch.Tensor]:
    q_out = d.heads * d.head_dim * (2 if d.gated_q else 1)
    kv = d.kv_heads * d.head_dim
    return {
        f"{p}self_attn.q_proj.weight": fill("q_proj", (q_out, d.hidden)),
        f"{p}self_attn.k_proj.weight": fill("k_proj", (kv, d.hidden)),
        f"{p}self_attn.v_proj.weight": fill("v_proj", (kv, d.hidden)),
        f"{p}self_attn.o_proj.weight": fill("o_proj", (d.hidden, d.heads * d.head_dim)),
        f"{p}self_attn.q_norm.weight": fill("q_norm", (d.head_dim,)),
        f"{p}self_attn.k_norm.weight": fill("k_norm", (d.head_dim,)),
    }


def _gated_mlp(p: str, hidden: int, inter: int, fill: Fill) -> dict[str, torch.Tensor]:
    return {
        f"{p}gate_proj.weight": fill("gate_proj", (inter, hidden)),
        f"{p}up_proj.weight": fill("up_proj", (inter, hidden)),
        f"{p}down_proj.weight": fill("down_proj", (hidden, inter)),
    }


def _moe(p: str, d: LayerDims, fill: Fill) -> dict[str, torch.Tensor]:
    h, inter = d.hidden, d.expert_intermediate
    out = {f"{p}mlp.gate.weight": fill("gate", (d.experts, h))}
    if d.fused_experts:
        out[f"{p}mlp.experts.gate_up_proj"] = fill("gate_up_proj", (d.experts, 2 * inter, h))
        out[f"{p}mlp.experts.down_proj"] = fill("down_proj", (d.experts, h, inter))
    else:
        for e in range(d.experts):
            out.update(_gated_mlp(f"{p}mlp.experts.{e}.", h, inter, fill))
    out.update(_gated_mlp(f"{p}mlp.{d.shared_name}.", h, d.shared_intermediate, fill))
    if d.shared_name == "shared_expert":
        out[f"{p}mlp.shared_expert_gate.weight"] = fill("shared_expert_gate", (1, h))
    return out


def decoder_layer(prefix: str, d: LayerDims, fill: Fill) -> dict[str, torch.Tensor]:
    """Every tensor of one decoder layer under ``prefix`` (which ends with a dot)."""
    out = {
        f"{prefix}input_layernorm.weight": fill("input_layernorm", (d.hidden,)),
        f"{prefix}post_attention_layernorm.weight": fill("post_attention_layernorm", (d.hidden,)),
    }
    out.update(_attention(prefix, d, fill))
    if d.experts:
        out.update(_moe(prefix, d, fill))
    else:
        out.update(_gated_mlp(f"{prefix}mlp.", d.hidden, d.intermediate, fill))
    return out
