"""Tiny Qwen3.5-family checkpoints for the vLLM end-to-end tests (DESIGN §6).

``--kind planted``: the target's next token is always ``t + 1`` (mod vocab):
``lm_head[t + 1]`` is the direction of ``embed_tokens[t]`` and every decoder
layer adds only a small perturbation to the residual stream. The drafter is
wired to pass the embedding of its input token through (``mtp.fc = [I, 0]``), so
it predicts ``t + 1`` as well and is accepted ~100% of the time. With
``--swap-fc`` the two halves of ``mtp.fc`` are exchanged (a mis-converted
drafter): it then reads the target's hidden state and proposes the token just
sampled, which is always rejected.

``--drafter-noise S`` (planted only) makes it a LOW-MARGIN drafter: seeded
Gaussian noise of std ``S`` is added to the embedding half of ``mtp.fc``, so the
drafter's logit for ``t + 1`` competes with the best of many noisy runners-up
and loses for some tokens (top-2 margins of a few logits; S = 0.25 gives a BF16
acceptance of roughly 70-80%). The noise has its own generator (from
``--seed``): the target's tensors, hence its greedy output, are unchanged, and
S = 0 (the default) writes the same bytes as before.

``--kind random``: the same construction over a random permutation (next token
``perm[t]``), with a random drafter: greedy output is stable in bf16 while the
drafter's proposals are mostly rejected, exercising vLLM's correction path.

Both write a real Hugging Face directory: ``config.json`` (all ``layer_types``
``full_attention``, no ``mrope_section``), ``model.safetensors`` in bf16 with
the drafter under ``mtp.*``, a byte-level ``tokenizer.json`` built with the
``tokenizers`` library and ``tokenizer_config.json``. ``--moe`` gives a
Qwen3.5-MoE model (routed experts, shared expert) instead of the dense one,
``--next`` the same MoE block in the Qwen3-Next layout (served by ``Qwen3NextMTP``).

Command line: ``python scripts/build_planted_model.py DST [--kind planted|random] [--moe|--next]
[--swap-fc] [--drafter-noise S] [--seed N]``
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mtpconv.testing.layers import LayerDims, decoder_layer

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class TinySpec:
    vocab: int = 512
    hidden: int = 128
    intermediate: int = 256
    layers: int = 1
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    moe: bool = False
    next: bool = False  # Qwen3-Next layout (always MoE; MTP depth in num_nextn_predict_layers)
    experts: int = 4
    experts_per_token: int = 2
    moe_intermediate: int = 64
    shared_intermediate: int = 128


def _config(s: TinySpec) -> dict[str, object]:
    arch, model_type = (
        ("Qwen3NextForCausalLM", "qwen3_next")
        if s.next
        else ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text")
        if s.moe
        else ("Qwen3_5ForCausalLM", "qwen3_5_text")
    )
    cfg: dict[str, object] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        # Text-only: no mrope_section (vLLM would feed 3-row positions to the drafter).
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "layer_types": ["full_attention"] * s.layers,
        "eos_token_id": s.vocab - 1,
        "dtype": "bfloat16",
    }
    cfg["num_nextn_predict_layers" if s.next else "mtp_num_hidden_layers"] = 1
    if s.moe:
        cfg.update(
            num_experts=s.experts,
            num_experts_per_tok=s.experts_per_token,
            moe_intermediate_size=s.moe_intermediate,
            shared_expert_intermediate_size=s.shared_intermediate,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    else:
        cfg["intermediate_size"] = s.intermediate
    return cfg


def _small(g: torch.Generator, *shape: int, std: float = 0.02) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


# The std of each kind of tensor: the layer's contribution to the residual stream stays small.
_PLANTED_STD = {
    "q_proj": 0.1,
    "k_proj": 0.1,
    "v_proj": 0.1,
    "gate_proj": 0.1,
    "up_proj": 0.1,
    "gate": 0.5,
    "shared_expert_gate": 0.1,
}
_ZERO = frozenset({"input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"})


def _layer(p: str, s: TinySpec, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One decoder layer whose contribution to the residual stream is small."""

    def fill(leaf: str, shape: tuple[int, ...]) -> torch.Tensor:
        if leaf in _ZERO:
            return torch.zeros(*shape)
        return _small(g, *shape, std=_PLANTED_STD.get(leaf, 0.02))

    dims = LayerDims(
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        experts=s.experts if s.moe else 0,
        expert_intermediate=s.moe_intermediate,
        shared_intermediate=s.shared_intermediate,
    )
    return decoder_layer(p, dims, fill)


# Offset of the drafter-noise generator's seed: independent of the main stream.
NOISE_SEED_OFFSET = 1_000_003


def build_tensors(
    s: TinySpec, *, kind: str = "planted", swap_fc: bool = False, seed: int = 0, drafter_noise: float = 0.0
) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint (bf16), target and drafter.

    ``drafter_noise`` > 0 adds seeded N(0, drafter_noise^2) to the embedding half
    (input columns ``0..hidden-1``) of ``mtp.fc`` of the planted drafter (low margin).
    """
    if kind not in ("planted", "random"):
        raise ValueError(f"kind must be planted or random, not {kind!r}")
    if drafter_noise < 0 or (drafter_noise and kind != "planted"):
        raise ValueError(f"drafter_noise must be >= 0 and only with kind planted, not {drafter_noise!r}")
    g = torch.Generator().manual_seed(seed)
    h, v = s.hidden, s.vocab
    embed = torch.randn(v, h, generator=g)
    unit = embed / embed.norm(dim=-1, keepdim=True)
    nxt = (torch.arange(v) + 1) % v if kind == "planted" else torch.randperm(v, generator=g)
    lm_head = torch.empty(v, h)
    lm_head[nxt] = 4.0 * unit  # logit of next(t) ~ 4 * sqrt(H); any other ~ 4 * N(0, 1)
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": lm_head,
        "model.norm.weight": torch.zeros(h),
    }
    for i in range(s.layers):
        t |= _layer(f"model.layers.{i}.", s, g)
    if kind == "planted":
        halves = [torch.eye(h), torch.zeros(h, h)]
        fc = torch.cat(halves[::-1] if swap_fc else halves, dim=1)
        if drafter_noise:
            gn = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET)
            fc[:, :h] += torch.randn(h, h, generator=gn) * drafter_noise
    else:
        fc = _small(g, h, 2 * h, std=0.1)
    t |= {
        "mtp.fc.weight": fc,
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(h),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(h),
        "mtp.norm.weight": torch.zeros(h),
    }
    t |= _layer("mtp.layers.0.", s, g)
    return {k: x.to(torch.bfloat16).contiguous() for k, x in t.items()}


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` ids (the last is EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = [chr(c) for c in range(256) if chr(c) in alphabet]
    byte_chars += sorted(set(alphabet) - set(byte_chars))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    letters = "etaoinshrdlucmfw"
    merges = []
    for a in letters:
        for b in letters:
            if len(vocab) >= vocab_size - 1:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} ids, wanted {vocab_size}")
    tok.save(str(directory / "tokenizer.json"))
    write_tokenizer_config(directory, 1024)


def write_tokenizer_config(directory: Path, max_length: int) -> None:
    """``tokenizer_config.json`` of a tokenizer whose EOS (also its padding) is :data:`EOS`."""
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "pad_token": EOS,
                "model_max_length": max_length,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )


def build_model(
    dst: str | Path,
    *,
    kind: str = "planted",
    moe: bool = False,
    next: bool = False,
    swap_fc: bool = False,
    seed: int = 0,
    drafter_noise: float = 0.0,
) -> Path:
    """Write the tiny checkpoint directory ``dst`` and return it."""
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    spec = TinySpec(moe=moe or next, next=next)
    save_file(
        build_tensors(spec, kind=kind, swap_fc=swap_fc, seed=seed, drafter_noise=drafter_noise),
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(_config(spec), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": spec.vocab - 1}) + "\n")
    write_tokenizer(out, spec.vocab)
    return out
