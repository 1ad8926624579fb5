"""A tiny planted MiMo checkpoint (``MiMoForCausalLM`` + ``MiMoMTP``) for the vLLM end-to-end tests.

The non-Qwen counterpart of :mod:`mtpconv.testing.planted`: the target's next token
is always ``t + 1`` (``lm_head[t + 1]`` is the direction of ``embed_tokens[t]``, every
decoder layer adds only a small perturbation to the residual stream), and the MTP
drafter passes the embedding of its input token through, so it predicts ``t + 1``
too and is accepted ~always.

Names and wiring are those vLLM 0.32's ``mimo.py`` / ``mimo_mtp.py`` read: the target is
a Qwen2 model (``q/k/v_proj`` with biases, no q/k norms, RMSNorm weights multiply, so
norms are ones), the drafter lives at ``model.mtp_layers.{i}.{token_layernorm,
hidden_layernorm, input_proj, final_layernorm}`` plus a Qwen2 decoder layer's tensors
(``self_attn.*``, ``mlp.*``, ``input_layernorm``, ``post_attention_layernorm``) under the
same prefix. ``input_proj`` is a plain ``nn.Linear`` over ``cat([hidden, embedding])``
(hidden half first), so the planted drafter's ``input_proj`` is ``[0, I]``; with
``swap_proj`` the halves are exchanged (a mis-converted drafter that reads the
target's hidden state and is always rejected).

``config.json`` is what Xiaomi's checkpoints carry: ``model_type: mimo``,
``architectures: [MiMoForCausalLM]``, ``num_nextn_predict_layers`` and an ``auto_map`` to
the ``configuration_mimo.py`` written next to it (a ``Qwen2Config`` subclass, as in
Xiaomi's repos): transformers knows no ``mimo`` type, so it is served with
``trust_remote_code=True``; vLLM picks the MTP class from the architecture
(``config/speculative.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mtpconv.testing.layers import LayerDims, decoder_layer
from mtpconv.testing.planted import write_tokenizer


@dataclass(frozen=True)
class MimoSpec:
    """Sizes of the tiny MiMo model (head_dim = hidden / heads, as Qwen2 computes it)."""

    vocab: int = 512
    hidden: int = 128
    intermediate: int = 256
    layers: int = 1
    heads: int = 4
    kv_heads: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def mimo_config(s: MimoSpec) -> dict[str, object]:
    """config.json of the tiny MiMo model (one MTP layer)."""
    return {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "mimo",
        "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig"},
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "num_nextn_predict_layers": 1,
        "eos_token_id": s.vocab - 1,
        "dtype": "bfloat16",
    }


# Xiaomi's configuration_mimo.py, reduced to what a config needs: Qwen2's plus the MTP depth.
CONFIGURATION_MIMO = """from transformers.models.qwen2.configuration_qwen2 import Qwen2Config


class MiMoConfig(Qwen2Config):
    model_type = "mimo"

    def __init__(self, *args, num_nextn_predict_layers=0, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(*args, **kwargs)
"""

# Std of each kind of tensor: the layer's contribution to the residual stream stays small.
_STD = {"q_proj": 0.1, "k_proj": 0.1, "v_proj": 0.1, "gate_proj": 0.1, "up_proj": 0.1}
_ONES = frozenset({"input_layernorm", "post_attention_layernorm"})


def _qwen2_layer(p: str, s: MimoSpec, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One Qwen2 decoder layer (q/k/v biases, no q/k norms) that barely moves the residual."""

    def fill(leaf: str, shape: tuple[int, ...]) -> torch.Tensor:
        if leaf in _ONES:
            return torch.ones(*shape)
        return torch.randn(*shape, generator=g) * _STD.get(leaf, 0.02)

    dims = LayerDims(
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        gated_q=False,
    )
    t = {
        k: v
        for k, v in decoder_layer(p, dims, fill).items()
        if not k.endswith(("q_norm.weight", "k_norm.weight"))
    }
    for proj, rows in (("q_proj", s.heads), ("k_proj", s.kv_heads), ("v_proj", s.kv_heads)):
        t[f"{p}self_attn.{proj}.bias"] = torch.zeros(rows * s.head_dim)
    return t


def build_tensors(s: MimoSpec, *, swap_proj: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """All tensors of the planted MiMo checkpoint (bf16), target and drafter."""
    g = torch.Generator().manual_seed(seed)
    h, v = s.hidden, s.vocab
    embed = torch.randn(v, h, generator=g)
    unit = embed / embed.norm(dim=-1, keepdim=True)
    lm_head = torch.empty(v, h)
    lm_head[(torch.arange(v) + 1) % v] = 4.0 * unit  # logit of t+1 ~ 4 * sqrt(H); others ~ 4 * N(0, 1)
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": lm_head,
        "model.norm.weight": torch.ones(h),
    }
    for i in range(s.layers):
        t |= _qwen2_layer(f"model.layers.{i}.", s, g)
    halves = [torch.zeros(h, h), torch.eye(h)]  # cat([hidden, embedding]): read the embedding
    p = "model.mtp_layers.0."
    t |= {
        f"{p}input_proj.weight": torch.cat(halves[::-1] if swap_proj else halves, dim=1),
        f"{p}token_layernorm.weight": torch.ones(h),
        f"{p}hidden_layernorm.weight": torch.ones(h),
        f"{p}final_layernorm.weight": torch.ones(h),
    }
    t |= _qwen2_layer(p, s, g)
    return {k: x.to(torch.bfloat16).contiguous() for k, x in t.items()}


def build_mimo_model(dst: str | Path, *, swap_proj: bool = False, seed: int = 0) -> Path:
    """Write the tiny planted MiMo checkpoint directory ``dst`` and return it."""
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    spec = MimoSpec()
    save_file(
        build_tensors(spec, swap_proj=swap_proj, seed=seed),
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(mimo_config(spec), indent=2) + "\n")
    (out / "configuration_mimo.py").write_text(CONFIGURATION_MIMO)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": spec.vocab - 1}) + "\n")
    write_tokenizer(out, spec.vocab)
    return out
